"""bench.csv's rows, rebuilt from a bench folder's files: each student's run row with its peaks, its teacher's
share, its repeats and profiler sums, and the '× tutorial' ratios against the tutorial-equivalent students
measured in the same bench."""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pandas as pd

from workbench import config as config_mod
from workbench import results
from workbench.bench.cells import div, integer, num, pct, precision_of, read, text, truthy
from workbench.measure import flops, peaks, profiler
from workbench.measure.profiler import host_bound  # one rule for bench and runs
from workbench.models import kinds

COLUMNS = [  # bench.csv, in order (env stamp and cfg_* columns follow)
    "schema_version", "bench_id", "preset", "variant", "student", "backend", "recipe", "precision",
    "status", "reason", "notes", "compiled", "graphed", "graph_scope", "layout", "param_dtype", "fused_optimizer",
    "optimizer",
    "step_ms_median", "step_ms_p20", "step_ms_p80", "tokens_per_s", "train_gflop_per_step", "tflops",
    "measured_peak_tflops", "pct_of_measured_peak", "datasheet_peak_tflops", "pct_of_datasheet_peak",
    "tutorial_bf16_ms", "speedup_vs_tutorial", "tutorial_same_path_ms", "speedup_vs_tutorial_same_path",
    "tutorial_rows", "fastest_bf16_ms", "fastest_bf16_row", "speedup_vs_fastest_bf16",
    "teacher_precision", "teacher_ms_median", "teacher_pct_of_student_step", "teacher_share_pct", "teacher_tflops",
    "teacher_pct_of_measured_peak", "repeats", "median_spread_pct", "host_bound",
    "profiled_step_ms_median", "kernel_ms_per_step", "gpu_busy_ms_per_step", "kernels_per_step",
    "kernel_to_event_ratio", "kernel_sum_to_event_ratio", "capture_ms", "compile_ms",
    "peak_mem_allocated_mb", "peak_mem_reserved_mb",
    "mem_floor_mb",
    "final_train_loss", "eval_mse", "run_dir",
]


# ---- observations: each timed region's repeats and profiled block -------------------------------
def observations(run_dir: Path, rows: list[dict] | None = None) -> dict[str, Any]:
    """observations.json of one run: per timed region (the teacher, each student) its repeat medians and
    profiled block, in the shape earlier benches wrote. Read from the rows' own cells and the profile
    files; a run written before rows carried them keeps the observations.json it has."""
    rows = results.load(run_dir, include_incomplete=True).to_dict("records") if rows is None else rows
    old = read(Path(run_dir) / "observations.json") or {}
    old_students = old.get("students") or {}
    return {
        "teacher": _region(run_dir, rows[0], "teacher_ms", "teacher", old.get("teacher")) if rows else None,
        "students": {r["student"]: _region(run_dir, r, "step_ms", r["student"], old_students.get(r["student"]))
                     for r in rows},
        "unmatched": old.get("unmatched") or [],  # earlier files' regions no row claimed; none since rows carry them
    }


def _region(run_dir: Path, r: dict, prefix: str, who: str, old: dict | None) -> dict | None:
    """One timed region from row `r`'s `<prefix>_*` cells and run_dir/profile-<who>.json."""
    if f"{prefix}_repeats" not in r:  # a run from before the rows carried repeats: its observations.json
        return old
    median = num(r.get(f"{prefix}_median"))
    if median is None:  # skipped, failed or diverged before its timed region
        return None
    medians = json.loads(r[f"{prefix}_repeat_medians"])
    profile = read(profiler.profile_path(run_dir, who)) or {}
    return {"median_ms": median, "iters": integer(r.get("cfg_iters")), "repeats": len(medians),
            "repeat_medians_ms": medians, "median_of_medians_ms": statistics.median(medians) if medians else None,
            "median_spread_pct": num(r.get(f"{prefix}_repeat_spread_pct")), **profile}


