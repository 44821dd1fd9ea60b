"""Sweep analysis: from which model size on does each FP8 recipe beat bf16, at what memory and loss cost.

    from workbench.sweep import analysis
    df = analysis.load_sweep("results/sweeps/size_crossover")  # every student row of every complete point
    analysis.crossover(df)                                     # smallest hidden at which each FP8 student wins

`load_sweep` reads only result files (workbench.results, the sweep's done markers and index.csv) and
adds the derived columns every table and plot of the report uses: `tokens`, `size_label`, and per row
the reference student's numbers at the same config (`ref_step_ms_median`, …) with the ratios
`speedup_vs_ref` (reference step time / this step time: > 1 is faster), `final_loss_ratio_vs_ref`,
`eval_mse_ratio_vs_ref` and `peak_mem_ratio_vs_ref`. The reference is matched on every config
column except the student list, so it works for one run per point (all students in one run) and for
sweeps with backends as a grid axis. A row whose loss rose (`unstable`, with `unstable_reason`), or
whose reference's did (`ref_unstable`), is not `comparable`: the crossover never counts it as a win
and the plots (workbench.sweep.figures) draw it hollow.
"""
from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench import results
from workbench.results import scaling
from workbench.sweep import index, plan

REFERENCE = "torch_bf16"
# Another framework's rows (a `framework` column: the JAX comparator) are compared with that framework's own bf16
# student, so its FP8 crossover stands beside the PyTorch one instead of under a PyTorch denominator
FRAMEWORK_REFERENCES = {"jax": "jax:bf16"}
RAN_OK = ("ok",)  # fallback rows ran another precision than their name says: not evidence about FP8
_LOW_PRECISION = re.compile(r"fp8|float8|fp4", re.I)
# config columns that name which students ran rather than what was run: not part of the match key
_NOT_KEY = {"cfg_backends", "cfg_baseline"}
REF_COLUMNS = ("step_ms_median", "final_train_loss", "eval_mse", "peak_mem_allocated_mb", "unstable", "unstable_reason")
# A student is unstable when its final train loss is above its initial loss, or any step's loss is
# above SPIKE x the initial loss (e.g. bf16 at hidden 8192 / 8192 tokens on the H200: 0.72 -> 2.0).
SPIKE = 2.0


def low_precision(df: pd.DataFrame) -> pd.Series:
    """FP8 / FP4 rows (TE recipes, torchao float8): the ones a crossover is computed for. Read from the
    rows' `gemm_precision`; sweeps written before that column existed fall back to the student name."""
    if "gemm_precision" in df.columns:
        return df["gemm_precision"].isin(["fp8", "fp4"])
    return df["student"].map(lambda s: bool(_LOW_PRECISION.search(str(s))))


# ---- loading -----------------------------------------------------------------------------------
def point_dirs(path: str | Path) -> list[Path]:
    """The complete points of a sweep folder; any other folder: every run below it (e.g. panel runs)."""
    path = Path(path)
    if (path / plan.SPEC_FILE).exists() or (path / index.INDEX_FILE).exists():
        return index.complete_points(path)
    return results.run_dirs(path)


def load_sweep(path: str | Path, reference: str = REFERENCE) -> pd.DataFrame:
    """Every student row of every complete point under `path`, with the derived columns."""
    dirs = point_dirs(path)
    if not dirs:
        raise FileNotFoundError(f"no complete sweep point (students.csv + done.json) in {path}")
    return add_derived(pd.concat([_point_frame(d) for d in dirs], ignore_index=True), reference)


def _point_frame(d: Path) -> pd.DataFrame:
    """A point's students.csv, plus each student's highest step loss (losses.csv: for `unstable`) and
    when the point finished (done.json: the report's date)."""
    df = results.read_students(d).assign(point=d.name)
    if (d / "losses.csv").exists():
        peak = results.read_csv(d / "losses.csv").groupby("student")["loss"].max().rename("max_train_loss")
        df = df.drop(columns="max_train_loss", errors="ignore").merge(
            peak, left_on="student", right_index=True, how="left"
        )
    if (d / index.DONE_FILE).exists():
        df["finished_at"] = results.read_json(d / index.DONE_FILE).get("finished_at")
    return df


def stability(df: pd.DataFrame) -> pd.DataFrame:
    """`unstable` and `unstable_reason` per row: final loss above initial, or a step above SPIKE x initial."""
    losses = df.reindex(columns=["initial_loss", "final_train_loss", "max_train_loss"]).astype(float)  # absent: unknown
    init, final, peak = losses["initial_loss"], losses["final_train_loss"], losses["max_train_loss"]
    rose, spiked = final > init, peak > SPIKE * init
    reason = [("; ".join(([f"final loss {sig3(f)} > initial {sig3(i)}"] if r else [])
                         + ([f"a step loss {sig3(p)} > {SPIKE:g}x initial {sig3(i)}"] if sp else [])))
              for i, f, p, r, sp in zip(init, final, peak, rose, spiked)]
    return pd.DataFrame({"unstable": rose | spiked, "unstable_reason": reason}, index=df.index)


