"""workbench.sweep: grid parsing, point ids, and a real 4-point cpu-smoke sweep with a failing point,
a simulated kill, and a resume that runs only what is missing (then the report notebook)."""
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import yaml

from workbench import cli, results
from workbench.config import ConfigError
from workbench.sweep import analysis, cluster, index, plan, point, run

# Tiny points: a sweep point is a papermill kernel start plus a few milliseconds of training.
TINY = {"steps": 2, "iters": 2, "warmup": 0, "eval_batches": 1}
# The largest vocab config allows: its embedding (256 GiB at hidden 32) cannot be allocated, so it fails inside the
# notebook.
OOM_VOCAB = 2**31 - 1


def test_grid_args_multiply_and_link():
    grid = plan.parse_grid_args(["hidden=512,1024", "intermediate=2048,4096", "seq_len=128,1024"],
                                 ["hidden,intermediate"])
    assert grid == {"hidden+intermediate": [{"hidden": "512", "intermediate": "2048"},
                                            {"hidden": "1024", "intermediate": "4096"}],
                    "seq_len": ["128", "1024"]}
    assert list(grid) == ["hidden+intermediate", "seq_len"]  # axis order = loop order, sizes outermost
    points = plan.plan(plan.Spec("t", "cpu-smoke", {}, grid))
    assert len(points) == 4  # 2 linked sizes x 2 sequence lengths, not 2 x 2 x 2
    assert [(p.grid["hidden"], p.grid["intermediate"], p.grid["seq_len"]) for p in points] == [
        (512, 2048, 128), (512, 2048, 1024), (1024, 4096, 128), (1024, 4096, 1024)]
    list_axis = plan.parse_grid_args(['backends=[[torch_fp32, torch_bf16], [torch_fp32]]'], [])
    assert list_axis == {"backends": [["torch_fp32", "torch_bf16"], ["torch_fp32"]]}


def test_bad_grids_fail_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError, match="same number of values"):
        plan.parse_grid_args(["hidden=512,1024", "intermediate=2048"], ["hidden,intermediate"])
    with pytest.raises(ConfigError, match="unknown config field"):
        plan.parse_grid_args(["hiddn=512"], [])
    with pytest.raises(ConfigError, match="model.hidden"):  # config validation, per point, up front
        run.run_sweep(plan.Spec("bad", "cpu-smoke", {}, {"hidden": [64, 0]}), root=tmp_path)
    assert not (tmp_path / "bad").exists()


def test_point_id_is_a_hash_of_the_spec_not_of_the_whole_config(monkeypatch):
    a = plan.plan(plan.Spec("t", "cpu-smoke", {"steps": "3"}, {"hidden": ["64"]}))[0]
    b = plan.plan(plan.Spec("u", "cpu-smoke", {"steps": 3}, {"model.hidden": [64]}))[0]
    c = plan.plan(plan.Spec("t", "cpu-smoke", {"steps": 4}, {"hidden": [64]}))[0]
    assert a.id == b.id != c.id and len(a.id) == 10
    # two grid entries that resolve to one config are one point
    assert len(plan.plan(plan.Spec("t", "cpu-smoke", {}, {"hidden": [64, "64"]}))) == 1
    # what the spec does not name (a field the config gains later, a preset default) leaves every id as it was
    from workbench import config

    preset = config.PRESETS["cpu-smoke"]
    monkeypatch.setitem(config.PRESETS, "cpu-smoke", lambda: preset().replace(warmup=7, eval_batches=3))
    assert plan.plan(plan.Spec("t", "cpu-smoke", {"steps": "3"}, {"hidden": ["64"]}))[0].id == a.id


