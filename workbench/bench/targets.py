"""A bench's targets: goals read from a file the user names (`workbench bench --targets FILE`), each judged
by `evaluate_targets` from the rows that ran into targets.json. The file holds the goals (id, presets, what,
comparison, value, unit, measure); the code holds only the measures, each a named function that picks a
target's deciding row and figure from the rows (MEASURES). The project's own goals live beside their evidence,
in results/reference/bench_targets.json; a bench run without --targets judges nothing."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from workbench import results
from workbench.bench import crosscheck
from workbench.bench.cells import best, div, num, truthy
from workbench.bench.rows import shape_is_preset
from workbench.config import ConfigError
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
    measure: str  # a name in MEASURES: how the figure is taken from the rows
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


# ---- the measures a targets file names ------------------------------------------------------------
MEASURES: dict[str, Callable[[Pools], Figure]] = {
    "fastest_step": _cell(lambda p: p.ran),
    "te_fp8_whole_step_graph_step": _cell(lambda p: p.te_fp8[p.te_fp8["graph_scope"] == "step"]),
    "te_fp8_step": _cell(lambda p: p.te_fp8),
    "fp8_step": _cell(lambda p: p.fp8),
    "te_fp8_speedup_vs_tutorial": _cell(lambda p: p.te_fp8, "speedup_vs_tutorial"),
    "bf16_pct_of_measured_peak": _cell(lambda p: p.ran[p.ran["precision"] == "bf16"], "pct_of_measured_peak",
                                       "pct_of_measured_peak", largest=True),
    "kernel_to_event_deviation_pct": _crosscheck,
    "teacher_pct_of_measured_peak": _teacher_mfu,
    "teacher_share_pct": _cell(lambda p: p.ran, "teacher_share_pct"),
    "worst_median_spread_pct": _spread,
    "te_fp8_peak_memory_vs_bf16": _memory_ratio,
    "fp8_vs_compiled_bf16": _vs_compiled_bf16(lambda p: p.fp8),
    "te_fp8_vs_compiled_bf16": _vs_compiled_bf16(lambda p: p.te_fp8),
    "te_fp8_vs_torchao_step": _te_vs_torchao,
}
COMPARISONS = ("<=", ">=", "<", "report")
FIELDS = ("id", "presets", "what", "comparison", "value", "unit", "measure", "split")
REQUIRED = ("id", "what", "comparison", "unit", "measure")


class TargetsError(ConfigError):
    """A targets file that cannot be judged: one line naming the file, the target, the field and what is allowed."""


# ---- reading a targets file ------------------------------------------------------------------------
def load_targets(path: str | Path) -> tuple[Target, ...]:
    """The targets of a JSON file {"targets": [{id, presets?, what, comparison, value?, unit, measure,
    split?}, ...]}, checked field by field before any bench runs."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise TargetsError(f"{path}: cannot read a JSON targets file ({type(e).__name__}: {e})") from None
    items = doc.get("targets") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items:
        raise TargetsError(f"{path}: expected an object with a non-empty list 'targets'")
    out = tuple(_target(path, i, t) for i, t in enumerate(items))
    ids = [t.id for t in out]
    if dup := sorted({i for i in ids if ids.count(i) > 1}):
        raise TargetsError(f"{path}: target id {dup[0]!r} appears more than once; ids must be unique")
    return out


def _target(path: Path, i: int, t: Any) -> Target:
    """One entry of the file, every field checked; the error names the entry, the field and what is allowed."""
    where = f"{path}: target {i + 1}" + (f" ({t['id']})" if isinstance(t, dict) and isinstance(t.get("id"), str)
                                         else "")

    def bad(field: str, allowed: str) -> TargetsError:
        return TargetsError(f"{where}: field '{field}' must be {allowed}, got {t.get(field)!r}")

    if not isinstance(t, dict):
        raise TargetsError(f"{where}: must be an object with the fields {', '.join(FIELDS)}")
    if unknown := sorted(set(t) - set(FIELDS)):
        raise TargetsError(f"{where}: unknown field '{unknown[0]}'; allowed fields: {', '.join(FIELDS)}")
    for field in REQUIRED:
        if not isinstance(t.get(field), str) or not t[field]:
            raise bad(field, "a non-empty string")
    if t["comparison"] not in COMPARISONS:
        raise bad("comparison", "one of " + ", ".join(repr(c) for c in COMPARISONS))
    if t["measure"] not in MEASURES:
        raise bad("measure", "one of " + ", ".join(MEASURES))
    presets = t.get("presets")
    if presets is not None and (not isinstance(presets, list) or not presets
                                or not all(isinstance(p, str) and p for p in presets)):
        raise bad("presets", "a non-empty list of preset names (absent: every preset)")
    value = t.get("value")
    number = (int, float)
    ok = (isinstance(value, number) and not isinstance(value, bool)) or (
        isinstance(value, dict) and value and all(isinstance(v, number) and not isinstance(v, bool)
                                                  for v in value.values()))
    if t["comparison"] == "report" and value is not None and not ok:
        raise bad("value", "absent or a number for a 'report' target")
    if t["comparison"] != "report" and not ok:
        raise bad("value", "a number, or an object {preset: number}")
    if not isinstance(t.get("split", False), bool):
        raise bad("split", "true or false")
    return Target(t["id"], None if presets is None else tuple(presets), t["what"], t["comparison"],
                  value, t["unit"], t["measure"], t.get("split", False))


MET = {"<=": lambda a, g: a <= g, ">=": lambda a, g: a >= g, "<": lambda a, g: a < g}


# ---- judging -------------------------------------------------------------------------------------
def evaluate_targets(df: pd.DataFrame, preset: str | None, targets: tuple[Target, ...],
                     bench_dir: Path | None = None) -> list[dict[str, Any]]:
    """targets.json: every target of `targets` with its goal, the best achieved figure here, the row that achieved it
    ('variant / student'), met (None: not judged here: another preset's target, a report-only figure, or
    nothing ran to measure it) and, where missed, the profiler's kernel categories of that row."""
    pools = Pools(results.ran(df).copy(), preset)
    same_shape = bool(len(pools.ran)) and shape_is_preset(preset, pools.ran.iloc[0].to_dict())
    return [_judge(t, pools, same_shape, bench_dir) for t in targets]


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
    row, achieved, note = MEASURES[t.measure](pools)
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
