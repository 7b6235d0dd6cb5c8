"""The notebooks run top to bottom (nbclient, kernel python3 of this venv), and are committed without outputs.

Each notebook asserts its own numbers (LP = closed form, plan marginals, verifier <= optimum,
Monte Carlo within its error, the K-SEQ bound, depth-1 acceptance of a decode run against the closed
form), so an execution that completes is a real check, not only a smoke test.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
NEEDS = {"03_decode.ipynb": "otm.decode"}


def test_there_are_notebooks():
    names = {p.name for p in NOTEBOOKS}
    assert {"01_lp_plan.ipynb", "02_optimality_gaps.ipynb", "03_decode.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: a code cell has outputs; strip them before committing"
            assert cell.execution_count is None, f"{path.name}: a code cell has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path):
    need = NEEDS.get(path.name)
    if need and importlib.util.find_spec(need) is None:
        pytest.skip(f"{path.name} needs {need}")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}})
    client.execute()  # raises CellExecutionError on the first failing cell (assertions included)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.get("output_type") == "error"]
    assert not errors
    assert any(c.outputs for c in nb.cells if c.cell_type == "code")
