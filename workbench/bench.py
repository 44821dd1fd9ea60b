"""`workbench bench`: every backend's best path, side by side, against the hardware's ceiling.

    python -m workbench bench --preset large --out results/bench --run-id large
    python -m workbench bench --preset seed --variants eager,graphs-fused-bf16 --out results/bench
    python -m workbench bench --list                                  # the variant catalogue
    python -m workbench bench --markdown results/bench [--readme PATH]   # tables from the files
    python -m workbench bench --write-readme results/reference/h200/bench  # its README.md, from targets.json

A *variant* is a set of config overrides (eager / compile / graphs, layout, parameter dtype, fused
optimizer) and the students worth running under it; the catalogue is data (VARIANTS). Each variant is
one `runner.run` into OUT/<run_id>/runs/<variant>/ with the config's `repeats` (the noise figure, P4)
and `profile` (one profiled block per timed region, the cross-check) set from --repeats and
--no-crosscheck: each student's row carries its repeat medians and profiler sums, its per-kernel
detail is in profile-<student>.json. A student the config rejects (e.g. a backend file not in this
checkout) or a variant whose run fails becomes an 'error' row with the reason; the bench goes on.

OUT/<run_id>/ holds
  peak.json        matmul peaks measured in this run (bf16/fp16/fp32/FP8) + datasheet entry with sources
  runs/<variant>/  what `run` writes (with profile-*.json), plus observations.json: per timed region (teacher,
                   each student) the repeat medians and the profiled block, gathered from those files
  bench.csv        one row per (variant, student), units in the column names (see COLUMNS)
  profiler.json  event-timed median vs torch.profiler kernel-time sum per row; headline at `large`
  targets.json     the P1-P6 targets (TARGETS): goal, best achieved, by which row, met (null = not judged here),
                   and where missed the profiler's kernel categories of that row
  bench.json       what was asked, variant status and wall time, environment
  bench.md         the Markdown tables (`--markdown` renders the same from any folder of benches)
  step_time_by_backend.png/.svg, pct_of_peak.png/.svg
bench.csv, profiler.json, targets.json and the tables are rebuilt from the other files by `aggregate()`.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import math
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from workbench import config as config_mod
from workbench import results
from workbench.measure import profiler, flops, peaks
from workbench.config import ConfigError

# ---- variants (data) -----------------------------------------------------------------------------
TE = ("te_bf16", "te_fp8:delayed", "te_fp8:current", "te_fp8:block")
TORCHAO = ("torchao_float8:tensorwise", "torchao_float8:rowwise")
BF16 = {"param_dtype": "bf16", "fused_optimizer": True}
FUSED_BF16 = {"layout": "fused", **BF16}
STEP = {"graphs": True, "te_graph": "step"}  # TE students graph their whole step, like the torch students
TE_ADAM = {"optimizer": "te_fused_adam"}


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: dict[str, Any]
    """Config overrides (flat field names) on top of the preset and the user's --set."""
    backends: tuple[str, ...]
    """Students run under this variant (the first is the run's baseline)."""
    doc: str = ""


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("tutorial", {}, ("torch_bf16", "te_fp8:delayed_e4m3"),
            "the tutorial's two students as it runs them (eager, its layout, fp32 master weights, bf16 autocast; "
            "TE delayed E4M3): every '× tutorial' ratio of the bench divides by these, measured in the same run"),
    Variant("eager", {}, ("torch_fp32", "torch_bf16") + TE,
            "the tutorial's layout and fp32 master weights, no compile, no graphs"),
    Variant("eager-fused-bf16", FUSED_BF16, ("torch_bf16",) + TE,
            "fused block (te.LayerNormMLP / torch equivalent), bf16 parameters, fused AdamW"),
    Variant("smoke", {}, ("torch_fp32", "torch_bf16", "te_fp8:delayed"),
            "the cpu-smoke preset's students: seconds on a CPU (tests, `make bench` without a GPU)"),
    # torchao converts nn.Linear modules, so its students live in the separate layout
    Variant("compile", {"compile": True}, ("torch_bf16",) + TORCHAO,
            "torch.compile of the torch students, tutorial layout, fp32 masters (torchao always runs compiled)"),
    Variant("compile-bf16", {"compile": True, **BF16}, ("torch_bf16",) + TORCHAO,
            "compiled, tutorial layout, bf16 parameters, fused AdamW"),
    Variant("compile-graphs-bf16", {"compile": True, "graphs": True, **BF16}, ("torch_bf16",) + TORCHAO,
            "compiled and graphed, tutorial layout, bf16 parameters, fused AdamW"),
    Variant("compile-fused-bf16", {"compile": True, **FUSED_BF16}, ("torch_bf16",),
            "compiled, fused layout, bf16 parameters, fused AdamW"),
    Variant("compile-graphs-fused-bf16", {"compile": True, "graphs": True, **FUSED_BF16}, ("torch_bf16",),
            "compiled and graphed, fused layout, bf16 parameters, fused AdamW (P1's fastest path)"),
    Variant("graphs", {"graphs": True}, ("torch_bf16",) + TE,
            "CUDA graphs (whole torch step; TE via make_graphed_callables), tutorial layout, fp32 masters"),
    Variant("graphs-fused-bf16", {"graphs": True, **FUSED_BF16}, ("torch_bf16",) + TE,
            "CUDA graphs, fused layout, bf16 parameters, fused AdamW"),
    Variant("graphs-step", STEP, TE,
            "the whole TE step (forward, loss, backward, AdamW, FP8 scale updates) in one CUDA graph, tutorial "
            "layout, fp32 masters"),
    Variant("graphs-step-fused-bf16", {**STEP, **FUSED_BF16}, ("torch_bf16",) + TE,
            "the whole step in one CUDA graph for every student, fused layout, bf16 parameters, fused AdamW"),
    Variant("te-adam-graphs-step-fused-bf16", {**STEP, **FUSED_BF16, **TE_ADAM},
            ("torch_bf16", "te_fp8:delayed", "te_fp8:current"),
            "whole-step graphs, fused layout, bf16 parameters, TE's FusedAdam with fp32 master weights"),
    Variant("te-adam-bf16-moments-graphs-step-fused-bf16", {**STEP, **FUSED_BF16, **TE_ADAM, "moments_dtype": "bf16"},
            ("torch_bf16", "te_fp8:delayed", "te_fp8:current"),
            "as te-adam-graphs-step-fused-bf16 with the Adam moments in bf16"),
    Variant("fp8-weights-fused-bf16", {**FUSED_BF16, **TE_ADAM, "te_fp8_weights": True},
            ("te_fp8:delayed", "te_fp8:current"),
            "FP8 primary weights (te.quantized_model_init) with TE FusedAdam's fp32 masters, fused layout, eager "
            "(FusedAdam cannot capture the update of FP8 weights)"),
    # decoder stacks (lm-a, lm-b): the previous LM table's students, then the levers
    Variant("lm-compile", {"compile": True}, ("torch_bf16", "torchao_float8:tensorwise"),
            "compiled torch bf16 and torchao float8 students (fp32 masters, fused AdamW)"),
    Variant("lm-te", {}, ("te_bf16", "te_fp8:delayed"), "TE students, eager"),
    Variant("lm-te-step", STEP, ("te_fp8:delayed",), "the whole TE FP8 step in one CUDA graph"),
    Variant("lm-te-fp8-weights", {**TE_ADAM, "te_fp8_weights": True}, ("te_fp8:delayed",),
            "FP8 primary weights with TE FusedAdam's fp32 masters, eager"),
    # the logit loss as it ran before loss_impl=auto picked the fused one for forward_kl: the lever measured
    Variant("lm-checkpointed-loss", {"compile": True, "loss_impl": "checkpointed"}, ("torch_bf16", "te_fp8:delayed"),
            "the logit loss under autograd (each chunk recomputed in the backward), not fused: compiled torch bf16 "
            "and eager TE FP8"),
    Variant("lm-te-step-checkpointed-loss", {**STEP, "loss_impl": "checkpointed"}, ("te_fp8:delayed",),
            "the whole TE FP8 step in one CUDA graph, with the checkpointed logit loss"),
    # your own Hugging Face decoder (--set lm.student=DIR): how TE converts it, and the precision levers
    Variant("hf-compile", {"compile": True}, ("torch_bf16", "torchao_float8:tensorwise"),
            "the Hugging Face model compiled: torch bf16 and torchao float8 (fp32 masters, fused AdamW)"),
    Variant("hf-te-linear", {"te_conversion": "linear"}, ("te_bf16", "te_fp8:delayed"),
            "TE per Linear / RMSNorm (the model's own attention maths in torch), eager"),
    Variant("hf-te-layer", {"te_conversion": "layer"}, ("te_bf16", "te_fp8:delayed", "te_fp8:current"),
            "each decoder layer one te.TransformerLayer (fused QKV, SwiGLU, TE attention and RoPE), eager"),
    Variant("hf-te-layer-step", {**STEP, "te_conversion": "layer"}, ("te_bf16", "te_fp8:delayed", "te_fp8:current"),
            "TE decoder layers, the whole step in one CUDA graph"),
    Variant("hf-te-layer-fp8-dpa", {"te_conversion": "layer", "te_fp8_dpa": True}, ("te_fp8:delayed", "te_fp8:current"),
            "TE decoder layers with FP8 attention (fp8_dpa), eager; refused with TE's reason where cuDNN cannot"),
    Variant("hf-te-layer-fp8-head", {**STEP, "te_conversion": "layer", "te_head_precision": "fp8"},
            ("te_fp8:delayed", "te_fp8:current"),
            "TE decoder layers and an FP8 LM head (te.Linear; a tied head shares the embedding), whole-step graph"),
)}

