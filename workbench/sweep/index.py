"""Which points of a sweep ran: its index (index.csv: one row per point, its status, error and worker) and
its point folders (which are complete, which were damaged since they finished). `Index` is the driver's
copy, rewritten atomically on every change; everything else here only reads."""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from workbench import results
from workbench.sweep.plan import Point, planned_ids, recorded_id
from workbench.sweep.point import DONE_FILE, done_fields, now

INDEX_FILE = "index.csv"
INDEX_COLUMNS = ["point", "status", "error_kind", "error", "problems", "wall_s", "started_at",
                 "finished_at", "worker", "overrides"]
STATUSES = ("running", "done", "failed", "interrupted")


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


def point_folders(sweep_dir: str | Path, ids: set[str]) -> dict[str, Path]:
    """Each planned point id -> its folder: a complete <sweep>/<id>, else a complete folder from before
    the current ids (POINT_ID_VERSION) whose config.json records this point's preset and overrides, else
    <sweep>/<id> (where a run of it goes). Published sweeps keep their folders; nothing is renamed."""
    sweep_dir = Path(sweep_dir)
    found = {pid: sweep_dir / pid for pid in ids}
    missing = {pid for pid, d in found.items() if not results.is_complete(d)}
    if missing:
        for d in sorted(sweep_dir.iterdir()):
            if d.is_dir() and d.name not in ids and results.is_complete(d):
                pid = recorded_id(d)
                if pid in missing:
                    found[pid] = d
                    missing.discard(pid)
    return found


def _complete(sweep_dir: Path) -> list[Path]:
    """The complete folders (by their done.json) of the current spec's points; without a spec, all of them."""
    wanted = planned_ids(sweep_dir)
    if wanted is None:
        return sorted(d for d in sweep_dir.iterdir() if d.is_dir() and results.is_complete(d))
    return sorted(d for d in point_folders(sweep_dir, wanted).values() if results.is_complete(d))


def complete_points(sweep_dir: str | Path) -> list[Path]:
    """The complete, readable point folders of the sweep's current spec (what the report reads). Folders
    of points a changed spec no longer plans stay on disk but are not mixed into the report; a point whose
    result files were damaged after it finished is left out and named by `damaged_points`."""
    return [d for d in _complete(Path(sweep_dir)) if results.check_complete(d) is None]


def damaged_points(sweep_dir: str | Path) -> dict[Path, str]:
    """Complete points of the current spec whose result files cannot be read: folder -> why (naming the file)."""
    found = {d: results.check_complete(d) for d in _complete(Path(sweep_dir))}
    return {d: why for d, why in found.items() if why is not None}


class Index:
    """index.csv, owned by the sweep's one driving process and rewritten atomically on every change.

    Opened by the lock holder: a `running` row left behind is a dead driver's (now `interrupted`), a
    complete point folder the index does not call done (killed between the two, or a damaged index)
    is entered as done from its files, and a done point whose result files were damaged since
    (results.check_complete) becomes `failed` (error_kind `damaged`, the error naming the file), so it
    reruns. `folders`: each point's folder (point_folders)."""

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
                self.update(p, status="failed", error_kind="damaged", error=why, finished_at=now())
            elif self.rows.get(p.id, {}).get("status") != "done":
                self.update(p, **done_fields(folders[p.id]))
        self.write()

    def update(self, point: Point, **fields: Any) -> None:
        row = self.rows.setdefault(point.id, {"point": point.id})
        row.update({f"grid_{k}": cell(v) for k, v in point.grid.items()})
        row["overrides"] = json.dumps(point.overrides, sort_keys=True, default=str)
        row.update(fields)
        self.write()

    def write(self) -> None:
        df = pd.DataFrame(list(self.rows.values()))
        grid_cols = sorted(c for c in df.columns if c.startswith("grid_"))
        cols = [c for c in INDEX_COLUMNS if c != "overrides"] + grid_cols + ["overrides"]
        results.write_csv(self.path, df.reindex(columns=cols))


def cell(v: Any) -> Any:
    """A grid value as one CSV cell: a list (backends, say) comma-joined."""
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else v


# ---- a budget ---------------------------------------------------------------------------------------
SEED_FIELDS = ("seed", "train.seed")


def _shape(overrides: dict[str, Any]) -> str:
    """A point's overrides less its seed: points of one shape take about as long (a study's seeds)."""
    return json.dumps({k: v for k, v in overrides.items() if k not in SEED_FIELDS}, sort_keys=True, default=str)


def expected_wall_s(sweep_dir: Path, overrides: dict[str, Any]) -> float | None:
    """The median wall time of the sweep's done points that differ from this one in their seed alone, from
    index.csv as the driver last wrote it (so also the points done earlier in this run); None where none has."""
    try:
        df = read_index(sweep_dir)
    except DamagedIndex:
        return None
    if df.empty or not {"overrides", "wall_s"} <= set(df.columns):
        return None
    want = _shape(overrides)
    walls = [float(r.wall_s) for r in df[(df["status"] == "done") & df["wall_s"].notna()].itertuples()
             if isinstance(r.overrides, str) and _shape(json.loads(r.overrides)) == want]
    return statistics.median(walls) if walls else None


def budget_skip(sweep_dir: Path, overrides: dict[str, Any], deadline: float | None) -> dict[str, Any] | None:
    """The index fields of a point not started because it would not end before `deadline` (time.time(); None:
    no budget), else None. A point cut by a hard limit loses all its work: on a lent GPU that is device time
    spent for nothing, and the time left may still fit a smaller point. Unknown duration: started."""
    if deadline is None:
        return None
    left, expected = deadline - time.time(), expected_wall_s(sweep_dir, overrides)
    if left > 0 and (expected is None or expected < left):
        return None
    why = (f"points like it took {expected:.0f} s and {max(left, 0):.0f} s of the budget were left" if expected
           else "the budget was spent")
    return {"status": "interrupted", "error_kind": "budget", "finished_at": now(),
            "error": f"not started: {why} (--budget-s); a restart runs it"}
