"""The backends are objects: runtime/backend.py chooses one, and the rest of
the runtime asks it to do what differs instead of asking which one it is."""
import ast
import inspect
from pathlib import Path

import pytest
from support.backends import current_backend

import mlirgpu as mg
from mlirgpu.runtime import backend
from mlirgpu.runtime.cpu import CpuBackend
from mlirgpu.runtime.gpu import CudaBackend

RUNTIME = Path(backend.__file__).resolve().parent
IMPLEMENTATIONS = [CudaBackend, CpuBackend]


def test_runtime_modules_do_not_branch_on_the_backend():
    """Outside backend.py no runtime module asks which backend is current:
    no call of mg.backend() / on_cpu(), no comparison with a backend's name."""
    wrong = []
    for path in sorted(RUNTIME.glob("*.py")):
        if path.name == "backend.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                called = getattr(node.func, "id", getattr(node.func, "attr", None))
                if called in ("on_cpu", "backend"):
                    wrong.append(f"{path.name}:{node.lineno}: calls {called}()")
            elif isinstance(node, ast.Compare):
                names = [c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
                if set(names) & set(backend.BACKENDS):
                    wrong.append(f"{path.name}:{node.lineno}: compares with a backend's name")
    assert not wrong, "\n".join(wrong)


def test_only_the_chooser_calls_on_cpu_or_names_an_implementation():
    def classes(name):
        source = (RUNTIME / name).read_text()
        assert "on_cpu" not in source
        return sorted(node.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef))

    # The chooser defines no backend; the interface module defines Backend and what backends use of kernels.
    assert classes("backend.py") == []
    assert classes("backend_interface.py") == ["Backend", "KernelSpecialization", "VectorizedCall"]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_each_backend_implements_the_interface(implementation):
    assert issubclass(implementation, backend.Backend) and not inspect.isabstract(implementation)
    made = implementation()
    assert made.name in backend.BACKENDS
    for attribute in ("host", "captures_graphs", "dispatches_in_c"):
        assert isinstance(getattr(made, attribute), bool), attribute
    for name, method in inspect.getmembers(backend.Backend, inspect.isfunction):
        mine = getattr(implementation, name)
        assert inspect.signature(mine).parameters.keys() == inspect.signature(method).parameters.keys(), name


def test_the_two_backends_differ_in_name_memory_and_abilities():
    cuda, cpu = CudaBackend(), CpuBackend()
    assert (cuda.name, cuda.host, cuda.captures_graphs, cuda.dispatches_in_c) == ("cuda", False, True, True)
    assert (cpu.name, cpu.host, cpu.captures_graphs, cpu.dispatches_in_c) == ("cpu", True, False, False)
    assert cpu.tuning_device() is None


def test_current_is_the_chosen_backend_object():
    with current_backend("cpu"):
        assert isinstance(backend.current(), CpuBackend)
        assert backend.current() is backend.current()
        assert backend.current().name == mg.backend() == "cpu"


def test_the_lowerings_sit_side_by_side_and_only_mg_target_is_a_target():
    from mlirgpu.targets.cpu import CpuLowering
    from mlirgpu.targets.gpu import GpuLowering

    assert issubclass(CpuLowering, GpuLowering)
    package = Path(mg.__file__).resolve().parent
    named = [f"{path.relative_to(package)}" for path in package.rglob("*.py")
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef) and node.name == "Target"]
    assert named == ["compiler/nvvm.py"]
    assert mg.Target.__module__ == "mlirgpu.compiler.nvvm"
