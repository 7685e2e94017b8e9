"""Every Python code block of README.md and docs/*.md runs, and the docs build.

A page's ```python blocks run in order in one namespace (a page is one
script a reader follows), each written to a file of its own first, so that
kernels defined in them have source the tracer can read. They run on the CPU
backend. A block whose first line is the marker

    # needs an NVIDIA GPU

(streams, events, graphs, host programs: what the CPU backend has no
meaning for) is only compiled here (and checked for names nobody defined);
test_pages_on_the_gpu runs every block, marked ones included, on a GPU
(a block that imports torch or CuPy where they are not installed is
reported as a warning there).

test_docs_build builds the guide with Sphinx (docs/conf.py) with warnings as
errors, the API reference included (autodoc imports this checkout's mlirgpu).
CI installs Sphinx and MyST-Parser (.ci/install)."""
import ast
import builtins
import contextlib
import io
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from support.backends import current_backend
from support.checks import PYTHON_DIR

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
GPU_MARKER = "# needs an NVIDIA GPU"
# Exchange examples use these; a machine without them runs the rest of the page.
OPTIONAL_LIBRARIES = ("torch", "cupy")
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def blocks(page):
    """(first line number, source) of each ```python block of `page`."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in FENCE.finditer(text)]


def free_names(source):
    """The names a block reads but never binds itself."""
    tree = ast.parse(source)
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
    return read - bound


def page_id(page):
    return str(page.relative_to(ROOT))


def run_page(page, tmp_path, run_gpu_blocks):
    environment = dict(os.environ)  # pages may set MLIRGPU_CHECK and the like
    try:
        run_blocks(page, tmp_path, run_gpu_blocks)
    finally:
        os.environ.clear()
        os.environ.update(environment)


def run_blocks(page, tmp_path, run_gpu_blocks):
    namespace = {"__name__": f"docs_{page.stem}"}
    for line, source in blocks(page):
        path = tmp_path / f"{page.stem}_line{line}.py"
        # Blank lines keep the page's line numbers in tracebacks and kernel locations.
        path.write_text("\n" * (line - 1) + source)
        code = compile(path.read_text(), str(path), "exec")
        if source.startswith(GPU_MARKER) and not run_gpu_blocks:
            undefined = sorted(free_names(source) - set(namespace) - set(dir(builtins)))
            assert not undefined, f"{page_id(page)}, the block at line {line} uses undefined names {undefined}"
            continue
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                exec(code, namespace)
            except ModuleNotFoundError as error:
                if error.name not in OPTIONAL_LIBRARIES:
                    raise AssertionError(f"{page_id(page)}, the block at line {line} raised {error}") from error
                warnings.warn(f"{page_id(page)}, the block at line {line} needs {error.name}, not installed here")
            except Exception as error:
                raise AssertionError(f"{page_id(page)}, the block at line {line} raised "
                                     f"{type(error).__name__}: {error}") from error


def test_every_guide_page_has_code():
    """The guide teaches by example; the reference pages (the API, measurements, docs/design) need not."""
    reference = ("index.md", "api.md", "sgemm_h100.md", "gemm_tensorcore_h100.md")
    assert [p for p in PAGES if not blocks(p) and p.name not in reference and p.parent.name != "design"] == []


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_page_runs_on_the_cpu_backend(page, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    with current_backend("cpu"):
        run_page(page, tmp_path, run_gpu_blocks=False)


@pytest.mark.gpu
@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_pages_on_the_gpu(page, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    with current_backend("cuda"):
        run_page(page, tmp_path, run_gpu_blocks=True)


def test_docs_build(tmp_path):
    pytest.importorskip("sphinx")   # CI installs it (the test extra); a GPU machine may not have it
    pytest.importorskip("myst_parser")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [PYTHON_DIR, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           str(ROOT / "docs"), str(tmp_path / "html")], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "html" / "api.html").exists()


# One letter of each word is a character class, so that this line, which
# users never read, does not itself contain the words it looks for.
INTERNAL = re.compile(r"\bse[e]d'?s?\b|\blec[t]ure'?s?\b|(?-i:AP[I]\.md)|\bthe con[t]ract\b|\bis[s]ue \d+",
                      re.IGNORECASE)


@pytest.mark.parametrize("page", PAGES + sorted((ROOT / "notebooks").glob("*.ipynb")), ids=page_id)
def test_pages_speak_to_users(page):
    """No project-internal vocabulary in what users read."""
    text = page.read_text()
    assert [m.group(0) for m in INTERNAL.finditer(text)] == []