# Default variant list per preset, most telling first (a --budget-s cut drops the tail). `large` skips
# compile-heavy repeats (each torch.compile costs 30-60 s) and runs fp32 eager only (~416 ms/step on the
# H200). Variants sharing a model sit next to each other: inductor's on-disk cache then hits.
DEFAULT_VARIANTS: dict[str, tuple[str, ...]] = {
    "seed": ("eager", "graphs-step-fused-bf16", "compile-graphs-fused-bf16", "graphs-fused-bf16", "graphs-step",
             "te-adam-graphs-step-fused-bf16", "compile-fused-bf16", "compile-graphs-bf16", "compile-bf16",
             "eager-fused-bf16", "graphs", "compile"),
    "large": ("tutorial", "graphs-step-fused-bf16", "fp8-weights-fused-bf16", "te-adam-graphs-step-fused-bf16",
              "te-adam-bf16-moments-graphs-step-fused-bf16", "graphs-fused-bf16", "eager", "compile-bf16",
              "eager-fused-bf16"),
    "lm-a": ("lm-te-step", "lm-compile", "lm-te", "lm-te-fp8-weights", "lm-checkpointed-loss",
             "lm-te-step-checkpointed-loss"),
    "lm-b": ("lm-te-step", "lm-compile", "lm-te", "lm-te-fp8-weights", "lm-checkpointed-loss",
             "lm-te-step-checkpointed-loss"),
    "cpu-smoke": ("smoke",),
}

COLUMNS = [  # bench.csv, in order (env stamp and cfg_* columns follow)
    "schema_version", "bench_id", "preset", "variant", "student", "backend", "recipe", "precision",
    "status", "reason", "notes", "compiled", "graphed", "graph_scope", "layout", "param_dtype", "fused_optimizer",
    "optimizer",
    "step_ms_median", "step_ms_p20", "step_ms_p80", "tokens_per_s", "train_gflop_per_step", "tflops",
    "measured_peak_tflops", "pct_of_measured_peak", "datasheet_peak_tflops", "pct_of_datasheet_peak",
    "tutorial_bf16_ms", "speedup_vs_tutorial", "tutorial_same_path_ms", "speedup_vs_tutorial_same_path", "tutorial_rows",
    "teacher_precision", "teacher_ms_median", "teacher_pct_of_student_step", "teacher_share_pct", "teacher_tflops",
    "teacher_pct_of_measured_peak", "repeats", "median_spread_pct", "host_bound",
    "profiled_step_ms_median", "kernel_ms_per_step", "gpu_busy_ms_per_step", "kernels_per_step",
    "kernel_to_event_ratio", "kernel_sum_to_event_ratio", "capture_ms", "compile_ms", "peak_mem_allocated_mb", "peak_mem_reserved_mb",
    "mem_floor_mb",
    "final_train_loss", "eval_mse", "run_dir",
]


