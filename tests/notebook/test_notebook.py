"""The main notebook executed for real by papermill with cpu-smoke, and what it shows a reader."""
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
import papermill as pm
import pytest

from workbench import config, notebook, results
from workbench.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_FILES = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """One cpu-smoke run through papermill: (run folder, executed notebook, what it printed to stdout)."""
    out = tmp_path_factory.mktemp("runs")
    captured = out / "stdout.txt"
    with open(captured, "w") as f:
        real, sys.stdout = sys.stdout, f  # execute forwards the kernel's output to sys.stdout
        try:
            run_dir = notebook.execute("cpu-smoke", {"steps": "3", "iters": 2}, out=out, run_id="nb")
        finally:
            sys.stdout = real
    return run_dir, json.loads((run_dir / "distill_benchmark.ipynb").read_text()), captured.read_text()


def _outputs(nb) -> list[dict]:
    return [o for c in nb["cells"] for o in c.get("outputs", [])]


def _text(output: dict) -> str:
    return "".join(output.get("text", "")) + "".join(output.get("data", {}).get("text/plain", ""))


@pytest.mark.slow
def test_papermill_runs_the_notebook_into_the_run_folder(executed):
    run_dir, nb, _ = executed
    injected = [c for c in nb["cells"] if "injected-parameters" in c["metadata"].get("tags", [])]
    assert injected and "steps = 3" in "".join(injected[0]["source"])  # typed, not the string "3"
    df = results.load(run_dir)
    assert (df["cfg_steps"] == 3).all() and len(df) == 3
    assert sum("image/png" in o.get("data", {}) for o in _outputs(nb)) == 2  # loss curves and step time
    assert not list(run_dir.glob(".*partial*")), "the executed notebook is moved into place"


@pytest.mark.slow
def test_the_executed_notebook_opens_with_the_summary_table(executed):
    """After the parameters and the run call: the versions line and one small table, no config dump, and
    on a CPU one line instead of empty memory axes."""
    run_dir, nb, _ = executed
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    run_call = next(i for i, c in enumerate(code) if "run_cell" in "".join(c["source"]))
    table_cell = _text_of(code[run_call + 1])
    assert "CPU · torch " in table_cell and "TE not installed" in table_cell
    for column in ("status", "step ms", "× vs torch_bf16", "final loss", "eval MSE", "peak GiB"):
        assert column in table_cell
    all_text = "".join(_text(o) for o in _outputs(nb))
    assert '"model": {' not in all_text and '"hidden":' not in all_text  # cfg.to_json() is gone
    assert "Peak memory is measured on GPUs only" in all_text


def _text_of(cell) -> str:
    return "".join(_text(o) for o in cell.get("outputs", []))


@pytest.mark.slow
def test_the_runner_lines_stream_while_the_kernel_runs(executed):
    _, _, printed = executed
    assert "[torch_fp32] training 3 steps" in printed and "[te_fp8:delayed]" in printed


@pytest.mark.slow
def test_the_executed_notebook_shows_readable_tables_and_folds_its_dumps(executed):
    """The parameters cell opens collapsed; the tables show no NaN / None and no six-decimal numbers; summary.json
    is a block that opens on a click, one line as plain text."""
    _, nb, _ = executed
    params = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    assert params["metadata"]["jupyter"]["source_hidden"] is True
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    run_call = next(i for i, c in enumerate(code) if "run_cell" in "".join(c["source"]))
    tables = [code[run_call + 1], next(c for c in code if "details_table" in "".join(c["source"]))]
    for cell in tables:
        shown = _text_of(cell) + "".join("".join(o.get("data", {}).get("text/html", "")) for o in cell["outputs"])
        assert "NaN" not in shown and "None" not in shown, shown
        digits = [n.replace(".", "").lstrip("0") for n in re.findall(r"\d+\.\d+", shown)]
        assert digits and max(map(len, digits)) <= 4, shown  # four significant digits at most
    folded = next(c for c in code if "summary_json" in "".join(c["source"]))["outputs"][0]["data"]
    assert folded["text/html"][0].startswith("<details><summary>summary.json: ") and '"mode":' in \
        "".join(folded["text/html"]).replace("&quot;", '"')
    assert "".join(folded["text/plain"]).count("\n") == 0


