"""targets.json: the bench's performance targets, each one declarative entry of TARGETS (its presets, goal and
the function that picks its deciding row and figure from the rows that ran), judged by evaluate_targets."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from workbench import results
from workbench.bench import crosscheck
from workbench.bench.cells import best, div, num, truthy
from workbench.bench.rows import shape_is_preset
from workbench.measure import profiler

STEP = "step_ms_median"
Figure = tuple[dict | None, float | None, str]
"""(the row that decides a target, its figure, a note)."""


@dataclass(frozen=True)
class Pools:
    """The rows that ran in one bench, and the subsets targets pick from."""
    ran: pd.DataFrame
    preset: str | None

    @property
    def te_fp8(self) -> pd.DataFrame:
        return self.ran[self.ran["backend"] == "te_fp8"]

    @property
    def fp8(self) -> pd.DataFrame:  # any FP8 GEMM: TE and torchao
        return self.ran[self.ran["precision"] == "fp8"]


@dataclass(frozen=True)
class Target:
    id: str
    presets: tuple[str, ...] | None  # None: evaluated at every preset
    what: str
    comparison: str  # "<=", ">=", "<" or "report" (a figure to show, no goal)
    value: float | dict[str, float] | None  # a dict: the goal per preset
    unit: str
    figure: Callable[[Pools], Figure]
    split: bool = False  # always attach the profiler's kernel split of the deciding row (else only when missed)

    def goal(self, preset: str | None) -> float | None:
        return self.value.get(preset) if isinstance(self.value, dict) else self.value


# ---- the figures ---------------------------------------------------------------------------------
def _cell(pool: Callable[[Pools], pd.DataFrame], col: str = STEP, by: str = STEP,
          largest: bool = False) -> Callable[[Pools], Figure]:
    """The figure `col` of the row of `pool` with the smallest (largest) `by`."""
    def figure(p: Pools) -> Figure:
        row = best(pool(p), by, largest)
        return row, num(row.get(col)) if row else None, ""
    return figure


def _crosscheck(p: Pools) -> Figure:
    """|GPU busy / event median - 1| in %, of the fastest TE FP8 row (else the fastest FP8 row)."""
    row = best(p.te_fp8) or best(p.fp8)
    r = num(row.get("kernel_to_event_ratio")) if row else None
    return row, None if r is None else abs(r - 1.0) * 100, ""


def _teacher_mfu(p: Pools) -> Figure:
    row = best(p.ran, "teacher_pct_of_measured_peak", largest=True)
    row = dict(row, student="teacher") if row else None  # the teacher of that variant's run
    return row, num(row["teacher_pct_of_measured_peak"]) if row else None, (
        "teacher FLOPs = a third of the student's train FLOPs (the teacher has the student's shape)")


def _spread(p: Pools) -> Figure:
    """The worst spread of the median over repeats (at seed graphed rows only: the eager ones are host-bound
    by design); the note names the host-bound rows apart."""
    ran = p.ran
    # astype(bool): with no row (every variant skipped) map() gives an object Series, which pandas takes as a
    # list of column labels and selects no column at all
    pool = ran[ran["graphed"].map(truthy).astype(bool)] if p.preset == "seed" else ran
    row = best(pool, "median_spread_pct", largest=True)
    host = ran[ran["host_bound"].map(truthy).astype(bool)]
    worst_host = best(host, "median_spread_pct", largest=True)
    note = (f"{len(host)} host-bound rows (GPU busy < {profiler.HOST_BOUND_BELOW:.0%} of the step), worst spread "
            f"{num(worst_host['median_spread_pct']):.1f} % ({worst_host['variant']} / {worst_host['student']})"
            if worst_host and num(worst_host.get("median_spread_pct")) is not None else "")
    return row, num(row["median_spread_pct"]) if row else None, note


def _memory_ratio(p: Pools) -> Figure:
    """The worst TE FP8 student's peak allocated memory over the bf16 student's of its own variant (the
    same layout and parameter dtype), or the bench's lowest bf16 peak where its variant has none."""
    ran, mem = p.ran, "peak_mem_allocated_mb"
    bf16 = ran[(ran["backend"] == "torch_bf16") & ran[mem].notna()]
    worst, worst_ratio = None, None
    for r in ran[(ran["backend"] == "te_fp8") & ran[mem].notna()].to_dict("records"):
        own = bf16[bf16["variant"] == r["variant"]]
        ref = (own if len(own) else bf16)[mem].min() if len(bf16) else None
        ratio = div(r[mem], ref)
        if ratio is not None and (worst_ratio is None or ratio > worst_ratio):
            worst, worst_ratio = r, ratio
    return worst, worst_ratio, "" if len(bf16) else "no bf16 student ran here"


def _vs_compiled_bf16(pool: Callable[[Pools], pd.DataFrame]) -> Callable[[Pools], Figure]:
    """The fastest row of `pool` as a speed-up over the fastest compiled torch bf16 student."""
    def figure(p: Pools) -> Figure:
        ran = p.ran
        compiled_bf16 = (ran["backend"] == "torch_bf16") & ran["compiled"].map(truthy).astype(bool)
        row, bf16 = best(pool(p)), best(ran[compiled_bf16])
        return row, div(bf16[STEP], row[STEP]) if row and bf16 else None, ""
    return figure


def _te_vs_torchao(p: Pools) -> Figure:
    row, ao = best(p.te_fp8), best(p.ran[p.ran["backend"] == "torchao_float8"])
    return row, div(row[STEP], ao[STEP]) if row and ao else None, ""


