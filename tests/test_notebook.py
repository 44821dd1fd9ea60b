"""The main notebook executed for real by papermill with cpu-smoke."""
import json

import papermill as pm
import pytest

from workbench import notebook, results
from workbench.config import ConfigError


@pytest.mark.slow
def test_papermill_runs_the_notebook_into_the_run_folder(tmp_path):
    run_dir = notebook.execute("cpu-smoke", {"steps": "3", "iters": 2}, out=tmp_path, run_id="nb")
    executed = json.loads((run_dir / "distill_benchmark.ipynb").read_text())
    injected = [c for c in executed["cells"] if "injected-parameters" in c["metadata"].get("tags", [])]
    assert injected and "steps = 3" in "".join(injected[0]["source"])  # typed, not the string "3"
    df = results.load(run_dir)
    assert (df["cfg_steps"] == 3).all() and len(df) == 3
    outputs = [o for c in executed["cells"] for o in c.get("outputs", [])]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 3  # the three plots rendered inline


def test_help_notebook_lists_the_config_fields():
    params = pm.inspect_notebook(str(notebook.MAIN_NOTEBOOK))
    assert {"preset", "hidden", "backends", "loss", "iters"} <= set(params)
    assert "residual stream" in params["hidden"]["help"]


def test_bad_parameters_fail_before_a_kernel_starts(tmp_path):
    with pytest.raises(ConfigError, match="model.hidden"):
        notebook.execute("cpu-smoke", {"hidden": 0}, out=tmp_path)
    assert not any(tmp_path.iterdir())