# ---- the rows ------------------------------------------------------------------------------------
def shape_is_preset(preset: str, row: dict[str, Any]) -> bool:
    """True when the row's model dims are the preset's own (tutorial figures and targets apply)."""
    if preset not in config_mod.PRESETS:
        return False
    m = config_mod.PRESETS[preset]().model
    return all(num(row.get(f"cfg_{k}")) == getattr(m, k)
               for k in ("vocab", "hidden", "intermediate", "layers", "seq_len", "batch"))


def bench_rows(bench_dir: Path) -> pd.DataFrame:
    """bench.csv's rows, from peak.json and runs/<variant>/{students.csv, profile-*.json, not_run.csv}
    (observations.json for variants run before the rows carried the repeats)."""
    bench_dir = Path(bench_dir)
    meta = read(bench_dir / "bench.json") or {}
    peak = read(bench_dir / "peak.json") or {}
    order = list((meta.get("variants") or {}).keys())
    runs = sorted((p for p in (bench_dir / "runs").glob("*") if p.is_dir()),
                  key=lambda p: order.index(p.name) if p.name in order else len(order))
    rows = []
    for run_dir in runs:
        rows += _variant_rows(bench_dir, run_dir, meta, peak)
    _with_tutorial_ratios(rows)
    with_fastest_bf16(rows)
    df = pd.DataFrame(rows)
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = None
    df["schema_version"] = results.SCHEMA_VERSION
    df["bench_id"] = meta.get("bench_id", bench_dir.name)
    df["preset"] = meta.get("preset")
    return df[COLUMNS + [c for c in df.columns if c not in COLUMNS]]


def _variant_rows(bench_dir: Path, run_dir: Path, meta: dict, peak: dict) -> list[dict]:
    """One variant's rows: its students that ran (students.csv), then those that did not (not_run.csv)."""
    variant, rows = run_dir.name, []
    # students.csv is written whole once every student ran (a run that failed before is in not_run.csv);
    # benches from before runs had a done.json marker are read the same way
    if (run_dir / "students.csv").exists():
        students = results.load(run_dir, include_incomplete=True).to_dict("records")
        obs = observations(run_dir, students)
        for r in students:
            rows.append(_bench_row(meta, peak, variant, r, obs["students"][r["student"]], obs["teacher"],
                                   run_dir.relative_to(bench_dir)))
    if (run_dir / "not_run.csv").exists():
        for r in results.read_csv(run_dir / "not_run.csv").to_dict("records"):
            name, _, recipe = str(r["student"]).partition(":")
            rows.append({"variant": variant, "student": r["student"], "backend": name, "recipe": recipe or None,
                         "precision": precision_of(r["student"]), "status": r["status"], "reason": r["reason"]})
    return rows


# ---- the '× tutorial' ratios ---------------------------------------------------------------------
def _is_tutorial_path(r: dict) -> bool:
    """The tutorial's way of running a student: eager (no compile, no graphs), its separate layout, fp32
    master weights, torch's plain AdamW; ran as itself (not a fallback)."""
    return (r.get("status") == "ok" and num(r.get("step_ms_median")) is not None
            and not truthy(r.get("compiled")) and not truthy(r.get("graphed"))
            and r.get("layout") == "separate" and r.get("param_dtype") == "fp32"
            and not truthy(r.get("fused_optimizer")) and text(r.get("optimizer")) in ("", "AdamW", "adamw"))


def tutorial_steps(rows: list[dict]) -> tuple[dict | None, dict | None]:
    """The tutorial-equivalent rows of this bench: (bf16 student, TE FP8 student). bf16: torch_bf16 on the
    tutorial's path; FP8: te_fp8 with the tutorial's recipe (delayed E4M3), else delayed HYBRID, on that
    path. The first such row in the bench's order; None where the bench did not run one."""
    path = [r for r in rows if _is_tutorial_path(r)]
    bf16 = next((r for r in path if r["backend"] == "torch_bf16"), None)
    fp8 = next((r for recipe in ("delayed_e4m3", "delayed") for r in path
                if r["backend"] == "te_fp8" and r.get("recipe") == recipe), None)
    return bf16, fp8


