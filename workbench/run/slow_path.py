"""Say when a slower path ran than this machine offers, so a run's default answer cannot mislead.

Every student row gets a `slow_path` cell: None when nothing slower than this machine offers ran, else plain
reasons joined by '; ', each naming what ran and what would change it:

  host-bound      the GPU was busy less than profiler.HOST_BOUND_BELOW of the step (`gpu_busy_share`, from
                  a few profiled steps, workbench.measure.timing): launches and Python set the pace, not the GPU.
                  The fix is one CUDA graph for the whole step; where the bench measured that student so
                  (results/reference/<machine>/bench/<preset>/bench.csv, same GPU), its step time is quoted.
  unfused         TE ran its unfused attention (the row's `attention_backend`), the slowest of TE's three.
  fallback        PyTorch autocast ran in place of a TE student that cannot run here (status 'fallback').
  not in FP8      an FP8 student kept some Linear layers in torch (`kept_torch_modules`): their GEMMs ran bf16.
  host logits     the teacher's logits of the training batches live in host memory (task.json
                  `teacher_logits`): training copies each batch to the GPU (the timed steps do not).
  cuDNN mixing    more than one cuDNN copy is mapped into the process (env.json `cudnn_mapped_dirs`), which
                  breaks or slows TE's fused attention.

`classify` is pure (a row, task.json, env.json, an optional bench figure), so tests drive it with synthetic
timings; `bench_step_graph_ms` reads the committed bench files.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from workbench.measure import profiler

REFERENCE = Path(__file__).resolve().parents[2] / "results" / "reference"
"""The committed measurements of a checkout (absent from a wheel: then no bench figure is quoted)."""
CPU_NOTE = ("CPU timings are a smoke test: they show the run works, not how the students compare on a GPU "
            "(no TE, no FP8, no CUDA graphs here)")


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def _text(x: Any) -> str:
    return x if isinstance(x, str) else ""


def _truthy(x: Any) -> bool:
    return str(x).strip().lower() in ("true", "1", "1.0")


def is_te(row: dict) -> bool:
    """Whether the row ran TE modules (its backend's declared mode; a fallback runs PyTorch)."""
    return _text(row.get("mode")).startswith("TE") and row.get("status") != "fallback"


def graph_fix(row: dict) -> str:
    """The switch that puts this student's whole step into one CUDA graph, or what is left to try."""
    scope = _text(row.get("graph_scope"))
    if _truthy(row.get("graphed")) and scope == "step":
        return "the step is already one CUDA graph: a larger step (hidden, batch, seq_len) gives the GPU more work"
    if is_te(row):
        return "set te_graph=step" if _truthy(row.get("graphed")) else "set graphs=true te_graph=step"
    return "set graphs=true"


def host_bound(row: dict, bench_ms: float | None = None) -> str | None:
    share = _num(row.get("gpu_busy_share"))
    if not profiler.host_bound(share):
        return None
    figure = f" (bench measured {bench_ms:.3g} ms)" if bench_ms is not None and not (
        _truthy(row.get("graphed")) and _text(row.get("graph_scope")) == "step") else ""
    return f"host-bound: GPU busy {share:.0%} of the step; {graph_fix(row)}{figure}"


def classify(row: dict, task_info: dict | None = None, env: dict | None = None,
             bench_ms: float | None = None) -> list[str]:
    """The reasons this student ran a slower path than the machine offers (empty: none). `bench_ms`: the
    bench's step time of the same student with its whole step graphed, where known."""
    task_info, env = task_info or {}, env or {}
    out = []
    if row.get("status") == "fallback":
        why = _text(row.get("reason")).split(" -> ")[0]
        out.append(f"fallback: PyTorch autocast ran instead of {row.get('backend')}" + (f" ({why})" if why else ""))
    hb = host_bound(row, bench_ms)
    if hb:
        out.append(hb)
    attention = _text(row.get("attention_backend"))
    if attention.startswith("unfused"):
        forced = _text(row.get("attention_requested")) == "unfused"
        out.append("TE's unfused attention ran, the slowest of its three" + (
            " (forced: te_attention=unfused)" if forced else "; `workbench probe` shows why flash / fused did not"))
    if is_te(row) and _text(row.get("gemm_precision")) == "fp8":
        linears = [m.strip() for m in _text(row.get("kept_torch_modules")).split(";") if m.strip().endswith("Linear)")]
        if linears:
            out.append(f"FP8 not applied to {', '.join(linears)}: torch Linear, bf16 GEMM")
    if task_info.get("teacher_logits") == "host":
        out.append("teacher logits in host memory (task.json teacher_logits): each training batch's logits are "
                   "copied to the GPU; the timed steps are not")
    dirs = env.get("cudnn_mapped_dirs") or []
    if is_te(row) and isinstance(dirs, list) and len(dirs) > 1:
        out.append(f"cuDNN mixing: {len(dirs)} cuDNN copies loaded ({', '.join(map(str, dirs))}); TE's fused "
                   "attention may fail or fall back (`workbench doctor`)")
    return out


def cell(reasons: list[str]) -> str | None:
    """The row's `slow_path` cell: None (unknown or nothing slower ran) or the reasons in one line."""
    return "; ".join(reasons) or None


def mark_rows(rows: list[dict], task_info: dict | None, env: dict | None,
              bench_root: str | Path | None = REFERENCE) -> None:
    """Every started row's `slow_path` cell, in place (None for students that did not start)."""
    from workbench import results

    for r in rows:
        started = r.get("status") in results.STARTED
        r["slow_path"] = cell(classify(r, task_info, env, bench_step_graph_ms(r, bench_root))) if started else None


def bench_step_graph_ms(row: dict, bench_root: str | Path | None) -> float | None:
    """The step time the bench measured for this student with its whole step in one CUDA graph, at the
    row's preset on the row's GPU: the same layout and parameter dtype where the bench ran them, else its
    fastest such row. None where no bench file under `bench_root` (results/reference/) has one."""
    import pandas as pd

    if bench_root is None or not isinstance(row.get("gpu_name"), str):
        return None
    best: tuple[int, float] | None = None  # (0 same layout and dtype / 1 other, ms)
    for path in sorted(Path(bench_root).glob(f"*/bench/{row.get('cfg_preset')}/bench.csv")):
        df = pd.read_csv(path)
        need = {"student", "status", "graphed", "graph_scope", "gpu_name", "step_ms_median"}
        if not need <= set(df.columns):
            continue
        hit = df[
            (df["student"] == row.get("student"))
            & (df["status"] == "ok")
            & df["graphed"].map(_truthy)
            & (df["graph_scope"] == "step")
            & (df["gpu_name"] == row["gpu_name"])
        ].dropna(subset=["step_ms_median"])
        for r in hit.to_dict("records"):
            same = int(
                not (r.get("layout") == row.get("cfg_layout") and r.get("param_dtype") == row.get("cfg_param_dtype"))
            )
            cand = (same, float(r["step_ms_median"]))
            best = cand if best is None or cand < best else best
    return best[1] if best else None
