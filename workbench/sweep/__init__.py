"""Sweeps: one papermill execution of the main notebook per grid point, resumable, then the report.

    python -m workbench sweep --name sizes --preset large --set steps=10 \\
        --grid hidden=1024,2048,4096 --grid intermediate=4096,8192,16384 --link hidden,intermediate \\
        --grid seq_len=128,1024
    python -m workbench sweep sizes.yaml          # the same sweep from a file (YAML or JSON, below)
    python -m workbench sweep --name sizes        # restart: resumes from results/sweeps/sizes/sweep.json
    make sweep NAME=sizes GRID="hidden=512,1024 seq_len=128,1024"

A spec file (sweep.json, written at the start, is one too):

    name: sizes
    preset: large
    set: {steps: 10, backends: [torch_bf16, "te_fp8:current"]}   # fixed overrides, every point
    grid:                              # the points are the product of the axes
      seq_len: [128, 1024]             # an axis over one config field
      size:                            # a linked axis: each entry sets several fields together
        - {hidden: 512, intermediate: 2048}
        - {hidden: 1024, intermediate: 4096}

    cell_timeout: 3600                 # optional: seconds one notebook cell may run (--cell-timeout)

results/sweeps/<name>/
  sweep.json   the spec a bare restart resumes
  index.csv    one row per point: id, grid values, status (running/done/failed/interrupted), error, wall time
  <point>/     a run folder (workbench.results files, done.json last, + the executed notebook)
  report/      workbench.sweep.report's CSVs, plots and report.html (written at the end)

A point's id is a short hash of its spec: the preset, the point's overrides and an id version
(sweep_plan.point_id), so a field the config gains later renames no point; folders of earlier ids (a hash
of the whole resolved config) are found by the overrides their config.json records. A point is complete
when its run is (students.csv and done.json, written last by the run; a point whose notebook fails after
that loses its done.json) and its result files still match what done.json recorded, so a sweep killed at
any moment and restarted skips exactly the complete points and reruns the others (a damaged one too)
from an empty folder: nothing lost, nothing duplicated. A point whose notebook fails (cell error, cell
timeout, out of memory, dead kernel) is recorded in index.csv with its error and the sweep goes on; a
restart retries it. Points running when the driver is stopped (Ctrl-C, SIGTERM) become `interrupted`.
Students that error or diverge inside a finished point are rows of its students.csv (status/reason)
and are summarised in the index's `problems` column. index.csv can always be rebuilt from the points'
folders, and is, with a line saying so, when it is found damaged.

Where the points run: a Dask cluster, one task per point (the `sweep` extra: dask, distributed). By
default the driver starts one on this machine and closes it at the end (no running cluster needed):
with GPUs, one worker per GPU pinned by CUDA_VISIBLE_DEVICES (dask-cuda's LocalCUDACluster when it is
installed), the point's kernel inheriting its worker's devices; on a CPU one worker (parallel CPU runs
would time each other), `--workers N` for more. A point whose config asks for k GPUs (parallel.nproc)
takes a Dask resource GPU=k; when any point does, every embedded worker gets k GPUs (cluster_plan says
what that costs), and a point asking for more than any worker has fails alone, before it starts.
`--scheduler ADDRESS` sends the points to a running cluster instead (a node, several, a Slurm
allocation); the sweep folder must then be at the same path on every worker (a shared filesystem), and
each worker runs one thread with `--resources GPU=<its GPUs>`:

    dask scheduler --port 8786                                         # on a host the workers reach
    CUDA_VISIBLE_DEVICES=0 dask worker tcp://HOST:8786 --nthreads 1 --resources GPU=1   # one per GPU
    dask cuda worker tcp://HOST:8786 --resources GPU=1               # or dask-cuda: all GPUs of a host
    python -m workbench sweep sizes.yaml --scheduler tcp://HOST:8786

On Slurm, dask-jobqueue (not a dependency) starts the workers as jobs, from a process that stays alive:

    cluster = dask_jobqueue.SLURMCluster(cores=8, processes=1, memory="64GB", walltime="02:00:00",
        job_extra_directives=["--gres=gpu:1"], worker_extra_args=["--nthreads", "1", "--resources", "GPU=1"])
    cluster.scale(jobs=4); print(cluster.scheduler_address)           # the ADDRESS for --scheduler

(docs/sweeps.md has more). The address is probed first (a raw socket waits for the Dask handshake), so
an HTTP server or the dashboard port is one line, not a hang; a scheduler without workers is waited for
`--wait-workers` seconds. LM points share the text, tokenizer and teacher caches under `--cache`
(results/cache by default, as `workbench run`). The driver holds the sweep lock (sweep.lock) and writes index.csv; a point's row says
which worker ran it (address and GPUs) and when it really started there (the task reports it).
Stopping the driver cancels the pending points; its embedded cluster closes (a worker's kernel exits
with it), and on a running cluster the workers still running its points are restarted.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pandas as pd

from workbench import config, results
from workbench.config import ConfigError
from workbench.sweep.plan import (  # noqa: F401 - the spec and files are part of the sweep's API
    DEFAULT_ROOT, DONE_FILE, INDEX_COLUMNS, INDEX_FILE, SPEC_FILE, STATUSES, DamagedIndex, Point, Spec,
    check_spec_shape, complete_points, damaged_points, load_spec_file, parse_grid_args, plan, planned_ids,
    point_folders, point_id, read_index, stored_spec)

LOCK_FILE = "sweep.lock"
DEFAULT_CACHE = Path("results") / "cache"  # the cache `workbench run` uses with its default --out

class Index:
    """index.csv, owned by the sweep's one driving process and rewritten atomically on every change.

    Opened by the lock holder: a `running` row left behind is a dead driver's (now `interrupted`), a
    complete point folder the index does not call done (killed between the two, or a damaged index)
    is entered as done from its files, and a done point whose result files were damaged since
    (results.check_complete) becomes `failed` (error_kind `damaged`, the error naming the file), so it
    reruns. `folders`: each point's folder (sweep_plan.point_folders)."""

    def __init__(self, sweep_dir: Path, points: list[Point], folders: dict[str, Path] | None = None):
        self.path = sweep_dir / INDEX_FILE
        folders = folders or point_folders(sweep_dir, {p.id for p in points})
        try:
            df = read_index(sweep_dir)
        except DamagedIndex as e:
            print(f"workbench sweep: {e}; rebuilt it from the points' {DONE_FILE}", file=sys.stderr)
            df = pd.DataFrame(columns=INDEX_COLUMNS)
        self.rows: dict[str, dict[str, Any]] = {
            r["point"]: {k: (None if isinstance(v, float) and pd.isna(v) else v) for k, v in r.items()}
            for r in df.to_dict("records")
        }
        for row in self.rows.values():
            if row.get("status") == "running":
                row.update(status="interrupted", error_kind="interrupted", error="the sweep driver stopped")
        self.damaged: dict[str, str] = {}
        for p in points:
            if not results.is_complete(folders[p.id]):
                continue
            why = results.check_complete(folders[p.id])
            if why:
                self.damaged[p.id] = why
                self.update(p, status="failed", error_kind="damaged", error=why, finished_at=_now())
            elif self.rows.get(p.id, {}).get("status") != "done":
                self.update(p, **done_fields(folders[p.id]))
        self.write()

    def update(self, point: Point, **fields: Any) -> None:
        row = self.rows.setdefault(point.id, {"point": point.id})
        row.update({f"grid_{k}": _cell(v) for k, v in point.grid.items()})
        row["overrides"] = json.dumps(point.overrides, sort_keys=True, default=str)
        row.update(fields)
        self.write()

    def write(self) -> None:
        df = pd.DataFrame(list(self.rows.values()))
        grid_cols = sorted(c for c in df.columns if c.startswith("grid_"))
        cols = [c for c in INDEX_COLUMNS if c != "overrides"] + grid_cols + ["overrides"]
        results.write_csv(self.path, df.reindex(columns=cols))