def test_tables_are_shown_to_four_significant_digits_and_empty_where_missing(tmp_path):
    t = pd.DataFrame({"ms": [652.1969189999481, None, 12345.678], "status": ["ok", None, "skipped"],
                      "ranks": [1, 2, 4], "loss": [0.123456, float("nan"), 3e-7]}, index=["a", "b", "c"])
    shown = notebook.readable(t)
    assert shown.loc["a"].tolist() == ["652.2", "ok", "1", "0.1235"]
    assert shown.loc["b"].tolist() == ["", "", "2", ""]
    assert shown.loc["c"].tolist() == ["12346", "skipped", "4", "3e-07"]
    cfg = config.from_preset("cpu-smoke")
    results.write_json(tmp_path / "config.json", {"config": cfg.to_dict()})
    rows = [{"student": "torch_bf16", "status": "ok", "step_ms_median": 10.123456, "final_train_loss": 0.2},
            {"student": "te_fp8:delayed", "status": "skipped", "reason": "no GPU"}]
    results.write_csv(tmp_path / "students.csv", results.students_frame(rows))
    results.write_json(tmp_path / "summary.json", {"baseline": "torch_bf16", "mode": "cpu", "fp8_reason": None})
    results.mark_complete(tmp_path)
    details = notebook.details_table(tmp_path)
    assert details.loc["torch_bf16", "step_ms_median"] == "10.12" and details.loc["te_fp8:delayed", "eval_mse"] == ""
    folded = notebook.summary_json(tmp_path)
    assert repr(folded).startswith("summary.json: 3 keys") and "<details><summary>" in folded._repr_html_()
    assert "&quot;fp8_reason&quot;: null" in folded._repr_html_()


def test_the_main_notebooks_parameters_cell_opens_collapsed():
    nb = nbformat.read(ROOT / "notebooks" / notebook.MAIN_NOTEBOOK.name, as_version=4)
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and params[0].metadata["jupyter"] == {"source_hidden": True}


def test_a_taken_run_id_is_named_as_the_notebooks_parameter(tmp_path):
    """Re-running an executed notebook (papermill keeps its injected run_id) meets its own run folder: the
    notebook names its parameter and how papermill sets it, not the command line's --run-id."""
    (tmp_path / "nb").mkdir()
    with pytest.raises(results.OutputError, match="exists already") as e:
        notebook.run_cell({"preset": "cpu-smoke", "out": str(tmp_path), "run_id": "nb"})
    assert "--run-id" not in str(e.value) and "-p run_id NAME" in str(e.value) and "-p run_id None" in str(e.value)
    assert not any((tmp_path / "nb").iterdir())


def test_a_fallback_row_gets_no_speedup_and_the_slow_path_shows(tmp_path):
    """A fallback ran PyTorch autocast in place of its backend: a ratio for it would compare nothing."""
    cfg = config.from_preset("cpu-smoke")
    results.write_json(tmp_path / "config.json", {"config": cfg.to_dict()})
    rows = [{"student": "torch_bf16", "status": "ok", "step_ms_median": 10.0, "gpu_busy_share": 0.95},
            {"student": "te_fp8:delayed", "status": "fallback", "step_ms_median": 5.0, "gpu_busy_share": 0.5,
             "slow_path": "fallback: PyTorch autocast ran instead of te_fp8"}]
    results.write_csv(tmp_path / "students.csv", results.students_frame(rows))
    results.mark_complete(tmp_path)
    t = notebook.summary_table(tmp_path)
    assert t.loc["torch_bf16", "× vs torch_bf16"] == 1.0 and pd.isna(t.loc["te_fp8:delayed", "× vs torch_bf16"])
    assert t.loc["te_fp8:delayed", "slow path"].startswith("fallback") and t.loc["torch_bf16", "slow path"] == ""
    assert t.loc["te_fp8:delayed", "GPU busy %"] == 50.0


