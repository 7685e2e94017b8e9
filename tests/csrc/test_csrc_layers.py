"""The C extension's layers: csrc/ is one folder per concern, and calls flow one way (down).

Each csrc .c file is compiled (-O0, in parallel) to an object; `nm` reads the
symbols it defines and the ones it uses from other files. A file's layer is
its folder's place in LAYERS. The checks: no file uses a symbol of a higher
layer (where one must reach up, the higher layer registers a callback table
at init), no two files use each other however indirectly, and files and
functions stay short enough to read. The map is docs/design/csrc.md.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"

# Bottom to top. "" is csrc/ itself: module.c, the module's init, which calls every area's init.
LAYERS = ("base", "mlir", "cuda", "arrays", "host", "cpu", "launch", "dispatch", "")

MAX_FILE_LINES = 1200
MAX_FUNCTION_LINES = 120

# Files and functions still longer than the limits, each to be split along the
# jobs it holds; the test fails when one is missing here or listed needlessly.
LONG_FILES = set()
LONG_FUNCTIONS = set()

pytestmark = pytest.mark.skipif(not CSRC.is_dir() or shutil.which("gcc") is None or shutil.which("nm") is None,
                                reason="the C sources (a source checkout) and gcc/nm are needed")


def sources():
    return sorted(CSRC.rglob("*.c"))


def layer_of(path):
    folder = path.parent.relative_to(CSRC).as_posix()
    folder = "" if folder == "." else folder
    assert folder in LAYERS, f"{path.relative_to(ROOT)}: csrc/{folder}/ is not in LAYERS"
    return LAYERS.index(folder)


def name(path):
    return path.relative_to(CSRC).as_posix()


def compile_flags():
    import numpy
    mlir = os.environ.get("MLIR_PREFIX", "/usr/lib/llvm-22")
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    return ["-std=c11", "-O0", "-fvisibility=hidden", "-DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION",
            '-DMG_CUDA_HOME="/usr/local/cuda"', f"-I{CSRC}", f"-I{ROOT / 'python' / 'mlirgpu' / 'export'}",
            f"-I{mlir}/include", f"-I{cuda}/include",
            f"-I{numpy.get_include()}", f"-I{sysconfig.get_paths()['include']}"]


@pytest.fixture(scope="module")
def symbols(tmp_path_factory):
    """{file: (defined, used)}: the global symbols each file defines and those it uses."""
    out = tmp_path_factory.mktemp("csrc_objects")
    flags = compile_flags()

    def read(path):
        obj = out / (name(path).replace("/", "__") + ".o")
        subprocess.run(["gcc", *flags, "-c", str(path), "-o", str(obj)], check=True, capture_output=True)
        listing = subprocess.run(["nm", str(obj)], check=True, capture_output=True, text=True).stdout
        defined, used = set(), set()
        for line in listing.splitlines():
            fields = line.split()
            if len(fields) == 3 and fields[1] in "TDBRCV":
                defined.add(fields[2])
            elif len(fields) == 2 and fields[0] == "U":
                used.add(fields[1])
        return path, (defined, used)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(pool.map(read, sources()))


@pytest.fixture(scope="module")
def uses(symbols):
    """{file: {file it uses: sorted symbols}} between csrc files."""
    owner = {symbol: path for path, (defined, _) in symbols.items() for symbol in defined}
    graph = {}
    for path, (_, used) in symbols.items():
        edges = {}
        for symbol in used:
            if symbol in owner and owner[symbol] != path:
                edges.setdefault(owner[symbol], []).append(symbol)
        graph[path] = {target: sorted(names) for target, names in edges.items()}
    return graph


def test_every_file_is_in_a_layer():
    for path in sources():
        layer_of(path)


def test_no_file_calls_a_higher_layer(uses):
    upward = [f"{name(path)} ({LAYERS[layer_of(path)] or 'csrc'}) uses {name(target)} "
              f"({LAYERS[layer_of(target)] or 'csrc'}): {', '.join(names)}"
              for path, edges in uses.items() for target, names in edges.items()
              if layer_of(target) > layer_of(path)]
    assert not upward, "calls up the layers:\n" + "\n".join(upward)


def test_no_call_circle_between_files(uses):
    # Tarjan's strongly connected components: any with two files is a circle.
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in uses[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(name(member) for member in component))

    for node in sorted(uses):
        if node not in index:
            visit(node)
    assert not circles, f"files that use each other: {circles}"


def test_no_file_is_too_long():
    long = {name(path): n for path in sources()
            if (n := len(path.read_text().splitlines())) > MAX_FILE_LINES}
    assert set(long) == set(LONG_FILES), f"files over {MAX_FILE_LINES} lines: {long}"


def function_lengths(path):
    """{function: lines of its body}: in this code a function's braces stand alone at column 0."""
    lines = path.read_text().splitlines()
    lengths, start = {}, None
    for number, line in enumerate(lines):
        if line == "{":
            start = number
        elif line == "}" and start is not None:
            # The signature starts on the nearest line above that starts with a letter.
            first = next((i for i in range(start - 1, max(-1, start - 6), -1) if re.match(r"[A-Za-z_]", lines[i])),
                         start - 1)
            names = re.findall(r"(\w+)\s*\(", " ".join(lines[first:start]))
            lengths[names[0] if names else f"line {start + 1}"] = number - start - 1
            start = None
    return lengths


def test_no_function_is_too_long():
    long = {f"{name(path)}:{function}": n for path in sources()
            for function, n in function_lengths(path).items() if n > MAX_FUNCTION_LINES}
    assert set(long) == set(LONG_FUNCTIONS), f"functions over {MAX_FUNCTION_LINES} lines: {long}"
