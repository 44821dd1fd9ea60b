"""The verdict's GPU part: the bench variants that matter for the model, run with the model as its own teacher, read
back into one judgement.

    measure(...)    on a CUDA GPU: (an hf-init shape is written first) `workbench bench` of the chosen variants into
                    <out>/bench/, then summarize(); elsewhere {'status': 'not run', 'reason': ...}
    summarize(...)  the bench folder -> verdict.json's `measured`: the denominator (the fastest bf16 row of the bench:
                    compiled HF bf16 or TE bf16 layers, graphed or not), each FP8 row's speed-up against it and against
                    compiled HF bf16, peak memory, step-0 quality (the student in its own precision against the
                    model's bf16 forward, before training), the prediction beside it, the profiler split of the
                    fastest FP8 row, and what did not run (rows with their reasons)
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pandas as pd

from workbench import results
from workbench.bench import rows as bench_rows

# bench row (variant, student) -> the prediction's recipe
RECIPE_OF = {("hf-te-layer-step", "te_fp8:delayed"): "te_fp8_delayed",
             ("hf-te-layer-step", "te_fp8:current"): "te_fp8_current",
             ("hf-te-layer-fp8-head", "te_fp8:delayed"): "te_fp8_delayed_head",
             ("hf-te-layer-fp8-head", "te_fp8:current"): "te_fp8_current_head",
             ("hf-te-layer-fp8-dpa", "te_fp8:delayed"): "te_fp8_delayed_head_attention",
             ("hf-compile", "torchao_float8:tensorwise"): "torchao_float8"}
WHAT = {"hf-te-layer-step": "TE decoder layers, the whole step in one CUDA graph",
        "hf-te-layer-fp8-head": "TE decoder layers + FP8 LM head, the whole step graphed",
        "hf-te-layer-fp8-dpa": "TE decoder layers + FP8 attention, eager", "hf-te-layer": "TE decoder layers, eager",
        "hf-te-linear": "TE per Linear, eager", "hf-compile": "the Hugging Face model compiled",
        "hf-compile-step": "the Hugging Face model compiled, the whole step graphed"}
COMPILED = ("hf-compile", "hf-compile-step")  # "compiled HF bf16": the faster of the two
STEP0 = ("kl_teacher_student_t1_nats_step0", "top1_agreement_step0", "heldout_ppl_step0")


def variants_for(prediction: dict[str, Any]) -> list[str]:
    """The bench variants for this model, in the order a budget should keep them: TE layers graphed (bf16, FP8
    delayed, current), the FP8 head where eligible (the recipe predicted fastest, seconds to run), compiled HF (bf16,
    torchao: the other bf16 denominator, and torch.compile's minutes on a deep model; then bf16 compiled and
    graphed), FP8 attention where eligible, eager TE layers (or per-Linear TE where TE's layer cannot hold the
    family)."""
    recipes = {r["recipe"]: r for r in prediction["recipes"]}
    te = prediction["eligibility"]["te_layers"]["supported"]
    out = ["hf-te-layer-step"] if te else []
    if te and recipes["te_fp8_delayed_head"]["eligible"]:
        out.append("hf-te-layer-fp8-head")
    out += ["hf-compile", "hf-compile-step"]  # side by side: the same graphs, which inductor's cache may serve
    if te and recipes["te_fp8_delayed_head_attention"]["eligible"]:
        out.append("hf-te-layer-fp8-dpa")
    return out + (["hf-te-layer"] if te else ["hf-te-linear"])


def measure(model: str, prediction: dict[str, Any], preset: str, overrides: dict[str, Any], out: Path,
            budget_s: float | None) -> dict[str, Any]:
    """verdict.json's `measured` (module doc)."""
    import torch

    if not torch.cuda.is_available():
        return {"status": "not run", "reason": "no CUDA GPU here"}
    from workbench.bench.run import BenchOptions, run_bench
    from workbench.models import hf_init

    t0 = time.monotonic()
    folder = Path(model)
    if not folder.is_dir():  # an hf-init shape: random weights of its config, its own tokenizer; a verdict run
        folder = out / "model"  # again into the same folder reuses the one it wrote
        made = folder / "hf_init.json"
        if not (made.exists() and results.read_json(made).get("shape") == model):
            folder = hf_init.write(model, folder if not folder.exists() else out / f"model-{int(time.time())}")
    created_s = time.monotonic() - t0
    opts = BenchOptions(preset=preset, overrides={**overrides, "lm.student": str(folder), "lm.teacher": str(folder),
                                                  "no_kd_student": False},
                        variants=variants_for(prediction), repeats=2, budget_s=budget_s)
    bench_dir = run_bench(opts, out=out / "bench")  # a new timestamped folder each time: runs never overwrite
    return {**summarize(bench_dir, prediction), "model_folder": str(folder), "model_created_s": round(created_s, 1),
            "wall_s": round(time.monotonic() - t0, 1), "budget_s": budget_s}