# ---- the targets ---------------------------------------------------------------------------------
LM_SHAPES = ("lm-a", "lm-b")
HF_SHAPES = ("hf-llama-4l", "hf-llama-1b", "hf-qwen2.5-0.5b")  # a Hugging Face folder of that shape as student
TARGETS = (
    Target("P1", ("seed",), "fastest student train step", "<=", 0.30, "ms", _cell(lambda p: p.ran)),
    Target("P1-te-fp8", ("seed",), "TE FP8 student step, whole step (forward, loss, backward, optimizer, FP8 "
           "scale updates) in one CUDA graph", "<=", 0.60, "ms",
           _cell(lambda p: p.te_fp8[p.te_fp8["graph_scope"] == "step"])),
    Target("P2", ("large",), "TE FP8 student step", "<=", 18.0, "ms", _cell(lambda p: p.te_fp8)),
    Target("P2-vs-tutorial", ("large",), "fastest TE FP8 student, × the tutorial-equivalent bf16 student of the "
           "same run", ">=", 2.4, "x", _cell(lambda p: p.te_fp8, "speedup_vs_tutorial")),
    Target("P2-bf16-mfu", ("large",), "our bf16 path, % of the bf16 matmul peak measured in the same run", ">=", 80.0,
           "%", _cell(lambda p: p.ran[p.ran["precision"] == "bf16"], "pct_of_measured_peak", "pct_of_measured_peak",
                      largest=True)),
    Target("P2-crosscheck", ("large",), "|profiler GPU busy time / event-timed median - 1|, fastest TE FP8 row",
           "<=", profiler.TOLERANCE * 100, "%", _crosscheck),
    Target("P3", None, "teacher forward, % of the measured matmul peak of its precision", ">=", 75.0, "%",
           _teacher_mfu),
    Target("P3-share", None, "teacher's share of a distillation step (its forward + the fastest student's step)",
           "report", None, "%", _cell(lambda p: p.ran, "teacher_share_pct")),
    Target("P4", None, "spread of the median over repeats, worst row (seed: graphed rows; elsewhere every row)",
           "<=", 2.0, "%", _spread),
    Target("P5", ("large",) + LM_SHAPES + HF_SHAPES, "peak memory of a TE FP8 student / the bf16 student's (same "
           "variant, else the bench's lowest), worst", "<=", 1.0, "x", _memory_ratio),
    Target("P6", LM_SHAPES, "fastest FP8 student step", "<=", {"lm-a": 20.0, "lm-b": 33.5}, "ms",
           _cell(lambda p: p.fp8)),
    Target("P6-vs-bf16", LM_SHAPES, "fastest FP8 student, × the fastest compiled bf16 student", ">=", 1.7, "x",
           _vs_compiled_bf16(lambda p: p.fp8)),
    Target("P6-vs-torchao", LM_SHAPES, "fastest TE FP8 step / fastest torchao float8 step", "<", 1.0, "x",
           _te_vs_torchao),
    # your own Llama-shaped model: the TE decoder-layer conversion against the compiled HF model and torchao
    Target("H1", ("hf-llama-4l",), "fastest TE FP8 student, × the fastest compiled bf16 student", ">=", 1.15, "x",
           _vs_compiled_bf16(lambda p: p.te_fp8)),
    Target("H1-vs-torchao", ("hf-llama-4l",), "fastest TE FP8 step / fastest torchao float8 step", "<", 1.0, "x",
           _te_vs_torchao),
    Target("H2", HF_SHAPES, "fastest FP8 student step, with the profiler's split of where its time goes", "report",
           None, "ms", _cell(lambda p: p.fp8), split=True),
)
MET = {"<=": lambda a, g: a <= g, ">=": lambda a, g: a >= g, "<": lambda a, g: a < g}


# ---- judging -------------------------------------------------------------------------------------
def evaluate_targets(df: pd.DataFrame, preset: str | None, bench_dir: Path | None = None) -> list[dict[str, Any]]:
    """targets.json: every target with its goal, the best achieved figure here, the row that achieved it
    ('variant / student'), met (None: not judged here: another preset's target, a report-only figure, or
    nothing ran to measure it) and, where missed, the profiler's kernel categories of that row."""
    pools = Pools(results.ran(df).copy(), preset)
    same_shape = bool(len(pools.ran)) and shape_is_preset(preset, pools.ran.iloc[0].to_dict())
    return [_judge(t, pools, same_shape, bench_dir) for t in TARGETS]


def _judge(t: Target, pools: Pools, same_shape: bool, bench_dir: Path | None) -> dict[str, Any]:
    """One target's record of targets.json."""
    preset = pools.preset
    goal = t.goal(preset)
    shown = goal if goal is not None else t.goal((t.presets or (None,))[0])
    rec = {"id": t.id, "preset": preset if t.presets is None or preset in t.presets else ",".join(t.presets),
           "what": t.what, "target": "report" if t.comparison == "report" else f"{t.comparison} {shown:g} {t.unit}",
           "target_value": shown, "unit": t.unit, "achieved": None, "by": None, "met": None, "note": "",
           "breakdown": None}
    if t.presets is not None and (preset not in t.presets or not same_shape):
        rec["note"] = f"evaluated on the {'/'.join(t.presets)} preset's shape; this bench is {preset!r}" + (
            "" if same_shape else " with overridden dims")
        return rec
    row, achieved, note = t.figure(pools)
    rec["note"] = note
    if achieved is None:
        rec["note"] = note or "no row measured it here"
        return rec
    rec.update(achieved=achieved, by=None if row is None else f"{row['variant']} / {row['student']}")
    if t.comparison != "report":
        rec["met"] = MET[t.comparison](achieved, goal)
    if (rec["met"] is False or t.split) and row is not None:
        rec["breakdown"] = crosscheck.kernel_breakdown(bench_dir, row).get("kernel_categories_ms_per_step")
    return rec