def hold_lock(sweep_dir):
    """A real second process that holds the sweep lock (a live driver) until killed."""
    hold = ("import sys, time; from pathlib import Path; from workbench.sweep import run\n"
            "with run.sweep_lock(Path(sys.argv[1])):\n    print('locked', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", hold, str(sweep_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_driver_of_the_same_sweep_is_refused(tmp_path):
    """A live driver (another process) holds the lock, a file lock on sweep.lock (not flock on the folder: that
    fails on NFS and does not exist on Windows): refused. Once that process is killed, the file it left behind
    locks nothing and the sweep can be restarted."""
    proc = hold_lock(tmp_path)
    try:
        assert (tmp_path / run.LOCK_FILE).is_file()
        with pytest.raises(ConfigError, match="being run by another process"):
            with run.sweep_lock(tmp_path):
                pass
    finally:
        proc.kill()
        proc.wait()
    with run.sweep_lock(tmp_path):  # the killed driver left no stale lock
        pass


@pytest.mark.parametrize("gpus, workers, nprocs, plan", [
    ([], "auto", [1, 1], ([None], 0)), ([], 2, [1], ([None, None], 0)),    # CPU: one worker unless asked
    ([], "auto", [2], ([None], 0)),                                         # no GPUs to give: nproc ranks share the CPU
    (["0", "1", "2", "3"], "auto", [1], (["0", "1", "2", "3"], 1)),        # one worker per GPU
    (["0", "1", "2", "3"], 2, [1, 1], (["0", "1"], 1)),
    (["5", "7"], "auto", [], (["5", "7"], 1)),                              # the ids this process was given
    (["0", "1", "2", "3"], "auto", [1, 2], (["0,1", "2,3"], 2)),           # a 2-GPU point: every worker gets 2
    (["0", "1", "2"], "auto", [2], (["0,1"], 2)),                           # a GPU left over idles
    (["0", "1"], "auto", [4, 1], (["0,1"], 2)),                             # capped: the 4-GPU point will fail
    (["0"], "3/gpu", [1], (["0", "0", "0"], 1)),                            # three points share the one GPU
    (["0", "1", "2", "3"], "2/gpu", [2], (["0,1", "0,1", "2,3", "2,3"], 2)),  # two per group of two
    ([], "3/gpu", [1], ([None], 0)),                                        # no GPU to share: one CPU worker
])
def test_cluster_plan(gpus, workers, nprocs, plan):
    assert cluster.cluster_plan(gpus, workers, nprocs) == cluster.ClusterPlan(*plan)


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5", "0/gpu", "/gpu", "2/cpu"])
def test_workers_must_be_auto_or_a_positive_number(tmp_path, capsys, bad):
    assert cli.main(["sweep", "--name", "w", "--grid", "hidden=16", "--out", str(tmp_path), f"--workers={bad}"]) == 2
    assert (f"--workers must be 'auto', a positive number or K/gpu (K workers sharing each GPU), got '{bad}'"
            in capsys.readouterr().err)
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("count, visible, ids", [(0, None, []), (2, None, ["0", "1"]), (2, "5,7,9", ["5", "7"])])
def test_visible_gpus(monkeypatch, count, visible, ids):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert cluster.visible_gpus() == ids


@pytest.mark.slow
def test_sweep_with_a_failing_point_then_resume_runs_only_what_is_missing(tmp_path, capsys):
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(yaml.safe_dump({
        "name": "tiny", "preset": "cpu-smoke", "set": TINY,
        "grid": {"case": [{"hidden": 32}, {"hidden": 48}, {"hidden": 64}, {"hidden": 32, "vocab": OOM_VOCAB}]},
    }))
    root = tmp_path / "sweeps"
    first = run.run_sweep(plan.Spec.from_dict(yaml.safe_load(spec_file.read_text())), root=root, progress=False,
                            workers=2)  # a local Dask cluster of two worker processes
    assert (first["points"], first["done"], first["failed"], first["skipped"]) == (4, 3, 1, 0)
    sweep_dir = root / "tiny"
    idx = index.read_index(sweep_dir).set_index("point")
    assert sorted(idx["status"]) == ["done", "done", "done", "failed"]
    assert idx["worker"].str.startswith("tcp://127.0.0.1:").all() and (idx["started_at"] <= idx["finished_at"]).all()
    failed = idx[idx["status"] == "failed"].iloc[0]
    assert failed["error_kind"] == "oom" and "allocate" in failed["error"] and failed["grid_vocab"] == OOM_VOCAB
    assert (sweep_dir / failed.name / "distill_benchmark.ipynb").exists()  # how far it got
    assert not (sweep_dir / failed.name / index.DONE_FILE).exists()

    # Simulate a kill in the middle of one point: its done marker never got written, partial files remain.
    done = sorted(idx[idx["status"] == "done"].index)
    killed, kept = done[0], done[1:]
    (sweep_dir / killed / index.DONE_FILE).unlink()
    (sweep_dir / killed / "partial.tmp").write_text("half a file")
    kept_marks = {p: (sweep_dir / p / index.DONE_FILE).stat().st_mtime_ns for p in kept}
    # ... and one killed after its done.json but before the index said so: complete, not rerun.
    table = index.read_index(sweep_dir)
    table.loc[table["point"] == kept[0], "status"] = "running"
    table.to_csv(sweep_dir / index.INDEX_FILE, index=False)

    # A bare restart by name resumes the stored spec; it reruns the failed and the killed point only.
    rc = cli.main(["sweep", "--name", "tiny", "--out", str(root), "--workers", "2"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 1  # the OOM point fails again, and says so
    assert (summary["skipped"], summary["done"], summary["failed"], summary["complete"]) == (2, 1, 1, 3)
    assert {p: (sweep_dir / p / index.DONE_FILE).stat().st_mtime_ns for p in kept} == kept_marks
    assert not (sweep_dir / killed / "partial.tmp").exists()  # rerun from an empty folder
    after = index.read_index(sweep_dir).set_index("point")
    assert len(after) == 4 and after.loc[kept[0], "status"] == "done"

    # Nothing duplicated: one row per student per complete point.
    df = analysis.load_sweep(sweep_dir)
    assert len(df) == 3 * 3 and not df.duplicated(["point", "student"]).any()
    assert sorted(df["cfg_hidden"].unique()) == [32, 48, 64] and (df["cfg_steps"] == 2).all()

    # The report ran at the end: HTML, CSVs and plots next to the sweep (the executed notebook, report.html's
    # source with this run's times in it, is not left there).
    out = sweep_dir / "report"
    for name in ("report.html", "sweep.csv", "crossover.csv", "failed_points.csv",
                 "speedup_vs_size.png", "step_time_vs_size.png"):
        assert (out / name).stat().st_size > 0, name
    # a CPU sweep measured no memory and ran no FP8 student: no empty frame for either (issue 33, ecosystem 5)
    assert not (out / "peak_memory_vs_size.png").exists() and not (out / "loss_band_vs_size.png").exists()
    assert not (out / "sweep_report.ipynb").exists()
    assert len(pd.read_csv(out / "sweep.csv")) == 9
    failed_csv = (out / "failed_points.csv").read_text()
    assert failed.name in failed_csv and "oom" in failed_csv
    html = (out / "report.html").read_text()
    assert "Crossover" in html and "<img" in html


def test_problems_of_a_finished_point_are_summarised(tmp_path):
    import pandas as pd

    from workbench import results

    rows = [{"student": "torch_bf16", "status": "ok", "reason": ""},
            {"student": "te_fp8:mxfp8", "status": "skipped", "reason": "needs CC 10.0"},
            {"student": "te_fp8:current", "status": "diverged", "reason": "loss nan at step 3"}]
    results.write_csv(tmp_path / "students.csv", pd.DataFrame(rows))
    text, kind = point.student_problems(tmp_path)
    assert kind == "diverged" and "te_fp8:current diverged: loss nan" in text and "mxfp8 skipped" in text
    rows[2] = {"student": "te_fp8:current", "status": "error", "reason": "OutOfMemoryError: CUDA out of memory."}
    results.write_csv(tmp_path / "students.csv", pd.DataFrame(rows))
    assert point.student_problems(tmp_path)[1] == "oom"
    results.write_csv(tmp_path / "students.csv", pd.DataFrame(rows[:2]))
    assert point.student_problems(tmp_path)[1] is None  # a skipped student is not an error


def test_a_slow_cluster_teardown_is_one_line_and_the_sweep_goes_on(tmp_path, capsys, monkeypatch):
    """Every point ended, then the embedded cluster (and its client) overrun distributed's close deadline: the
    sweep returns its counts (the report comes next) and says so in one line, not a TimeoutError."""
    distributed = pytest.importorskip("distributed")

    class SlowToClose:  # a LocalCluster / Client whose close raises distributed's TimeoutError
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            raise TimeoutError("close timed out after 10 s")

    def points_that_ran(client, points, *args, **kwargs):  # _execute's events without a real worker
        for p in points:
            yield "start", p.id, {"worker": "fake", "started_at": point.now()}
            yield "end", p.id, {"status": "done", "finished_at": point.now(), "wall_s": 0.0}

    monkeypatch.setattr(cluster, "visible_gpus", lambda: [])
    monkeypatch.setattr(cluster, "embedded_cluster", lambda cp: SlowToClose())
    monkeypatch.setattr(distributed, "Client", SlowToClose)
    monkeypatch.setattr(cluster, "_execute", points_that_ran)
    spec = plan.Spec("slow_close", "cpu-smoke", dict(TINY), {"hidden": ["16", "32"]})
    summary = run.run_sweep(spec, root=tmp_path, progress=False, cache=None)
    assert (summary["points"], summary["done"], summary["failed"]) == (2, 2, 0)
    err = capsys.readouterr().err
    assert err.count("slow to close") == 2 and "not an error" in err  # the cluster's line and the client's
    assert set(index.read_index(tmp_path / "slow_close")["status"]) == {"done"}
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C during the sweep stays Ctrl-C (exit 130), whatever the close does
        with cluster.slow_close_is_no_error(SlowToClose()):
            raise KeyboardInterrupt

@pytest.mark.slow
def test_gpu_workers_get_their_devices_and_a_point_wanting_more_fails_alone(tmp_path, monkeypatch):
    """The GPU path on a CPU (its devices are only environment values here): two visible GPUs and a point
    asking for 3 make one worker of two GPUs; the 3-GPU point fails up front, the other runs there and its
    kernel sees one of them."""
    monkeypatch.setattr(cluster, "visible_gpus", lambda: ["0", "1"])
    monkeypatch.setattr(plan, "point_nproc", lambda cfg: 3 if cfg.flat()["hidden"] == 48 else 1)
    spec = plan.Spec(
        "gpus", "cpu-smoke", {**TINY, "backends": "torch_fp32", "baseline": "torch_fp32"}, {"hidden": [32, 48]}
    )
    summary = run.run_sweep(spec, root=tmp_path, progress=False)
    assert (summary["done"], summary["failed"]) == (1, 1)
    idx = index.read_index(tmp_path / "gpus").set_index("grid_hidden")
    assert idx.loc[32, "status"] == "done" and idx.loc[32, "worker"].endswith(" GPU 0")
    assert (idx.loc[48, "status"], idx.loc[48, "error_kind"]) == ("failed", "resources")
    assert "asks for 3 GPUs (parallel.nproc) but the largest Dask worker has 2" in idx.loc[48, "error"]


@pytest.mark.slow
def test_points_go_to_a_running_cluster_at_scheduler_address(tmp_path, capsys):
    from distributed import LocalCluster

    args = ["sweep", "--name", "remote", "--preset", "cpu-smoke", "--grid", "hidden=32", "--out", str(tmp_path),
            "--no-report", "--set", "backends=torch_fp32", "--set", "baseline=torch_fp32"]
    args += [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, **cluster.NO_DASHBOARD_KW) as local:
        assert cli.main([*args, "--scheduler", local.scheduler_address]) == 0
        worker = next(iter(local.scheduler.workers))
        assert local.status.name == "running"  # the driver left the cluster it did not start running
    row = index.read_index(tmp_path / "remote").iloc[0]
    assert (row["status"], row["worker"]) == ("done", worker)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["done"] == 1


# ---- faults: the lock, a damaged index, interrupted and timed-out points -----------------------------
LONG = {"steps": 20000, "iters": 1, "warmup": 0, "eval_batches": 1, "seq_len": 8, "batch": 1,
        "backends": "torch_fp32", "baseline": "torch_fp32"}  # a point that runs far longer than these tests wait



def test_report_only_is_refused_beside_a_live_driver(tmp_path, capsys):
    (tmp_path / "live").mkdir()
    proc = hold_lock(tmp_path / "live")
    try:
        rc = cli.main(["sweep", "--name", "live", "--out", str(tmp_path), "--report-only"])
    finally:
        proc.kill()
        proc.wait()
    assert rc == 2 and "being run by another process" in capsys.readouterr().err
    assert not (tmp_path / "live" / "report").exists()


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
    """A sweep whose two points are complete (each a real tiny run) and whose index says so."""
    from workbench import config
    from workbench.run import runner
    root = tmp_path_factory.mktemp("sweeps")
    spec = plan.Spec("fin", "cpu-smoke", {**TINY, "backends": "torch_fp32,torch_bf16", "baseline": "torch_fp32"},
                      {"hidden": [32, 48]})
    for p in plan.plan(spec):
        runner.run(config.from_preset(spec.preset, **p.overrides), out=root / "fin", run_id=p.id, progress=False)
    assert run.run_sweep(spec, root=root, progress=False)["skipped"] == 2
    return spec, root


def damage_index(path, how):
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: data.rindex(b",")], "garbage": b"\x00\xff\xfe PK\x03\x04 not a csv\n",
                      "empty": b""}[how])


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty"])
def test_a_damaged_index_is_rebuilt_from_the_points_on_resume(finished_sweep, tmp_path, capsys, how):
    spec, root = finished_sweep
    root = shutil.copytree(root, tmp_path / "sweeps")
    damage_index(root / "fin" / index.INDEX_FILE, how)
    summary = run.run_sweep(spec, root=root, progress=False)
    assert (summary["skipped"], summary["done"], summary["complete"]) == (2, 0, 2)
    assert "rebuilt it from the points' done.json" in capsys.readouterr().err
    idx = index.read_index(root / "fin")
    assert sorted(idx["status"]) == ["done", "done"] and sorted(idx["grid_hidden"]) == [32, 48]


@pytest.mark.slow
def test_report_only_leaves_a_damaged_index_as_it_is(finished_sweep, tmp_path, capsys):
    _, root = finished_sweep
    root = shutil.copytree(root, tmp_path / "sweeps")
    damage_index(root / "fin" / index.INDEX_FILE, "garbage")
    damaged = (root / "fin" / index.INDEX_FILE).read_bytes()
    rc = cli.main(["sweep", "--name", "fin", "--out", str(root), "--report-only", "--reference", "torch_fp32"])
    assert rc == 0
    assert (root / "fin" / "report" / "report.html").stat().st_size > 0
    assert (root / "fin" / index.INDEX_FILE).read_bytes() == damaged  # read-only: the next sweep run rebuilds it


def test_a_dead_drivers_running_rows_become_interrupted(finished_sweep, tmp_path):
    spec, root = finished_sweep
    sweep_dir = shutil.copytree(root / "fin", tmp_path / "fin")
    points = plan.plan(spec)
    (sweep_dir / points[0].id / index.DONE_FILE).unlink()  # its driver was killed while it ran
    table = index.read_index(sweep_dir)
    table.loc[table["point"] == points[0].id, "status"] = "running"
    table.to_csv(sweep_dir / index.INDEX_FILE, index=False)
    with run.sweep_lock(sweep_dir):
        index.Index(sweep_dir, points)
    after = index.read_index(sweep_dir).set_index("point")["status"]
    assert (after[points[0].id], after[points[1].id]) == ("interrupted", "done")


@pytest.mark.slow
def test_sigterm_marks_the_running_point_interrupted_and_progress_names_its_grid_values(tmp_path):
    args = ["--name", "term", "--preset", "cpu-smoke", "--grid", "hidden=16", "--out", str(tmp_path), "--no-report"]
    args += [a for k, v in LONG.items() for a in ("--set", f"{k}={v}")]
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "sweep", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    index_csv = tmp_path / "term" / index.INDEX_FILE
    try:
        for _ in range(600):  # until the point is running (or the driver ended early: the asserts say why)
            if index_csv.exists() and "running" in index_csv.read_text() or proc.poll() is not None:
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    row = index.read_index(tmp_path / "term").iloc[0]
    assert row["status"] == "interrupted" and not (tmp_path / "term" / row["point"] / index.DONE_FILE).exists()
    assert f"point 1/1 hidden=16 [{row['point']}] started" in err


@pytest.mark.slow
def test_sigterm_as_timeout_sends_it_stops_with_one_line_and_the_same_command_resumes(tmp_path):
    """`timeout -s TERM` signals the driver, then its whole process group (the Dask workers too), and a person
    may press Ctrl-C again while the sweep stops. A handler that raised KeyboardInterrupt wherever the driver
    was could raise inside Queue.get while it re-took its lock: "RuntimeError: release unlocked lock" and a
    traceback instead of a stop. The signals keep coming here while the driver stops, so that such a spot is hit."""
    command = [sys.executable, "-m", "workbench", "sweep", "--name", "stop", "--preset", "cpu-smoke",
               "--grid", "hidden=16", "--out", str(tmp_path), "--no-report", "--cache", "none"]
    command += [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]
    index_csv = tmp_path / "stop" / index.INDEX_FILE
    with open(tmp_path / "err.txt", "w") as err_file:  # a file, not a pipe nobody reads while the signals go
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err_file,
                                start_new_session=True)  # its own process group, as under `timeout`
        try:
            while proc.poll() is None and not (index_csv.exists() and "running" in index_csv.read_text()):
                time.sleep(0.05)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)  # what `timeout` does: the driver, then its group
                os.killpg(proc.pid, signal.SIGTERM)
            for _ in range(3000):  # and again while it stops, a few seconds' worth
                if proc.poll() is not None:
                    break
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
                time.sleep(0.001)
            proc.wait(timeout=120)  # a driver hung by the signals fails here rather than hanging the tests
        finally:
            proc.kill()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # any worker left behind
    err = (tmp_path / "err.txt").read_text()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.count("workbench sweep: stopped by SIGTERM; run the same command (or --name stop) to resume") == 1, err
    row = index.read_index(tmp_path / "stop").iloc[0]
    assert row["status"] == "interrupted" and not (tmp_path / "stop" / row["point"] / index.DONE_FILE).exists()

    rerun = subprocess.run(command, capture_output=True, text=True, timeout=600)  # the same command resumes
    assert rerun.returncode == 0, rerun.stderr
    after = index.read_index(tmp_path / "stop").iloc[0]
    assert (after["point"], after["status"]) == (row["point"], "done")
    assert json.loads(rerun.stdout.strip().splitlines()[-1])["done"] == 1