def test_summary_table_numbers(tmp_path):
    """Speedup is the baseline's step time over the student's; memory in GiB; three significant digits."""
    cfg = config.from_preset("cpu-smoke")
    results.write_json(tmp_path / "config.json", {"config": cfg.to_dict()})
    rows = [
        {"student": "torch_fp32", "status": "ok", "step_ms_median": 30.0, "final_train_loss": 0.123456,
         "eval_mse": 0.5, "peak_mem_allocated_mb": 2048.0, "gpu_name": "NVIDIA H200", "compute_capability": "9.0",
         "torch": "2.11.0", "torch_cuda": "12.8", "te_version": "2.20.2", "git_sha": "abc1234"},
        {"student": "torch_bf16", "status": "ok", "step_ms_median": 10.0, "final_train_loss": 0.2,
         "eval_mse": 0.25, "peak_mem_allocated_mb": 1536.0},
        {"student": "te_fp8:delayed", "status": "skipped", "step_ms_median": None, "final_train_loss": None,
         "eval_mse": None, "peak_mem_allocated_mb": None},
    ]
    results.write_csv(tmp_path / "students.csv", results.students_frame(rows))
    results.mark_complete(tmp_path)
    t = notebook.summary_table(tmp_path)
    assert list(t.columns) == [
        "status",
        "step ms",
        "× vs torch_bf16",
        "final loss",
        "eval MSE",
        "peak GiB",
        "slow path",
    ]
    assert t.loc["torch_fp32", "× vs torch_bf16"] == pytest.approx(0.333)
    assert t.loc["torch_bf16", "× vs torch_bf16"] == 1.0
    assert t.loc["torch_fp32", "peak GiB"] == 2.0 and t.loc["torch_bf16", "peak GiB"] == 1.5
    assert t.loc["torch_fp32", "final loss"] == 0.123
    assert t.loc["te_fp8:delayed", "status"] == "skipped"
    assert notebook.versions_line(tmp_path) == \
        "GPU NVIDIA H200 (CC 9.0) · torch 2.11.0 · CUDA 12.8 · TE 2.20.2 · git abc1234"


@pytest.mark.parametrize("ipynb", NOTEBOOK_FILES, ids=[p.name for p in NOTEBOOK_FILES])
def test_papermill_help_gives_every_parameter_a_type_and_help(ipynb):
    """What `papermill --help-notebook` prints: each parameter has a type (papermill reads it from the
    annotation; it prints "Unknown type" without one) and a help text (the line's comment)."""
    out = subprocess.run([sys.executable, "-m", "papermill", "--help-notebook", str(ipynb)],
                         capture_output=True, text=True, check=True).stdout
    listing = out.split("Parameters inferred for notebook", 1)[1].splitlines()[1:]
    entries, current = [], None
    for line in listing:
        m = re.match(r"  (\w+): (.+?) \(default (.*?)\)\s*(.*)$", line)
        if m:
            current = [m.group(1), m.group(2), m.group(4).strip()]
            entries.append(current)
        elif current is not None and line.strip():
            current[2] = (current[2] + " " + line.strip()).strip()
    names = {e[0] for e in entries}
    assert names == {p["name"] for p in pm.inspect_notebook(str(ipynb)).values()} and len(names) >= 3
    for name, type_, help_ in entries:
        assert "Unknown type" not in type_, f"{ipynb.name}: {name} has no type"
        assert help_, f"{ipynb.name}: {name} has no help"
    if ipynb.name == notebook.MAIN_NOTEBOOK.name:
        assert {"preset", "out", "run_id", "hidden", "backends", "show_panel"} <= names


def test_help_notebook_lists_the_config_fields():
    params = pm.inspect_notebook(str(notebook.MAIN_NOTEBOOK))
    assert {"preset", "hidden", "backends", "loss", "iters"} <= set(params)
    assert "residual stream" in params["hidden"]["help"]
    assert params["hidden"]["inferred_type_name"] == "Optional[int]"


