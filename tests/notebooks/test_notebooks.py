"""Every notebook runs from a clean kernel and all of its asserted claims hold (scripts/run_notebooks.py runs them);
each notebook's kernel is shut down when it ends, passed or failed."""
import importlib.util
from pathlib import Path

import nbformat
import psutil
import pytest
from nbclient.exceptions import CellExecutionError

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
# One notebook takes 20-60 s on two idle cores; the limit leaves room for a machine busy with other work.
NOTEBOOK_TIMEOUT_S = 420

_spec = importlib.util.spec_from_file_location("run_notebooks", REPO / "scripts" / "run_notebooks.py")
run_notebooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_notebooks)


def running_descendants() -> set[int]:
    """This process's descendants (kernels and whatever they started) that are still running, not zombies."""
    alive = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 9


@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_runs_and_its_claims_hold(path):
    before = running_descendants()
    notebook, _ = run_notebooks.execute(path, cell_timeout_s=NOTEBOOK_TIMEOUT_S)
    errors = [output for cell in notebook.cells if cell.cell_type == "code"
              for output in cell.outputs if output.output_type == "error"]
    assert not errors
    assert running_descendants() <= before, "the notebook's kernel (or a process it started) is still running"


def notebook_recording_its_kernel(folder: Path, last_cell: str) -> Path:
    """A two-cell notebook whose kernel writes its process id into `folder`, then runs `last_cell`."""
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import os\nopen('kernel.pid', 'w').write(str(os.getpid()))"),
        nbformat.v4.new_code_cell(last_cell)])
    path = folder / "tiny.ipynb"
    nbformat.write(notebook, path)
    return path


def kernel_is_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(120)
def test_the_kernel_is_shut_down_after_a_notebook_that_passes(tmp_path):
    before = running_descendants()
    notebook, _ = run_notebooks.execute(notebook_recording_its_kernel(tmp_path, "assert 1 + 1 == 2"))
    pid = int((tmp_path / "kernel.pid").read_text())
    assert pid not in before and kernel_is_gone(pid)
    assert running_descendants() <= before


@pytest.mark.timeout(120)
def test_the_kernel_is_shut_down_after_a_notebook_that_fails(tmp_path):
    before = running_descendants()
    with pytest.raises(CellExecutionError, match="the claim no longer holds"):
        run_notebooks.execute(notebook_recording_its_kernel(tmp_path, "assert 1 + 1 == 3, 'the claim no longer holds'"))
    pid = int((tmp_path / "kernel.pid").read_text())
    assert pid not in before and kernel_is_gone(pid)
    assert running_descendants() <= before
