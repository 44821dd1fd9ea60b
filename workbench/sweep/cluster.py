"""Where a sweep's points run: a Dask cluster, one task per point. Embedded (started here for the sweep's
lifetime: one worker per GPU, or per group of k GPUs when a point needs k; one on a CPU) or a running
one at `--scheduler`, probed first under a deadline so that a wrong address is one line, not a hang,
and waited on for `--wait-workers` seconds when it has no worker yet."""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import socket
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from workbench.config import ConfigError
from workbench.sweep.index import budget_skip
from workbench.sweep.plan import Point
from workbench.sweep.point import describe_failure, now, run_on_worker


@dataclass(frozen=True)
class ClusterPlan:
    """The embedded cluster's workers: one entry each, its CUDA_VISIBLE_DEVICES ('0', or '0,1' for a
    2-GPU worker), or None on a CPU."""
    workers: list[str | None]
    gpus_per_worker: int


PER_GPU = "/gpu"  # `--workers K/gpu`: K workers on every GPU group (points that share a GPU)


def check_workers(workers: str | int) -> str | int:
    """'auto', a positive number or 'K/gpu' with K positive (`--workers`); anything else is a ConfigError."""
    text = str(workers)
    if text == "auto":
        return "auto"
    if text.isdigit() and int(text) > 0:
        return int(text)
    share = text.removesuffix(PER_GPU)
    if text.endswith(PER_GPU) and share.isdigit() and int(share) > 0:
        return text
    raise ConfigError(f"--workers must be 'auto', a positive number or K{PER_GPU} (K workers sharing each GPU), "
                      f"got {workers!r}")


def per_gpu(workers: str | int) -> int:
    """How many workers share each GPU group: K for 'K/gpu', else 1."""
    text = str(workers)
    return int(text.removesuffix(PER_GPU)) if text.endswith(PER_GPU) else 1


def cluster_plan(gpu_ids: list[str], workers: str | int, nprocs: list[int]) -> ClusterPlan:
    """The embedded cluster for `nprocs` (each point's GPU count) on a machine with GPUs `gpu_ids`.

    GPUs: every worker gets k GPUs, k = the most any point asks for (capped at the machine's), as one
    CUDA_VISIBLE_DEVICES list, so a k-GPU point runs on any worker. The price: while a 1-GPU point of
    a sweep that also holds k-GPU points runs, the other k-1 GPUs of its worker idle; sweeps that mix
    sizes are rarer than sweeps of one size, and a worker that picked GPUs per task would be the
    hand-made allocator this replaces. 'auto' = as many workers as there are whole groups of k GPUs; a
    number caps that; 'K/gpu' puts K workers on every group, whose points then share its GPUs (for work whose
    numbers do not depend on speed, such as a quality study's: their step times time each other). CPU: one
    worker unless a number asks for more (parallel CPU runs time each other)."""
    workers = check_workers(workers)
    if not gpu_ids:
        return ClusterPlan([None] * (workers if isinstance(workers, int) else 1), 0)
    k = max(1, min(max(nprocs, default=1), len(gpu_ids)))
    groups = [",".join(gpu_ids[i:i + k]) for i in range(0, len(gpu_ids) - k + 1, k)]
    if isinstance(workers, int):
        groups = groups[:workers]
    return ClusterPlan([g for g in groups for _ in range(per_gpu(workers))], k)