def _with_tutorial_ratios(rows: list[dict]) -> None:
    """Fill every row's '× tutorial' cells from the tutorial-equivalent students measured in the same bench
    (`tutorial_steps`); same path: an FP8 row against the tutorial's TE FP8 student, others against bf16."""
    bf16, fp8 = tutorial_steps(rows)
    bf16_ms = num(bf16["step_ms_median"]) if bf16 else None
    fp8_ms = num(fp8["step_ms_median"]) if fp8 else None
    who = "; ".join(f"{r['variant']} / {r['student']}" for r in (bf16, fp8) if r) or None
    for r in rows:
        step = num(r.get("step_ms_median"))
        same = fp8_ms if r.get("precision") == "fp8" else bf16_ms
        r.update(tutorial_bf16_ms=bf16_ms, speedup_vs_tutorial=div(bf16_ms, step), tutorial_same_path_ms=same,
                 speedup_vs_tutorial_same_path=div(same, step), tutorial_rows=who)


def fastest_bf16(rows: list[dict]) -> dict | None:
    """The bench's denominator (the verdict reads it too): its fastest bf16 row that ran its own backend (compiled,
    TE bf16 layers, graphed: whichever won; never a no-KD student, which skips the distillation loss, nor a
    distributed run's one-process reference row); None where no bf16 row ran."""
    bf16 = [r for r in rows if r.get("status") == "ok" and r.get("precision") == "bf16"
            and ":no_kd" not in str(r.get("student")) and results.REFERENCE_SUFFIX not in str(r.get("student"))
            and num(r.get("step_ms_median")) is not None]
    return min(bf16, key=lambda r: num(r["step_ms_median"])) if bf16 else None


def with_fastest_bf16(rows: list[dict]) -> None:
    """Every row's '× fastest bf16': the bench's fastest bf16 row (`fastest_bf16`) over its step."""
    best = fastest_bf16(rows)
    ms = num(best["step_ms_median"]) if best else None
    who = f"{best['variant']} / {best['student']}" if best else None
    for r in rows:
        r.update(fastest_bf16_ms=ms, fastest_bf16_row=who,
                 speedup_vs_fastest_bf16=div(ms, num(r.get("step_ms_median"))))


# ---- one row's cells -----------------------------------------------------------------------------
def _teacher_cells(r: dict, step: float | None, peak: dict) -> dict[str, Any]:
    """The teacher's share of a distillation step (its forward + the student's step) and, where the teacher
    has the student's shape (the MLP task; an LM preset without teacher_* dims), its TFLOP/s (a forward is
    a third of the student's train FLOPs) against the measured peak of the precision it ran in."""
    t = num(r.get("teacher_ms_median"))
    share = pct(t, (t + step) if t is not None and step is not None else None)
    kind = r.get("cfg_kind")
    same_shape = kind is None or not kinds.is_lm(kind) or (
        all(not num(r.get(f"cfg_teacher_{k}")) for k in ("hidden", "layers", "intermediate", "heads"))
        and r.get("cfg_teacher") in ("train", "random"))
    gflop = num(r.get("train_gflop_per_step"))  # rows from before it was a cell: no teacher TFLOP/s
    tflops = flops.tflops(gflop * 1e9 / 3, t) if same_shape and gflop and t else None
    prec = r.get("teacher_precision_used")  # what ran: an FP8 teacher against the FP8 peak, a fallback against its own
    if not isinstance(prec, str):  # rows from before it was a cell
        prec = {"auto": "bf16" if isinstance(r.get("gpu_name"), str) else "fp32"}.get(
            r.get("cfg_teacher_precision"), r.get("cfg_teacher_precision"))
    return {"teacher_precision": prec, "teacher_share_pct": share, "teacher_tflops": tflops,
            "teacher_pct_of_measured_peak": pct(tflops, peaks.measured_tflops(peak, prec))}


