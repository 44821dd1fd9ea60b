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
  report/      workbench.report's CSVs, plots and report.html (written at the end)

A point's id is a short hash of its resolved config. It is complete when its run is (students.csv and
done.json, written last by the run; a point whose notebook fails after that loses its done.json), so a
sweep killed at any moment and restarted skips exactly the complete points and reruns the others from
an empty folder: nothing lost, nothing duplicated. A point whose notebook fails (cell error, cell
timeout, out of memory, dead kernel) is recorded in index.csv with its error and the sweep goes on; a
restart retries it. Points running when the driver is stopped (Ctrl-C, SIGTERM) become `interrupted`.
Students that error or diverge inside a finished point are rows of its students.csv (status/reason)
and are summarised in the index's `problems` column. index.csv can always be rebuilt from the points'
folders, and is, with a line saying so, when it is found damaged.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import yaml

from workbench import config, results
from workbench.config import ConfigError

DEFAULT_ROOT = Path("results") / "sweeps"
SPEC_FILE, INDEX_FILE, DONE_FILE = "sweep.json", "index.csv", results.DONE_FILE
INDEX_COLUMNS = ["point", "status", "error_kind", "error", "problems", "wall_s", "started_at",
                 "finished_at", "worker", "overrides"]
STATUSES = ("running", "done", "failed", "interrupted")


# ---- the spec ----------------------------------------------------------------------------------
@dataclass
class Spec:
    name: str
    preset: str = "auto"
    fixed: dict[str, Any] = field(default_factory=dict)
    """Overrides every point gets (`--set`, `set:`)."""
    grid: dict[str, list] = field(default_factory=dict)
    """axis -> values: a config field's values, or (linked axis) dicts of field values."""
    cell_timeout: int | None = None
    """Seconds one notebook cell may run before its point fails as 'timeout' (None: no limit)."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "preset": self.preset, "set": self.fixed, "grid": self.grid,
                "cell_timeout": self.cell_timeout}

    @staticmethod
    def from_dict(d: dict[str, Any], name: str | None = None) -> "Spec":
        unknown = set(d) - {"name", "preset", "set", "grid", "cell_timeout"}
        if unknown:
            raise ConfigError(f"sweep spec: unknown keys {sorted(unknown)}; allowed: name, preset, set, grid, cell_timeout")
        name = name or d.get("name")
        if not name:
            raise ConfigError("sweep spec: a sweep needs a name (--name or `name:`)")
        timeout = d.get("cell_timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0):
            raise ConfigError(f"sweep spec: cell_timeout must be a positive number of seconds, got {timeout!r}")
        spec = Spec(name=results.check_name(str(name), "sweep name"), preset=str(d.get("preset") or "auto"),
                    fixed=dict(d.get("set") or {}),
                    grid={str(k): v if isinstance(v, list) else [v] for k, v in (d.get("grid") or {}).items()},
                    cell_timeout=timeout)
        spec.axes()  # fail early on a malformed grid
        return spec

    def axes(self) -> list[list[dict[str, Any]]]:
        """Each axis as the list of field overrides its values stand for."""
        out = []
        for axis, values in self.grid.items():
            if not values:
                raise ConfigError(f"sweep grid: axis {axis!r} has no values")
            if all(isinstance(v, dict) for v in values):  # linked axis: fields move together
                for v in values:
                    for k in v:
                        config.locate(k)
                out.append([dict(v) for v in values])
            elif any(isinstance(v, dict) for v in values):
                raise ConfigError(f"sweep grid: axis {axis!r} mixes field values and point dicts")
            else:
                config.locate(axis)  # a plain axis is named by the field it varies
                out.append([{axis: v} for v in values])
        return out or [[{}]]


@dataclass
class Point:
    id: str
    grid: dict[str, Any]
    """This point's grid values (what distinguishes it from the sweep's other points)."""
    overrides: dict[str, Any]
    """Everything passed to the notebook: the spec's fixed overrides and the grid values."""


