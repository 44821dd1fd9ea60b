"""Result files are the contract: every run writes them, plots and reports read only them.

results/<run_id>/
  config.json    the resolved config (+ what was derived from it)
  env.json       the probe (workbench.probe)
  summary.json   the tutorial's summary keys and more (FP8/bf16 loss ratios, teacher time)
  students.csv   one row per student: schema version, config, env stamp, metrics with units in names
  losses.csv     step, student, loss
  profile-<student>.json, profile-teacher.json   with bench.profile: the profiled block (workbench.crosscheck)
  *.png / *.svg  plots (workbench.plots)
Every write goes to a temporary file in the same folder, then os.replace: a reader never sees half a file.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

SCHEMA_VERSION = 1

STUDENT_COLUMNS = [  # the first columns of students.csv, in order; config and env stamp follow
    "schema_version", "run_id", "student", "backend", "recipe", "mode", "gemm_precision", "status", "reason",
    "initial_loss", "first_step_loss", "final_train_loss", "eval_mse",
    "step_ms_median", "step_ms_p20", "step_ms_p80", "step_ms_mean", "tokens_per_s", "tflops",
    "peak_mem_allocated_mb", "peak_mem_reserved_mb", "mem_floor_mb", "teacher_ms_median", "steps_run",
    "compiled", "graphed", "compile_ms", "capture_ms", "notes",
]
ENV_STAMP = ["gpu_name", "compute_capability", "torch", "torch_cuda", "te_version", "git_sha"]


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


def write_json(path: Path, obj: Any) -> Path:
    return _atomic_write(path, lambda f: json.dump(obj, f, indent=2, sort_keys=False, default=str))


def write_csv(path: Path, df: pd.DataFrame) -> Path:
    return _atomic_write(path, lambda f: df.to_csv(f, index=False))


def write_bytes(path: Path, data: bytes) -> Path:
    return _atomic_write(path, lambda f: f.write(data), mode="wb")


def write_figure(fig, folder: Path, name: str) -> list[Path]:
    """A matplotlib figure as <name>.png and <name>.svg, each written atomically."""
    paths = []
    for ext in ("png", "svg"):
        def save(f, ext=ext):
            fig.savefig(f, format=ext, dpi=110)
        paths.append(_atomic_write(Path(folder) / f"{name}.{ext}", save, mode="wb"))
    return paths


def read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


def students_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    first = [c for c in STUDENT_COLUMNS if c in df.columns]
    return df[first + [c for c in df.columns if c not in first]]


def run_dirs(path: str | Path, marker: str = "students.csv") -> list[Path]:
    """`path` itself if it is a run folder (has `marker`), else every run folder below it (sorted)."""
    path = Path(path)
    if (path / marker).exists():
        return [path]
    return sorted(p.parent for p in path.rglob(marker))


def load(path: str | Path) -> pd.DataFrame:
    """students.csv of one run, or of every run below `path`, as one DataFrame."""
    dirs = run_dirs(path)
    if not dirs:
        raise FileNotFoundError(f"no students.csv in or below {path}")
    return pd.concat([pd.read_csv(d / "students.csv") for d in dirs], ignore_index=True)


def load_losses(run_dir: str | Path) -> pd.DataFrame:
    return pd.read_csv(Path(run_dir) / "losses.csv")


def load_summary(run_dir: str | Path) -> dict[str, Any]:
    return read_json(Path(run_dir) / "summary.json")


def load_config(run_dir: str | Path):
    from workbench.config import Config

    return Config.from_dict(read_json(Path(run_dir) / "config.json")["config"])
