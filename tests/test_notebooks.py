"""The notebooks in notebooks/ run top to bottom on the CPU backend, as a
reader would run them: nbclient starts Jupyter's python3 kernel (ipykernel,
this interpreter) in the notebooks directory and executes every cell; a cell
that raises fails the test with the cell and its traceback. CI installs
nbclient, nbformat and ipykernel (.ci/install)."""
import os
from pathlib import Path

from checks import PYTHON_DIR
import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parents[1]
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
    assert [p.name for p in NOTEBOOKS][:1] == ["01_sgemm.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in notebook.cells
               if c.cell_type == "code"), f"{path.name}: clear its outputs before committing it"


def test_sgemm_notebook_runs_on_cpu():
    notebook = execute(ROOT / "notebooks" / "01_sgemm.ipynb")
    text = "\n".join(cell_text(c) for c in notebook.cells if c.cell_type == "code")
    assert "backend: cpu" in text
    for number in (1, 3, 10):  # check() prints "<TITLE>: MxK @ KxN on the cpu backend, relative error ..."
        assert any(line.startswith(f"{number}: ") and "on the cpu backend, relative error" in line
                   for line in text.splitlines()), f"no checked result of kernel {number} in the notebook's output"
    assert "gpu.func" in text  # the IR cell printed the traced module
    assert ".entry" in text    # and the PTX cell the kernel's entry