# ---- running -------------------------------------------------------------------------------------
@dataclass
class BenchOptions:
    preset: str = "auto"
    overrides: dict[str, Any] = field(default_factory=dict)
    variants: list[str] | None = None
    repeats: int = 3
    """Timed blocks per region for the noise figure (P4); the first is the run's own measurement."""
    crosscheck: bool = True
    """One more block per region under torch.profiler (the config's `profile`)."""
    budget_s: float | None = None
    """Skip the variants not yet started once this many seconds have passed (rows say so)."""


def resolve_variants(preset: str, names: list[str] | None) -> list[Variant]:
    names = list(names) if names else list(DEFAULT_VARIANTS.get(preset, ("eager",)))
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ConfigError(f"unknown bench variants {unknown}; allowed: {sorted(VARIANTS)}")
    return [VARIANTS[n] for n in names]


def variant_config(preset: str, overrides: dict[str, Any], v: Variant) -> tuple[Any, list[dict]]:
    """The variant's validated Config over the students the config accepts, and a row per rejected one."""
    from workbench import backends  # torch: only once a bench runs

    base = {**overrides, **v.overrides}
    ok, rejected = [], []
    for spec in v.backends:
        try:
            backends.check_specs([spec])  # the registry knows the backends, the config does not
            config_mod.from_preset(preset, **base, backends=[spec], baseline=spec)
            ok.append(spec)
        except ConfigError as e:
            rejected.append({"student": spec, "status": "error", "reason": f"config rejected: {e}"})
    if not ok:
        return None, rejected
    return config_mod.from_preset(preset, **base, backends=ok, baseline=ok[0]), rejected


def run_bench(opts: BenchOptions, out: str | Path = "results/bench", run_id: str | None = None,
              progress: bool = True) -> Path:
    """Peak probe, every variant, then aggregate(); returns OUT/<run_id>."""
    import torch

    from workbench.run import runner

    for key in opts.overrides:
        if config_mod.locate(key)[1] in ("backends", "baseline"):
            raise ConfigError("bench takes its students from the variants (--variants); drop --set backends/baseline")
        if config_mod.locate(key)[1] in ("repeats", "profile"):
            raise ConfigError("bench sets repeats and profile from --repeats and --no-crosscheck; drop --set repeats/profile")
    preset = config_mod.default_preset_name() if opts.preset == "auto" else opts.preset
    base_cfg = config_mod.from_preset(preset, **opts.overrides, repeats=opts.repeats, profile=opts.crosscheck)
    variants = resolve_variants(preset, opts.variants)
    device = runner.resolve_device(base_cfg)
    bench_dir = results.create_run_dir(out, run_id, f"{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-bench-{preset}")
    run_id = bench_dir.name
    t0 = time.perf_counter()
    # rewritten whole at the end; written now so that a bench cut short (a time limit) still aggregates at its preset
    results.write_json(bench_dir / "bench.json", {"schema_version": results.SCHEMA_VERSION, "bench_id": run_id,
                                                   "preset": preset, "status": "running"})

    _say(progress, f"[bench] peak probe on {device}")
    results.write_json(bench_dir / "peak.json", peaks.probe_matmul(device))

    status: dict[str, Any] = {}
    for v in variants:
        elapsed = time.perf_counter() - t0
        if opts.budget_s is not None and elapsed > opts.budget_s:
            status[v.name] = {"status": "skipped", "reason": f"time budget {opts.budget_s:.0f} s spent ({elapsed:.0f} s)"}
            _write_rejected(bench_dir, v, [{"student": s, "status": "skipped", "reason": status[v.name]["reason"]}
                                           for s in v.backends])
            continue
        _say(progress, f"[bench] variant {v.name} ({elapsed:.0f} s so far): {v.doc}")
        status[v.name] = _run_variant(v, preset, opts, bench_dir, progress)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if hasattr(torch, "_dynamo"):
            torch._dynamo.reset()  # compiled students of earlier variants must not eat the recompile limit

    results.write_json(bench_dir / "bench.json", {
        "schema_version": results.SCHEMA_VERSION, "bench_id": run_id, "preset": preset,
        "requested": {"preset": opts.preset, "overrides": opts.overrides, "variants": opts.variants,
                      "repeats": opts.repeats, "crosscheck": opts.crosscheck, "budget_s": opts.budget_s},
        "variants": {v.name: {"overrides": v.overrides, "backends": list(v.backends), "doc": v.doc,
                              **status.get(v.name, {})} for v in variants},
        "wall_s": time.perf_counter() - t0, "torchao_version": _version("torchao"),
    })
    aggregate(bench_dir)
    _say(progress, f"[bench] wrote {bench_dir} in {time.perf_counter() - t0:.0f} s")
    return bench_dir


def _run_variant(v: Variant, preset: str, opts: BenchOptions, bench_dir: Path, progress: bool) -> dict[str, Any]:
    from workbench.run import runner  # torch-heavy: imported when a bench really runs

    t = time.perf_counter()
    measured = {"repeats": opts.repeats, "profile": opts.crosscheck}
    try:
        cfg, rejected = variant_config(preset, {**opts.overrides, **measured}, v)
    except ConfigError as e:  # the variant's own overrides are not allowed here
        rejected, cfg = [{"student": s, "status": "error", "reason": f"config rejected: {e}"} for s in v.backends], None
    if cfg is None:
        _write_rejected(bench_dir, v, rejected)
        return {"status": "error", "reason": "no student of this variant passed config validation", "wall_s": 0.0}
    try:
        run_dir = runner.run(cfg, out=bench_dir / "runs", run_id=v.name, progress=progress,
                             requested={"bench_variant": v.name, "preset": preset, **opts.overrides, **measured,
                                        **v.overrides})
        results.write_json(run_dir / "observations.json", observations(run_dir))
        _write_rejected(bench_dir, v, rejected)  # after the run: runner.run creates its folder itself, new
        return {"status": "ok", "reason": "", "wall_s": time.perf_counter() - t}
    except Exception as e:  # a failing variant is rows that say why, never the end of the bench
        reason = f"{type(e).__name__}: {e}".strip()[:2000]
        _say(progress, traceback.format_exc())
        _write_rejected(bench_dir, v, rejected + [{"student": s, "status": "error", "reason": f"run failed: {reason}"}
                                                  for s in cfg.backends])
        return {"status": "error", "reason": reason, "wall_s": time.perf_counter() - t}


def _write_rejected(bench_dir: Path, v: Variant, rows: list[dict]) -> None:
    """Students that never ran (rejected, skipped, failed run) as rows of runs/<variant>/not_run.csv."""
    path = bench_dir / "runs" / v.name / "not_run.csv"
    if rows:
        results.write_csv(path, pd.DataFrame(rows, columns=["student", "status", "reason"]))