def add_derived(df: pd.DataFrame, reference: str = REFERENCE) -> pd.DataFrame:
    df = df.copy()
    df["tokens"] = df["cfg_batch"] * df["cfg_seq_len"]
    df["size_label"] = [f"{h}/{i}" for h, i in zip(df["cfg_hidden"], df["cfg_intermediate"])]
    df[["unstable", "unstable_reason"]] = stability(df)
    key = [c for c in df.columns if c.startswith("cfg_") and c not in _NOT_KEY]
    framework = df["framework"].fillna("torch") if "framework" in df.columns else pd.Series("torch", index=df.index)
    df["reference"] = framework.map(lambda f: FRAMEWORK_REFERENCES.get(f, reference))
    ref = df[(df["student"] == df["reference"]) & df["status"].isin(RAN_OK)]
    ref = ref[[*key, "reference", *REF_COLUMNS]].drop_duplicates(subset=[*key, "reference"], keep="last")
    ref = ref.rename(columns={c: f"ref_{c}" for c in REF_COLUMNS})
    df = df.drop(columns=[f"ref_{c}" for c in REF_COLUMNS], errors="ignore").merge(ref, on=[*key, "reference"],
                                                                                    how="left")
    df["ref_unstable"] = df["ref_unstable"].eq(True)  # no reference at this config: nothing to flag
    df["ref_unstable_reason"] = df["ref_unstable_reason"].fillna("")
    # a speedup or loss ratio against a student whose loss rose is no evidence: never counted as a win
    df["comparable"] = df["status"].isin(RAN_OK) & ~df["unstable"] & ~df["ref_unstable"]
    df["speedup_vs_ref"] = df["ref_step_ms_median"] / df["step_ms_median"]
    df["final_loss_ratio_vs_ref"] = df["final_train_loss"] / df["ref_final_train_loss"]
    df["eval_mse_ratio_vs_ref"] = df["eval_mse"] / df["ref_eval_mse"]
    df["peak_mem_ratio_vs_ref"] = df["peak_mem_allocated_mb"] / df["ref_peak_mem_allocated_mb"]
    df["reference"] = df.pop("reference")  # the last column, where sweep.csv has always had it
    return df.sort_values(["tokens", "cfg_hidden", "student"], kind="stable").reset_index(drop=True)


def failed_points(sweep_dir: str | Path) -> pd.DataFrame:
    """Points of the current spec without results in the report: those index.csv does not call done, with
    their error, and every complete point whose result files were damaged after it finished (status
    `damaged`, the error naming the file). A damaged index.csv is said on stderr and leaves the damaged ones."""
    try:
        idx = index.read_index(sweep_dir)
    except index.DamagedIndex as e:
        print(f"workbench report: {e}; the next sweep run rebuilds it", file=sys.stderr)
        idx = pd.DataFrame(columns=index.INDEX_COLUMNS)
    wanted = plan.planned_ids(sweep_dir)  # rows of an earlier spec's points are history, not failures
    bad = idx[(idx["status"] != "done") & (idx["point"].isin(wanted) if wanted is not None else True)]
    damaged = pd.DataFrame([{"point": d.name, "status": "damaged", "error_kind": "damaged", "error": why}
                            for d, why in index.damaged_points(sweep_dir).items()],
                           columns=["point", "status", "error_kind", "error"])
    bad = pd.concat([bad[~bad["point"].isin(damaged["point"])], damaged], ignore_index=True) if len(damaged) else bad
    cols = ["point", "status", "error_kind", "error"] + [c for c in idx.columns if c.startswith("grid_")]
    return bad[[c for c in cols if c in bad.columns]].reset_index(drop=True)


def overview(df: pd.DataFrame) -> pd.DataFrame:
    """One row per point: its size, tokens and each student's status ('ok, unstable' where its loss rose)."""
    status = df["status"].where(~df["unstable"], df["status"] + ", unstable")
    table = df.assign(status=status).pivot_table(index="point", columns="student", values="status", aggfunc="first")
    first = df.groupby("point")[["cfg_hidden", "cfg_intermediate", "tokens"]].first()
    return first.join(table).sort_values(["tokens", "cfg_hidden"]).reset_index()


# ---- the crossover ------------------------------------------------------------------------------
def _other_axes(df: pd.DataFrame) -> list[str]:
    """Swept config columns besides size and tokens (layers, layout, ...): each value gets its own
    crossover, never one merged over them."""
    size_axes = {"cfg_hidden", "cfg_intermediate", "cfg_batch", "cfg_seq_len"} | _NOT_KEY
    return [c for c in df.columns if c.startswith("cfg_") and c not in size_axes and df[c].nunique(dropna=False) > 1]


CROSSOVER_COLUMNS = ["student", "reference", "sizes_measured", "crossover_hidden", "crossover_intermediate",
                     "speedup_at_crossover", "faster_at_all_larger_sizes", "max_speedup", "hidden_at_max_speedup",
                     "speedup_at_largest", "min_speedup_below_crossover", "not_counted_hidden", "note"]


