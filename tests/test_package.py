"""The package's shape: its layers import downward only, and `mlirgpu`
shows exactly its public API."""
import ast
import inspect
from pathlib import Path

import mlirgpu as mg

PACKAGE = Path(mg.__file__).resolve().parent

# Each layer may import the ones before it (and the leaves), never one after it.
LAYERS = ["ir", "layout", "language", "frontend", "compiler", "runtime"]
# Modules every layer may import: the C extension, the version, the driver façade.
LEAVES = {"_mlirgpu", "_version", "cuda"}


def module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path):
    """The mlirgpu modules `path` imports, at any level of its code (functions too)."""
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
            if target == "mlirgpu":
                found.update(f"mlirgpu.{alias.name}" for alias in node.names)
            elif target.startswith("mlirgpu."):
                found.add(target)
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