@pytest.mark.slow
def test_a_cell_past_the_cell_timeout_fails_its_point_and_the_timeout_is_in_the_spec(tmp_path, capsys):
    args = ["sweep", "--name", "slow", "--preset", "cpu-smoke", "--grid", "hidden=16", "--out", str(tmp_path),
            "--no-report", "--cell-timeout", "1"]
    args += [a for k, v in LONG.items() for a in ("--set", f"{k}={v}")]
    assert cli.main(args) == 1
    assert results.read_json(tmp_path / "slow" / plan.SPEC_FILE)["cell_timeout"] == 1
    row = index.read_index(tmp_path / "slow").iloc[0]
    assert (row["status"], row["error_kind"]) == ("failed", "timeout")
    assert "point 1/1 hidden=16" in capsys.readouterr().err


# ---- damaged result files: named, left out of the report, rerun ------------------------------------
def damage(path, how):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * 0.6)] if how == "cut" else os.urandom(len(data)))


@pytest.mark.parametrize("how", ["cut", "random"])
def test_a_damaged_students_csv_is_named_and_never_half_a_row(finished_sweep, tmp_path, capsys, how):
    spec, root = finished_sweep
    sweep_dir = shutil.copytree(root / "fin", tmp_path / "fin")
    bad, good = plan.plan(spec)
    damage(sweep_dir / bad.id / "students.csv", how)
    assert [d.name for d in index.complete_points(sweep_dir)] == [good.id]
    df = analysis.load_sweep(sweep_dir, reference="torch_fp32")
    assert set(df["point"]) == {good.id} and len(df) == 2 and df["status"].notna().all()
    failed = analysis.failed_points(sweep_dir).set_index("point")
    assert failed.loc[bad.id, "status"] == "damaged"
    assert str(sweep_dir / bad.id / "students.csv") in failed.loc[bad.id, "error"]
    # the resume's index no longer calls it done: it is rerun (the index says why until then)
    with run.sweep_lock(sweep_dir):
        opened = index.Index(sweep_dir, [bad, good])
    assert opened.rows[bad.id]["status"] == "failed" and opened.rows[bad.id]["error_kind"] == "damaged"
    assert opened.rows[good.id]["status"] == "done"