def visible_gpus() -> list[str]:
    """The CUDA device ids this process may use (its CUDA_VISIBLE_DEVICES, else 0..n-1); [] on a CPU."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else [str(i) for i in range(n)]
    return ids[:n]


# The scheduler's HTTP server (its health and metrics routes) starts even with the dashboard off, at 8787 unless
# told otherwise: a second sweep, or anything else there, made every sweep say "Port 8787 is already in use".
# Port 0 is any free port, and the dashboard itself stays off.
NO_DASHBOARD = {"dashboard_address": ":0", "dashboard": False}  # a Scheduler's options
NO_DASHBOARD_KW = {"dashboard_address": ":0", "scheduler_kwargs": {"dashboard": False}}  # a LocalCluster's arguments


def embedded_cluster(cp: ClusterPlan):
    """A cluster on this machine for the sweep's lifetime (the driver closes it). Workers are processes
    with one thread each: a worker runs one point (one notebook kernel) at a time. No dashboard, no fixed port."""
    from distributed import LocalCluster, Nanny, Scheduler, SpecCluster

    quiet = {**NO_DASHBOARD_KW, "silence_logs": logging.WARNING}  # the sweep's own lines stay readable
    if not cp.gpus_per_worker:
        return LocalCluster(n_workers=len(cp.workers), threads_per_worker=1, processes=True, **quiet)
    gpus = {"GPU": cp.gpus_per_worker}
    shared = len(set(cp.workers)) < len(cp.workers)  # K/gpu: dask-cuda takes one worker per device
    if cp.gpus_per_worker == 1 and not shared and importlib.util.find_spec("dask_cuda") is not None:
        from dask_cuda import LocalCUDACluster  # one worker per GPU, pinned (and its CPUs bound to that GPU)

        return LocalCUDACluster(CUDA_VISIBLE_DEVICES=cp.workers, threads_per_worker=1, resources=gpus, **quiet)
    # k GPUs per worker (or no dask-cuda): the workers are spelled out, each with its own device list
    worker = {"cls": Nanny, "options": {"nthreads": 1, "host": "127.0.0.1", "resources": gpus,
                                        "silence_logs": logging.WARNING}}
    specs = {f"gpu{ids}-{n}": {**worker, "options": {**worker["options"], "env": {"CUDA_VISIBLE_DEVICES": ids}}}
             for n, ids in enumerate(cp.workers)}
    return SpecCluster(workers=specs, silence_logs=logging.WARNING,
                       scheduler={"cls": Scheduler, "options": {"host": "127.0.0.1", **NO_DASHBOARD}})


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
    with slow_close_is_no_error(embedded_cluster(cp)) as cluster, slow_close_is_no_error(Client(cluster)) as client:
        yield client, cp.gpus_per_worker


@contextlib.contextmanager
def slow_close_is_no_error(resource):
    """`with resource`, but a TimeoutError from closing it is one line, not an error: the cluster closes
    once the points have ended, and a teardown past distributed's deadline used to lose the report. An
    error of the body still propagates (the close's TimeoutError does not replace it). The close is quiet:
    distributed's warnings while it tears down ("Worker process still alive after 4.0 seconds, killing": its
    nanny ending a worker whose kernel is slow to exit) are not the sweep's news; its errors still show."""
    from distributed.utils import silence_logging_cmgr

    value = resource.__enter__()
    exc: BaseException | None = None
    try:
        yield value
    except BaseException as e:
        exc = e
        raise
    finally:
        try:
            with silence_logging_cmgr(logging.ERROR):
                resource.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)
        except TimeoutError as e:
            print(f"workbench sweep: the Dask {type(resource).__name__} was slow to close ({e or 'TimeoutError'}); "
                  f"not an error, going on", file=sys.stderr)


class Stop:
    """A stop asked for by a signal (SIGTERM from `timeout`, a scheduler or `kill`; Ctrl-C): `handle` is the
    handler the CLI installs (run.stop_on_signals), and the driver stops where it can do so cleanly.

    Why not raise KeyboardInterrupt in the handler, as Python's own Ctrl-C does: the driver waits for the
    points in Queue.get, and a KeyboardInterrupt raised there while the queue's Condition re-takes its lock
    leaves its `with` releasing a lock it no longer holds, "RuntimeError: release unlocked lock": a traceback
    instead of a stop (`timeout` signals twice, the driver and then its process group, which makes that
    likely). So while the points run (`deferring`, set by _execute) the handler only records the stop and
    _execute raises KeyboardInterrupt itself between two waits (of 0.2 s); before that (starting the
    cluster, a study's teacher) it raises at once, as before. Only the first signal counts: a later one
    (timeout's second, Ctrl-C pressed again) would interrupt the stopping itself (the cancel, the interrupted
    rows, the cluster's close). Plain attributes, no threading.Event: a signal handler takes no lock."""

    def __init__(self) -> None:
        self.signum: int | None = None  # the signal that asked for the stop; None: no stop asked for
        self.deferring = False

    def handle(self, signum, frame) -> None:
        if self.signum is not None:
            return  # stopping already
        self.signum = signum
        if not self.deferring:
            raise KeyboardInterrupt(f"signal {signum}")

    def check(self) -> None:
        """KeyboardInterrupt when a stop was asked for: called where raising is safe."""
        if self.signum is not None:
            raise KeyboardInterrupt(f"signal {self.signum}")