def _rows(bench_dir: Path) -> pd.DataFrame:
    df = pd.read_csv(bench_dir / "bench.csv")
    # a no-KD student does less work, a distributed run's one-process reference row is another run: no denominator
    df = df[~df["student"].astype(str).str.contains(f":no_kd|{results.REFERENCE_SUFFIX}", regex=True)]
    step0 = []
    for variant in df["variant"].unique():
        f = bench_dir / "runs" / variant / "students.csv"
        if f.exists():
            s = results.read_csv(f)
            step0.append(s.assign(variant=variant)[["variant", "student", *[c for c in STEP0 if c in s]]])
    return df.merge(pd.concat(step0), on=["variant", "student"], how="left") if step0 else df


def _split(bench_dir: Path, variant: str, student: str) -> dict[str, float] | None:
    f = bench_dir / "runs" / variant / f"profile-{student.replace(':', '-')}.json"
    return json.loads(f.read_text()).get("kernel_categories_ms_per_step") if f.exists() else None


def _num(v: Any) -> float | None:
    return None if v is None or pd.isna(v) else float(v)


def _mem_ratio(mem: Any, base: Any) -> float | None:
    """Peak memory against the denominator's, -1; None where either is unknown."""
    m, b = _num(mem), _num(base)
    return m / b - 1 if m is not None and b else None


def summarize(bench_dir: Path, prediction: dict[str, Any] | None = None) -> dict[str, Any]:
    """verdict.json's `measured` from a bench folder (module doc)."""
    df = _rows(bench_dir)
    ok = df[df["status"] == "ok"]
    bf16 = ok[ok["precision"] == "bf16"]
    den = bench_rows.fastest_bf16(ok.to_dict("records"))  # the bench's own rule: one denominator everywhere
    if den is None:
        return {"status": "no denominator", "reason": "no bf16 row of the bench ran", "bench_dir": str(bench_dir),
                "not_run": _not_run(df)}
    base = pd.Series(den)
    compiled = bf16[bf16["variant"].isin(COMPILED)]
    comp_ms = _num(compiled["step_ms_median"].min()) if not compiled.empty else None
    expected = {r["recipe"]: r for r in (prediction or {}).get("recipes", [])}
    rows = []
    for r in ok.itertuples():
        recipe = RECIPE_OF.get((r.variant, r.student))
        pred = expected.get(recipe, {})
        rows.append({"variant": r.variant, "what": WHAT.get(r.variant, r.variant), "student": r.student,
                     "precision": r.precision, "step_ms": r.step_ms_median,
                     "speedup_vs_fastest_bf16": base.step_ms_median / r.step_ms_median,
                     "speedup_vs_compiled_bf16": comp_ms / r.step_ms_median if comp_ms else None,
                     "spread_pct": _num(getattr(r, "median_spread_pct", None)),
                     "peak_mem_mb": _num(r.peak_mem_allocated_mb),
                     "mem_vs_fastest_bf16": _mem_ratio(r.peak_mem_allocated_mb, base.peak_mem_allocated_mb),
                     **{c: _num(getattr(r, c, None)) for c in STEP0},
                     "recipe": recipe, "predicted_speedup": pred.get("speedup_expected"),
                     "predicted_range": [pred.get("speedup_low"), pred.get("speedup_high")] if pred else None})
    fp8 = [x for x in rows if x["precision"] == "fp8"]
    best = max(fp8, key=lambda x: x["speedup_vs_fastest_bf16"]) if fp8 else None
    return {"status": "ok", "bench_dir": str(bench_dir),
            "denominator": {"variant": base.variant, "what": WHAT.get(base.variant, base.variant),
                            "student": base.student, "step_ms": base.step_ms_median},
            "compiled_bf16_ms": comp_ms, "rows": rows, "best_fp8": best,
            "best_fp8_split_ms": _split(bench_dir, best["variant"], best["student"]) if best else None,
            "not_run": _not_run(df), "judgement": judge(best, base)}


def _not_run(df: pd.DataFrame) -> list[dict[str, str]]:
    return [{"variant": r.variant, "student": r.student, "status": r.status, "reason": str(r.reason)}
            for r in df[df["status"] != "ok"].itertuples()]


def judge(best: dict[str, Any] | None, base: pd.Series) -> dict[str, Any]:
    """Recommended when the fastest FP8 row beats the fastest bf16 row by more than the two rows' own spread."""
    if best is None:
        return {"recommended": False, "why": "no FP8 row ran"}
    x = best["speedup_vs_fastest_bf16"]
    noise = ((best["spread_pct"] or 0.0) + (_num(base.get("median_spread_pct")) or 0.0)) / 100
    if x - 1 > noise:
        return {"recommended": True, "why": f"{x:.2f}x the fastest bf16 path, beyond the rows' spread ({noise:.1%})"}
    if x - 1 < -noise:
        return {"recommended": False, "why": f"FP8 is slower here: {x:.2f}x the fastest bf16 path"}
    return {"recommended": False, "why": f"{x:.2f}x the fastest bf16 path: within the rows' spread ({noise:.1%})"}