def test_a_changed_losses_csv_is_named_too(finished_sweep, tmp_path):
    spec, root = finished_sweep
    sweep_dir = shutil.copytree(root / "fin", tmp_path / "fin")
    bad = plan.plan(spec)[0]
    losses = sweep_dir / bad.id / "losses.csv"
    losses.write_text(losses.read_text().replace(",", ";", 3))  # same size, other bytes: the hash tells
    assert "losses.csv is damaged" in index.damaged_points(sweep_dir)[sweep_dir / bad.id]


@pytest.mark.slow
def test_a_damaged_point_is_rerun_on_resume_and_report_only_names_the_file(finished_sweep, tmp_path, capsys):
    spec, root = finished_sweep
    root = shutil.copytree(root, tmp_path / "sweeps")
    bad = plan.plan(spec)[0]
    damage(root / "fin" / bad.id / "students.csv", "random")
    rc = cli.main(["sweep", "--name", "fin", "--out", str(root), "--report-only", "--reference", "torch_fp32"])
    err = capsys.readouterr().err
    assert rc == 1 and f"point {bad.id} left out of the report: {root / 'fin' / bad.id / 'students.csv'}" in err
    assert "PapermillExecutionError" not in err
    assert bad.id in (root / "fin" / "report" / "failed_points.csv").read_text()
    summary = run.run_sweep(spec, root=root, progress=False)
    assert (summary["skipped"], summary["done"], summary["complete"]) == (1, 1, 2)
    assert "running it again" in capsys.readouterr().err
    assert len(results.read_students(root / "fin" / bad.id)) == 2


