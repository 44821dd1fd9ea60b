"""The configuration's seam: a new field is one attribute with a docstring in workbench/config/fields.py.
The CLI's --set, the notebook's parameters cell and every result row's cfg_<field> cell then carry it
without another file being edited (they read the dataclasses)."""
import pathlib
import shutil
import subprocess
import sys

import workbench

FIELD = '''    seed: int = 42
    """Seeds the teacher, the students' shared initial weights and the batches."""
    probe_steps: int = 3
    """A field that exists only in this test."""
'''

CHECK = """
import contextlib, io, json, types
from workbench import cli, notebook
from workbench.config import Config, from_preset
from workbench.run.rows import run_cells

cell = notebook.parameters_cell()
assert "probe_steps: Optional[int] = None  # A field that exists only in this test." in cell.splitlines(), cell
cfg = from_preset("cpu-smoke", probe_steps=5)
row = run_cells(cfg, "r", {}, types.SimpleNamespace(cells=dict), {})
assert row["cfg_probe_steps"] == 5 and Config().train.probe_steps == 3, row
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out):
    assert cli.main(["config", "--preset", "cpu-smoke", "--set", "probe_steps=7"]) == 0
assert json.loads(out.getvalue())["train"]["probe_steps"] == 7
with contextlib.redirect_stderr(err):
    assert cli.main(["config", "--set", "probe_steps=many"]) != 0
assert "probe_steps expects a value of type int, got 'many'" in err.getvalue(), err.getvalue()
print("seam ok")
"""


def test_a_new_config_field_is_one_attribute(tmp_path):
    pkg = tmp_path / "src" / "workbench"
    shutil.copytree(pathlib.Path(workbench.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    fields = pkg / "config" / "fields.py"
    old = FIELD.split("    probe_steps")[0]
    assert fields.read_text().count(old) == 1  # the anchor: TrainConfig's seed
    fields.write_text(fields.read_text().replace(old, FIELD))
    env = {"PYTHONPATH": str(tmp_path / "src"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}

    p = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "seam ok" in p.stdout
