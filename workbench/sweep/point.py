"""One point of a sweep, on a Dask worker: execute the main notebook into <sweep>/<point id>/ and say how
it went, as the fields of its index row (status, error_kind and error, the students' problems, wall
time, where and when it ran). A failing notebook is a result, never an exception."""
from __future__ import annotations

import datetime as _dt
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from workbench import results

DONE_FILE = results.DONE_FILE  # written last by a run: a point is complete once it is there


def now() -> str:
    """The index's timestamps: local time to the second."""
    return _dt.datetime.now().isoformat(timespec="seconds")


def done_fields(point_dir: Path) -> dict[str, Any]:
    """The index fields of a complete point, from its files."""
    marker = results.read_json(point_dir / DONE_FILE)
    problems, kind = student_problems(point_dir)
    return {"status": "done", "error_kind": kind, "error": None, "problems": problems,
            "wall_s": marker.get("wall_s"), "finished_at": marker.get("finished_at")}


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
                "finished_at": now()}
    return {**done_fields(point_dir), "wall_s": wall_s}


_OOM = re.compile(r"out of memory|OutOfMemoryError|can't allocate memory|Cannot allocate memory", re.I)


def describe_failure(e: BaseException) -> tuple[str, str]:
    """(kind, message): kind is 'oom', 'kernel_died', 'timeout', 'cell_error' or 'error'. Never raises: without
    nbclient or papermill (a worker lacking the notebook stack) e is none of their errors."""
    try:
        from nbclient.exceptions import CellTimeoutError, DeadKernelError
        from papermill.exceptions import PapermillExecutionError
    except ImportError:
        CellTimeoutError = DeadKernelError = PapermillExecutionError = ()  # isinstance(e, ()) is False

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



def run_on_worker(sweep_dir: str, preset: str, point_id: str, overrides: dict[str, Any],
                   cell_timeout: int | None, gpus: int, topic: str, cache: str | None = None) -> dict[str, Any]:
    """One point, on a Dask worker: announce its start (the driver's index shows when it really started)
    and run it. A point of `gpus` GPUs gets the first that many of its worker's devices (dask-cuda's
    workers see every GPU, their own first); the worker runs one point at a time (one thread)."""
    from distributed import get_worker

    worker = get_worker()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if gpus and visible:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible = ",".join(visible.split(",")[:gpus])
    where = {"worker": f"{worker.address}" + (f" GPU {visible}" if visible else ""), "started_at": now()}
    worker.log_event(topic, {"point": point_id, "address": worker.address, **where})
    return {**run_point(Path(sweep_dir), preset, point_id, overrides, cell_timeout, cache), **where}