def test_bad_parameters_fail_before_a_kernel_starts(tmp_path):
    with pytest.raises(ConfigError, match="model.hidden"):
        notebook.execute("cpu-smoke", {"hidden": 0}, out=tmp_path)
    assert not any(tmp_path.iterdir())


def _tiny_notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python",
                                                           "display_name": "Python 3"}})
    nb.cells = [nbformat.v4.new_code_cell("preset = out = run_id = None", metadata={"tags": ["parameters"]}),
                *(nbformat.v4.new_code_cell(s) for s in sources)]
    nbformat.write(nb, path)
    return path


@pytest.mark.slow
def test_a_failing_notebook_still_leaves_the_executed_copy(tmp_path):
    nb = _tiny_notebook(
        tmp_path / "fails.ipynb", "print('before the failure')", "raise RuntimeError('cell failed here')"
    )
    with pytest.raises(pm.PapermillExecutionError, match="cell failed here"):
        notebook.execute("cpu-smoke", out=tmp_path / "runs", run_id="r", notebook=nb, log_output=False)
    executed = tmp_path / "runs" / "r" / "fails.ipynb"
    assert "cell failed here" in executed.read_text()  # moved into place, showing the failure
    assert [p.name for p in executed.parent.iterdir()] == ["fails.ipynb"]  # no temporary file left


@pytest.mark.slow
def test_the_kernels_own_log_stays_out_of_the_terminal(tmp_path, capfd):
    """No 'Kernel is running over TCP without encryption' warning at the start of every run, and no
    'KeyboardInterrupt caught in kernel' at its end (capfd sees the kernel process's own stderr)."""
    nb = _tiny_notebook(tmp_path / "quiet.ipynb", "print('cell ran')")
    notebook.execute("cpu-smoke", out=tmp_path / "runs", run_id="q", notebook=nb)
    err = capfd.readouterr().err
    assert "Kernel is running over TCP" not in err and "KeyboardInterrupt" not in err, err
    assert "cell ran" in (tmp_path / "runs" / "q" / "quiet.ipynb").read_text()


@pytest.mark.slow
def test_cell_timeout_stops_a_cell_that_runs_too_long(tmp_path):
    nb = _tiny_notebook(tmp_path / "slow.ipynb", "import time; time.sleep(60)")
    with pytest.raises(Exception, match="(?i)timed out"):
        notebook.execute("cpu-smoke", out=tmp_path / "runs", run_id="r", notebook=nb, cell_timeout=2,
                         log_output=False)
    assert (tmp_path / "runs" / "r" / "slow.ipynb").exists()