def observations(run_dir: Path, rows: list[dict] | None = None) -> dict[str, Any]:
    """observations.json of one run: per timed region (the teacher, each student) its repeat medians and
    profiled block, in the shape earlier benches wrote. Read from the rows' own cells and the profile
    files; a run written before rows carried them keeps the observations.json it has."""
    rows = results.load(run_dir, include_incomplete=True).to_dict("records") if rows is None else rows
    old = _read(Path(run_dir) / "observations.json") or {}
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
    median = _num(r.get(f"{prefix}_median"))
    if median is None:  # skipped, failed or diverged before its timed region
        return None
    medians = json.loads(r[f"{prefix}_repeat_medians"])
    profile = _read(profiler.profile_path(run_dir, who)) or {}
    return {"median_ms": median, "iters": _int(r.get("cfg_iters")), "repeats": len(medians),
            "repeat_medians_ms": medians, "median_of_medians_ms": statistics.median(medians) if medians else None,
            "median_spread_pct": _num(r.get(f"{prefix}_repeat_spread_pct")), **profile}


# ---- aggregation (files in, files out) -----------------------------------------------------------
def _num(x) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _int(x) -> int | None:
    f = _num(x)
    return None if f is None else int(f)


def _precision_of(spec: str) -> str | None:
    """GEMM precision of a student that has no row of its own (not run, or files from before the column)."""
    from workbench import backends

    try:
        return backends.make(spec).gemm_precision
    except Exception:  # a spec this version no longer knows
        return None


def _pct(a, b) -> float | None:
    a, b = _num(a), _num(b)
    return a / b * 100.0 if a is not None and b else None


def _div(a, b) -> float | None:
    a, b = _num(a), _num(b)
    return a / b if a is not None and b else None


def shape_is_preset(preset: str, row: dict[str, Any]) -> bool:
    """True when the row's model dims are the preset's own (tutorial figures and targets apply)."""
    if preset not in config_mod.PRESETS:
        return False
    m = config_mod.PRESETS[preset]().model
    return all(_num(row.get(f"cfg_{k}")) == getattr(m, k)
               for k in ("vocab", "hidden", "intermediate", "layers", "seq_len", "batch"))


def bench_rows(bench_dir: Path) -> pd.DataFrame:
    """bench.csv's rows, from peak.json and runs/<variant>/{students.csv, profile-*.json, not_run.csv}
    (observations.json for variants run before the rows carried the repeats)."""
    bench_dir = Path(bench_dir)
    meta = _read(bench_dir / "bench.json") or {}
    peak = _read(bench_dir / "peak.json") or {}
    order = list((meta.get("variants") or {}).keys())
    runs = sorted((p for p in (bench_dir / "runs").glob("*") if p.is_dir()),
                  key=lambda p: order.index(p.name) if p.name in order else len(order))
    rows = []
    for run_dir in runs:
        variant = run_dir.name
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
                             "precision": _precision_of(r["student"]), "status": r["status"], "reason": r["reason"]})
    _with_tutorial_ratios(rows)
    df = pd.DataFrame(rows)
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = None
    df["schema_version"] = results.SCHEMA_VERSION
    df["bench_id"] = meta.get("bench_id", bench_dir.name)
    df["preset"] = meta.get("preset")
    return df[COLUMNS + [c for c in df.columns if c not in COLUMNS]]


HOST_BOUND_BELOW, _host_bound = profiler.HOST_BOUND_BELOW, profiler.host_bound  # one rule for bench and runs


def _truthy(x) -> bool:
    return str(x).strip().lower() in ("true", "1", "1.0")


def _is_tutorial_path(r: dict) -> bool:
    """The tutorial's way of running a student: eager (no compile, no graphs), its separate layout, fp32
    master weights, torch's plain AdamW; ran as itself (not a fallback)."""
    return (r.get("status") == "ok" and _num(r.get("step_ms_median")) is not None
            and not _truthy(r.get("compiled")) and not _truthy(r.get("graphed"))
            and r.get("layout") == "separate" and r.get("param_dtype") == "fp32"
            and not _truthy(r.get("fused_optimizer")) and _text(r.get("optimizer")) in ("", "AdamW", "adamw"))


def _text(x) -> str:
    """A CSV cell as text: '' for empty (None, NaN)."""
    return x if isinstance(x, str) else ""


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
    bf16_ms = _num(bf16["step_ms_median"]) if bf16 else None
    fp8_ms = _num(fp8["step_ms_median"]) if fp8 else None
    who = "; ".join(f"{r['variant']} / {r['student']}" for r in (bf16, fp8) if r) or None
    for r in rows:
        step = _num(r.get("step_ms_median"))
        same = fp8_ms if r.get("precision") == "fp8" else bf16_ms
        r.update(tutorial_bf16_ms=bf16_ms, speedup_vs_tutorial=_div(bf16_ms, step), tutorial_same_path_ms=same,
                 speedup_vs_tutorial_same_path=_div(same, step), tutorial_rows=who)


def _teacher_cells(r: dict, step: float | None, peak: dict) -> dict[str, Any]:
    """The teacher's share of a distillation step (its forward + the student's step) and, where the teacher
    has the student's shape (the MLP task; an LM preset without teacher_* dims), its TFLOP/s (a forward is
    a third of the student's train FLOPs) against the measured peak of the precision it ran in."""
    t = _num(r.get("teacher_ms_median"))
    share = _pct(t, (t + step) if t is not None and step is not None else None)
    same_shape = r.get("cfg_kind") in (None, "mlp") or (
        all(not _num(r.get(f"cfg_teacher_{k}")) for k in ("hidden", "layers", "intermediate", "heads"))
        and r.get("cfg_teacher") in ("train", "random"))
    gflop = _num(r.get("train_gflop_per_step"))  # rows from before it was a cell: no teacher TFLOP/s
    tflops = flops.tflops(gflop * 1e9 / 3, t) if same_shape and gflop and t else None
    prec = r.get("teacher_precision_used")  # what ran: an FP8 teacher against the FP8 peak, a fallback against its own
    if not isinstance(prec, str):  # rows from before it was a cell
        prec = {"auto": "bf16" if isinstance(r.get("gpu_name"), str) else "fp32"}.get(
            r.get("cfg_teacher_precision"), r.get("cfg_teacher_precision"))
    return {"teacher_precision": prec, "teacher_share_pct": share, "teacher_tflops": tflops,
            "teacher_pct_of_measured_peak": _pct(tflops, peaks.measured_tflops(peak, prec))}