def config_hash(cfg: config.Config) -> str:
    """Short, stable id of a resolved config: the same run gets the same folder on every restart."""
    return hashlib.sha1(json.dumps(cfg.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:10]


def plan(spec: Spec) -> list[Point]:
    """The sweep's points in grid order; every point's config is validated before anything runs."""
    points: dict[str, Point] = {}
    for combo in itertools.product(*spec.axes()):
        grid: dict[str, Any] = {}
        for part in combo:
            grid.update(part)
        overrides = {**spec.fixed, **grid}
        try:
            cfg = config.from_preset(spec.preset, **overrides)
        except ConfigError as e:
            raise ConfigError(f"sweep point {grid}: {e}") from None
        flat = cfg.flat()
        typed_grid = {k: flat[config.locate(k)[1]] for k in grid}
        pid = config_hash(cfg)
        points.setdefault(pid, Point(pid, typed_grid, overrides))  # two grid entries, one config: one run
    return list(points.values())


def parse_grid_args(items: list[str], links: list[str]) -> dict[str, list]:
    """`--grid field=v1,v2` (or `field=[...]` in YAML/JSON, e.g. for list values such as backends) and
    `--link a,b`: the named axes advance together (zipped) instead of multiplying."""
    grid: dict[str, list] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ConfigError(f"--grid expects field=v1,v2,..., got {item!r}")
        config.locate(key)
        if value.startswith("["):
            values = yaml.safe_load(value)
        else:
            values = [v.strip() for v in value.split(",") if v.strip()]
        grid[key] = list(values)
    for link in links:
        names = [n.strip() for n in link.split(",") if n.strip()]
        missing = [n for n in names if n not in grid]
        if len(names) < 2 or missing:
            raise ConfigError(f"--link {link!r}: name two or more --grid fields (missing: {missing})")
        lengths = {n: len(grid[n]) for n in names}
        if len(set(lengths.values())) != 1:
            raise ConfigError(f"--link {link!r}: linked axes need the same number of values, got {lengths}")
        zipped = [dict(zip(names, vals)) for vals in zip(*(grid[n] for n in names))]
        # the linked axis takes the place of its first field: axis order is loop order (first = outermost)
        grid = {("+".join(names) if k == names[0] else k): (zipped if k == names[0] else v)
                for k, v in grid.items() if k == names[0] or k not in names}
    return grid


def load_spec_file(path: str | Path) -> dict[str, Any]:
    """A spec file (JSON if it ends in .json, else YAML) as a dict of the right shape; a file that cannot
    be read or parsed, or holds the wrong types, is a ConfigError naming the file and what is wrong."""
    where = f"sweep spec {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{where}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})") from None
    try:
        d = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not valid JSON (line {e.lineno}: {e.msg})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML ({f'line {mark.line + 1}: ' if mark else ''}{problem})") from None
    return check_spec_shape(d if d is not None else {}, where)


def check_spec_shape(d: Any, where: str = "sweep spec") -> dict[str, Any]:
    """The types Spec.from_dict relies on: a mapping; name and preset texts; set a mapping of fields;
    grid a mapping of axis -> a value or a list of values (a linked axis: a list of mappings). Field
    names are texts everywhere; the values themselves are checked by the config when points are planned."""
    def kind(v: Any) -> str:
        return "nothing" if v is None else type(v).__name__

    if not isinstance(d, dict):
        raise ConfigError(f"{where}: expected a mapping with keys name, preset, set, grid; got {kind(d)}")
    for key in ("name", "preset"):
        v = d.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (str, int))):
            raise ConfigError(f"{where}: `{key}` must be a text, got {kind(d[key])} {d[key]!r}")
    for key, what in (("set", "field: value"), ("grid", "axis: [values]")):
        if d.get(key) is not None and not isinstance(d[key], dict):
            raise ConfigError(f"{where}: `{key}` must be a mapping of {what}, got {kind(d[key])} {d[key]!r}")
    linked = [v for values in (d.get("grid") or {}).values() for v in (values if isinstance(values, list) else [values])
              if isinstance(v, dict)]
    for fields in [d.get("set") or {}, d.get("grid") or {}, *linked]:
        bad = [k for k in fields if not isinstance(k, str)]
        if bad:
            raise ConfigError(f"{where}: field and axis names must be texts, got {bad[0]!r} in {fields!r}")
    return d


# ---- the index ---------------------------------------------------------------------------------
class DamagedIndex(results.DamagedResults):
    """index.csv cut short, garbage or empty; `Index` rebuilds it from the point folders."""


def read_index(sweep_dir: str | Path) -> pd.DataFrame:
    path = Path(sweep_dir) / INDEX_FILE
    if not path.exists():
        return pd.DataFrame(columns=INDEX_COLUMNS)
    data = path.read_bytes()
    if not data.endswith(b"\n"):  # the writer always ends with a newline
        raise DamagedIndex(f"{path} is {'empty' if not data else 'cut short'}")
    try:
        df = pd.read_csv(path, dtype={"point": str}, keep_default_na=False, na_values=[""])
    except (ValueError, UnicodeDecodeError) as e:  # pandas' ParserError / EmptyDataError are ValueErrors
        raise DamagedIndex(f"{path} is unreadable ({' '.join(str(e).split())[:200]})") from None
    if not {"point", "status"} <= set(df.columns) or df["point"].isna().any() or not df["status"].isin(STATUSES).all():
        raise DamagedIndex(f"{path} is garbage (no point/status columns, or rows without a point or a known status)")
    return df


