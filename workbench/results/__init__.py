"""Result files are the contract: every run writes them, plots and reports read only them.

results/<run_id>/
  config.json    the resolved config (+ what was derived from it)
  env.json       the probe (workbench.probe)
  summary.json   the tutorial's summary keys and more (FP8/bf16 loss ratios, teacher time)
  students.csv   one row per student: schema version, config, env stamp, metrics with units in names
  losses.csv     step, student, loss
  profile-<student>.json, profile-teacher.json   with bench.profile: the profiled block (workbench.measure.profiler)
  *.png / *.svg  plots (workbench.results.plots)
  done.json      written last: the run is complete (loaders skip folders without it); it records the size
                 and hash of every CSV, so a file damaged later is named (read_csv) instead of read as half a row
Every write goes to a temporary file in the same folder, then os.replace: a reader never sees half a file.

Every command names its folders through `output_root`, `check_name` and `create_run_dir`: run ids and
sweep names are single folder names (no `..`, no `/`), and a run folder is created exclusively, so two
runs never write into one folder.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import io
import itertools
import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pandas as pd

from workbench.config import Config, ConfigError

SCHEMA_VERSION = 1
DONE_FILE = "done.json"
HANDOVER_ENV = "WORKBENCH_RUN_DIR"
"""A driver (`workbench notebook`, a sweep point) creates the run folder and names it here for the
notebook kernel it starts; the kernel's `create_run_dir` takes that one folder over, once."""
CACHE_ENV = "WORKBENCH_CACHE_DIR"
"""The folder of the text, tokenizer and teacher caches, where a driver (a sweep) shares one across its
runs; unset: each run's <out>/cache."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

STUDENT_COLUMNS = [  # the first columns of students.csv, in order; config and env stamp follow
    "schema_version", "run_id", "student", "backend", "recipe", "mode", "gemm_precision", "status", "reason",
    "initial_loss", "first_step_loss", "final_train_loss", "eval_mse",
    "step_ms_median", "step_ms_p20", "step_ms_p80", "step_ms_mean", "tokens_per_s", "tflops",
    "peak_mem_allocated_mb", "peak_mem_reserved_mb", "mem_floor_mb", "teacher_ms_median", "steps_run",
    "compiled", "graphed", "compile_ms", "capture_ms", "setup_wall_s", "train_wall_s", "eval_wall_s", "bench_wall_s",
    "student_wall_s", "notes",
]
# where a student's wall time went (workbench.train.loop.run_student): setup (build, convert, compile, capture),
# its training steps, its held-out evaluations, the timed region; student_wall_s is all of them
WALL_CELLS = ("setup_wall_s", "train_wall_s", "eval_wall_s", "bench_wall_s", "student_wall_s")
ENV_STAMP = ["gpu_name", "compute_capability", "torch", "torch_cuda", "te_version", "git_sha"]
# '<metric>_step0': a language-model student's held-out <metric> before its first training step, in its own
# precision (workbench.train.loop.step0_metrics); the file puts it right after '<metric>', its after-training value
STEP0_SUFFIX = "_step0"

# The vocabulary of a row. A *student* is one entry of `backends` (its spec, 'backend:recipe'); it *ran*
# when it trained and was timed ('ok', or 'fallback': PyTorch autocast ran in place of an unusable TE, and
# the reason says so); it *started* when its initial state was measured, which a 'diverged' student was.
# 'skipped' (cannot run here) and 'error' (failed) students have no metrics.
RAN = ("ok", "fallback")
STARTED = RAN + ("diverged",)


def ran(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of students that ran (trained and were timed)."""
    return df[df["status"].isin(RAN)]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _atomic_write(path: Path, write, mode: str = "w") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; results are meant to be shared
    try:
        with os.fdopen(fd, mode, **({"newline": ""} if "b" not in mode else {})) as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


write_with = _atomic_write  # write_with(path, write(f), mode): any writer, atomically (the caches' torch.save)


def write_json(path: Path, obj: Any) -> Path:
    return _atomic_write(path, lambda f: json.dump(obj, f, indent=2, sort_keys=False, default=str))