def _bench_row(meta, peak, variant, r, obs, teacher_obs, run_dir) -> dict[str, Any]:
    # the row's own GEMM precision (a fallback row ran torch autocast, whatever backend it stands for)
    precision = r.get("gemm_precision") if isinstance(r.get("gemm_precision"), str) else _precision_of(r["student"])
    step = _num(r.get("step_ms_median"))
    measured, sheet = peaks.measured_tflops(peak, precision), peaks.datasheet_tflops(peak, precision)
    obs = obs or {}
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
        "measured_peak_tflops": measured, "pct_of_measured_peak": _pct(r.get("tflops"), measured),
        "datasheet_peak_tflops": sheet, "pct_of_datasheet_peak": _pct(r.get("tflops"), sheet),
        "optimizer": r.get("optimizer", r.get("cfg_optimizer")), "graph_scope": r.get("graph_scope"),
        **({"loss_impl": r["loss_impl"]} if isinstance(r.get("loss_impl"), str) else {}),  # LM rows: the logit loss that ran
        # TE rows of a Hugging Face student: the conversion that ran (decoder layers or per Linear) and why
        **{k: r[k] for k in ("te_conversion", "te_conversion_note") if isinstance(r.get(k), str)},
        "teacher_ms_median": r.get("teacher_ms_median"),
        "teacher_pct_of_student_step": _pct(r.get("teacher_ms_median"), step),
        **_teacher_cells(r, step, peak),
        "repeats": obs.get("repeats"), "median_spread_pct": obs.get("median_spread_pct"),
        "teacher_median_spread_pct": (teacher_obs or {}).get("median_spread_pct"),
        "profiled_step_ms_median": obs.get("profiled_step_ms_median"),
        "kernel_ms_per_step": obs.get("kernel_ms_per_step"), "gpu_busy_ms_per_step": obs.get("gpu_busy_ms_per_step"),
        "kernels_per_step": obs.get("kernels_per_step"),
        "kernel_to_event_ratio": _div(obs.get("gpu_busy_ms_per_step"), step),
        "host_bound": _host_bound(_div(obs.get("gpu_busy_ms_per_step"), step)),
        "kernel_sum_to_event_ratio": _div(obs.get("kernel_ms_per_step"), step),
        "profiler_reason": obs.get("profiler_reason"),
        "capture_ms": r.get("capture_ms"), "compile_ms": r.get("compile_ms"),
        "peak_mem_allocated_mb": r.get("peak_mem_allocated_mb"), "peak_mem_reserved_mb": r.get("peak_mem_reserved_mb"),
        "mem_floor_mb": r.get("mem_floor_mb"),
        "final_train_loss": r.get("final_train_loss"), "eval_mse": r.get("eval_mse"), "run_dir": str(run_dir),
        "torchao_version": meta.get("torchao_version"),
    }
    row.update({k: r.get(k) for k in results.ENV_STAMP})
    row.update({k: v for k, v in r.items() if k.startswith("cfg_")})
    return row


def _kernel_breakdown(bench_dir: Path | None, row: dict) -> dict[str, Any]:
    """The profiled block's kernel categories / top kernels for one row (empty when not recorded); the
    student 'teacher' is the teacher's timed region of that variant's run."""
    run_dir = bench_dir / "runs" / str(row["variant"]) if bench_dir else None
    if run_dir is None or not (run_dir / "students.csv").exists():
        return {}
    found = observations(run_dir)
    obs = (found["teacher"] if row["student"] == "teacher" else found["students"].get(row["student"])) or {}
    return {k: obs[k] for k in profiler.DETAIL if k in obs}


def crosscheck_report(df: pd.DataFrame, preset: str | None, bench_dir: Path | None = None) -> dict[str, Any]:
    """crosscheck.json: per row, the event-timed median vs the kernel-time sum; headline = the P2 row,
    with its kernel-time breakdown (categories, top kernels) from its profile file (observations.json
    for earlier benches)."""
    ran = results.ran(df)
    rows = []
    for r in ran.to_dict("records"):
        rat = _num(r.get("kernel_to_event_ratio"))
        rows.append({k: r.get(k) for k in ("variant", "student", "step_ms_median", "profiled_step_ms_median",
                                            "kernel_ms_per_step", "gpu_busy_ms_per_step", "kernels_per_step",
                                            "kernel_sum_to_event_ratio", "profiler_reason")}
                    | {"kernel_to_event_ratio": rat, "within_tolerance": profiler.agrees(rat)})
    head = _best(ran[ran["precision"] == "fp8"]) or _best(ran)
    return {
        "schema_version": results.SCHEMA_VERSION, "preset": preset, "tolerance": profiler.TOLERANCE,
        "what": "gpu_busy_ms_per_step = union of the GPU activity intervals (kernels, memcpy, memset) torch.profiler "
                "saw in one extra timed block, per step; kernel_ms_per_step = their plain sum (counts kernels "
                "overlapping on several streams twice); kernel_to_event_ratio = gpu_busy_ms_per_step / "
                "step_ms_median (the run's own CUDA-event median)",
        "headline": None if head is None else {
            "variant": head["variant"], "student": head["student"], "step_ms_median": head["step_ms_median"],
            "kernel_ms_per_step": head.get("kernel_ms_per_step"), "gpu_busy_ms_per_step": head.get("gpu_busy_ms_per_step"),
            "kernel_to_event_ratio": _num(head.get("kernel_to_event_ratio")),
            "within_tolerance": profiler.agrees(_num(head.get("kernel_to_event_ratio"))),
            **_kernel_breakdown(bench_dir, head)},
        "rows": rows,
    }


def _best(df: pd.DataFrame, col: str = "step_ms_median", largest: bool = False) -> dict | None:
    d = df.dropna(subset=[col])
    if d.empty:
        return None
    return (d.nlargest(1, col) if largest else d.nsmallest(1, col)).iloc[0].to_dict()


@dataclass(frozen=True)
class Target:
    id: str
    presets: tuple[str, ...] | None  # None: evaluated at every preset
    what: str
    comparison: str  # "<=", ">=", "<" or "report" (a figure to show, no goal)
    value: float | dict[str, float] | None  # a dict: the goal per preset
    unit: str


