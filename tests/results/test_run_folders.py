"""Run folders: names that stay below --out, output roots that cannot be written, exclusive creation,
the done.json completion marker, and damaged result files named instead of read."""
import os
import shutil

import pytest

from workbench import cli, config, notebook, results
from workbench.bench.run import BenchOptions, run_bench
from workbench.run import runner
from workbench.sweep import plan

TINY = {"steps": 2, "iters": 1, "warmup": 0, "eval_batches": 1, "backends": "torch_fp32", "baseline": "torch_fp32"}
BAD_NAMES = ["../x", "../../x", "/tmp/abs", ".", "..", "grp/r1", "", "-x", "a" * 129, "sp ace"]


def tiny_run(out, run_id=None):
    return runner.run(config.from_preset("cpu-smoke", **TINY), out=out, run_id=run_id, progress=False)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_names_are_one_folder_name(name):
    with pytest.raises(results.OutputError, match="is not allowed"):
        results.check_name(name, "run id")


@pytest.mark.parametrize("cmd", [
    ["run", "--preset", "cpu-smoke", "--run-id"],
    ["notebook", "--preset", "cpu-smoke", "--run-id"],
    ["bench", "--preset", "cpu-smoke", "--run-id"],
    ["sweep", "--preset", "cpu-smoke", "--grid", "hidden=32", "--name"],
    ["sweep", "--report-only", "--name"],
])
@pytest.mark.parametrize("name", ["../x", "/tmp/abs-escape", ".", "grp/r1"])
def test_every_command_refuses_names_that_leave_out(tmp_path, capsys, cmd, name):
    out = tmp_path / "out"
    rc = cli.main([*cmd, name, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "is not allowed" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists() and not os.path.exists("/tmp/abs-escape")
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("cmd", [
    ["run", "--preset", "cpu-smoke"], ["notebook", "--preset", "cpu-smoke"], ["bench", "--preset", "cpu-smoke"],
    ["sweep", "--preset", "cpu-smoke", "--grid", "hidden=32", "--name", "s"],
])
def test_an_output_root_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, capsys, cmd):
    a_file = tmp_path / "file"
    a_file.write_text("not a folder")
    for out in ("/proc/forbidden", str(a_file / "below")):
        rc = cli.main([*cmd, "--out", out])
        err = capsys.readouterr().err
        assert rc == 2 and f"output folder {out}:" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("cmd", [
    ["run", "--preset", "cpu-smoke"], ["bench", "--preset", "cpu-smoke"],
    ["sweep", "--preset", "cpu-smoke", "--grid", "hidden=32", "--name", "s"],
])
def test_a_symlink_loop_as_output_root_is_one_line_naming_it(tmp_path, capsys, cmd):
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop")  # resolving it never ends: Python says "Symlink loop" or ELOOP
    for out in (loop, loop / "below"):
        rc = cli.main([*cmd, "--out", str(out)])
        err = capsys.readouterr().err
        assert rc == 2 and f"output folder {out}:" in err and len(err.strip().splitlines()) == 1, err


def test_an_explicit_run_id_that_exists_is_refused_and_the_first_run_is_kept(tmp_path, capsys):
    first = tiny_run(tmp_path, "same")
    before = {p.name: p.read_bytes() for p in first.iterdir()}
    with pytest.raises(results.OutputError, match="exists already"):
        tiny_run(tmp_path, "same")
    assert cli.main(["run", "--preset", "cpu-smoke", "--run-id", "same", "--out", str(tmp_path)]) == 2
    assert "exists already" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in first.iterdir()} == before
    assert list(tmp_path.iterdir()) == [first]


def test_automatic_ids_of_one_second_get_distinct_folders(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "new_run_id", lambda cfg: "20260101-120000-cpu-smoke")  # both start in one second
    a, b = tiny_run(tmp_path), tiny_run(tmp_path)
    assert a != b and (a.name, b.name) == ("20260101-120000-cpu-smoke", "20260101-120000-cpu-smoke-2")
    assert results.read_json(b / "config.json")["run_id"] == b.name
    assert set(results.load(tmp_path)["run_id"]) == {a.name, b.name}