REFERENCE_SUFFIX = "@1gpu"  # a distributed run's one-process reference row of a student: '<student>@1gpu'


def write_csv(path: Path, df: pd.DataFrame) -> Path:
    return _atomic_write(path, lambda f: df.to_csv(f, index=False))


def write_bytes(path: Path, data: bytes) -> Path:
    return _atomic_write(path, lambda f: f.write(data), mode="wb")


def write_figure(fig, folder: Path, name: str) -> list[Path]:
    """A matplotlib figure as <name>.png (a 256-colour palette PNG) and <name>.svg, each written atomically."""
    import matplotlib  # the figure's own library

    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    paths = [write_bytes(Path(folder) / f"{name}.png", compact_png(png.getvalue()))]
    # no date and ids from the content, not random ones: the same figure is the same SVG bytes (a report
    # rewritten from unchanged results changes nothing in git)
    with matplotlib.rc_context({"svg.hashsalt": "workbench"}):
        paths.append(_atomic_write(Path(folder) / f"{name}.svg",
                                   lambda f: fig.savefig(f, format="svg", metadata={"Date": None}), mode="wb"))
    return paths


def compact_png(data: bytes) -> bytes:
    """The PNG re-encoded with a 256-colour palette: a line plot looks the same at about a third of the
    bytes, which keeps the committed figures, and a copy of the tree sent to a GPU machine, small. The
    original where it is smaller."""
    from PIL import Image  # matplotlib's own dependency

    out = io.BytesIO()
    image = Image.open(io.BytesIO(data)).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        out, "PNG", optimize=True
    )
    return out.getvalue() if out.tell() < len(data) else data


def read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


def students_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Every STUDENT_COLUMNS column first, also when no student produced it (all diverged or skipped:
    empty, never missing), then the other metrics (each step-0 one beside its after-training one), the config
    and env stamp."""
    df = pd.DataFrame(rows)
    return df.reindex(columns=STUDENT_COLUMNS + _step0_beside([c for c in df.columns if c not in STUDENT_COLUMNS]))


def _step0_beside(columns: list[str]) -> list[str]:
    """The columns in their order, except that each '<metric>_step0' follows '<metric>' where both exist (a
    reader compares the two; a row's dict holds the step-0 cells first, since they are measured first)."""
    paired = {c for c in columns if c.endswith(STEP0_SUFFIX) and c.removesuffix(STEP0_SUFFIX) in columns}
    out = []
    for c in columns:
        if c not in paired:
            out += [c] + ([c + STEP0_SUFFIX] if c + STEP0_SUFFIX in paired else [])
    return out


# ---- folders -------------------------------------------------------------------------------------
class OutputError(ConfigError):
    """A folder the user named cannot be used: a bad name, an unwritable root, a folder in use."""


class DamagedResults(ValueError):
    """A result file that was cut short or changed after its run finished."""


def check_name(value: str, what: str) -> str:
    """`value` as a folder name directly below an output root (run id, sweep name), or OutputError."""
    if not isinstance(value, str) or not _NAME.fullmatch(value) or value in (".", ".."):
        raise OutputError(f"{what} {value!r} is not allowed: one folder name of letters, digits, '.', '_' "
                          f"and '-', starting with a letter or digit, at most 128 characters")
    return value


def cache_dir(out: str | Path) -> Path:
    """Where a run with output root `out` keeps its caches: CACHE_ENV when a driver set it, else <out>/cache."""
    return Path(os.environ.get(CACHE_ENV) or Path(out) / "cache")


def output_root(out: str | Path) -> Path:
    """`out` resolved, created if missing and checked writable; OutputError (one line) otherwise."""
    try:
        root = Path(out).expanduser().resolve()
        root.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=root).close()  # the one check that holds for root users and read-only mounts
    except (OSError, RuntimeError) as e:  # RuntimeError: resolve() met a symlink loop (Python < 3.13)
        raise OutputError(f"output folder {out}: {getattr(e, 'strerror', None) or e} (it must be a folder this user "
                          "can write)") from None
    return root


RUN_ID_TAKEN = "choose another --run-id, or leave it out for a new one"
"""What to do about a run folder that exists: said for the command line (the notebook says it for its parameter)."""