def test_notebook_command_rejects_a_missing_notebook(tmp_path, capsys):
    from workbench import cli

    assert cli.main(["notebook", "--preset", "cpu-smoke", "--notebook", str(tmp_path / "nope.ipynb")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"workbench notebook: --notebook {tmp_path / 'nope.ipynb'}: no such file"


def test_notebooks_are_package_data_read_through_importlib_resources():
    from importlib import resources

    for name in ("distill_benchmark.ipynb", "sweep_report.ipynb"):
        packaged = resources.files("workbench").joinpath("notebooks", name)
        assert packaged.read_bytes() == (ROOT / "notebooks" / name).read_bytes()
    assert notebook.MAIN_NOTEBOOK.is_file()


def test_default_output_is_the_repository_results_folder_in_a_checkout(monkeypatch):
    """Jupyter runs the notebook from notebooks/: its results still go to <repo>/results (not
    notebooks/results)."""
    monkeypatch.chdir(ROOT / "notebooks")
    assert notebook.checkout_root() == ROOT
    assert notebook.default_out() == ROOT / "results"


def test_the_quality_report_shows_its_csv_tables_readable():
    """Every table the study report reads from a CSV is shown through notebook.readable (four significant digits,
    empty cells for NaN), not as pandas prints a raw frame."""
    nb = nbformat.read(ROOT / "notebooks" / "quality_report.ipynb", as_version=4)
    shown = [c.source for c in nb.cells if c.cell_type == "code" and "read_csv(" in c.source]
    assert len(shown) == 3 and all("readable(pd.read_csv(" in s for s in shown), shown


DYING_KERNEL = '''import os, sys
if "-f" in sys.argv:  # a kernel (python -m ipykernel_launcher -f CONNECTION_FILE), not another interpreter
    log = os.environ["KERNEL_STARTS_LOG"]
    with open(log, "a") as f:
        f.write("start\\n")
    if len(open(log).read().split()) <= int(os.environ["KERNEL_DEATHS"]):
        if os.environ.get("KERNEL_HANGS"):  # up, silent: as a kernel that lost its port race may stay
            import time
            time.sleep(600)
        os._exit(3)  # dies before replying to kernel_info, as a kernel that lost its port race does
'''


def dying_kernels(tmp_path, monkeypatch, deaths: int, cell: str) -> Path:
    """A one-cell notebook in tmp_path, and kernels of which the first `deaths` exit while starting; returns the
    file where each kernel start leaves a line."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(DYING_KERNEL)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    monkeypatch.setenv("KERNEL_STARTS_LOG", str(tmp_path / "starts.log"))
    monkeypatch.setenv("KERNEL_DEATHS", str(deaths))
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)]), tmp_path / "in.ipynb")
    notebook.kernel_uses_this_python()
    return tmp_path / "starts.log"


@pytest.mark.parametrize("deaths", [1, notebook.KERNEL_START_TRIES])
def test_a_kernel_that_dies_while_starting_is_started_again(tmp_path, monkeypatch, capfd, deaths):
    # Real kernels that really exit during start-up (a sitecustomize on the kernel's PYTHONPATH makes the first
    # `deaths` of them exit): the first death is retried, and a kernel that never starts is an error after the tries.
    log = dying_kernels(tmp_path, monkeypatch, deaths, "x = 6 * 7")
    if deaths < notebook.KERNEL_START_TRIES:
        notebook.papermill_execute(str(tmp_path / "in.ipynb"), str(tmp_path / "out.ipynb"))
        assert log.read_text().split() == ["start"] * (deaths + 1)
        assert "starting it again (2/3)" in capfd.readouterr().err
        assert nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[0].execution_count == 1
    else:
        with pytest.raises(RuntimeError, match="kernel_info"):
            notebook.papermill_execute(str(tmp_path / "in.ipynb"), str(tmp_path / "out.ipynb"))
        assert log.read_text().split() == ["start"] * notebook.KERNEL_START_TRIES


def test_a_kernel_that_hangs_while_starting_is_started_again(tmp_path, monkeypatch, capfd):
    # the other way a kernel loses the port race: it stays up without replying until jupyter_client's start
    # timeout (5 s here, 60 s by default); the next kernel runs the notebook
    log = dying_kernels(tmp_path, monkeypatch, 1, "x = 6 * 7")
    monkeypatch.setenv("KERNEL_HANGS", "1")
    notebook.papermill_execute(str(tmp_path / "in.ipynb"), str(tmp_path / "out.ipynb"), start_timeout=5)
    assert log.read_text().split() == ["start"] * 2
    assert "Kernel didn't respond in 5 seconds" in capfd.readouterr().err
    assert nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[0].execution_count == 1


def test_a_failing_cell_is_not_mistaken_for_a_kernel_that_failed_to_start(tmp_path, monkeypatch):
    log = dying_kernels(tmp_path, monkeypatch, 0, "raise RuntimeError('before replying to kernel_info')")
    with pytest.raises(pm.PapermillExecutionError):
        notebook.papermill_execute(str(tmp_path / "in.ipynb"), str(tmp_path / "out.ipynb"))
    assert log.read_text().split() == ["start"]  # one kernel: a cell's error is the notebook's, never retried