class Index:
    """index.csv, owned by the sweep's one driving process and rewritten atomically on every change.

    Opened by the lock holder: a `running` row left behind is a dead driver's (now `interrupted`), a
    complete point folder the index does not call done (killed between the two, or a damaged index)
    is entered as done from its files."""

    def __init__(self, sweep_dir: Path, points: list[Point]):
        self.path = sweep_dir / INDEX_FILE
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
        for p in points:
            if results.is_complete(sweep_dir / p.id) and self.rows.get(p.id, {}).get("status") != "done":
                self.update(p, **done_fields(sweep_dir / p.id))
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


def planned_ids(sweep_dir: str | Path) -> set[str] | None:
    """Point ids the sweep's current spec (sweep.json) plans; None when there is no spec file."""
    spec = Path(sweep_dir) / SPEC_FILE
    return {p.id for p in plan(Spec.from_dict(results.read_json(spec)))} if spec.exists() else None


def complete_points(sweep_dir: str | Path) -> list[Path]:
    """The complete point folders of the sweep's current spec (what the report reads). Folders of
    points a changed spec no longer plans stay on disk but are not mixed into the report."""
    sweep_dir = Path(sweep_dir)
    wanted = planned_ids(sweep_dir)
    return sorted(d for d in sweep_dir.iterdir()
                  if d.is_dir() and results.is_complete(d) and (wanted is None or d.name in wanted))


# ---- one point -----------------------------------------------------------------------------------
def run_point(sweep_dir: Path, preset: str, point_id: str, overrides: dict[str, Any],
              cell_timeout: int | None = None) -> dict[str, Any]:
    """Execute the main notebook for one point; return its index fields. Never raises for a failing
    notebook (the failure is the result); KeyboardInterrupt still stops the sweep."""
    from workbench import notebook

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
    bad = df[~df["status"].isin(["ok", "fallback"])]
    text = "; ".join(f"{r.student} {r.status}: {r.reason}" for r in bad.itertuples())[:2000]
    errors = bad[bad["status"].isin(["error", "diverged"])]
    if errors.empty:
        kind = None
    elif errors["reason"].fillna("").str.contains(_OOM).any():
        kind = "oom"
    else:
        kind = "diverged" if (errors["status"] == "diverged").any() else "student_error"
    return text, kind


# ---- workers -------------------------------------------------------------------------------------
def worker_slots(workers: str | int) -> list[str | None]:
    """One slot per worker: a CUDA device id each on a GPU machine, a single `None` slot on a CPU
    (parallel CPU runs would time each other)."""
    import torch

    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n_gpus == 0:
        return [None]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",")] if visible else [str(i) for i in range(n_gpus)]
    ids = ids[:n_gpus]
    n = len(ids) if str(workers) == "auto" else max(1, min(int(workers), len(ids)))
    return [None] if n == 1 else ids[:n]  # one worker keeps the parent's CUDA_VISIBLE_DEVICES


def _worker(gpu: str, tasks, events, sweep_dir: str, preset: str, cell_timeout: int | None) -> None:
    """A worker process pinned to one GPU: the kernels it starts inherit CUDA_VISIBLE_DEVICES."""
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    for point_id, overrides in iter(tasks.get, None):
        events.put(("start", point_id, gpu, {}))
        events.put(("end", point_id, gpu, run_point(Path(sweep_dir), preset, point_id, overrides, cell_timeout)))


def _execute(points: list[Point], slots: list[str | None], sweep_dir: Path, preset: str,
             cell_timeout: int | None) -> Iterator[tuple]:
    """Yield ('start'|'end', point id, worker, fields) events as the points run."""
    if len(slots) == 1:  # in this process: simplest, and Ctrl-C stops it cleanly
        for p in points:
            yield "start", p.id, slots[0], {}
            yield "end", p.id, slots[0], run_point(sweep_dir, preset, p.id, p.overrides, cell_timeout)
        return
    import multiprocessing as mp
    import queue

    ctx = mp.get_context("spawn")  # a fresh interpreter per worker: no CUDA state inherited
    tasks, events = ctx.Queue(), ctx.Queue()
    for p in points:
        tasks.put((p.id, p.overrides))
    procs = [ctx.Process(target=_worker, args=(gpu, tasks, events, str(sweep_dir), preset, cell_timeout), daemon=True)
             for gpu in slots]
    for proc in procs:
        tasks.put(None)
        proc.start()
    ended = 0
    try:
        while ended < len(points):
            try:
                ev = events.get(timeout=5)
            except queue.Empty:
                if not any(proc.is_alive() for proc in procs):
                    return  # every worker died; what did not end becomes 'interrupted' and reruns next time
                continue
            ended += ev[0] == "end"
            yield ev
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join(timeout=10)