def _cell(v: Any) -> Any:
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else v


def _now() -> str:
    return _dt.datetime.now().isoformat(timespec="seconds")


def done_fields(point_dir: Path) -> dict[str, Any]:
    """The index fields of a complete point, from its files."""
    marker = results.read_json(point_dir / DONE_FILE)
    problems, kind = student_problems(point_dir)
    return {"status": "done", "error_kind": kind, "error": None, "problems": problems,
            "wall_s": marker.get("wall_s"), "finished_at": marker.get("finished_at")}


# ---- one point -----------------------------------------------------------------------------------
def run_point(sweep_dir: Path, preset: str, point_id: str, overrides: dict[str, Any],
              cell_timeout: int | None = None, cache: str | None = None) -> dict[str, Any]:
    """Execute the main notebook for one point; return its index fields. Never raises for a failing
    notebook (the failure is the result). It runs in a Dask worker; stopping the sweep is the driver's job.
    `cache`: the folder of the text, tokenizer and teacher caches (results.CACHE_ENV; the kernel inherits it)."""
    from workbench import notebook

    if cache:
        os.environ[results.CACHE_ENV] = cache

    point_dir = sweep_dir / point_id
    if point_dir.exists():
        shutil.rmtree(point_dir)  # leftovers of a killed or failed attempt: start from an empty folder
    t0 = time.monotonic()
    error = None
    try:
        notebook.execute(preset, overrides, out=sweep_dir, run_id=point_id, cell_timeout=cell_timeout)
        if not results.is_complete(point_dir):
            error = ("error", f"the notebook finished without a complete run (students.csv, {DONE_FILE})")
    except Exception as e:  # noqa: BLE001 - any failure of one point is recorded; the sweep goes on
        error = describe_failure(e)
        (point_dir / DONE_FILE).unlink(missing_ok=True)  # a point is complete only once its notebook is
    wall_s = round(time.monotonic() - t0, 2)
    if error:
        return {"status": "failed", "error_kind": error[0], "error": error[1], "wall_s": wall_s,
                "finished_at": _now()}
    return {**done_fields(point_dir), "wall_s": wall_s}