LM_SHAPES = ("lm-a", "lm-b")
TARGETS = (
    Target("P1", ("seed",), "fastest student train step", "<=", 0.30, "ms"),
    Target("P1-te-fp8", ("seed",), "TE FP8 student step, whole step (forward, loss, backward, optimizer, FP8 "
           "scale updates) in one CUDA graph", "<=", 0.60, "ms"),
    Target("P2", ("large",), "TE FP8 student step", "<=", 18.0, "ms"),
    Target("P2-vs-tutorial", ("large",), "fastest TE FP8 student, × the tutorial-equivalent bf16 student of the "
           "same run", ">=", 2.4, "x"),
    Target("P2-bf16-mfu", ("large",), "our bf16 path, % of the bf16 matmul peak measured in the same run", ">=", 80.0, "%"),
    Target("P2-crosscheck", ("large",), "|profiler GPU busy time / event-timed median - 1|, fastest TE FP8 row",
           "<=", profiler.TOLERANCE * 100, "%"),
    Target("P3", None, "teacher forward, % of the measured matmul peak of its precision", ">=", 75.0, "%"),
    Target("P3-share", None, "teacher's share of a distillation step (its forward + the fastest student's step)",
           "report", None, "%"),
    Target("P4", None, "spread of the median over repeats, worst row (seed: graphed rows; elsewhere every row)",
           "<=", 2.0, "%"),
    Target("P5", ("large",) + LM_SHAPES, "peak memory of a TE FP8 student / the bf16 student's (same variant, "
           "else the bench's lowest), worst", "<=", 1.0, "x"),
    Target("P6", LM_SHAPES, "fastest FP8 student step", "<=", {"lm-a": 20.0, "lm-b": 33.5}, "ms"),
    Target("P6-vs-bf16", LM_SHAPES, "fastest FP8 student, × the fastest compiled bf16 student", ">=", 1.7, "x"),
    Target("P6-vs-torchao", LM_SHAPES, "fastest TE FP8 step / fastest torchao float8 step", "<", 1.0, "x"),
)


def _goal(t: Target, preset: str | None) -> float | None:
    return t.value.get(preset) if isinstance(t.value, dict) else t.value


def evaluate_targets(df: pd.DataFrame, preset: str | None, bench_dir: Path | None = None) -> list[dict[str, Any]]:
    """targets.json: every target with its goal, the best achieved figure here, the row that achieved it
    ('variant / student'), met (None: not judged here: another preset's target, a report-only figure, or
    nothing ran to measure it) and, where missed, the profiler's kernel categories of that row."""
    ran = results.ran(df).copy()
    same_shape = bool(len(ran)) and shape_is_preset(preset, ran.iloc[0].to_dict())
    out = []
    for t in TARGETS:
        goal = _goal(t, preset)
        shown = goal if goal is not None else _goal(t, (t.presets or (None,))[0])
        rec = {"id": t.id, "preset": preset if t.presets is None or preset in t.presets else ",".join(t.presets),
               "what": t.what, "target": "report" if t.comparison == "report" else f"{t.comparison} {shown:g} {t.unit}",
               "target_value": shown, "unit": t.unit, "achieved": None, "by": None, "met": None, "note": "",
               "breakdown": None}
        if t.presets is not None and (preset not in t.presets or not same_shape):
            rec["note"] = f"evaluated on the {'/'.join(t.presets)} preset's shape; this bench is {preset!r}" + (
                "" if same_shape else " with overridden dims")
            out.append(rec)
            continue
        best, achieved, note = _target_figure(t, ran, preset)
        rec["note"] = note
        if achieved is None:
            rec["note"] = note or "no row measured it here"
            out.append(rec)
            continue
        rec.update(achieved=achieved, by=None if best is None else f"{best['variant']} / {best['student']}")
        if t.comparison != "report":
            rec["met"] = {"<=": achieved <= goal, ">=": achieved >= goal, "<": achieved < goal}[t.comparison]
        if rec["met"] is False and best is not None:
            rec["breakdown"] = _kernel_breakdown(bench_dir, best).get("kernel_categories_ms_per_step")
        out.append(rec)
    return out


def _target_figure(t: Target, ran: pd.DataFrame, preset: str | None) -> tuple[dict | None, float | None, str]:
    """(the row that decides the target, its figure, a note)."""
    graphed = ran["graphed"].map(_truthy)
    te_fp8 = ran[ran["backend"] == "te_fp8"]
    fp8 = ran[ran["precision"] == "fp8"]
    step = "step_ms_median"
    if t.id in ("P1", "P1-te-fp8", "P2", "P6"):
        pool = {"P1": ran, "P1-te-fp8": te_fp8[te_fp8["graph_scope"] == "step"],
                "P2": te_fp8, "P6": fp8}[t.id]
        best = _best(pool)
        return best, _num(best[step]) if best else None, ""
    if t.id == "P2-vs-tutorial":
        best = _best(te_fp8)
        return best, _num(best.get("speedup_vs_tutorial")) if best else None, ""
    if t.id == "P2-bf16-mfu":
        best = _best(ran[ran["precision"] == "bf16"], "pct_of_measured_peak", largest=True)
        return best, _num(best["pct_of_measured_peak"]) if best else None, ""
    if t.id == "P2-crosscheck":
        best = _best(te_fp8) or _best(fp8)
        r = _num(best.get("kernel_to_event_ratio")) if best else None
        return best, None if r is None else abs(r - 1.0) * 100, ""
    if t.id == "P3":
        best = _best(ran, "teacher_pct_of_measured_peak", largest=True)
        best = dict(best, student="teacher") if best else None  # the teacher of that variant's run
        return best, _num(best["teacher_pct_of_measured_peak"]) if best else None, (
            "teacher FLOPs = a third of the student's train FLOPs (the teacher has the student's shape)")
    if t.id == "P3-share":
        best = _best(ran)
        return best, _num(best.get("teacher_share_pct")) if best else None, ""
    if t.id == "P4":
        pool = ran[graphed] if preset == "seed" else ran
        best = _best(pool, "median_spread_pct", largest=True)
        host = ran[ran["host_bound"].map(_truthy)]
        worst_host = _best(host, "median_spread_pct", largest=True)
        note = (f"{len(host)} host-bound rows (GPU busy < {HOST_BOUND_BELOW:.0%} of the step), worst spread "
                f"{_num(worst_host['median_spread_pct']):.1f} % ({worst_host['variant']} / {worst_host['student']})"
                if worst_host and _num(worst_host.get("median_spread_pct")) is not None else "")
        return best, _num(best["median_spread_pct"]) if best else None, note
    if t.id == "P5":
        return _memory_ratio(ran)
    if t.id == "P6-vs-bf16":
        best, bf16 = _best(fp8), _best(ran[(ran["backend"] == "torch_bf16") & ran["compiled"].map(_truthy)])
        return best, _div(bf16[step], best[step]) if best and bf16 else None, ""
    if t.id == "P6-vs-torchao":
        best, ao = _best(te_fp8), _best(ran[ran["backend"] == "torchao_float8"])
        return best, _div(best[step], ao[step]) if best and ao else None, ""
    raise KeyError(t.id)


