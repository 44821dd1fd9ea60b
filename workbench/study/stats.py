"""The statistics of a distillation-quality study (workbench.study): over seeds, per arm and per gap.

Pure functions of numbers, no files, no torch, so every rule here is tested against hand-computed values
(tests/study/test_quality_stats.py).

  summary(values)          n, mean, sd (n - 1), and the 95% Student-t interval of the mean
  paired_gaps_pct(r, a)    per seed: 100 (a_s - r_s) / r_s, for the seeds both have
  noise_floor_pct(r, b)    root mean square over seeds of the paired bf16-vs-bf16 gaps: how far two bf16
                           students apart only in their init and batch order land from each other
  within_noise(gap, floor) the rule: the gap's interval contains 0, or |mean gap| is below the floor
  teacher_beaten(rows)     the KD students that end better than their teacher (the study then refuses)
  flattened(curve)         did a held-out curve's last step move less than a threshold
"""
from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping

CONFIDENCE = 0.95
FLAT_THRESHOLD_PCT = 2.0  # a held-out curve has flattened when its last interval moved it by less than this
# t(0.975, df) for df = 1..30 (any statistics table; scipy.stats.t.ppf agrees to the digits given)
_T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
         2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
         2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)
_Z975 = 1.959964


def t975(df: int) -> float:
    """The two-sided 95% quantile of Student's t with `df` degrees of freedom (table to 30, then the
    Cornish-Fisher expansion around the normal quantile, within 1e-4 there)."""
    if df < 1:
        raise ValueError(f"Student t needs at least one degree of freedom, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def _finite(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if v is not None and isinstance(v, (int, float)) and math.isfinite(v)]


def summary(values: Iterable[Any]) -> dict[str, Any]:
    """{n, mean, sd, ci_low, ci_high} of the finite values: sd with n - 1, the interval mean +- t sd / sqrt(n).
    Unknown (None) where there are too few values: the mean needs one, sd and the interval two."""
    xs = _finite(values)
    n = len(xs)
    out: dict[str, Any] = {"n": n, "mean": None, "sd": None, "ci_low": None, "ci_high": None}
    if not n:
        return out
    mean = sum(xs) / n
    out["mean"] = mean
    if n >= 2:
        sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
        half = t975(n - 1) * sd / math.sqrt(n)
        out.update(sd=sd, ci_low=mean - half, ci_high=mean + half)
    return out


def paired_gaps_pct(reference: Mapping[Any, Any], arm: Mapping[Any, Any]) -> dict[Any, float]:
    """{seed: 100 (arm - reference) / reference} over the seeds where both have a finite, non-zero reference
    value: pairing by seed takes the seed's init and batches, shared by both, out of the gap."""
    out = {}
    for seed in sorted(set(reference) & set(arm)):
        r, a = _finite([reference[seed]]), _finite([arm[seed]])
        if r and a and r[0] != 0:
            out[seed] = 100.0 * (a[0] - r[0]) / r[0]
    return out


def paired_diffs(reference: Mapping[Any, Any], arm: Mapping[Any, Any]) -> dict[Any, float]:
    """{seed: arm - reference} in the metric's own unit (nats for KL and loss), over the seeds where both are
    finite: the absolute scale against which a relative gap of a small KL can be read."""
    out = {}
    for seed in sorted(set(reference) & set(arm)):
        r, a = _finite([reference[seed]]), _finite([arm[seed]])
        if r and a:
            out[seed] = a[0] - r[0]
    return out


def noise_floor_abs(reference: Mapping[Any, Any], noise: Mapping[Any, Any]) -> float | None:
    """The noise floor in the metric's unit: the root mean square of the paired differences between the two bf16
    arms (as noise_floor_pct, without dividing). None with fewer than two seeds."""
    d = list(paired_diffs(reference, noise).values())
    return math.sqrt(sum(x * x for x in d) / len(d)) if len(d) >= 2 else None


def gap_row(reference: Mapping[Any, Any], arm: Mapping[Any, Any], floor_pct: float | None,
            floor_abs: float | None) -> dict[str, Any]:
    """gaps.csv's columns of one arm and metric: the paired gap in % (mean, sd, 95% interval, per seed), the
    within-noise verdict, and the paired difference in the metric's unit with its interval and floor."""
    gaps = paired_gaps_pct(reference, arm)
    s, d = summary(gaps.values()), summary(paired_diffs(reference, arm).values())
    return {"n_seeds": s["n"], "gap_pct_mean": s["mean"], "gap_pct_sd": s["sd"], "gap_pct_ci_low": s["ci_low"],
            "gap_pct_ci_high": s["ci_high"], "noise_floor_pct": floor_pct, "within_noise": within_noise(s, floor_pct),
            "gap_pct_by_seed": json.dumps({str(k): v for k, v in gaps.items()}),
            "diff_mean": d["mean"], "diff_ci_low": d["ci_low"], "diff_ci_high": d["ci_high"],
            "noise_floor_abs": floor_abs}


def noise_floor_pct(reference: Mapping[Any, Any], noise: Mapping[Any, Any]) -> float | None:
    """The bf16 noise floor, in %: sqrt(mean(d_s^2)) over seeds of the paired gaps d_s between the reference
    bf16 arm and the second bf16 arm, which trains the same student from another init and batch order. Two
    such runs differ by about this much. The root mean square, not the sd around the mean: the two arms
    have no true difference, so their mean difference is noise too (an sd would call a consistent
    difference of 10% a floor of 0). None with fewer than two seeds."""
    gaps = list(paired_gaps_pct(reference, noise).values())
    return math.sqrt(sum(d * d for d in gaps) / len(gaps)) if len(gaps) >= 2 else None


def within_noise(gap: Mapping[str, Any], floor_pct: float | None) -> bool | None:
    """The rule: a gap (a `summary` of paired gaps in %) is within noise when its 95% interval contains 0,
    or when |mean| is below the noise floor. None (unknown) when neither can be decided: no interval and
    no floor, or no gap at all."""
    if gap.get("mean") is None:
        return None
    lo, hi = gap.get("ci_low"), gap.get("ci_high")
    if lo is not None and hi is not None and lo <= 0 <= hi:
        return True
    if floor_pct is not None and abs(gap["mean"]) < floor_pct:
        return True
    if lo is None and floor_pct is None:
        return None
    return False


def teacher_beaten(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The KD students (rows with `kd` true) whose held-out perplexity ends below their teacher's, on the
    same tokens: such a student learned from the text past its teacher, so the study measures the
    cross-entropy term, not distillation. [{arm, seed, heldout_ppl, teacher_heldout_ppl}]."""
    out = []
    for r in rows:
        ppl, teacher = _finite([r.get("heldout_ppl")]), _finite([r.get("teacher_heldout_ppl")])
        if r.get("kd") and ppl and teacher and ppl[0] < teacher[0]:
            out.append({"arm": r.get("arm"), "seed": r.get("seed"), "heldout_ppl": ppl[0],
                        "teacher_heldout_ppl": teacher[0]})
    return out


def flattened(values: list[Any], threshold_pct: float = FLAT_THRESHOLD_PCT) -> tuple[float | None, bool | None]:
    """(last change in %, flattened?) of a held-out curve in step order: 100 |v[-1] - v[-2]| / |v[-2]|, and
    whether it is below `threshold_pct`. (None, None) with fewer than two finite points."""
    xs = _finite(values)
    if len(xs) < 2 or xs[-2] == 0:
        return None, None
    change = 100.0 * abs(xs[-1] - xs[-2]) / abs(xs[-2])
    return change, change < threshold_pct