STOP = Stop()


def _execute(client, points: list[Point], gpus_per_worker: int, sweep_dir: Path, preset: str,
             cell_timeout: int | None, cache: str | None = None,
             deadline: float | None = None) -> Iterator[tuple[str, str, dict[str, Any]]]:
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
    STOP.deferring = True  # a signal from here on is a flag the loop below checks (Stop says why)
    try:
        for i, p in enumerate(points):
            if gpus_per_worker and p.nproc > gpus_per_worker:
                yield "end", p.id, {"status": "failed", "error_kind": "resources", "finished_at": now(),
                                    "error": f"the point asks for {p.nproc} GPUs (parallel.nproc) but the "
                                             f"largest Dask worker has {gpus_per_worker}"}
                continue
            gpus = p.nproc if gpus_per_worker else 0
            future = client.submit(_run_in_budget, str(sweep_dir.resolve()), preset, p.id, p.overrides, cell_timeout,
                                   gpus, topic, cache, deadline, key=f"point-{p.id}-{topic}", pure=False,
                                   resources={"GPU": gpus} if gpus else None,
                                   # grid order: Dask runs GPU-restricted tasks submitted together in no set
                                   # order (an H100 sweep ran 512, 8192, 4096 and its budget cut 2048, 1024)
                                   priority=len(points) - i)
            future.add_done_callback(lambda f, pid=p.id: events.put(("end", pid, f)))
            futures.append(future)
        ended: set[str] = set()
        while len(ended) < len(futures):
            STOP.check()  # before the wait and after the caller handled the last event
            try:
                # short waits: a stop is seen at once, before Dask, whose workers `timeout` signals too,
                # restarts them and reruns the point on the new one
                kind, pid, payload = events.get(timeout=0.2)
            except queue.Empty:
                continue
            if kind == "start" and pid not in ended:
                running[pid] = payload["address"]
                yield kind, pid, {"worker": payload["worker"], "started_at": payload["started_at"]}
            elif kind == "end":
                ended.add(pid)
                running.pop(pid, None)
                yield kind, pid, _future_fields(payload)
        STOP.check()  # a stop asked for while the caller handled the last point's end is still a stop
    finally:
        STOP.deferring = False
        client.unsubscribe_topic(topic)
        client.cancel(futures)
        if running and client.cluster is None:
            client.restart_workers(sorted(set(running.values())), raise_for_error=False)


def _run_in_budget(sweep_dir: str, preset: str, point_id: str, overrides: dict[str, Any], cell_timeout: int | None,
                   gpus: int, topic: str, cache: str | None, deadline: float | None) -> dict[str, Any]:
    """run_on_worker, unless the point would not end before `deadline` (index.budget_skip: decided on the worker,
    when the point's turn comes, from the index as it is then)."""
    return (budget_skip(Path(sweep_dir), overrides, deadline)
            or run_on_worker(sweep_dir, preset, point_id, overrides, cell_timeout, gpus, topic, cache))


def point_events(scheduler: str | None, workers: str | int, points: list[Point], sweep_dir: Path, preset: str,
                 cell_timeout: int | None, cache: str | None = None,
                 wait_workers: float = 120, deadline: float | None = None) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """_execute's events on the sweep's cluster; no cluster at all when every point is complete."""
    if points:
        with dask_client(scheduler, workers, [p.nproc for p in points], wait_workers) as (client, gpus_per_worker):
            yield from _execute(client, points, gpus_per_worker, sweep_dir, preset, cell_timeout, cache, deadline)


def _future_fields(future) -> dict[str, Any]:
    """A finished task's index fields; a task that raised (its worker died, say) is a failed point."""
    if future.status == "finished":
        return future.result()
    if future.status == "cancelled":
        return {"status": "interrupted", "error_kind": "interrupted", "finished_at": now(),
                "error": "the Dask cluster cancelled the point; a restart reruns it"}
    kind, msg = describe_failure(future.exception())
    return {"status": "failed", "error_kind": kind, "error": msg, "finished_at": now()}