# ---- a damaged sweep.json, the published sweep ------------------------------------------------------
@pytest.mark.parametrize("content", [b'{"name": "fin", "grid": ', b"\xff\xfe\x00garbage"])
def test_report_only_with_a_damaged_spec_is_one_line(finished_sweep, tmp_path, capsys, content):
    _, root = finished_sweep
    root = shutil.copytree(root, tmp_path / "sweeps")
    (root / "fin" / plan.SPEC_FILE).write_bytes(content)
    rc = cli.main(["sweep", "--name", "fin", "--out", str(root), "--report-only"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert str(root / "fin" / plan.SPEC_FILE) in err and "restore it" in err
    assert not (root / "fin" / "report").exists()


ROOT = results.Path(__file__).resolve().parents[2]
REFERENCE_SWEEP = ROOT / "results" / "reference" / "h200" / "sweeps" / "size_crossover"


def test_published_points_with_old_ids_are_found_and_skipped_on_resume(tmp_path):
    """The reference sweep's folders carry ids of the whole-config hash: found by their recorded overrides."""
    sweep_dir = shutil.copytree(REFERENCE_SWEEP, tmp_path / "size_crossover")
    found = index.complete_points(sweep_dir)
    assert len(found) == 10 and all(results.read_json(d / "config.json")["requested"]["steps"] == 10 for d in found)
    spec = plan.Spec.from_dict(results.read_json(sweep_dir / plan.SPEC_FILE))
    summary = run.run_sweep(spec, root=tmp_path, progress=False)  # every point complete: no cluster, no run
    assert (summary["points"], summary["skipped"], summary["complete"]) == (10, 10, 10)


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_report_only_rereports_the_published_sweep_unchanged(tmp_path):
    before = _files(REFERENCE_SWEEP)
    copy = shutil.copytree(REFERENCE_SWEEP, tmp_path / "size_crossover")
    rc = cli.main(["sweep", "--name", "size_crossover", "--out", str(tmp_path), "--report-only"])
    assert rc == 0
    after = _files(copy)
    # the same inputs, the same bytes: a second rewrite changes nothing, and no executed notebook is added
    assert cli.main(["sweep", "--name", "size_crossover", "--out", str(tmp_path), "--report-only"]) == 0
    assert _files(copy) == after
    assert not (copy / "report" / "sweep_report.ipynb").exists()
    outside = {k: v for k, v in after.items() if k.parts[0] != "report"}
    assert outside == {k: v for k, v in before.items() if k.parts[0] != "report"}  # index.csv included
    for name in ("sweep.csv", "crossover.csv", "loss_band.csv", "failed_points.csv"):
        assert after[results.Path("report", name)] == before[results.Path("report", name)], name
    assert _files(REFERENCE_SWEEP) == before
    status = subprocess.run(["git", "status", "--porcelain", str(REFERENCE_SWEEP)], capture_output=True, text=True,
                            cwd=REFERENCE_SWEEP)
    assert status.returncode != 0 or status.stdout == ""


@pytest.mark.slow
def test_a_finished_sweep_without_nbconvert_exits_0_and_names_the_pip_command(finished_sweep, tmp_path, capsys,
                                                                              monkeypatch):
    _, root = finished_sweep
    root = shutil.copytree(root, tmp_path / "sweeps")
    monkeypatch.setitem(sys.modules, "nbconvert", None)  # what `import nbconvert` finds where it is not installed
    assert cli.main(["sweep", "--name", "fin", "--out", str(root), "--reference", "torch_fp32"]) == 0
    err = capsys.readouterr().err
    assert "report.html not written" in err and "pip install 'nbconvert>=7.0'" in err and "-e" not in err
    assert (root / "fin" / "report" / "crossover.csv").exists() and not (
        root / "fin" / "report" / "report.html"
    ).exists()
    assert (root / "fin" / "report" / "sweep_report.ipynb").exists()  # no HTML page: the notebook is the report


# ---- --scheduler at something else, a scheduler without workers ----------------------------------
def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_server():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                cluster.socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"tcp://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def test_a_scheduler_address_that_is_an_http_server_is_one_line_not_a_hang(http_server, tmp_path):
    args = [sys.executable, "-m", "workbench", "sweep", "--name", "x", "--preset", "cpu-smoke", "--grid", "hidden=32",
            "--out", str(tmp_path), "--scheduler", http_server]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1, done.stderr
    assert f"--scheduler {http_server}: an HTTP server (SimpleHTTP" in err[0] and "not a Dask scheduler" in err[0]
    assert not (tmp_path / "x").exists()  # refused before the sweep folder was made


def test_a_scheduler_address_where_nothing_listens_is_one_line():
    with pytest.raises(cluster.SchedulerError, match="nothing answers there"):
        cluster.probe_scheduler(f"tcp://127.0.0.1:{_free_port()}")
    with pytest.raises(cluster.SchedulerError, match="expected tcp://HOST:PORT"):
        cluster.probe_scheduler("tcp://127.0.0.1")


def test_a_scheduler_without_workers_is_a_clear_line_after_the_wait(capsys):
    from distributed import LocalCluster

    with LocalCluster(n_workers=0, processes=False, **cluster.NO_DASHBOARD_KW) as local:
        cluster.probe_scheduler(local.scheduler_address)  # a real scheduler passes the probe
        with pytest.raises(cluster.SchedulerError, match="has no workers after 1 s.*--wait-workers"):
            with cluster.dask_client(local.scheduler_address, "auto", [1], wait_workers=1):
                pass
    assert "has no workers yet; waiting up to 1 s" in capsys.readouterr().err


def test_runs_of_a_sweep_share_the_cache_named_for_them(tmp_path, monkeypatch):
    import argparse

    p = argparse.ArgumentParser()
    run.add_arguments(p)
    assert p.parse_args([]).cache == str(run.DEFAULT_CACHE)  # the cache `workbench run` uses, not <sweep>/cache
    monkeypatch.delenv(results.CACHE_ENV, raising=False)
    assert results.cache_dir(tmp_path) == tmp_path / "cache"
    monkeypatch.setenv(results.CACHE_ENV, str(tmp_path / "shared"))
    assert results.cache_dir(tmp_path / "sweep") == tmp_path / "shared"


def test_workers_sharing_a_gpu_are_spelled_out_each_with_its_device(monkeypatch):
    """`--workers 2/gpu` on one GPU: the embedded cluster starts two workers (dask-cuda takes one worker per
    device, so they are spelled out, even where dask-cuda is installed: here a FAKE of it that refuses), each
    holding that GPU as its one GPU resource and CUDA_VISIBLE_DEVICES."""
    import types

    from distributed import Client

    def refuse(**kw):
        raise AssertionError("dask-cuda's LocalCUDACluster was asked for workers that share a GPU")

    monkeypatch.setitem(sys.modules, "dask_cuda", types.SimpleNamespace(LocalCUDACluster=refuse))
    monkeypatch.setattr(cluster.importlib.util, "find_spec", lambda name, *a: object() if name == "dask_cuda" else None)
    with cluster.embedded_cluster(cluster.cluster_plan(["0"], "2/gpu", [1])) as c, Client(c) as client:
        client.wait_for_workers(2, timeout=60)
        info = client.scheduler_info(n_workers=-1)["workers"].values()
        assert [w["resources"] for w in info] == [{"GPU": 1}, {"GPU": 1}]
        assert set(client.run(lambda: os.environ["CUDA_VISIBLE_DEVICES"]).values()) == {"0"}


def test_points_run_in_grid_order_on_one_worker(tmp_path, monkeypatch):
    """Dask runs GPU-restricted tasks submitted together in no set order: seen on an H100 sweep, hidden 512, 8192,
    4096, 2048 ran in that order and the budget cut 2048 and 1024. In grid order a cut sweep keeps a contiguous run
    of sizes, and its log reads in the order of its table."""
    from distributed import Client, LocalCluster

    def fake_run_on_worker(sweep_dir, preset, pid, *args, **kwargs):  # a named fake: no notebook, just done
        return {"status": "done", "finished_at": "now"}

    monkeypatch.setattr(cluster, "run_on_worker", fake_run_on_worker)
    points = [plan.Point(id=f"{h:06x}"[::-1], grid={"hidden": h}, overrides={}) for h in range(100, 1300, 100)]
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, resources={"GPU": 1},
                      **cluster.NO_DASHBOARD_KW) as local, Client(local) as client:
        events = list(cluster._execute(client, points, 1, tmp_path, "cpu-smoke", None))
    assert [pid for kind, pid, _ in events if kind == "end"] == [p.id for p in points]


def _index_with_a_done_point(sweep_dir, overrides, wall_s):
    row = {"point": "donepoint", "status": "done", "wall_s": wall_s, "overrides": json.dumps(overrides)}
    pd.DataFrame([row], columns=index.INDEX_COLUMNS).to_csv(sweep_dir / index.INDEX_FILE, index=False)


def test_a_points_expected_time_is_that_of_its_other_seeds(tmp_path):
    _index_with_a_done_point(tmp_path, {"backends": ["a", "b"], "seed": 1}, 120.0)
    assert index.expected_wall_s(tmp_path, {"backends": ["a", "b"], "seed": 2}) == 120.0
    assert index.expected_wall_s(tmp_path, {"backends": ["a"], "seed": 2}) is None  # another shape
    assert index.expected_wall_s(tmp_path / "nothing-here", {"seed": 2}) is None
    now = time.time()
    assert index.budget_skip(tmp_path, {"backends": ["a", "b"], "seed": 2}, None) is None  # no budget
    assert index.budget_skip(tmp_path, {"backends": ["a", "b"], "seed": 2}, now + 600) is None  # fits
    skip = index.budget_skip(tmp_path, {"backends": ["a", "b"], "seed": 2}, now + 60)
    assert skip["status"] == "interrupted" and skip["error_kind"] == "budget" and "took 120 s" in skip["error"]
    assert index.budget_skip(tmp_path, {"backends": ["a"], "seed": 2}, now + 60) is None  # unknown: it starts
    assert index.budget_skip(tmp_path, {"backends": ["a"], "seed": 2}, now - 1)["error_kind"] == "budget"


def test_a_sweep_starts_no_point_that_would_outlast_its_budget(tmp_path, monkeypatch):
    """On a one-worker cluster, the real run_on_worker: the point whose other seed took 120 s is not started with
    60 s left, the one of unknown length is (its run is a named fake); both end at once past the deadline."""
    from distributed import Client, LocalCluster

    ran = []

    def fake_run_point(sweep_dir, preset, pid, *args, **kwargs):  # a named fake: no notebook, just done
        ran.append(pid)
        return {"status": "done", "finished_at": "now"}

    monkeypatch.setattr(point, "run_point", fake_run_point)
    _index_with_a_done_point(tmp_path, {"backends": ["a", "b"], "seed": 1}, 120.0)
    points = [plan.Point(id="longpoint", grid={"seed": 2}, overrides={"backends": ["a", "b"], "seed": 2}),
              plan.Point(id="newshape", grid={"seed": 2}, overrides={"backends": ["a"], "seed": 2})]
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, **cluster.NO_DASHBOARD_KW) as local, \
            Client(local) as client:
        ends = {pid: f for kind, pid, f in cluster._execute(client, points, 0, tmp_path, "cpu-smoke", None,
                                                            deadline=time.time() + 60) if kind == "end"}
        assert ends["longpoint"]["error_kind"] == "budget" and ends["newshape"]["status"] == "done"
        assert ran == ["newshape"]
        ends = [f for kind, _, f in cluster._execute(client, points, 0, tmp_path, "cpu-smoke", None,
                                                     deadline=time.time() - 1) if kind == "end"]
        assert [f["error_kind"] for f in ends] == ["budget", "budget"] and ran == ["newshape"]