# ---- the sweep -------------------------------------------------------------------------------------
def sweep_folder(root: str | Path, name: str) -> Path:
    """<root>/<name>: a sweep name is one folder name (results.check_name), never a path."""
    return Path(root) / results.check_name(str(name), "sweep name")


@contextlib.contextmanager
def sweep_lock(sweep_dir: Path) -> Iterator[None]:
    """Two processes driving one sweep folder would run points twice; the second one is refused.

    The lock is an OS lock (flock) on the sweep folder itself, held through an open descriptor: it
    goes with a killed driver's process (never stale), and there is no lock file that a user could
    delete as a leftover while a driver runs."""
    fd = os.open(sweep_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise results.OutputError(f"sweep folder {sweep_dir} is being run by another process; wait for "
                                      f"it to finish (or stop it), then run this again") from None
        yield
    finally:
        os.close(fd)  # releases the lock


def describe_point(p: Point, n: int, total: int) -> str:
    """'point 3/10 hidden=2048 seq_len=1024 [a1b2c3d4e5]': what a progress line says is running."""
    return " ".join([f"point {n}/{total}", *(f"{k}={_cell(v)}" for k, v in p.grid.items()), f"[{p.id}]"])


def run_sweep(spec: Spec, root: str | Path = DEFAULT_ROOT, workers: str | int = "auto",
              progress: bool = True) -> dict[str, Any]:
    """Run every incomplete point of `spec` into <root>/<name>/; return counts and the folder."""
    from tqdm.auto import tqdm

    points = plan(spec)  # validates every point before any kernel starts
    sweep_dir = sweep_folder(results.output_root(root), spec.name)
    sweep_dir.mkdir(exist_ok=True)
    with sweep_lock(sweep_dir):
        results.write_json(sweep_dir / SPEC_FILE, spec.to_dict())
        index = Index(sweep_dir, points)
        todo = [p for p in points if not results.is_complete(sweep_dir / p.id)]
        by_id = {p.id: p for p in points}
        position = {p.id: n for n, p in enumerate(points, 1)}
        counts = {"points": len(points), "skipped": len(points) - len(todo), "done": 0, "failed": 0}
        bar = tqdm(total=len(points), initial=counts["skipped"], desc=f"sweep {spec.name}", unit="point",
                   disable=not progress, file=sys.stderr)
        running: set[str] = set()
        try:
            for kind, pid, worker, fields in _execute(todo, worker_slots(workers), sweep_dir, spec.preset,
                                                      spec.cell_timeout):
                line = describe_point(by_id[pid], position[pid], len(points))
                if kind == "start":
                    running.add(pid)
                    index.update(by_id[pid], status="running", started_at=_now(), finished_at=None,
                                 worker=worker or "", error_kind=None, error=None, problems=None, wall_s=None)
                    bar.set_postfix_str(line)
                    if progress:
                        bar.write(f"sweep {spec.name}: {line} started", file=sys.stderr)
                    continue
                running.discard(pid)
                index.update(by_id[pid], **fields)
                counts[fields["status"]] += 1
                if fields["status"] == "failed":
                    bar.write(f"sweep {spec.name}: {line} failed ({fields['error_kind']}): {fields['error'][:300]}",
                              file=sys.stderr)
                bar.update(1)
        finally:
            bar.close()
            for pid in running:  # the driver is stopping (Ctrl-C, SIGTERM, an error) or its workers died
                index.update(by_id[pid], status="interrupted", error_kind="interrupted", finished_at=_now(),
                             error="the sweep driver stopped while this point ran; a restart reruns it")
    counts["complete"] = sum(results.is_complete(sweep_dir / p.id) for p in points)
    return {"sweep_dir": str(sweep_dir), **counts}


def report_only(sweep_dir: Path, reference: str) -> Path:
    """(Re)write the report of a sweep no driver is running; a damaged index is rebuilt first."""
    from workbench import report

    with sweep_lock(sweep_dir):  # a live driver's half-written points are not a report
        stored = sweep_dir / SPEC_FILE
        Index(sweep_dir, plan(Spec.from_dict(results.read_json(stored))) if stored.exists() else [])
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
    p.add_argument("--workers", default="auto", help="'auto': one per visible GPU, one on a CPU; or a number")
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


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(args) -> int:
    from workbench import report

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
        return 0
    spec = spec_from_args(args)
    # `timeout`, a scheduler or `kill` stop the sweep like Ctrl-C does: the running kernel is shut down,
    # the lock released, and the interrupted point (no done.json) reruns on the next start.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        summary = run_sweep(spec, root=args.out, workers=args.workers)
    except KeyboardInterrupt:
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