def crossover(df: pd.DataFrame) -> pd.DataFrame:
    """Per token count and low-precision student: the smallest hidden size at which its step is faster
    than the reference's (`crossover_hidden`; empty where it never is), whether it stays faster at
    every larger size measured, its speedups, and its worst speedup below the crossover. Sizes where
    the student or the reference was unstable are left out of all of these (`not_counted_hidden`).
    Reads the derived columns of `load_sweep`. No FP8 row: the columns with no rows."""
    other = _other_axes(df)
    rows: list[dict[str, Any]] = []
    for key, g in df[low_precision(df)].groupby(["tokens", *other, "student"]):
        g = g.sort_values("cfg_hidden")
        ran = g[g["status"].isin(RAN_OK) & g["speedup_vs_ref"].notna()]
        counted = ran[ran["comparable"]]
        row: dict[str, Any] = {"tokens": key[0], **dict(zip(other, key[1:-1])), "student": key[-1],
                               "reference": g["reference"].iloc[0], "sizes_measured": len(ran), "note": ""}
        skipped = ran[~ran["comparable"]]
        if len(skipped):
            row["not_counted_hidden"] = " ".join(str(h) for h in skipped["cfg_hidden"])
            why = [f"hidden {h} ({'reference' if ref_bad else 'own loss'} rose)"
                   for h, ref_bad in zip(skipped["cfg_hidden"], skipped["ref_unstable"])]  # details: sweep.csv
            row["note"] = "unstable, not counted: " + ", ".join(why)
        if ran.empty and g["status"].isin(RAN_OK).any():  # it ran, but its reference did not (not in backends)
            row["note"] = f"no {row['reference']} row at its sizes to compare with: add it to the backends"
        elif ran.empty:
            reasons = sorted({f"{s}: {r}" for s, r in zip(g["status"], g["reason"].fillna(""))})
            row["note"] = "never ran as itself: " + "; ".join(reasons)[:300]
        elif counted.empty:
            row["note"] = "no stable size to compare; " + row["note"]
        else:
            best = counted.loc[counted["speedup_vs_ref"].idxmax()]
            row.update(max_speedup=best["speedup_vs_ref"], hidden_at_max_speedup=best["cfg_hidden"],
                       speedup_at_largest=counted["speedup_vs_ref"].iloc[-1])
            wins = counted[counted["speedup_vs_ref"] > 1]
            below = counted
            if len(wins):
                first = wins.iloc[0]
                below = counted[counted["cfg_hidden"] < first["cfg_hidden"]]
                row.update(crossover_hidden=first["cfg_hidden"], crossover_intermediate=first["cfg_intermediate"],
                           speedup_at_crossover=first["speedup_vs_ref"],
                           faster_at_all_larger_sizes=bool((counted[counted["cfg_hidden"] >= first["cfg_hidden"]]
                                                            ["speedup_vs_ref"] > 1).all()))
            else:
                row["note"] = "; ".join(
                    filter(None, [f"slower than {row['reference']} at every size measured", row["note"]])
                )
            if len(below):
                row["min_speedup_below_crossover"] = below["speedup_vs_ref"].min()
        rows.append(row)
    out = pd.DataFrame(rows, columns=["tokens", *other, *CROSSOVER_COLUMNS])
    for c in ("crossover_hidden", "crossover_intermediate", "hidden_at_max_speedup"):
        out[c] = out[c].astype("Int64")  # sizes are integers; missing stays empty, never a fake size
    return out


def loss_band(df: pd.DataFrame) -> pd.DataFrame:
    """Per token count and size: min / max over the low-precision students of final loss / reference
    loss, over the comparable rows only (a ratio to a loss that rose says nothing about FP8). Each ratio is to the
    student's own framework's bf16 reference (a JAX FP8 row's to jax:bf16)."""
    d = df[low_precision(df) & df["comparable"]].dropna(subset=["final_loss_ratio_vs_ref"])
    g = d.groupby(["tokens", "cfg_hidden"])["final_loss_ratio_vs_ref"]
    return g.agg(loss_ratio_min="min", loss_ratio_max="max", students="count").reset_index()


def multi_gpu(df: pd.DataFrame) -> pd.DataFrame:
    """The scaling table (workbench.results.scaling) of the points that ran over several GPUs; empty if none did."""
    spread = scaling.points(df)
    return spread if (spread["gpus"] > 1).any() else spread.iloc[0:0]


def sig3(v: Any) -> Any:
    """A float to 3 significant digits without exponents (36,800 rather than 3.68e+04); others unchanged."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (float, np.floating)):
        return v
    if not math.isfinite(v):
        return "" if math.isnan(v) else str(v)
    if v == 0 or abs(v) < 1e-3:
        return f"{v:.3g}"
    v = float(f"{v:.3g}")  # round first: 0.99967 -> 1.0 -> "1.00", not "1.000"
    return f"{v:,.{max(2 - math.floor(math.log10(abs(v))), 0)}f}"
