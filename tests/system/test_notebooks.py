"""The notebooks in notebooks/ run top to bottom on the CPU backend, as a
reader would run them: nbclient starts Jupyter's python3 kernel (ipykernel,
this interpreter) in the notebooks directory and executes every cell; a cell
that raises fails the test with the cell and its traceback. CI installs
nbclient, nbformat and ipykernel (.ci/install)."""
import os
from pathlib import Path

from support.checks import PYTHON_DIR
import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT = 600  # seconds; the first cell that compiles a kernel pays for MLIR's JIT


def cell_text(cell):
    """What a code cell printed or displayed, as text."""
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            parts.append(output.get("data", {}).get("text/plain", ""))
    return "".join(parts)


def execute(path):
    notebook = nbformat.read(path, as_version=4)
    env = dict(os.environ, MLIRGPU_BACKEND="cpu",
               PYTHONPATH=os.pathsep.join(filter(None, [PYTHON_DIR, os.environ.get("PYTHONPATH")])))
    client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute(env=env)  # CellExecutionError at the first cell that raises
    return notebook


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS][:3] == ["00_first_kernel.ipynb", "01_sgemm.ipynb", "02_tensor_cores.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_with_outputs(path):
    """Readers see what each cell prints before they run it: every code cell ran, none raised."""
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    cells = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") is not None for c in cells), f"{path.name}: store it run, with its outputs"
    assert not [o for c in cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert sum(bool(c.get("outputs")) for c in cells) >= len(cells) // 2


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_installs_only_where_needed(path):
    """The first code cell installs mlirgpu, guarded so that it does nothing where mlirgpu imports."""
    notebook = nbformat.read(path, as_version=4)
    first = next(c for c in notebook.cells if c.cell_type == "code")
    assert 'if importlib.util.find_spec("mlirgpu") is None:' in first.source
    assert "pip install mlirgpu" in first.source


def test_first_kernel_notebook_runs_on_cpu():
    notebook = execute(ROOT / "notebooks" / "00_first_kernel.ipynb")
    text = "\n".join(cell_text(c) for c in notebook.cells if c.cell_type == "code")
    assert "on the cpu backend" in text
    assert "max error: 0.0" in text
    for checked in ("scale_rows matches NumPy", "smooth matches NumPy", "fixed: [ 1.  3.  5.  7.  9. 11.]"):
        assert checked in text
    assert "KernelError: out-of-bounds load from 'x' at index (64,)" in text  # the bug, found
    assert "x[5] = -1.000000" in text and "x[40] = -1.000000" in text       # printf
    assert "gpu.func @vector_add" in text and ".visible .entry vector_add(" in text


def test_sgemm_notebook_runs_on_cpu():
    notebook = execute(ROOT / "notebooks" / "01_sgemm.ipynb")
    text = "\n".join(cell_text(c) for c in notebook.cells if c.cell_type == "code")
    assert "backend: cpu" in text
    for number in (1, 3, 10):  # check() prints "<TITLE>: MxK @ KxN on the cpu backend, relative error ..."
        assert any(line.startswith(f"{number}: ") and "on the cpu backend, relative error" in line
                   for line in text.splitlines()), f"no checked result of kernel {number} in the notebook's output"
    assert "gpu.func" in text  # the IR cell printed the traced module
    assert "refused: LaunchError" in text  # kernel 10 takes multiples of its tiles only
    assert ".entry" in text    # and the PTX cell the kernel's entry


def test_tensor_cores_notebook_runs_both_gemms_on_cpu():
    notebook = execute(ROOT / "notebooks" / "02_tensor_cores.ipynb")
    text = "\n".join(cell_text(c) for c in notebook.cells if c.cell_type == "code")
    errors = {}
    for line in text.splitlines():
        if "relative error" in line:
            errors[line.split(":")[0]] = float(line.rsplit(" ", 1)[1])
    assert errors["128x128x128 bf16 -> f32"] < 1e-5               # the mma.sync GEMM
    assert errors["130x90x72 bf16 -> f32 on the cpu backend"] < 1e-5  # the Hopper GEMM: TMA, mbarriers, wgmma


def test_attention_notebook_runs_on_cpu():
    notebook = execute(ROOT / "notebooks" / "03_attention.ipynb")
    text = "\n".join(cell_text(c) for c in notebook.cells if c.cell_type == "code")
    assert "backend: cpu" in text
    errors = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if "max error" in line]
    assert len(errors) == 6 and max(errors) < 2e-2      # causal, window, three packed sequences, decode
    relative = [float(word) for line in text.splitlines() if line.startswith("backward,")
                for word in line.replace(",", " ").split() if word[0].isdigit()]
    assert len(relative) == 6 and max(relative) < 3e-2  # dq, dk, dv, with atomics and deterministic
    assert "mma.sync per 64 queries: " in text and "atomic adds: 0" not in text