_OOM = re.compile(r"out of memory|OutOfMemoryError|can't allocate memory|Cannot allocate memory", re.I)


def describe_failure(e: BaseException) -> tuple[str, str]:
    """(kind, message): kind is 'oom', 'kernel_died', 'timeout', 'cell_error' or 'error'."""
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    if isinstance(e, CellTimeoutError):
        return "timeout", " ".join(f"a cell ran past the cell timeout: {e}".split())[:2000]
    if isinstance(e, PapermillExecutionError):
        msg, kind = f"{e.ename}: {e.evalue} (cell {e.exec_count})", "cell_error"
    elif isinstance(e, DeadKernelError):
        # usually the host OOM killer, or a crash in native code; the executed notebook shows how far it got
        msg, kind = f"kernel died: {e}", "kernel_died"
    else:
        msg, kind = f"{type(e).__name__}: {e}", "error"
    if _OOM.search(msg):
        kind = "oom"
    return kind, " ".join(msg.split())[:2000]


def student_problems(point_dir: Path) -> tuple[str, str | None]:
    """('te_fp8:current diverged: …; torchao_float8 skipped: …', kind) for the students of a finished
    point that did not run cleanly. kind ('oom', 'diverged', 'student_error' or None; skipped students
    are not errors) makes such points filterable in the index although the point itself is complete."""
    df = results.read_students(point_dir)
    bad = df[~df["status"].isin(results.RAN)]
    text = "; ".join(f"{r.student} {r.status}: {r.reason}" for r in bad.itertuples())[:2000]
    errors = bad[bad["status"].isin(["error", "diverged"])]
    if errors.empty:
        kind = None
    elif errors["reason"].fillna("").str.contains(_OOM).any():
        kind = "oom"
    else:
        kind = "diverged" if (errors["status"] == "diverged").any() else "student_error"
    return text, kind


# ---- where the points run: a Dask cluster -----------------------------------------------------------
@dataclass(frozen=True)
class ClusterPlan:
    """The embedded cluster's workers: one entry each, its CUDA_VISIBLE_DEVICES ('0', or '0,1' for a
    2-GPU worker), or None on a CPU."""
    workers: list[str | None]
    gpus_per_worker: int


def check_workers(workers: str | int) -> str | int:
    """'auto' or a positive number (`--workers`); anything else is a ConfigError."""
    if str(workers) == "auto":
        return "auto"
    if str(workers).isdigit() and int(workers) > 0:
        return int(workers)
    raise ConfigError(f"--workers must be 'auto' or a positive number, got {workers!r}")


