"""Every notebook is a jupytext pair (.ipynb + py:percent .py) and the two halves say the same thing.

Fix a failure with `jupytext --sync notebooks/<name>.py` (or .ipynb, whichever you edited last).
"""
from pathlib import Path

import jupytext
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def cells(nb) -> list[tuple[str, str, tuple[str, ...]]]:
    """What a pair must agree on: each cell's type, source and tags (not outputs or ids)."""
    return [(c.cell_type, c.source.strip(), tuple(c.metadata.get("tags", ()))) for c in nb.cells]


def pair_differences(ipynb: Path) -> list[str]:
    py = ipynb.with_suffix(".py")
    if not py.exists():
        return [f"{py.name} is missing"]
    a, b = jupytext.read(ipynb), jupytext.read(py, fmt="py:percent")
    problems = []
    if "py:percent" not in str(a.metadata.get("jupytext", {}).get("formats", "")):
        problems.append(f"{ipynb.name} is not paired with py:percent (jupytext formats metadata)")
    ca, cb = cells(a), cells(b)
    if len(ca) != len(cb):
        problems.append(f"{len(ca)} cells in {ipynb.name}, {len(cb)} in {py.name}")
    problems += [f"cell {i}: {x[:2]} != {y[:2]}"[:300] for i, (x, y) in enumerate(zip(ca, cb)) if x != y]
    return problems


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {"distill_benchmark.ipynb", "sweep_report.ipynb"}


@pytest.mark.parametrize("ipynb", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_pair_in_sync(ipynb):
    assert not pair_differences(ipynb), f"run `jupytext --sync {ipynb.with_suffix('.py')}`"


def test_an_out_of_sync_pair_is_caught(tmp_path):
    src = NOTEBOOKS[0]
    (tmp_path / src.name).write_bytes(src.read_bytes())
    py = src.with_suffix(".py").read_text()
    (tmp_path / src.with_suffix(".py").name).write_text(py.replace("# %% [markdown]", "# %% [markdown]\n# edited", 1))
    assert pair_differences(tmp_path / src.name)
