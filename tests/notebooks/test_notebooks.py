"""Every notebook runs from a clean kernel and all of its asserted claims hold (scripts/run_notebooks.py runs them)."""
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
# One notebook takes 20-60 s on two idle cores; the limit leaves room for a machine busy with other work.
NOTEBOOK_TIMEOUT_S = 420

_spec = importlib.util.spec_from_file_location("run_notebooks", REPO / "scripts" / "run_notebooks.py")
run_notebooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_notebooks)


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 9


@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_runs_and_its_claims_hold(path):
    notebook, _ = run_notebooks.execute(path, cell_timeout_s=NOTEBOOK_TIMEOUT_S)
    errors = [output for cell in notebook.cells if cell.cell_type == "code"
              for output in cell.outputs if output.output_type == "error"]
    assert not errors