def cluster_plan(gpu_ids: list[str], workers: str | int, nprocs: list[int]) -> ClusterPlan:
    """The embedded cluster for `nprocs` (each point's GPU count) on a machine with GPUs `gpu_ids`.

    GPUs: every worker gets k GPUs, k = the most any point asks for (capped at the machine's), as one
    CUDA_VISIBLE_DEVICES list, so a k-GPU point runs on any worker. The price: while a 1-GPU point of
    a sweep that also holds k-GPU points runs, the other k-1 GPUs of its worker idle; sweeps that mix
    sizes are rarer than sweeps of one size, and a worker that picked GPUs per task would be the
    hand-made allocator this replaces. 'auto' = as many workers as there are whole groups of k GPUs; a
    number caps that. CPU: one worker unless asked for more (parallel CPU runs time each other)."""
    workers = check_workers(workers)
    if not gpu_ids:
        return ClusterPlan([None] * (1 if workers == "auto" else workers), 0)
    k = max(1, min(max(nprocs, default=1), len(gpu_ids)))
    groups = [",".join(gpu_ids[i:i + k]) for i in range(0, len(gpu_ids) - k + 1, k)]
    return ClusterPlan(groups if workers == "auto" else groups[:workers], k)


def visible_gpus() -> list[str]:
    """The CUDA device ids this process may use (its CUDA_VISIBLE_DEVICES, else 0..n-1); [] on a CPU."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else [str(i) for i in range(n)]
    return ids[:n]


def embedded_cluster(cp: ClusterPlan):
    """A cluster on this machine for the sweep's lifetime (the driver closes it). Workers are processes
    with one thread each: a worker runs one point (one notebook kernel) at a time."""
    from distributed import LocalCluster, Nanny, Scheduler, SpecCluster

    quiet = {"dashboard_address": None, "silence_logs": logging.WARNING}  # the sweep's own lines stay readable
    if not cp.gpus_per_worker:
        return LocalCluster(n_workers=len(cp.workers), threads_per_worker=1, processes=True, **quiet)
    gpus = {"GPU": cp.gpus_per_worker}
    if cp.gpus_per_worker == 1 and importlib.util.find_spec("dask_cuda") is not None:
        from dask_cuda import LocalCUDACluster  # one worker per GPU, pinned (and its CPUs bound to that GPU)

        return LocalCUDACluster(CUDA_VISIBLE_DEVICES=cp.workers, threads_per_worker=1, resources=gpus, **quiet)
    # k GPUs per worker (or no dask-cuda): the workers are spelled out, each with its own device list
    worker = {"cls": Nanny, "options": {"nthreads": 1, "host": "127.0.0.1", "resources": gpus,
                                        "silence_logs": logging.WARNING}}
    specs = {f"gpu{ids}": {**worker, "options": {**worker["options"], "env": {"CUDA_VISIBLE_DEVICES": ids}}}
             for ids in cp.workers}
    return SpecCluster(workers=specs, silence_logs=logging.WARNING,
                       scheduler={"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": None}})


class SchedulerError(ConfigError):
    """`--scheduler` names something that is not a usable Dask scheduler: nothing there, something else
    answering, or a scheduler without workers."""


CONNECT_TIMEOUT_S = 10.0


def probe_scheduler(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Return when a Dask scheduler answers at `address` (tcp://HOST:PORT), else SchedulerError saying what
    answered. distributed's Client can wait forever on a peer that accepts the connection but speaks
    another protocol (an HTTP server, the scheduler's own dashboard port), whatever its timeout: a Dask
    server writes its handshake as soon as it accepts, so a raw socket tells the two apart in `timeout`
    seconds. Other schemes (tls://, ucx://) are left to distributed."""
    scheme, sep, rest = address.rpartition("://")
    if sep and scheme != "tcp":
        return
    host, colon, port = rest.rpartition(":")
    if not colon or not port.isdigit() or not host:
        raise SchedulerError(f"--scheduler {address!r}: expected tcp://HOST:PORT (e.g. tcp://127.0.0.1:8786)")
    host = host.strip("[]")
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except OSError as e:
        raise SchedulerError(f"--scheduler {address}: nothing answers there ({e.strerror or e}); start a scheduler "
                             f"(dask scheduler --port {port}) or check the address") from None
    with sock:
        head = _receive(sock, 16)
        if len(head) == 16:
            # a Dask TCP message: total length, frame count, then one length per frame (distributed.comm.tcp)
            total, frames = struct.unpack("<QQ", head)
            if 1 <= frames <= 64 and 8 * (frames + 1) <= total < 2**24:
                return
        what = f"something that sent {head[:40]!r}" if head else ""
        if not head:  # silent until asked: perhaps an HTTP server waiting for a request
            with contextlib.suppress(OSError):
                sock.sendall(b"HEAD / HTTP/1.0\r\n\r\n")
            reply = _receive(sock, 512)
            if reply.startswith(b"HTTP/"):
                server = next((line.split(b":", 1)[1].strip().decode(errors="replace")
                               for line in reply.splitlines() if line.lower().startswith(b"server:")), "")
                what = f"an HTTP server{f' ({server})' if server else ''}"
            else:
                what = f"something that accepted the connection but sent no Dask handshake within {timeout:g} s"
    raise SchedulerError(f"--scheduler {address}: {what} answered, not a Dask scheduler; give the scheduler's "
                         f"own address (its port is 8786 by default; 8787 is its dashboard)")