def _memory_ratio(ran: pd.DataFrame) -> tuple[dict | None, float | None, str]:
    """P5: the worst TE FP8 student's peak allocated memory over the bf16 student's of its own variant (the
    same layout and parameter dtype), or the bench's lowest bf16 peak where its variant has none."""
    mem = "peak_mem_allocated_mb"
    bf16 = ran[(ran["backend"] == "torch_bf16") & ran[mem].notna()]
    worst, worst_ratio = None, None
    for r in ran[(ran["backend"] == "te_fp8") & ran[mem].notna()].to_dict("records"):
        own = bf16[bf16["variant"] == r["variant"]]
        ref = (own if len(own) else bf16)[mem].min() if len(bf16) else None
        ratio = _div(r[mem], ref)
        if ratio is not None and (worst_ratio is None or ratio > worst_ratio):
            worst, worst_ratio = r, ratio
    return worst, worst_ratio, "" if len(bf16) else "no bf16 student ran here"


def aggregate(bench_dir: str | Path) -> pd.DataFrame:
    """(Re)build bench.csv, profiler.json, targets.json, bench.md and the plots from the files."""
    from workbench.results import plots

    bench_dir = Path(bench_dir)
    df = bench_rows(bench_dir)
    preset = (_read(bench_dir / "bench.json") or {}).get("preset")
    results.write_csv(bench_dir / "bench.csv", df)
    results.write_json(bench_dir / "crosscheck.json", crosscheck_report(df, preset, bench_dir))
    results.write_json(bench_dir / "targets.json", {"schema_version": results.SCHEMA_VERSION, "preset": preset,
                                                     "source": "workbench.bench.TARGETS",
                                                     "targets": evaluate_targets(df, preset, bench_dir)})
    results.write_bytes(bench_dir / "bench.md", markdown(bench_dir).encode())
    plots.plot_bench(bench_dir)
    return df


# ---- Markdown (the README table is generated from the files) -------------------------------------
def _fmt(x, spec: str = ".3g", suffix: str = "") -> str:
    v = _num(x)
    return "–" if v is None else f"{v:{spec}}{suffix}"


def bench_dirs(path: str | Path) -> list[Path]:
    return results.folders_with(path, "bench.csv")


def markdown(path: str | Path, targets: bool = True) -> str:
    """Markdown tables of every bench.csv in or below `path`: one per preset, each followed by its targets
    unless `targets` is False (the README, whose one table of every preset's targets comes first)."""
    parts = []
    for d in bench_dirs(path):
        df = results.read_csv(d / "bench.csv")
        parts.append(_markdown_one(d, df, targets))
    return "\n\n".join(parts) + "\n" if parts else f"_no bench.csv in or below {path}_\n"


