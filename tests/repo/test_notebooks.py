"""Every notebook in notebooks/: committed executed top to bottom, and still runs (quick setting).

The quick setting (INT4LAB_QUICK=1) shrinks problem sizes but runs the same code path; the committed
outputs come from the full setting (`make notebooks`). Deselect the slow half with `-m "not notebook"`.
"""
import time

import nbformat
import pytest

from lab.notebooks import find_notebooks, run_notebook

NOTEBOOKS = find_notebooks()
CELL_TIMEOUT_S = 600        # one cell in the quick setting; a hang fails here instead of stalling CI
NOTEBOOK_BUDGET_S = 900     # one whole notebook in the quick setting (CI: 2 cores, 90 minutes for everything)


def _ids(paths):
    return [p.stem for p in paths]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_committed_notebook_is_executed_and_framed(path):
    nb = nbformat.read(path, as_version=4)
    cells = nb.cells
    assert cells, f"{path.name} is empty"
    assert cells[0].cell_type == "markdown", f"{path.name} must open with a markdown cell (the question)"
    assert cells[-1].cell_type == "markdown", f"{path.name} must close with a markdown cell (what it showed)"
    code = [(i, c) for i, c in enumerate(cells) if c.cell_type == "code" and c.source.strip()]
    assert code, f"{path.name} has no code cells"
    counts = []
    for i, c in code:
        assert c.execution_count is not None, f"{path.name}: cell {i} was never executed"
        errors = [o for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{path.name}: cell {i} has an error output: {errors[0].get('ename')}"
        counts.append(c.execution_count)
    # one fresh kernel, top to bottom: counts 1, 2, 3, ... in cell order
    assert counts == list(range(1, len(counts) + 1)), \
        f"{path.name} was not executed top to bottom in one run (execution counts {counts})"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_stored_outputs_run_only_modules_that_exist(path):
    """A printed `python -m X` must name a module of this checkout: outputs stored before a module moved
    (and not re-executed since) would send the reader to one that is gone."""
    import importlib.util
    import re
    nb = nbformat.read(path, as_version=4)
    texts = [o.get("text", "") or str(o.get("data", {}).get("text/plain", ""))
             for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    missing = sorted({m for t in texts for m in re.findall(r"python -m ([A-Za-z_][\w.]*[\w])", t)
                      if importlib.util.find_spec(m) is None})
    assert not missing, f"{path.name}: stored outputs print `python -m` for modules that do not exist: {missing}"


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs_in_quick_mode(path):
    t0 = time.time()
    run_notebook(path, write=False, quick_mode=True, timeout=CELL_TIMEOUT_S)
    dt = time.time() - t0
    assert dt < NOTEBOOK_BUDGET_S, f"{path.name} took {dt:.0f} s in quick mode (budget {NOTEBOOK_BUDGET_S} s)"