def _receive(sock: socket.socket, n: int) -> bytes:
    """Up to `n` bytes, fewer when the peer stops sending or the socket's timeout passes."""
    data = b""
    with contextlib.suppress(OSError):  # socket.timeout is an OSError
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                break
            data += chunk
    return data


@contextlib.contextmanager
def dask_client(scheduler: str | None, workers: str | int, nprocs: list[int],
                wait_workers: float = 120) -> Iterator[tuple[Any, int]]:
    """(client, GPUs per worker; 0 when the workers have no GPU resources) for the sweep's points:
    a running cluster at `scheduler` (probed first; SchedulerError when it has no worker after
    `wait_workers` seconds), or an embedded one started here and closed on the way out."""
    from distributed import Client

    if scheduler:
        probe_scheduler(scheduler)
        with Client(scheduler, timeout=f"{CONNECT_TIMEOUT_S:g}s") as client:
            if not client.scheduler_info(n_workers=-1)["workers"]:
                print(f"workbench sweep: the scheduler at {scheduler} has no workers yet; waiting up to "
                      f"{wait_workers:g} s (--wait-workers)", file=sys.stderr)
                try:
                    client.wait_for_workers(1, timeout=wait_workers)
                except TimeoutError:
                    raise SchedulerError(
                        f"--scheduler {scheduler}: the scheduler has no workers after {wait_workers:g} s; start "
                        f"some (dask worker {scheduler} --nthreads 1 --resources GPU=1) or wait longer "
                        f"(--wait-workers SECONDS)") from None
            info = client.scheduler_info(n_workers=-1)["workers"].values()
            yield client, int(max((w.get("resources", {}).get("GPU", 0) for w in info), default=0))
        return
    cp = cluster_plan(visible_gpus(), workers, nprocs)
    with embedded_cluster(cp) as cluster, Client(cluster) as client:
        yield client, cp.gpus_per_worker


def _run_on_worker(sweep_dir: str, preset: str, point_id: str, overrides: dict[str, Any],
                   cell_timeout: int | None, gpus: int, topic: str, cache: str | None = None) -> dict[str, Any]:
    """One point, on a Dask worker: announce its start (the driver's index shows when it really started)
    and run it. A point of `gpus` GPUs gets the first that many of its worker's devices (dask-cuda's
    workers see every GPU, their own first); the worker runs one point at a time (one thread)."""
    from distributed import get_worker

    worker = get_worker()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if gpus and visible:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible = ",".join(visible.split(",")[:gpus])
    where = {"worker": f"{worker.address}" + (f" GPU {visible}" if visible else ""), "started_at": _now()}
    worker.log_event(topic, {"point": point_id, "address": worker.address, **where})
    return {**run_point(Path(sweep_dir), preset, point_id, overrides, cell_timeout, cache), **where}


