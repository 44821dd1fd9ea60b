"""The sweep's driver: plan the points, hold the sweep lock, resume (skip the complete points, rerun the
others), run the rest on the cluster while keeping index.csv current, then write the report; and the
`workbench sweep` command line (workbench.sweep's docstring has the whole story)."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from workbench import config, notebook, results
from workbench.config import ConfigError
from workbench.sweep.cluster import STOP, SchedulerError, check_workers, point_events, probe_scheduler
from workbench.sweep.index import Index, cell, damaged_points, point_folders
from workbench.sweep.plan import (
    DEFAULT_ROOT,
    SPEC_FILE,
    Point,
    Spec,
    load_spec_file,
    parse_grid_args,
    plan,
    stored_spec,
)
from workbench.sweep.point import now

LOCK_FILE = "sweep.lock"
DEFAULT_CACHE = Path("results") / "cache"  # the cache `workbench run` uses with its default --out


# ---- the sweep -------------------------------------------------------------------------------------
def sweep_folder(root: str | Path, name: str) -> Path:
    """<root>/<name>: a sweep name is one folder name (results.check_name), never a path."""
    return Path(root) / results.check_name(str(name), "sweep name")


_LOCKS: dict[str, Any] = {}


@contextlib.contextmanager
def sweep_lock(sweep_dir: Path) -> Iterator[None]:
    """Two processes driving one sweep folder would run points twice; the second one is refused.

    The lock is an OS lock (filelock) on <sweep>/sweep.lock, held while the driver runs: it goes with a
    killed driver's process, so the file a dead driver leaves behind locks nothing. Deleting that file
    while a driver runs lets a second one in: it is not a leftover to clean up. The process that holds it
    may take it again (`workbench study` around its sweep)."""
    from filelock import FileLock, Timeout

    # one FileLock per sweep folder and process, re-entrant: a study takes its sweep's lock before it writes
    # its own files, then runs the sweep, which takes it again (a second FileLock would refuse its own process)
    path = str((Path(sweep_dir) / LOCK_FILE).resolve())
    lock = _LOCKS.setdefault(path, FileLock(path, timeout=0))
    try:
        lock.acquire()
    except Timeout:
        raise results.OutputError(f"sweep folder {sweep_dir} is being run by another process; wait for "
                                  f"it to finish (or stop it), then run this again") from None
    try:
        yield
    finally:
        lock.release()


def check_no_driver(sweep_dir: Path) -> None:
    """OutputError while a driver holds the sweep lock; writes nothing (no lock file where none is)."""
    if (sweep_dir / LOCK_FILE).exists():
        with sweep_lock(sweep_dir):
            pass


def budget_deadline(budget_s: float | None) -> float | None:
    """--budget-s as a deadline (time.time()), from now; ConfigError for a budget that is not positive."""
    if budget_s is None:
        return None
    if not budget_s > 0:
        raise ConfigError(f"--budget-s: {budget_s} is not a positive number of seconds")
    return time.time() + budget_s


def describe_point(p: Point, n: int, total: int) -> str:
    """'point 3/10 hidden=2048 seq_len=1024 [a1b2c3d4e5]': what a progress line says is running."""
    return " ".join([f"point {n}/{total}", *(f"{k}={cell(v)}" for k, v in p.grid.items()), f"[{p.id}]"])


def run_sweep(spec: Spec, root: str | Path = DEFAULT_ROOT, workers: str | int = "auto",
              progress: bool = True, scheduler: str | None = None, cache: str | Path | None = DEFAULT_CACHE,
              wait_workers: float = 120, deadline: float | None = None) -> dict[str, Any]:
    """Run every incomplete point of `spec` into <root>/<name>/; return counts and the folder. The points
    run on a Dask cluster: the one at `scheduler`, else one started here (`workers`: cluster_plan).
    `cache`: the text, tokenizer and teacher caches every point shares (None: each run's <out>/cache,
    here <sweep>/cache); a complete point whose result files were damaged since is rerun. `deadline`
    (time.time(), budget_deadline): a point that would not end by then is not started (point.budget_skip)."""
    from tqdm.auto import tqdm

    points = plan(spec)  # validates every point before any kernel starts
    check_workers(workers)
    if scheduler:
        probe_scheduler(scheduler)  # before the sweep folder exists: a wrong address leaves nothing behind
    else:  # the local cluster's workers are this Python: without the notebook stack every point would fail
        notebook.require_stack()
    sweep_dir = sweep_folder(results.output_root(root), spec.name)
    sweep_dir.mkdir(exist_ok=True)
    cache = str(Path(cache).expanduser().resolve()) if cache else None
    with sweep_lock(sweep_dir):
        results.write_json(sweep_dir / SPEC_FILE, spec.to_dict())
        folders = point_folders(sweep_dir, {p.id for p in points})
        index = Index(sweep_dir, points, folders)
        for pid, why in index.damaged.items():
            print(f"workbench sweep: point {pid}: {why}; running it again", file=sys.stderr)
        todo = [p for p in points if not results.is_complete(folders[p.id]) or p.id in index.damaged]
        counts = {"points": len(points), "skipped": len(points) - len(todo), "done": 0, "failed": 0, "interrupted": 0}
        bar = tqdm(total=len(points), initial=counts["skipped"], desc=f"sweep {spec.name}", unit="point",
                   disable=not progress, file=sys.stderr)
        events = point_events(scheduler, workers, todo, sweep_dir, spec.preset, spec.cell_timeout, cache, wait_workers,
                              deadline)
        _follow(events, points, index, counts, bar, spec.name, progress)
    folders = point_folders(sweep_dir, {p.id for p in points})
    counts["complete"] = sum(results.is_complete(d) and results.check_complete(d) is None for d in folders.values())
    return {"sweep_dir": str(sweep_dir), **counts}


def _follow(events: Iterator[tuple[str, str, dict[str, Any]]], points: list[Point], index: Index,
            counts: dict[str, int], bar, name: str, progress: bool) -> None:
    """Keep the index, the counts and the progress bar in step with the points' events; on the way out
    (done, Ctrl-C, SIGTERM, an error, a cluster gone away) the points still running become `interrupted`."""
    by_id = {p.id: p for p in points}
    position = {p.id: n for n, p in enumerate(points, 1)}
    running: set[str] = set()
    try:
        for kind, pid, fields in events:
            line = describe_point(by_id[pid], position[pid], len(points))
            if kind == "start":
                running.add(pid)
                index.update(by_id[pid], status="running", finished_at=None, error_kind=None, error=None,
                             problems=None, wall_s=None, **fields)
                bar.set_postfix_str(line)
                if progress:
                    bar.write(f"sweep {name}: {line} started on {fields['worker']}", file=sys.stderr)
                continue
            running.discard(pid)
            index.update(by_id[pid], **fields)
            counts[fields["status"]] += 1
            if fields["status"] == "failed":
                bar.write(f"sweep {name}: {line} failed ({fields['error_kind']}): {fields['error'][:300]}",
                          file=sys.stderr)
            bar.update(1)
    finally:
        try:
            events.close()  # now, not when garbage-collected: the cluster stops before the index says so
        finally:
            bar.close()
            for pid in running:
                index.update(by_id[pid], status="interrupted", error_kind="interrupted", finished_at=now(),
                             error="the sweep driver stopped while this point ran; a restart reruns it")


def report_only(sweep_dir: Path, reference: str) -> Path:
    """(Re)write the report of a sweep no driver is running. Read-only but for <sweep>/report/: the
    index, the spec and the points stay as they are (a published sweep's tracked files included)."""
    from workbench.sweep import report

    check_no_driver(sweep_dir)  # a live driver's half-written points are not a report
    stored_spec(sweep_dir)  # a damaged sweep.json: one line naming it, before any kernel starts
    for d, why in damaged_points(sweep_dir).items():
        print(f"workbench sweep: point {d.name} left out of the report: {why}; run the sweep again "
              f"(workbench sweep --name {sweep_dir.name}) to rerun it", file=sys.stderr)
    return report.run(sweep_dir, reference=reference)


# ---- CLI -------------------------------------------------------------------------------------------
def add_arguments(p) -> None:
    p.add_argument("spec", nargs="?", help="sweep spec file (YAML or JSON: name, preset, set, grid)")
    p.add_argument("--name", help="sweep name, the folder <out>/<name>; alone: resume that sweep")
    p.add_argument("--preset", default=None, help="preset every point starts from (default: the spec's, or auto)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="fixed override for every point, e.g. --set steps=10")
    p.add_argument("--grid", action="append", default=[], metavar="FIELD=V1,V2",
                   help="an axis of the grid, e.g. --grid hidden=512,1024 (list values: --grid 'backends=[[a,b],[a]]')")
    p.add_argument("--link", action="append", default=[], metavar="F1,F2",
                   help="zip these --grid axes (equal lengths) instead of multiplying, e.g. --link hidden,intermediate")
    p.add_argument("--out", default=str(DEFAULT_ROOT), help="parent folder of the sweep folder")
    p.add_argument("--cell-timeout", type=int, default=None, metavar="SECONDS",
                   help="a point fails ('timeout') when one notebook cell runs longer (kept in sweep.json)")
    p.add_argument("--workers", default="auto",
                   help="workers of the embedded Dask cluster: 'auto' (one per visible GPU, or per group of k GPUs "
                        "when a point needs k; one on a CPU), a number, or K/gpu (K workers sharing each GPU: their "
                        "step times time each other)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run the points on a running Dask cluster (e.g. tcp://host:8786) instead of one started "
                        "here; the sweep folder must be at the same path on its workers")
    p.add_argument("--wait-workers", type=float, default=120, metavar="SECONDS",
                   help="with --scheduler: how long to wait for its first worker before giving up (default 120)")
    p.add_argument("--cache", default=str(DEFAULT_CACHE), metavar="DIR",
                   help="folder of the text, tokenizer and teacher caches, shared by every point and sweep "
                        "(default results/cache, as `workbench run`); 'none': each sweep's own <sweep>/cache")
    p.add_argument("--budget-s", type=float, default=None, metavar="SECONDS",
                   help="start no point that would not end within this many seconds from now, by the wall time "
                        "of the done points that differ from it in their seed alone (one of unknown length "
                        "starts); those not started are 'interrupted' (budget) and run on the next start")
    p.add_argument("--reference", default="torch_bf16", help="student the report compares with")
    p.add_argument("--no-report", action="store_true", help="skip the report notebook at the end")
    p.add_argument("--report-only", action="store_true", help="only (re)write the report of an existing sweep")


def spec_from_args(args) -> Spec:
    d: dict[str, Any] = load_spec_file(args.spec) if args.spec else {}
    name = args.name or d.get("name")
    stored = sweep_folder(args.out, name) / SPEC_FILE if name else None
    if not args.spec and not args.grid and stored is not None and stored.exists():
        d = load_spec_file(stored)  # a bare restart: resume the stored sweep (plus any new --set)
    elif not args.spec and not args.grid:
        raise ConfigError("give a spec file or --grid axes (or --name of an existing sweep to resume it)")
    if args.preset:
        d["preset"] = args.preset
    if args.cell_timeout is not None:
        d["cell_timeout"] = args.cell_timeout
    d["set"] = {**(d.get("set") or {}), **config.parse_set(args.overrides)}
    d["grid"] = {**(d.get("grid") or {}), **parse_grid_args(args.grid, args.link)}
    return Spec.from_dict(d, name=name)


NO_DASK = "sweeps run on Dask, which is not installed here: pip install 'te-workbench[sweep]'"


def stop_on_signals() -> None:
    """SIGTERM (`timeout`, a scheduler, `kill`) and Ctrl-C stop the sweep: the running points become
    `interrupted`, the cluster closes, the lock goes, and the same command resumes. The handler raises
    nothing while the points run (cluster.Stop says why); the driver stops at its next check."""
    STOP.signum = None
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, STOP.handle)


def stopped_line(command: str, name: str) -> str:
    """The line a stopped driver ends with: what stopped it and how to go on."""
    how = signal.Signals(STOP.signum).name if STOP.signum else "an interrupt"
    return f"workbench {command}: stopped by {how}; run the same command (or --name {name}) to resume"


def _report_only_main(args) -> int:
    """`--report-only`: rewrite the report of the sweep folder <out>/<name>; 1 when points were left out."""
    if not args.name:
        raise ConfigError("--report-only needs --name (the sweep folder <out>/<name>)")
    sweep_dir = sweep_folder(args.out, args.name)
    if not sweep_dir.is_dir():
        print(f"workbench sweep: no report: no sweep folder {sweep_dir}", file=sys.stderr)
        return 1
    try:
        out = report_only(sweep_dir, args.reference)
    except FileNotFoundError as e:
        print(f"workbench sweep: no report: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"report_dir": str(out)}), flush=True)
    print(done_line(sweep_dir, out), file=sys.stderr)
    return 1 if damaged_points(sweep_dir) else 0


def done_line(sweep_dir: str | Path, report_dir: str | Path | None) -> str:
    """The last line a person reads (as `workbench notebook`'s): the report to open, where the points are."""
    html = Path(report_dir) / "report.html" if report_dir else None
    if html is not None and html.exists():
        return f"Done: open {html} (the sweep's report); its CSVs and plots are beside it, the points in {sweep_dir}/"
    if report_dir:  # no nbconvert: the executed report notebook stands in for report.html
        return f"Done: the sweep's report (CSVs, plots, the notebook) is in {report_dir}/, the points in {sweep_dir}/"
    return f"Done: no report written (see above); the points' result files are in {sweep_dir}/"


def main(args) -> int:
    from workbench.sweep import report

    if args.report_only:
        return _report_only_main(args)
    spec = spec_from_args(args)
    if importlib.util.find_spec("distributed") is None:
        print(f"workbench sweep: {NO_DASK}", file=sys.stderr)
        return 2
    # `timeout`, a scheduler, `kill` or Ctrl-C stop the sweep: the running kernel is shut down, the lock
    # released, and the interrupted point (no done.json) reruns on the next start.
    stop_on_signals()
    cache = None if args.cache.lower() == "none" else args.cache
    deadline = budget_deadline(args.budget_s)
    try:
        summary = run_sweep(spec, root=args.out, workers=args.workers, scheduler=args.scheduler, cache=cache,
                            wait_workers=args.wait_workers, deadline=deadline)
        rc = 1 if summary["failed"] else 0
        # stopped during the report: every point is complete, so the rerun skips them all and writes it
        if not args.no_report and summary["complete"]:
            try:
                summary["report_dir"] = str(report.run(summary["sweep_dir"], reference=args.reference))
            except Exception as e:  # noqa: BLE001 - the sweep's results stand; say why the report did not
                print(f"workbench sweep: the report failed: {type(e).__name__}: {e}", file=sys.stderr)
                rc = 1
    except SchedulerError as e:
        print(f"workbench sweep: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Stopping already: a late SIGINT (shutting the kernel down can interrupt its process group, which
        # may be ours) must not turn exit status 130 into death by signal halfway through the exit.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(stopped_line("sweep", spec.name), file=sys.stderr)
        return 130
    print(json.dumps(summary), flush=True)  # last stdout line: machine-readable
    print(done_line(summary["sweep_dir"], summary.get("report_dir")), file=sys.stderr)  # and the last a person reads
    return rc
