"""crosscheck.json: the event-timed median of each row against the GPU time torch.profiler saw in one
extra timed block, and the kernel-time split of a row (what takes a missed target's time)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from workbench import results
from workbench.bench.cells import best, num
from workbench.bench.rows import observations
from workbench.measure import profiler


def kernel_breakdown(bench_dir: Path | None, row: dict) -> dict[str, Any]:
    """The profiled block's kernel categories / top kernels for one row (empty when not recorded); the
    student 'teacher' is the teacher's timed region of that variant's run."""
    run_dir = bench_dir / "runs" / str(row["variant"]) if bench_dir else None
    if run_dir is None or not (run_dir / "students.csv").exists():
        return {}
    found = observations(run_dir)
    obs = (found["teacher"] if row["student"] == "teacher" else found["students"].get(row["student"])) or {}
    return {k: obs[k] for k in profiler.DETAIL if k in obs}


def crosscheck_report(df: pd.DataFrame, preset: str | None, bench_dir: Path | None = None) -> dict[str, Any]:
    """crosscheck.json: per row, the event-timed median vs the kernel-time sum; headline = the fastest FP8
    row (else the fastest row), with its kernel-time breakdown (categories, top kernels) from its profile
    file (observations.json for earlier benches)."""
    ran = results.ran(df)
    rows = []
    for r in ran.to_dict("records"):
        rat = num(r.get("kernel_to_event_ratio"))
        rows.append({k: r.get(k) for k in ("variant", "student", "step_ms_median", "profiled_step_ms_median",
                                            "kernel_ms_per_step", "gpu_busy_ms_per_step", "kernels_per_step",
                                            "kernel_sum_to_event_ratio", "profiler_reason")}
                    | {"kernel_to_event_ratio": rat, "within_tolerance": profiler.agrees(rat)})
    head = best(ran[ran["precision"] == "fp8"]) or best(ran)
    return {
        "schema_version": results.SCHEMA_VERSION,
        "preset": preset,
        "tolerance": profiler.TOLERANCE,
        "what": "gpu_busy_ms_per_step = union of the GPU activity intervals (kernels, memcpy, memset) torch.profiler "
        "saw in one extra timed block, per step; kernel_ms_per_step = their plain sum (counts kernels "
        "overlapping on several streams twice); kernel_to_event_ratio = gpu_busy_ms_per_step / "
        "step_ms_median (the run's own CUDA-event median)",
        "headline": None
        if head is None
        else {
            "variant": head["variant"],
            "student": head["student"],
            "step_ms_median": head["step_ms_median"],
            "kernel_ms_per_step": head.get("kernel_ms_per_step"),
            "gpu_busy_ms_per_step": head.get("gpu_busy_ms_per_step"),
            "kernel_to_event_ratio": num(head.get("kernel_to_event_ratio")),
            "within_tolerance": profiler.agrees(num(head.get("kernel_to_event_ratio"))),
            **kernel_breakdown(bench_dir, head),
        },
        "rows": rows,
    }