def _execute(client, points: list[Point], gpus_per_worker: int, sweep_dir: Path, preset: str,
             cell_timeout: int | None, cache: str | None = None) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Submit the points; yield ('start'|'end', point id, fields) as they run on the workers. A point
    asking for more GPUs than a worker has ends at once as failed. Pending points are cancelled when the
    caller stops; on a running cluster, the workers still running one of ours are restarted (their
    kernels with them), so nothing keeps writing into a point folder that the next start reruns."""
    import queue
    import uuid

    events: queue.Queue = queue.Queue()
    topic = f"workbench-sweep-{uuid.uuid4().hex[:12]}"
    client.subscribe_topic(topic, lambda event: events.put(("start", event[1]["point"], event[1])))
    futures, running = [], {}
    try:
        for p in points:
            if gpus_per_worker and p.nproc > gpus_per_worker:
                yield "end", p.id, {"status": "failed", "error_kind": "resources", "finished_at": _now(),
                                    "error": f"the point asks for {p.nproc} GPUs (parallel.nproc) but the "
                                             f"largest Dask worker has {gpus_per_worker}"}
                continue
            gpus = p.nproc if gpus_per_worker else 0
            future = client.submit(_run_on_worker, str(sweep_dir.resolve()), preset, p.id, p.overrides, cell_timeout,
                                   gpus, topic, cache, key=f"point-{p.id}-{topic}", pure=False,
                                   resources={"GPU": gpus} if gpus else None)
            future.add_done_callback(lambda f, pid=p.id: events.put(("end", pid, f)))
            futures.append(future)
        ended: set[str] = set()
        while len(ended) < len(futures):
            try:
                kind, pid, payload = events.get(timeout=1)
            except queue.Empty:
                continue
            if kind == "start" and pid not in ended:
                running[pid] = payload["address"]
                yield kind, pid, {"worker": payload["worker"], "started_at": payload["started_at"]}
            elif kind == "end":
                ended.add(pid)
                running.pop(pid, None)
                yield kind, pid, _future_fields(payload)
    finally:
        client.unsubscribe_topic(topic)
        client.cancel(futures)
        if running and client.cluster is None:
            client.restart_workers(sorted(set(running.values())), raise_for_error=False)


def _events(scheduler: str | None, workers: str | int, points: list[Point], sweep_dir: Path, preset: str,
            cell_timeout: int | None, cache: str | None = None,
            wait_workers: float = 120) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """_execute's events on the sweep's cluster; no cluster at all when every point is complete."""
    if points:
        with dask_client(scheduler, workers, [p.nproc for p in points], wait_workers) as (client, gpus_per_worker):
            yield from _execute(client, points, gpus_per_worker, sweep_dir, preset, cell_timeout, cache)


def _future_fields(future) -> dict[str, Any]:
    """A finished task's index fields; a task that raised (its worker died, say) is a failed point."""
    if future.status == "finished":
        return future.result()
    if future.status == "cancelled":
        return {"status": "interrupted", "error_kind": "interrupted", "finished_at": _now(),
                "error": "the Dask cluster cancelled the point; a restart reruns it"}
    kind, msg = describe_failure(future.exception())
    return {"status": "failed", "error_kind": kind, "error": msg, "finished_at": _now()}


# ---- the sweep -------------------------------------------------------------------------------------
def sweep_folder(root: str | Path, name: str) -> Path:
    """<root>/<name>: a sweep name is one folder name (results.check_name), never a path."""
    return Path(root) / results.check_name(str(name), "sweep name")