def test_a_budget_that_is_not_positive_is_refused_by_name():
    with pytest.raises(ConfigError, match="--budget-s"):
        run.budget_deadline(0)
    assert run.budget_deadline(None) is None and run.budget_deadline(10) > time.time()


_FIND_SPEC = importlib.util.find_spec


def _without(monkeypatch, *modules):
    """This Python as a GPU image without the notebook stack sees it (a checkout on PYTHONPATH); a second call
    replaces the first."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in modules else _FIND_SPEC(name, *a))


def test_a_sweep_without_the_notebook_stack_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    """Found on a GPU image: nbclient missing made every point fail and then the failure's description raise."""
    from workbench import notebook

    _without(monkeypatch, "nbclient")
    with pytest.raises(notebook.MissingStack, match=r"nbclient not installed for .*papermill, nbclient, ipykernel"):
        run.run_sweep(plan.Spec("nostack", "cpu-smoke", {}, {"hidden": [64]}), root=tmp_path)
    assert not (tmp_path / "nostack").exists()
    _without(monkeypatch, "ipykernel")
    rc = cli.main(["study", "--preset", "distill-quality-cpu", "--seeds", "7,8", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and notebook.NO_KERNEL in err and len(err.strip().splitlines()) == 1, err
    assert not any(tmp_path.iterdir())  # no study folder, no teacher trained


def test_a_failure_is_described_without_the_notebook_stack(monkeypatch):
    monkeypatch.setitem(sys.modules, "nbclient.exceptions", None)  # import raises ImportError
    assert point.describe_failure(MemoryError("CUDA out of memory")) == ("oom", "MemoryError: CUDA out of memory")
    assert point.describe_failure(ValueError("x"))[0] == "error"