def _markdown_one(d: Path, df: pd.DataFrame, targets: bool = True) -> str:
    first = df.iloc[0].to_dict() if len(df) else {}
    ran = results.ran(df).sort_values("step_ms_median")
    peak = _read(d / "peak.json") or {}
    meas = {p: peaks.measured_tflops(peak, p) for p in peaks.PRECISIONS}
    gpu = first.get("gpu_name") if isinstance(first.get("gpu_name"), str) else "CPU"
    te = first.get("te_version") if isinstance(first.get("te_version"), str) else "not installed"
    head = (f"### `{first.get('preset')}` preset — {gpu}, torch {first.get('torch')}, TE {te}"
            f" ({d.name})\n\nMeasured matmul peak in this run (TFLOP/s): "
            + ", ".join(f"{p} {_fmt(v, '.4g')}" for p, v in meas.items()) + "; datasheet"
            + (f" ({peak['datasheet']['gpu']})" if peak.get("datasheet") else "") + ": "
            + (", ".join(f"{p} {_fmt(v, 'g')}" for p, v in ((peak.get('datasheet') or {}).get('tflops') or {}).items())
               if peak.get("datasheet") else "unknown for this GPU") + ".\n")
    tut = next((r for r in df.get("tutorial_rows", pd.Series(dtype=object)) if isinstance(r, str)), None)
    head += (f"\n× tutorial: the tutorial-equivalent student's step measured in this bench ({tut}).\n" if tut else
             "\n× tutorial: not measured in this bench (no tutorial-equivalent student ran), so no ratio.\n")
    lines = ["| variant | student | step ms (median) | TFLOP/s | % measured peak | % datasheet peak "
             "| × tutorial bf16 | spread % | kernel/event | peak MB | capture ms | compile ms |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in ran.to_dict("records"):
        who = f"`{r['student']}`" + (" (fallback: torch autocast)" if r["status"] == "fallback" else "")  # not TE: say so
        host = " (host-bound)" if _truthy(r.get("host_bound")) else ""
        lines.append(f"| {md_cell(r['variant'])} | {md_cell(who)} | {_fmt(r['step_ms_median'])} | {_fmt(r['tflops'], '.3g')} "
                     f"| {_fmt(r['pct_of_measured_peak'], '.0f')} | {_fmt(r['pct_of_datasheet_peak'], '.0f')} "
                     f"| {_fmt(r['speedup_vs_tutorial'], '.2f')} | {_fmt(r['median_spread_pct'], '.1f')}{host} "
                     f"| {_fmt(r['kernel_to_event_ratio'], '.2f')} | {_fmt(r.get('peak_mem_allocated_mb'), '.0f')} "
                     f"| {_fmt(r['capture_ms'], '.0f')} | {_fmt(r['compile_ms'], '.0f')} |")
    not_ran = df[~df["status"].isin(results.RAN)]
    if len(not_ran):
        lines.append("\nNot run here: " + "; ".join(
            f"{r['variant']} / `{r['student']}` ({r['status']}: {str(r['reason'])[:120]})" for r in not_ran.to_dict("records")))
    tlines = targets_table([d], with_preset=False) if targets else ""
    return head + "\n" + "\n".join(lines) + ("\n\n" + tlines if tlines else "")


def _own_targets(doc: dict) -> list[dict]:
    """A targets.json's targets judged at its bench's preset (another preset's are left out)."""
    return [t for t in doc.get("targets") or []
            if not (t.get("achieved") is None and str(t.get("note", "")).startswith("evaluated on"))]


def _breakdown(cats: dict | None, top: int = 4) -> str:
    """'gemm 15.2, optimizer 4.7, …' (ms per step): the profiler's view of what takes a missed target's time."""
    return ", ".join(f"{k} {v:.3g}" for k, v in list((cats or {}).items())[:top]) or "–"


def targets_table(dirs: list[Path], with_preset: bool = True) -> str:
    """The Markdown table of the targets.json of every bench folder in `dirs` (each at its own preset):
    goal, best achieved, by which row, met, and where missed the profiler's split of that row's step."""
    head = (["preset"] if with_preset else []) + ["target", "what", "goal", "achieved", "by", "met",
                                                  "where the time goes (ms/step), if missed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for d in dirs:
        doc = _read(d / "targets.json") or {}
        preset = doc.get("preset")
        for t in _own_targets(doc):
            met = t.get("met", t.get("pass"))  # benches before 'met' wrote 'pass'
            cells = ([f"`{preset}`"] if with_preset else []) + [
                t["id"], t["what"], t["target"], _fmt(t["achieved"], ".3g"), t["by"] or "–",
                {True: "yes", False: "**no**", None: "–"}[met], _breakdown(t.get("breakdown")) if met is False else ""]
            lines.append("| " + " | ".join(map(md_cell, cells)) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def md_cell(x) -> str:
    """A Markdown table cell: a '|' in the text (e.g. '|kernel/event - 1|') would split the row."""
    return str(x).replace("|", "\\|")


def readme(path: str | Path) -> str:
    """The README of a folder of benches (results/reference/h200/bench/), generated from its files: the
    targets of every preset in one table, then each preset's table of rows."""
    dirs = bench_dirs(path)
    return ("# Benchmarks\n\nGenerated by `python -m workbench bench --write-readme DIR` from the files below "
            "(targets.json and bench.csv of each preset); do not edit by hand.\n\n## Targets\n\n"
            + (targets_table(dirs) or "_no targets.json here_") + "\n\n## Every row\n\n" + markdown(path, targets=False))


README_BEGIN, README_END = "<!-- bench:begin -->", "<!-- bench:end -->"


def update_readme(readme: str | Path, table: str) -> bool:
    """Replace the text between the bench markers in `readme`; False when the markers are missing."""
    readme = Path(readme)
    text = readme.read_text()
    a, b = text.find(README_BEGIN), text.find(README_END)
    if a < 0 or b < a:
        return False
    new = text[: a + len(README_BEGIN)] + "\n" + table.strip() + "\n" + text[b:]
    results.write_bytes(readme, new.encode())
    return True


# ---- CLI -----------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="auto", choices=config_mod.PRESET_CHOICES, metavar="PRESET",
                   help=config_mod.preset_help())
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="config override applied to every variant, e.g. --set iters=50")
    p.add_argument("--variants", default=None,
                   help="comma-separated variant names (default: the preset's list; see --list)")
    p.add_argument("--repeats", type=int, default=3, help="timed blocks per region for the noise figure (P4)")
    p.add_argument("--no-crosscheck", action="store_true", help="skip the profiled block per timed region")
    p.add_argument("--budget-s", type=float, default=None, help="skip variants not started after this many seconds")
    p.add_argument("--out", default="results/bench", help="parent folder of the bench folder")
    p.add_argument("--run-id", default=None, help="bench folder name (default: <timestamp>-bench-<preset>)")
    p.add_argument("--list", action="store_true", help="print the variant catalogue and exit")
    p.add_argument("--markdown", metavar="DIR", default=None,
                   help="print the Markdown tables of every bench.csv in or below DIR and exit")
    p.add_argument("--readme", metavar="PATH", default=None,
                   help="with --markdown: write the tables between the bench markers of PATH (the H200 README)")
    p.add_argument("--write-readme", metavar="DIR", default=None,
                   help="write DIR/README.md: the targets of every bench below DIR in one table, then their rows")
    p.add_argument("--aggregate", metavar="DIR", default=None,
                   help="rebuild bench.csv, targets.json, profiler.json, bench.md and plots of DIR from its files")


def main(args: argparse.Namespace) -> int:
    if args.list:
        for v in VARIANTS.values():
            print(f"{v.name:28s} {json.dumps(v.overrides):70s} {','.join(v.backends)}\n{'':28s} {v.doc}")
        for preset, names in DEFAULT_VARIANTS.items():
            print(f"default for {preset}: {','.join(names)}")
        return 0
    if args.aggregate:  # bench.json, not bench.csv: a bench cut short before its aggregate has none yet
        for d in results.folders_with(args.aggregate, "bench.json"):
            aggregate(d)
            print(f"aggregated {d}")
        return 0
    if args.write_readme:
        results.write_bytes(Path(args.write_readme) / "README.md", readme(args.write_readme).encode())
        print(f"wrote {Path(args.write_readme) / 'README.md'}")
        return 0
    if args.markdown:
        table = markdown(args.markdown)
        if args.readme:
            if not update_readme(args.readme, table):
                print(f"{args.readme}: no '{README_BEGIN}' ... '{README_END}' markers", file=sys.stderr)
                return 1
            print(f"updated {args.readme}")
        else:
            print(table)
        return 0
    opts = BenchOptions(preset=args.preset, overrides=config_mod.parse_set(args.overrides),
                        variants=[s.strip() for s in args.variants.split(",") if s.strip()] if args.variants else None,
                        repeats=args.repeats, crosscheck=not args.no_crosscheck, budget_s=args.budget_s)
    bench_dir = run_bench(opts, out=args.out, run_id=args.run_id)
    print(json.dumps({"bench_dir": str(bench_dir),
                      "targets": (_read(bench_dir / "targets.json") or {}).get("targets")}, default=str))
    return 0


def _read(path: Path) -> Any:
    return results.read_json(path) if Path(path).exists() else None


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(msg, flush=True)