@contextlib.contextmanager
def sweep_lock(sweep_dir: Path) -> Iterator[None]:
    """Two processes driving one sweep folder would run points twice; the second one is refused.

    The lock is an OS lock (filelock) on <sweep>/sweep.lock, held while the driver runs: it goes with a
    killed driver's process, so the file a dead driver leaves behind locks nothing. Deleting that file
    while a driver runs lets a second one in: it is not a leftover to clean up."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(sweep_dir / LOCK_FILE), timeout=0)
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


def describe_point(p: Point, n: int, total: int) -> str:
    """'point 3/10 hidden=2048 seq_len=1024 [a1b2c3d4e5]': what a progress line says is running."""
    return " ".join([f"point {n}/{total}", *(f"{k}={_cell(v)}" for k, v in p.grid.items()), f"[{p.id}]"])


def run_sweep(spec: Spec, root: str | Path = DEFAULT_ROOT, workers: str | int = "auto",
              progress: bool = True, scheduler: str | None = None, cache: str | Path | None = DEFAULT_CACHE,
              wait_workers: float = 120) -> dict[str, Any]:
    """Run every incomplete point of `spec` into <root>/<name>/; return counts and the folder. The points
    run on a Dask cluster: the one at `scheduler`, else one started here (`workers`: cluster_plan).
    `cache`: the text, tokenizer and teacher caches every point shares (None: each run's <out>/cache,
    here <sweep>/cache); a complete point whose result files were damaged since is rerun."""
    from tqdm.auto import tqdm

    points = plan(spec)  # validates every point before any kernel starts
    check_workers(workers)
    if scheduler:
        probe_scheduler(scheduler)  # before the sweep folder exists: a wrong address leaves nothing behind
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
        by_id = {p.id: p for p in points}
        position = {p.id: n for n, p in enumerate(points, 1)}
        counts = {"points": len(points), "skipped": len(points) - len(todo), "done": 0, "failed": 0, "interrupted": 0}
        bar = tqdm(total=len(points), initial=counts["skipped"], desc=f"sweep {spec.name}", unit="point",
                   disable=not progress, file=sys.stderr)
        running: set[str] = set()
        events = _events(scheduler, workers, todo, sweep_dir, spec.preset, spec.cell_timeout, cache, wait_workers)
        try:
            for kind, pid, fields in events:
                line = describe_point(by_id[pid], position[pid], len(points))
                if kind == "start":
                    running.add(pid)
                    index.update(by_id[pid], status="running", finished_at=None, error_kind=None, error=None,
                                 problems=None, wall_s=None, **fields)
                    bar.set_postfix_str(line)
                    if progress:
                        bar.write(f"sweep {spec.name}: {line} started on {fields['worker']}", file=sys.stderr)
                    continue
                running.discard(pid)
                index.update(by_id[pid], **fields)
                counts[fields["status"]] += 1
                if fields["status"] == "failed":
                    bar.write(f"sweep {spec.name}: {line} failed ({fields['error_kind']}): {fields['error'][:300]}",
                              file=sys.stderr)
                bar.update(1)
        finally:
            try:
                events.close()  # now, not when garbage-collected: the cluster stops before the index says so
            finally:
                bar.close()
                for pid in running:  # the driver is stopping (Ctrl-C, SIGTERM, an error) or its cluster went away
                    index.update(by_id[pid], status="interrupted", error_kind="interrupted", finished_at=_now(),
                                 error="the sweep driver stopped while this point ran; a restart reruns it")
    folders = point_folders(sweep_dir, {p.id for p in points})
    counts["complete"] = sum(results.is_complete(d) and results.check_complete(d) is None for d in folders.values())
    return {"sweep_dir": str(sweep_dir), **counts}


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
                        "when a point needs k; one on a CPU) or a number")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run the points on a running Dask cluster (e.g. tcp://host:8786) instead of one started "
                        "here; the sweep folder must be at the same path on its workers")
    p.add_argument("--wait-workers", type=float, default=120, metavar="SECONDS",
                   help="with --scheduler: how long to wait for its first worker before giving up (default 120)")
    p.add_argument("--cache", default=str(DEFAULT_CACHE), metavar="DIR",
                   help="folder of the text, tokenizer and teacher caches, shared by every point and sweep "
                        "(default results/cache, as `workbench run`); 'none': each sweep's own <sweep>/cache")
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


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(args) -> int:
    from workbench.sweep import report

    if args.report_only:
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
        print(json.dumps({"report_dir": str(out)}))
        return 1 if damaged_points(sweep_dir) else 0
    spec = spec_from_args(args)
    if importlib.util.find_spec("distributed") is None:
        print(f"workbench sweep: {NO_DASK}", file=sys.stderr)
        return 2
    # `timeout`, a scheduler or `kill` stop the sweep like Ctrl-C does: the running kernel is shut down,
    # the lock released, and the interrupted point (no done.json) reruns on the next start.
    signal.signal(signal.SIGTERM, _interrupt)
    cache = None if args.cache.lower() == "none" else args.cache
    try:
        summary = run_sweep(spec, root=args.out, workers=args.workers, scheduler=args.scheduler, cache=cache,
                            wait_workers=args.wait_workers)
    except SchedulerError as e:
        print(f"workbench sweep: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Stopping already: a late SIGINT (shutting the kernel down can interrupt its process group, which
        # may be ours) must not turn exit status 130 into death by signal halfway through the exit.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(f"workbench sweep: interrupted; run the same command (or --name {spec.name}) to resume",
              file=sys.stderr)
        return 130
    rc = 1 if summary["failed"] else 0
    if not args.no_report and summary["complete"]:
        try:
            summary["report_dir"] = str(report.run(summary["sweep_dir"], reference=args.reference))
        except Exception as e:  # noqa: BLE001 - the sweep's results stand; say why the report did not
            print(f"workbench sweep: the report failed: {type(e).__name__}: {e}", file=sys.stderr)
            rc = 1
    print(json.dumps(summary))  # last line: machine-readable
    return rc