def test_the_driver_hands_its_folder_to_the_kernel_once(tmp_path, monkeypatch):
    """`workbench notebook` creates the folder; the kernel's run may take that folder, and only that one."""
    handed = results.create_run_dir(tmp_path, "nb", "unused")
    monkeypatch.setenv(results.HANDOVER_ENV, str(handed))
    (tmp_path / "other").mkdir()
    with pytest.raises(results.OutputError, match="exists already"):  # any other folder: exclusive as always
        results.create_run_dir(tmp_path, "other", "unused")
    assert results.create_run_dir(tmp_path, "nb", "unused") == handed  # the kernel's run
    with pytest.raises(results.OutputError, match="exists already"):  # a second run in that kernel
        results.create_run_dir(tmp_path, "nb", "unused")


def test_notebook_refuses_an_existing_run_id_before_a_kernel_starts(tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(results.OutputError, match="exists already"):
        notebook.execute("cpu-smoke", {}, out=tmp_path, run_id="taken")
    assert list(tmp_path.iterdir()) == [tmp_path / "taken"] and not any((tmp_path / "taken").iterdir())


def test_a_run_interrupted_before_its_marker_is_skipped_by_the_loaders(tmp_path, monkeypatch):
    from workbench.results import plots

    complete = tiny_run(tmp_path, "complete")
    assert results.read_json(complete / results.DONE_FILE)["run_id"] == "complete"

    def ctrl_c(run_dir):  # Ctrl-C after summary.json, while the plots are drawn
        raise KeyboardInterrupt

    monkeypatch.setattr(plots, "plot_run", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        tiny_run(tmp_path, "cut")
    cut = tmp_path / "cut"
    assert (cut / "summary.json").exists() and not (cut / results.DONE_FILE).exists()
    assert results.run_dirs(tmp_path) == [complete]
    assert set(results.load(tmp_path)["run_id"]) == {"complete"}
    flagged = results.load(tmp_path, include_incomplete=True).set_index("run_id")["complete"]
    assert flagged["complete"].all() and not flagged["cut"].any()
    with pytest.raises(FileNotFoundError, match="incomplete"):
        results.load(cut)


@pytest.mark.parametrize("damage", ["half", "last_row", "empty"])
def test_a_damaged_students_csv_is_named(smoke_run, tmp_path, damage):
    _, run_dir = smoke_run
    copy = shutil.copytree(run_dir, tmp_path / "run")
    path = copy / "students.csv"
    data = path.read_bytes()
    path.write_bytes({"half": data[: len(data) // 2], "last_row": data[:-40], "empty": b""}[damage])
    with pytest.raises(results.DamagedResults, match=f"{path} is damaged"):
        results.load(copy)
    (copy / results.DONE_FILE).unlink()  # not finished: no recorded size, the file's own shape still tells
    with pytest.raises(results.DamagedResults, match=f"{path} is damaged"):
        results.load(copy, include_incomplete=True)


def test_bench_ids_are_created_exclusively(tmp_path):
    (tmp_path / "b").mkdir()
    with pytest.raises(results.OutputError, match="exists already"):
        run_bench(BenchOptions(preset="cpu-smoke", variants=["smoke"]), out=tmp_path, run_id="b")


def test_sweep_names_from_spec_files_are_checked_too():
    with pytest.raises(results.OutputError, match="sweep name '../x'"):
        plan.Spec.from_dict({"name": "../x", "preset": "cpu-smoke", "grid": {"hidden": [32]}})


def test_loading_wide_runs_with_their_completeness_does_not_warn(tmp_path):
    """A GPU point's students.csv has ~150 columns: read_csv keeps them in one block each, and adding the
    `complete` column to that warned of a fragmented frame on every load (the study driver's logs filled)."""
    import tarfile
    import warnings

    import pandas as pd

    with tarfile.open("results/reference/h100/quality/528e816/real-finetune.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.PerformanceWarning)
        df = results.load(tmp_path, include_incomplete=True)
    assert len(df.columns) > 100 and df["complete"].all()


def test_identifiers_read_back_as_the_text_written(tmp_path):
    # a short git sha of digits and one 'e' is a float to pandas (528e816 -> inf), one of digits an int
    path = tmp_path / "students.csv"
    path.write_text("run_id,student,git_sha,point,step_ms_median\n1234567890,torch_bf16,528e816,0012,1.5\n"
                    "4e81050ac1,te_bf16,1234567,3e10,2.5\n")
    df = results.read_csv(path)
    assert df["git_sha"].tolist() == ["528e816", "1234567"]
    assert df["run_id"].tolist() == ["1234567890", "4e81050ac1"]
    assert df["point"].tolist() == ["0012", "3e10"]
    assert df["step_ms_median"].tolist() == [1.5, 2.5]