def _profiled_cells(obs: dict, teacher_obs: dict | None, step: float | None) -> dict[str, Any]:
    """The repeats' spread and the profiled block's sums of one student (and its teacher's spread)."""
    return {
        "repeats": obs.get("repeats"), "median_spread_pct": obs.get("median_spread_pct"),
        "teacher_median_spread_pct": (teacher_obs or {}).get("median_spread_pct"),
        "profiled_step_ms_median": obs.get("profiled_step_ms_median"),
        "kernel_ms_per_step": obs.get("kernel_ms_per_step"), "gpu_busy_ms_per_step": obs.get("gpu_busy_ms_per_step"),
        "kernels_per_step": obs.get("kernels_per_step"),
        "kernel_to_event_ratio": div(obs.get("gpu_busy_ms_per_step"), step),
        "host_bound": host_bound(div(obs.get("gpu_busy_ms_per_step"), step)),
        "kernel_sum_to_event_ratio": div(obs.get("kernel_ms_per_step"), step),
        "profiler_reason": obs.get("profiler_reason"),
    }


def _bench_row(meta, peak, variant, r, obs, teacher_obs, run_dir) -> dict[str, Any]:
    """bench.csv's row of student `r` (a students.csv row) of one variant's run."""
    # the row's own GEMM precision (a fallback row ran torch autocast, whatever backend it stands for)
    precision = r.get("gemm_precision") if isinstance(r.get("gemm_precision"), str) else precision_of(r["student"])
    step = num(r.get("step_ms_median"))
    measured, sheet = peaks.measured_tflops(peak, precision), peaks.datasheet_tflops(peak, precision)
    m = config_mod.ModelConfig(**{k: int(r[f"cfg_{k}"]) for k in ("vocab", "hidden", "intermediate", "layers",
                                                                  "seq_len", "batch")})
    row = {
        "variant": variant, "student": r["student"], "backend": r["backend"], "recipe": r.get("recipe"),
        "precision": precision, "status": r["status"], "reason": r.get("reason"), "notes": r.get("notes"),
        "compiled": r.get("compiled", r.get("cfg_compile")), "graphed": r.get("graphed", r.get("cfg_graphs")),
        "layout": r.get("cfg_layout"), "param_dtype": r.get("cfg_param_dtype"),
        "fused_optimizer": r.get("cfg_fused_optimizer"),
        "step_ms_median": step, "step_ms_p20": r.get("step_ms_p20"), "step_ms_p80": r.get("step_ms_p80"),
        # runs written before rows carried their model's count (MLP students only): recount from the config
        "tokens_per_s": r.get("tokens_per_s"),
        "train_gflop_per_step": r.get("train_gflop_per_step") or flops.train_flops(m) / 1e9,
        "tflops": r.get("tflops"),
        "measured_peak_tflops": measured, "pct_of_measured_peak": pct(r.get("tflops"), measured),
        "datasheet_peak_tflops": sheet, "pct_of_datasheet_peak": pct(r.get("tflops"), sheet),
        "optimizer": r.get("optimizer", r.get("cfg_optimizer")), "graph_scope": r.get("graph_scope"),
        # LM rows: the logit loss that ran
        **({"loss_impl": r["loss_impl"]} if isinstance(r.get("loss_impl"), str) else {}),
        # TE rows of a Hugging Face student: the conversion that ran (decoder layers or per Linear) and why
        **{k: r[k] for k in ("te_conversion", "te_conversion_note") if isinstance(r.get(k), str)},
        "teacher_ms_median": r.get("teacher_ms_median"),
        "teacher_pct_of_student_step": pct(r.get("teacher_ms_median"), step),
        **_teacher_cells(r, step, peak),
        **_profiled_cells(obs or {}, teacher_obs, step),
        "capture_ms": r.get("capture_ms"), "compile_ms": r.get("compile_ms"),
        "peak_mem_allocated_mb": r.get("peak_mem_allocated_mb"), "peak_mem_reserved_mb": r.get("peak_mem_reserved_mb"),
        "mem_floor_mb": r.get("mem_floor_mb"),
        "final_train_loss": r.get("final_train_loss"), "eval_mse": r.get("eval_mse"), "run_dir": str(run_dir),
        "torchao_version": meta.get("torchao_version"),
    }
    row.update({k: r.get(k) for k in results.ENV_STAMP})
    row.update({k: v for k, v in r.items() if k.startswith("cfg_")})
    return row
