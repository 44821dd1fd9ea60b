"""The `workbench study` command: run a study's arms x seeds as a resumable sweep, the teacher once before
the first point, then the report notebook. See `workbench.study` for the study and its files."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from workbench import config, notebook, results
from workbench.config import ConfigError
from workbench.study.report import report, run_report_notebook
from workbench.study.spec import (
    DEFAULT_ROOT,
    PRESETS,
    STUDY_FILE,
    TEACHER_FILE,
    Study,
    check,
    from_preset,
    parse_seeds,
    point_overrides,
    read_study,
    sweep_spec,
)
from workbench.sweep.cluster import check_workers, per_gpu, visible_gpus


# ---- the teacher ---------------------------------------------------------------------------------
def ensure_teacher(study: Study, study_dir: Path) -> dict[str, Any] | None:
    """Train (or find) the study's one teacher before any point runs, in its own process (no GPU memory
    held by this driver): every point then finds it in <study>/cache. None when the teacher is not
    trained here (lm.teacher is a Hugging Face folder, or 'random')."""
    first = {**study.fixed, **point_overrides(study)[0]}
    cfg = config.from_preset(study.preset, **first)
    from workbench.models import kinds  # torch: only once a study needs its teacher

    if not kinds.is_lm(cfg.model.kind) or cfg.lm.teacher != "train":
        return None
    sets = [f"--set={k}={_cli_value(v)}" for k, v in first.items()]
    cmd = [sys.executable, "-m", "workbench", "teacher", "--preset", study.preset, "--out", str(study_dir), *sets]
    print("workbench study: the teacher (trained once, then cached for every point)", file=sys.stderr)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        raise RuntimeError(f"the teacher could not be trained (exit {proc.returncode}): {' '.join(cmd)}")
    info = json.loads(lines[-1])
    results.write_json(study_dir / TEACHER_FILE, info)
    return info


def set_aside_oom_points(study_dir: Path) -> list[str]:
    """Move each complete point whose index row says a student ran out of GPU memory (`done`, error_kind `oom`)
    to <study>/oom/<id>-<n>/, so that the sweep runs it again; the ids moved. In a study every arm has the same
    shape, so an OOM is the machine's state (other points beside it held the memory), not a result, and a seed
    missing from one arm would narrow its interval for nothing. Moved, not deleted: the folder is kept."""
    from workbench.sweep.index import read_index

    try:
        index = read_index(study_dir)
    except results.DamagedResults:
        return []  # the sweep rebuilds a damaged index from the folders
    moved = []
    for pid in index.loc[(index["status"] == "done") & (index["error_kind"] == "oom"), "point"]:
        src = study_dir / pid
        if not results.is_complete(src):
            continue
        n = 1
        while (study_dir / "oom" / f"{pid}-{n}").exists():
            n += 1
        (study_dir / "oom").mkdir(exist_ok=True)
        src.rename(study_dir / "oom" / f"{pid}-{n}")
        moved.append(pid)
    if moved:
        print(f"workbench study: {len(moved)} point(s) had a student run out of GPU memory, running again: "
              f"{', '.join(moved)} (kept under {study_dir / 'oom'})", file=sys.stderr)
    return moved


def shared_cache(folder: str | None) -> str | None:
    """The --cache folder, resolved and created, and made this process's cache (results.CACHE_ENV) so that the
    teacher's process and every point's kernel inherit it; None: each run's own, the study's <study>/cache.
    Every entry is named by a hash of what it holds (the top-k store's: teacher weights, text, seed, steps,
    shape, k) and built under a lock, so studies side by side read one store where their recipes agree: the
    depth-pruned and the random student of one teacher train on the same batches at each seed."""
    if not folder:
        return None
    path = results.output_root(folder)  # a folder that cannot be written fails here, before any teacher
    os.environ[results.CACHE_ENV] = str(path)
    return str(path)


def _cli_value(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def points_per_gpu(study: Study, stored: Path, workers: str | int) -> int:
    """The most points that shared a GPU over this run of the study and the earlier ones (`stored` study.json):
    K of `--workers K/gpu` where there is a GPU (a CPU's one worker shares nothing)."""
    try:
        earlier = read_study(stored).points_per_gpu if stored.exists() else 1
    except ConfigError:  # a study.json this version cannot read is rewritten by this run, as before
        earlier = 1
    sharing = per_gpu(check_workers(workers)) if visible_gpus() else 1
    return max(earlier, study.points_per_gpu, sharing)


# ---- CLI -----------------------------------------------------------------------------------------
def add_arguments(p) -> None:
    p.add_argument("--preset", default=None, help=f"study preset: {', '.join(PRESETS)} (a bare --name resumes)")
    p.add_argument("--name", default=None, help="study name, the folder <out>/<name> (default: the preset's name)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override for every point, e.g. --set lm.student=DIR --set lm.teacher=DIR")
    p.add_argument("--seeds", default=None, help="the students' seeds, e.g. 1,2,3 (default: the preset's)")
    p.add_argument("--out", default=str(DEFAULT_ROOT), help="parent folder of the study folder")
    p.add_argument("--workers", default="auto", help="workers of the sweep's Dask cluster (see `sweep --help`)")
    p.add_argument("--budget-s", type=float, default=None, metavar="SECONDS",
                   help="start no point that would not end within this many seconds of the study's start (the "
                        "teacher's training counted), by its seeds' earlier points; see `sweep --help`")
    p.add_argument("--cache", default=None, metavar="DIR",
                   help="folder of the text, teacher and top-k caches (default: the study's own <study>/cache); "
                        "studies of one teacher, text and steps share their top-k stores through one such folder")
    p.add_argument("--no-report", action="store_true", help="run the points, skip the report")
    p.add_argument("--report-only", action="store_true", help="only (re)write the report of an existing study")
    p.add_argument("--compare", nargs="+", default=None, metavar="NAME",
                   help="put two or more studies (folders under --out, or paths) side by side in <out>/comparison/: "
                        "a table, a figure, a page; runs nothing")


def study_from_args(args) -> Study:
    name = args.name or args.preset
    if not name:
        raise ConfigError("give --preset (a study preset) or --name of an existing study")
    stored = Path(args.out) / results.check_name(name, "study name") / STUDY_FILE
    if not args.preset and stored.exists():
        study = read_study(stored)  # resume, plus any new --set
        study.fixed.update(config.parse_set(args.overrides))
        check(study)
        return study
    if not args.preset:
        raise ConfigError(f"no study {stored.parent}: give --preset ({', '.join(PRESETS)})")
    return from_preset(args.preset, config.parse_set(args.overrides), parse_seeds(args.seeds), name)


def main(args) -> int:
    from workbench.sweep import run as sweep

    if args.compare:
        from workbench.study.compare import compare

        root = Path(args.out)
        dirs = [Path(n) if Path(n).is_dir() else root / results.check_name(n, "study name") for n in args.compare]
        table = compare(dirs, root / "comparison")
        print(json.dumps({"comparison": str(root / "comparison"), "rows": len(table)}))
        return 0
    study = study_from_args(args)
    deadline = sweep.budget_deadline(args.budget_s)  # from the start: the teacher counts
    study_dir = sweep.sweep_folder(results.output_root(args.out), study.name)
    if not args.report_only:
        study.points_per_gpu = points_per_gpu(study, study_dir / STUDY_FILE, args.workers)
    if args.report_only:
        if not (study_dir / STUDY_FILE).exists():
            print(f"workbench study: no report: no study folder {study_dir}", file=sys.stderr)
            return 1
        head = report(study_dir)
        print(json.dumps({"study_dir": str(study_dir), **head}, default=str))
        return 0 if not head["refused"] else 1
    notebook.require_stack()  # before the teacher trains: every point is a notebook
    spec = sweep_spec(study)
    study_dir.mkdir(parents=True, exist_ok=True)
    cache = shared_cache(args.cache)
    sweep.stop_on_signals()  # a kill stops the study like Ctrl-C: a rerun resumes
    try:
        # the sweep's lock before any write: a second study refused here must not rewrite the running one's
        # study.json / teacher.json (its report would then list the finished points as not run)
        with sweep.sweep_lock(study_dir):
            results.write_json(study_dir / STUDY_FILE, study.to_dict())
            ensure_teacher(study, study_dir)
            set_aside_oom_points(study_dir)
            # cache=None: the points' caches are <study>/cache, where ensure_teacher put the teacher (the sweep's
            # default, results/cache under the working folder, had every study train its teacher a second time);
            # a --cache folder is the teacher's and the points' alike (shared_cache set it for both)
            summary = sweep.run_sweep(spec, root=args.out, workers=args.workers, cache=cache, deadline=deadline)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(sweep.stopped_line("study", study.name), file=sys.stderr)
        return 130
    summary["study_dir"] = summary.pop("sweep_dir")
    rc = 1 if summary["failed"] else 0
    if not args.no_report:
        run_report_notebook(study_dir)
        head = results.read_json(study_dir / "headline.json")
        summary["headline"] = head["sentence"]
        if head["refused"]:
            print(f"workbench study: {head['sentence']}", file=sys.stderr)
            rc = 1
    print(json.dumps(summary, default=str))  # last line: machine-readable
    return rc
