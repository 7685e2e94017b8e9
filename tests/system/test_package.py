"""The package's shape: its layers import downward only, and `mlirgpu`
shows exactly its public API."""
import ast
import importlib
import inspect
from pathlib import Path

import pytest
from support.checks import assert_isolated

import mlirgpu as mg

PACKAGE = Path(mg.__file__).resolve().parent

# Each layer may import the ones before it (and the leaves), never one after it.
LAYERS = ["ir", "layout", "language", "targets", "frontend", "compiler", "runtime", "ops", "export"]
# Modules every layer may import: the C extension, the version, the driver façade.
LEAVES = {"_mlirgpu", "_version", "cuda"}


def module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


# Every mlirgpu module: the package's .py files and the C extension.
MODULES = {module_name(path) for path in PACKAGE.rglob("*.py")} | {"mlirgpu._mlirgpu"}


def imports(path):
    """The mlirgpu modules `path` imports, at any level of its code (functions
    and TYPE_CHECKING blocks too): `from P import name` imports P.name where
    that is a module, else P (a package means its __init__.py)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "mlirgpu" or target.startswith("mlirgpu."):
                found.update(f"{target}.{alias.name}" if f"{target}.{alias.name}" in MODULES else target
                             for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("mlirgpu"))
    return found


def layer(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_module_is_in_a_layer_or_a_leaf():
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        if name == "mlirgpu":
            continue
        assert layer(name) in LAYERS or layer(name) in LEAVES or layer(name) in ("info", "run", "__main__"), name


def test_layers_import_downward_only():
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        here = layer(module_name(path))
        if here not in LAYERS:
            continue
        for target in imports(path):
            there = layer(target)
            if there is None:
                wrong.append(f"{module_name(path)} imports the mlirgpu package itself")
            elif there in LEAVES or there == here:
                continue
            elif there not in LAYERS or LAYERS.index(there) > LAYERS.index(here):
                wrong.append(f"{module_name(path)} -> {target}")
    assert not wrong, "imports that go up a layer:\n" + "\n".join(sorted(wrong))


# Import circles that are meant to be, each with why.
CIRCLES = [
    # Deliberate: Scalar's operators (**, abs(), % on floats) are math's functions, which take Scalars
    # (and Vectors); splitting them would leave the operators' meaning in a file apart from the type.
    {"mlirgpu.language.core", "mlirgpu.language.intrinsics", "mlirgpu.language.math"},
]


def test_no_import_circle_spans_two_files():
    """No two modules import each other, directly or round a longer circle: a
    circle makes the order of first imports matter, and a reader cannot read
    either file first. Every import counts, deferred ones in functions and
    TYPE_CHECKING ones too (a reader and a type checker follow them)."""
    # mlirgpu/__init__.py counts with its TYPE_CHECKING imports, which would
    # close a circle through any module importing the package itself (none
    # may: test_layers_import_downward_only); its lazy _WHERE table is strings.
    graph = {module_name(path): imports(path) for path in PACKAGE.rglob("*.py")}

    def reach(module):
        seen, todo = set(), [module]
        while todo:
            for target in graph.get(todo.pop(), ()):
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen

    reached = {module: reach(module) for module in graph}
    # A circle is a strongly connected component: modules that reach each other.
    circles = {frozenset(m for m in reached[module] if module in reached.get(m, ())) for module in graph}
    found = sorted(sorted(c) for c in circles if len(c) > 1)
    assert found == sorted(sorted(c) for c in CIRCLES), "import circles:\n" + "\n".join(map(str, found))


def test_leaves_import_nothing_of_mlirgpu_but_the_extension():
    for leaf in LEAVES - {"_mlirgpu"}:
        path = PACKAGE / f"{leaf}.py"
        assert {layer(t) for t in imports(path)} <= {"_mlirgpu"}, leaf


def test_dir_shows_the_public_api():
    assert dir(mg) == sorted(mg.__all__)
    assert len(set(mg.__all__)) == len(mg.__all__)
    for name in mg.__all__:
        assert hasattr(mg, name), name
    for internal in ("tracer", "host", "program", "elementwise", "language", "frontend", "compiler",
                     "runtime", "kernel_module", "sys", "np"):
        assert internal not in dir(mg)


def test_public_functions_have_real_signatures():
    for name in ("empty", "zeros", "to_device", "graph", "kernel", "vectorize", "autotune", "func",
                 "set_backend", "asarray"):
        parameters = inspect.signature(getattr(mg, name)).parameters
        assert not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters.values()), name
    assert list(inspect.signature(mg.empty).parameters) == ["shape", "dtype", "stream"]


def test_import_loads_no_layer_until_a_name_is_used():
    proc = assert_isolated("""
        import sys
        import mlirgpu as mg
        print(sorted(m for m in sys.modules if m.startswith("mlirgpu")), "numpy" in sys.modules)
        mg.kernel
        print("used:", "mlirgpu.runtime.kernel" in sys.modules, "mlirgpu._mlirgpu" in sys.modules)
    """, "used: True True")
    assert proc.stdout.splitlines()[0] == "['mlirgpu', 'mlirgpu._version'] False"


def test_public_names_are_their_layers_objects():
    from mlirgpu import _mlirgpu, language, runtime
    from mlirgpu.compiler import cache
    from mlirgpu.ir import passes

    assert mg.f32 is _mlirgpu.f32 and mg.CompileError is _mlirgpu.CompileError
    assert mg.kernel is runtime.kernel.kernel and mg.cpu is runtime.cpu
    assert mg.math is language.math and mg.thread_idx is language.thread_idx
    assert mg.passes is passes and mg.cache_info is cache.cache_info


def test_unknown_names_are_attribute_errors():
    with pytest.raises(AttributeError, match="module 'mlirgpu' has no attribute 'kernels'"):
        mg.kernels
    assert not hasattr(mg, "runtime_") and getattr(mg, "nothing", None) is None


def test_star_import_and_threads_resolve_every_name_in_a_new_process():
    assert_isolated("""
        import threading
        import mlirgpu as mg
        names = list(mg.__all__)
        barrier = threading.Barrier(8)
        found = {}

        def use(part):
            barrier.wait()
            for name in part:
                found[name] = getattr(mg, name)

        threads = [threading.Thread(target=use, args=(names[i::8],)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        scope = {}
        exec("from mlirgpu import *", scope)
        assert all(scope[name] is found[name] for name in names), "star import differs"
        print("resolved", len(found) == len(names))
    """, "resolved True")


def test_an_extension_that_cannot_load_fails_the_first_use():
    assert_isolated("""
        import sys
        sys.modules["mlirgpu._mlirgpu"] = None   # as if the extension were missing
        import mlirgpu as mg
        print("imported", mg.__version__ == mg._version.__version__)
        try:
            mg.f32
        except ImportError:
            print("first use: ImportError")
    """, "first use: ImportError")


def test_what_type_checkers_read_is_what_the_first_use_gives():
    """The TYPE_CHECKING imports of __init__.py (what editors and type
    checkers read) name every public name, each as the object it is at run time."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and getattr(node.test, "id", "") ==
                 "TYPE_CHECKING")
    read = {}
    for node in block.body:
        for alias in node.names:
            if node.module is None:     # `from . import cuda`: the submodule itself, not mlirgpu's __getattr__
                read[alias.name] = importlib.import_module(f"mlirgpu.{alias.name}")
                continue
            module = importlib.import_module(f"mlirgpu.{node.module}")
            value = getattr(module, alias.name, None)
            read[alias.name] = value if value is not None else importlib.import_module(
                f"{module.__name__}.{alias.name}")
    assert set(read) | {"__version__"} == set(mg.__all__)
    for name, value in read.items():
        assert getattr(mg, name) is value, name
