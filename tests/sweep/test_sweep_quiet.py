"""A sweep ends on one line naming its report, and quietly (issue 33, ecosystem 7): no "Port 8787 is already
in use" from a dashboard that is off, no distributed teardown warnings, no report-kernel log lines."""
import io
import logging
import shutil
import socket
import warnings

import pytest

from workbench import cli
from workbench.sweep import cluster, index, plan, run
from workbench.sweep import report as sweep_report

TINY = {"steps": 2, "iters": 2, "warmup": 0, "eval_batches": 1}


def test_the_done_line_names_the_report_page(tmp_path):
    (tmp_path / "report").mkdir()
    assert "no report written" in run.done_line(tmp_path, None)
    assert run.done_line(tmp_path, tmp_path / "report").startswith("Done: the sweep's report (CSVs, plots, ")
    (tmp_path / "report" / "report.html").write_text("<html></html>")
    line = run.done_line(tmp_path, tmp_path / "report")
    assert line.startswith(f"Done: open {tmp_path / 'report' / 'report.html'} (the sweep's report)")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A sweep whose one point is complete (a real tiny run) and whose index says so."""
    from workbench import config
    from workbench.run import runner

    root = tmp_path_factory.mktemp("sweeps")
    spec = plan.Spec("fin", "cpu-smoke", {**TINY, "backends": "torch_fp32,torch_bf16", "baseline": "torch_fp32"},
                     {"hidden": [32]})
    for p in plan.plan(spec):
        runner.run(config.from_preset(spec.preset, **p.overrides), out=root / "fin", run_id=p.id, progress=False)
    assert run.run_sweep(spec, root=root, progress=False)["skipped"] == 1
    return root


def test_a_sweep_ends_on_the_line_naming_its_report(finished, tmp_path, capsys, monkeypatch):
    root = shutil.copytree(finished, tmp_path / "sweeps")

    def fake_report(sweep_dir, reference="torch_bf16", out_dir=None, progress=False):
        out = sweep_report.default_out(sweep_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.html").write_text("<html></html>")
        return out

    monkeypatch.setattr(sweep_report, "run", fake_report)
    assert cli.main(["sweep", "--name", "fin", "--out", str(root)]) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"Done: open {root / 'fin' / 'report' / 'report.html'}")


@pytest.mark.slow
def test_report_only_is_quiet_and_names_its_report(finished, tmp_path, capfd):
    """The report kernel's log (its TCP warning, the KeyboardInterrupt of jupyter_client's shutdown) stays out
    of the terminal: capfd sees the kernel process's own stderr."""
    root = shutil.copytree(finished, tmp_path / "sweeps")
    assert cli.main(["sweep", "--name", "fin", "--out", str(root), "--report-only", "--reference", "torch_fp32"]) == 0
    err = capfd.readouterr().err
    assert "Kernel is running over TCP" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines()[-1].startswith(f"Done: open {root / 'fin' / 'report' / 'report.html'}")
    assert (root / "fin" / index.INDEX_FILE).exists()


def _hold_8787():
    """Something on the dashboard's default port, as a second sweep or a notebook's cluster would be."""
    s = socket.socket()
    try:
        s.bind(("", 8787))
        s.listen()
    except OSError:  # already taken: just as good
        s.close()
        return None
    return s


@pytest.mark.parametrize("plan_", [cluster.ClusterPlan([None], 0), cluster.ClusterPlan(["0,1"], 2)],
                         ids=["LocalCluster", "SpecCluster"])
def test_the_embedded_cluster_takes_no_fixed_port_and_has_no_dashboard(plan_):
    held = _hold_8787()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            c = cluster.embedded_cluster(plan_)
        try:
            assert not [w for w in caught if "already in use" in str(w.message)], [str(w.message) for w in caught]
            assert c.scheduler.http_server.port != 8787
            assert "dashboard" not in c.scheduler.services or c.scheduler.services["dashboard"].port != 8787
            assert not c.dashboard_link or ":8787" not in c.dashboard_link
        finally:
            c.close()
    finally:
        if held:
            held.close()


def test_the_clusters_close_is_quiet_but_its_errors_show():
    """distributed's WARNINGs while the cluster tears down ('Worker process still alive … killing') are not
    shown; its errors are, and the handlers' levels are back afterwards."""
    import distributed  # noqa: F401 - configures the 'distributed' logger and its handler

    log = logging.getLogger("distributed.nanny")
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setLevel(logging.WARNING)
    root = logging.getLogger("distributed")
    root.addHandler(handler)

    class Noisy:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            log.warning("Worker process still alive after 4.0 seconds, killing")
            log.error("a real error")

    try:
        with cluster.slow_close_is_no_error(Noisy()):
            log.warning("while the points run: shown")
        log.warning("after the close: shown again")
    finally:
        root.removeHandler(handler)
    text = buf.getvalue()
    assert "still alive" not in text and "a real error" in text
    assert "while the points run: shown" in text and "after the close: shown again" in text
    assert handler.level == logging.WARNING