def create_run_dir(out: str | Path, run_id: str | None, auto_id: str) -> Path:
    """A new, empty run folder <out>/<run_id>, created exclusively.

    An explicit `run_id` that exists is an OutputError; the automatic `auto_id` gets a -2, -3, ... suffix
    instead. The one exception: the folder this process was handed by its driver (HANDOVER_ENV), taken once.
    """
    root = output_root(out)
    if run_id is not None:
        path = root / check_name(run_id, "run id")
        if os.environ.get(HANDOVER_ENV) == str(path) and path.is_dir() and not (path / "config.json").exists():
            del os.environ[HANDOVER_ENV]  # one run per handed folder: a second run in the kernel gets its own
            return path
        try:
            path.mkdir()
        except FileExistsError:
            raise OutputError(f"run folder {path} exists already: {RUN_ID_TAKEN}") from None
        return path
    check_name(auto_id, "run id")
    for n in itertools.count(1):
        path = root / (auto_id if n == 1 else f"{auto_id}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue  # another run started in the same second


PRE_TASK_FILES = ("config.json", "env.json", "task.json")  # what a run writes before its first student


def discard_run_dir(run_dir: str | Path) -> None:
    """Remove a run folder refused before any student ran: the files it wrote so far (PRE_TASK_FILES), and
    the folder once it is empty (a driver's folder with its own files in it stays)."""
    run_dir = Path(run_dir)
    for name in PRE_TASK_FILES:
        (run_dir / name).unlink(missing_ok=True)
    try:
        run_dir.rmdir()
    except OSError:
        pass


# ---- completeness --------------------------------------------------------------------------------
def mark_complete(run_dir: str | Path, **info: Any) -> Path:
    """Write done.json, the last file of a run: it makes the run complete and records the size and
    SHA-256 of every CSV in the folder (students.csv, losses.csv, ...), against which `read_csv` checks them."""
    run_dir = Path(run_dir)
    students = run_dir / "students.csv"
    return write_json(run_dir / DONE_FILE, {
        "finished_at": _dt.datetime.now().isoformat(timespec="seconds"),
        "students_csv_bytes": students.stat().st_size, "students_rows": len(pd.read_csv(students)),
        "files": {f.name: _fingerprint(f) for f in sorted(run_dir.glob("*.csv"))}, **info})


def _fingerprint(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def is_complete(run_dir: str | Path) -> bool:
    return (Path(run_dir) / "students.csv").exists() and (Path(run_dir) / DONE_FILE).exists()


def folders_with(path: str | Path, name: str) -> list[Path]:
    """`path` itself if it holds a file `name`, else every folder below it that does (sorted)."""
    path = Path(path)
    if (path / name).exists():
        return [path]
    return sorted(p.parent for p in path.rglob(name))


def run_dirs(path: str | Path, include_incomplete: bool = False) -> list[Path]:
    """The complete run folders at or below `path` (also the incomplete ones if asked)."""
    return [d for d in folders_with(path, "students.csv") if include_incomplete or is_complete(d)]


# identifiers read as text: a short git sha such as 528e816 parses as the float 528e816 (inf), 1234567 as an int,
# and a run id or sweep point of hex digits likewise (the H100 record at 528e816 read back git_sha=inf)
TEXT_COLUMNS = {"git_sha": str, "run_id": str, "point": str, "student": str, "backend": str}


def read_csv(path: str | Path) -> pd.DataFrame:
    """A result CSV, checked: against the size and hash that its folder's done.json recorded for it (runs
    from before the hash: students.csv's size), else that it ends with the newline its writer ends with;
    then parsed. DamagedResults naming the file when it is cut short, changed or unreadable."""
    path = Path(path)
    done = path.parent / DONE_FILE
    marker = _read_marker(done) if done.exists() else {}
    recorded = (marker.get("files") or {}).get(path.name) or {}
    if not recorded and path.name == "students.csv" and marker.get("students_csv_bytes") is not None:
        recorded = {"bytes": marker["students_csv_bytes"]}
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DamagedResults(f"{path} cannot be read ({e.strerror or e})") from None
    if "bytes" in recorded and len(data) != recorded["bytes"]:
        raise DamagedResults(f"{path} is damaged: {len(data)} bytes, but {DONE_FILE} recorded {recorded['bytes']} "
                             f"(cut short or changed after the run finished)")
    if "sha256" in recorded and hashlib.sha256(data).hexdigest() != recorded["sha256"]:
        raise DamagedResults(f"{path} is damaged: its content differs from what {DONE_FILE} recorded "
                             f"(changed after the run finished)")
    if not data.endswith(b"\n"):  # without a record: a file the writer finished ends with a newline
        raise DamagedResults(f"{path} is damaged: {'empty' if not data else 'its last row is cut short'}")
    try:
        # copy(): read_csv leaves a wide file (students.csv, ~200 columns) in one block per column, and a column
        # added to that (assign) makes pandas warn of a fragmented frame on every call; the copy consolidates them
        return pd.read_csv(io.BytesIO(data), dtype=TEXT_COLUMNS).copy()
    except (ValueError, UnicodeDecodeError) as e:  # pandas' ParserError / EmptyDataError are ValueErrors
        raise DamagedResults(f"{path} is damaged: {' '.join(str(e).split())[:300]}") from None


def _read_marker(done: Path) -> dict[str, Any]:
    try:
        marker = read_json(done)
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise DamagedResults(f"{done} is damaged ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(marker, dict):
        raise DamagedResults(f"{done} is damaged (not a JSON object)")
    return marker


def read_students(run_dir: str | Path) -> pd.DataFrame:
    """One run's students.csv (read_csv), with every row's student and status; DamagedResults naming the file."""
    path = Path(run_dir) / "students.csv"
    df = read_csv(path)
    if "student" not in df.columns or "status" not in df.columns or df[["student", "status"]].isna().any().any():
        raise DamagedResults(f"{path} is damaged: a row without its student or status")
    return df


def check_complete(run_dir: str | Path) -> str | None:
    """Why a complete run's results cannot be read (DamagedResults' message), or None when they can."""
    try:
        read_students(run_dir)
        if (Path(run_dir) / "losses.csv").exists():
            read_csv(Path(run_dir) / "losses.csv")
    except DamagedResults as e:
        return str(e)
    return None


def load(path: str | Path, include_incomplete: bool = False) -> pd.DataFrame:
    """students.csv of one run, or of every complete run below `path`, as one DataFrame.

    Incomplete runs (no done.json: interrupted, or still running) are skipped; `include_incomplete=True`
    reads them too, with a `complete` column saying which rows come from a finished run.
    """
    dirs = run_dirs(path, include_incomplete)
    if not dirs:
        partial = run_dirs(path, include_incomplete=True)
        why = f" (incomplete, no {DONE_FILE}: interrupted or still running: {partial[0]})" if partial else ""
        raise FileNotFoundError(f"no complete run in or below {path}{why}")
    frames = [read_students(d) for d in dirs]
    if include_incomplete:
        frames = [f.assign(complete=is_complete(d)) for f, d in zip(frames, dirs)]
    return pd.concat(frames, ignore_index=True)


def load_losses(run_dir: str | Path) -> pd.DataFrame:
    return read_csv(Path(run_dir) / "losses.csv")


def load_summary(run_dir: str | Path) -> dict[str, Any]:
    return read_json(Path(run_dir) / "summary.json")


def load_config(run_dir: str | Path) -> Config:
    return Config.from_dict(read_json(Path(run_dir) / "config.json")["config"])


# ---- a new folder written whole (hf-init, hf-import, hf-prune) ----------------------------------------------
def check_new_folder(out: str | Path, option: str) -> Path:
    """`out` as a Path; ConfigError naming `option` where it exists and is not an empty folder (checked before
    anything slow, so a bad --out fails at once)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{option} {out}: exists and is not an empty folder; give a new one")
    return out


@contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """A folder beside `out` to write into, renamed into place when the block ends without error and removed
    otherwise: a stopped writer leaves no half folder. `out` must be new or empty (check_new_folder)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        yield tmp
        if out.exists():
            out.rmdir()  # empty (check_new_folder)
        tmp.replace(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
