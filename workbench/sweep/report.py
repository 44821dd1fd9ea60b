"""Sweep report: from which model size on does each FP8 recipe beat bf16, at what memory and loss cost.

    from workbench.sweep import report
    df = report.load_sweep("results/sweeps/size_crossover")  # every student row of every complete point
    report.crossover(df)                                     # smallest hidden at which each FP8 student wins
    report.run("results/sweeps/size_crossover")              # the report notebook -> <sweep>/report/
    python -m workbench sweep --name size_crossover --report-only      # the same from the shell

`load_sweep` reads only result files (workbench.results, the sweep's done markers and index.csv) and
adds the derived columns every table and plot here uses: `tokens`, `size_label`, and per row the
reference student's numbers at the same config (`ref_step_ms_median`, …) with the ratios
`speedup_vs_ref` (reference step time / this step time: > 1 is faster), `final_loss_ratio_vs_ref`,
`eval_mse_ratio_vs_ref` and `peak_mem_ratio_vs_ref`. The reference is matched on every config
column except the student list, so it works for one run per point (all students in one run) and for
sweeps with backends as a grid axis. A row whose loss rose (`unstable`, with `unstable_reason`), or
whose reference's did (`ref_unstable`), is not `comparable`: the crossover never counts it as a win
and the plots draw it hollow. `run` executes notebooks/sweep_report.ipynb with papermill and
converts it to report.html with nbconvert; the notebook calls `write_files` (CSVs and plots).
"""
from __future__ import annotations

import importlib.util
import math
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from workbench import results


from workbench.results import plots, scaling

from workbench.sweep import plan
REFERENCE = "torch_bf16"
REPORT_NOTEBOOK = resources.files("workbench") / "notebooks" / "sweep_report.ipynb"  # package data
RAN_OK = ("ok",)  # fallback rows ran another precision than their name says: not evidence about FP8
_LOW_PRECISION = re.compile(r"fp8|float8|fp4", re.I)
# config columns that name which students ran rather than what was run: not part of the match key
_NOT_KEY = {"cfg_backends", "cfg_baseline"}
REF_COLUMNS = ("step_ms_median", "final_train_loss", "eval_mse", "peak_mem_allocated_mb", "unstable", "unstable_reason")
# A student is unstable when its final train loss is above its initial loss, or any step's loss is
# above SPIKE x the initial loss (e.g. bf16 at hidden 8192 / 8192 tokens on the H200: 0.72 -> 2.0).
SPIKE = 2.0
NO_NBCONVERT = "pip install 'nbconvert>=7.0'"  # the `report` extra; the same command for a wheel and a checkout


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
    if (path / plan.SPEC_FILE).exists() or (path / plan.INDEX_FILE).exists():
        return plan.complete_points(path)
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
        df = df.drop(columns="max_train_loss", errors="ignore").merge(peak, left_on="student", right_index=True, how="left")
    if (d / plan.DONE_FILE).exists():
        df["finished_at"] = results.read_json(d / plan.DONE_FILE).get("finished_at")
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
    ref = df[(df["student"] == reference) & df["status"].isin(RAN_OK)]
    ref = ref[key + list(REF_COLUMNS)].drop_duplicates(subset=key, keep="last")
    ref = ref.rename(columns={c: f"ref_{c}" for c in REF_COLUMNS})
    df = df.drop(columns=[f"ref_{c}" for c in REF_COLUMNS], errors="ignore").merge(ref, on=key, how="left")
    df["ref_unstable"] = df["ref_unstable"].eq(True)  # no reference at this config: nothing to flag
    df["ref_unstable_reason"] = df["ref_unstable_reason"].fillna("")
    # a speedup or loss ratio against a student whose loss rose is no evidence: never counted as a win
    df["comparable"] = df["status"].isin(RAN_OK) & ~df["unstable"] & ~df["ref_unstable"]
    df["speedup_vs_ref"] = df["ref_step_ms_median"] / df["step_ms_median"]
    df["final_loss_ratio_vs_ref"] = df["final_train_loss"] / df["ref_final_train_loss"]
    df["eval_mse_ratio_vs_ref"] = df["eval_mse"] / df["ref_eval_mse"]
    df["peak_mem_ratio_vs_ref"] = df["peak_mem_allocated_mb"] / df["ref_peak_mem_allocated_mb"]
    df["reference"] = reference
    return df.sort_values(["tokens", "cfg_hidden", "student"], kind="stable").reset_index(drop=True)


def failed_points(sweep_dir: str | Path) -> pd.DataFrame:
    """Points of the current spec without results in the report: those index.csv does not call done, with
    their error, and every complete point whose result files were damaged after it finished (status
    `damaged`, the error naming the file). A damaged index.csv is said on stderr and leaves the damaged ones."""
    try:
        idx = plan.read_index(sweep_dir)
    except plan.DamagedIndex as e:
        print(f"workbench report: {e}; the next sweep run rebuilds it", file=sys.stderr)
        idx = pd.DataFrame(columns=plan.INDEX_COLUMNS)
    wanted = plan.planned_ids(sweep_dir)  # rows of an earlier spec's points are history, not failures
    bad = idx[(idx["status"] != "done") & (idx["point"].isin(wanted) if wanted is not None else True)]
    damaged = pd.DataFrame([{"point": d.name, "status": "damaged", "error_kind": "damaged", "error": why}
                            for d, why in plan.damaged_points(sweep_dir).items()],
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
        if ran.empty:
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
                row["note"] = "; ".join(filter(None, [f"slower than {row['reference']} at every size measured", row["note"]]))
            if len(below):
                row["min_speedup_below_crossover"] = below["speedup_vs_ref"].min()
        rows.append(row)
    out = pd.DataFrame(rows, columns=["tokens", *other, *CROSSOVER_COLUMNS])
    for c in ("crossover_hidden", "crossover_intermediate", "hidden_at_max_speedup"):
        out[c] = out[c].astype("Int64")  # sizes are integers; missing stays empty, never a fake size
    return out


def loss_band(df: pd.DataFrame) -> pd.DataFrame:
    """Per token count and size: min / max over the low-precision students of final loss / reference
    loss, over the comparable rows only (a ratio to a loss that rose says nothing about FP8)."""
    d = df[low_precision(df) & df["comparable"]].dropna(subset=["final_loss_ratio_vs_ref"])
    g = d.groupby(["tokens", "cfg_hidden"])["final_loss_ratio_vs_ref"]
    return g.agg(loss_ratio_min="min", loss_ratio_max="max", students="count").reset_index()


# ---- the words at the top of the report --------------------------------------------------------
_NAMES = {"te_fp8": "TE FP8", "te_bf16": "TE bf16", "torch_bf16": "torch bf16", "torch_fp16": "torch fp16",
          "torch_fp32": "torch fp32", "torchao_float8": "torchao float8"}


def pretty(spec: str) -> str:
    """'te_fp8:delayed' -> 'TE FP8 (delayed)': the student as a reader says it."""
    name, _, recipe = spec.partition(":")
    return f"{_NAMES.get(name, name)} ({recipe})" if recipe else _NAMES.get(name, name)


def headline(cross: pd.DataFrame, gpu: str, reference: str = REFERENCE) -> str:
    """One sentence from crossover.csv: from which size FP8 beats the reference at each token count
    (the earliest student there, with its speedup), and how much slower FP8 is below that."""
    ref = pretty(reference)
    if cross.empty or cross["sizes_measured"].fillna(0).eq(0).all():
        return f"On {gpu}, no FP8 student ran as itself, so there is no crossover with {ref} to report."
    groups = [c for c in cross.columns if c not in CROSSOVER_COLUMNS]  # tokens and any other swept axis
    wins, never = [], []
    for key, g in cross.groupby(groups, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        where = ", ".join([f"{int(key[0]):,} tokens/step"] + [f"{c.removeprefix('cfg_')} {v}" for c, v in zip(groups[1:], key[1:])])
        w = g.dropna(subset=["crossover_hidden"])
        if w.empty:
            never.append(where)
            continue
        first = w.sort_values(["crossover_hidden", "speedup_at_crossover"], ascending=[True, False]).iloc[0]
        wins.append((-key[0], f"from hidden {first['crossover_hidden']} at {where} "
                               f"({pretty(first['student'])}, {first['speedup_at_crossover']:.2f}x)"))
    slow = cross["min_speedup_below_crossover"].dropna()
    slower = f"up to {1 / slow.min():.3g}x slower" if len(slow) and slow.min() < 1 else ""
    if not wins:
        return f"On {gpu}, no FP8 student beats {ref} at any size measured" + (f" ({slower})." if slower else ".")
    tail = f"; below that FP8 is {slower}" if slower else ""
    text = f"On {gpu}, FP8 beats {ref} " + " and ".join(w for _, w in sorted(wins))
    if never:
        text += f", but at no size measured at {' or '.join(never)}"
    return text + tail + "."


def environment(df: pd.DataFrame) -> dict[str, str]:
    """What the numbers were measured on, from the rows' env stamp (every distinct value, so a sweep
    resumed on another machine or commit says so) and the points' finish times."""
    def values(col: str) -> str:
        v = df[col].dropna().astype(str).unique() if col in df else []
        return ", ".join(sorted(v)) or "unknown"

    done = df["finished_at"].dropna() if "finished_at" in df else pd.Series(dtype=str)
    gpu = values("gpu_name") if values("gpu_name") != "unknown" else "CPU"
    return {"GPU": f"{gpu} (compute capability {values('compute_capability')})", "torch": values("torch"),
            "CUDA (torch)": values("torch_cuda"), "Transformer Engine": values("te_version"),
            "git sha": values("git_sha"),
            "date": f"{done.min()} – {done.max()}".replace("T", " ") if len(done) else "unknown",
            "points": str(df["point"].nunique()) if "point" in df else "unknown"}


DEFINITIONS = {
    "speedup": "the reference's median train-step time / the student's (timed loop, same config); > 1 is faster.",
    "crossover": "per token count, the smallest hidden size at which an FP8 student's speedup is > 1.",
    "loss band": "per size, the lowest to highest final train loss of the FP8 students divided by the "
                 "reference's final train loss; 1 = the same loss.",
    "unstable": f"a student whose final train loss is above its initial loss, or whose loss at any step is "
                f"above {SPIKE:g}x its initial loss. A size where the student or the reference is unstable "
                f"is not counted in the crossover or the loss band, and is drawn hollow.",
}


def intro(df: pd.DataFrame) -> str:
    """The report's opening, as Markdown: the headline, any unstable reference, the environment, the definitions."""
    env = environment(df)
    reference = df["reference"].iloc[0]
    lines = [f"**{headline(crossover(df), env['GPU'].split(' (')[0], reference)}**", ""]
    bad = df[(df["student"] == reference) & df["unstable"]]
    for _, r in bad.iterrows():
        lines.append(f"- Not counted: at hidden {r['cfg_hidden']} / {r['tokens']:,} tokens the {pretty(reference)} "
                     f"reference is unstable ({r['unstable_reason']}), so FP8's speedup and loss ratio there are no evidence.")
    lines += ["", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in env.items()] + [""]
    lines += [f"- **{k}**: {v}" for k, v in DEFINITIONS.items()]
    return "\n".join(lines)


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


_TABLE_CSS = [  # long snake_case headers may wrap after an underscore; long notes wrap: the table fits the page
    {"selector": "th", "props": "white-space: normal; max-width: 8em; vertical-align: bottom"},
    {"selector": "td", "props": "white-space: normal; max-width: 32em"},
]


def table(df: pd.DataFrame, caption: str = ""):
    """A table for the report: every row and column (never pandas' '...'), floats to 3 significant
    digits, headers allowed to wrap at underscores (a zero-width space after each)."""
    if df.empty:
        return df.style.hide(axis="index").hide(axis="columns").set_caption(caption or "none")
    text = [c for c in df.columns if not pd.api.types.is_numeric_dtype(df[c])]  # words left, numbers right
    return (df.style.format(sig3, na_rep="").hide(axis="index").set_properties(subset=text, **{"text-align": "left"})
            .format_index(lambda c: str(c).replace("_", "_\u200b"), axis=1)
            .set_table_styles(_TABLE_CSS).set_caption(caption))


# ---- plots (each returns a Figure; one panel per token count) -----------------------------------
def _panels(df: pd.DataFrame, what: str):
    tokens = sorted(df["tokens"].dropna().unique()) or [None]
    fig, axes = plt.subplots(1, len(tokens), figsize=(5.2 * len(tokens) + 1, 4.6), squeeze=False, sharey=True)
    gpu = df["gpu_name"].dropna().iloc[0] if "gpu_name" in df and df["gpu_name"].notna().any() else "CPU"
    fig.suptitle(f"{what} — {gpu}", fontsize=11)
    return fig, list(zip(axes[0], tokens))


def _size_axis(ax, d: pd.DataFrame) -> None:
    ax.set_xscale("log", base=2)
    sizes = sorted(d["cfg_hidden"].unique())
    if sizes:
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.minorticks_off()
    ax.set_xlabel("hidden (intermediate as configured)")
    ax.grid(True, alpha=0.3)


def _unknown(ax, col: str) -> None:
    ax.text(0.5, 0.5, f"{col}: unknown here", ha="center", va="center", transform=ax.transAxes)


def _hollow(ax, g: pd.DataFrame, x: str, y: str, color: str) -> bool:
    """Redraw the rows that are not comparable (unstable student or reference) as hollow markers."""
    bad = g[~g["comparable"]]
    ax.plot(bad[x], bad[y], ls="none", marker="o", markersize=9, mfc="white", mec=color, mew=2, zorder=3)
    return len(bad) > 0


def _legend(ax, hollow: bool) -> None:
    handles, _ = ax.get_legend_handles_labels()
    if hollow:
        handles.append(Line2D([], [], ls="none", marker="o", mfc="white", mec="black", mew=2,
                              label="hollow: student or reference unstable, not counted"))
    ax.legend(handles=handles, fontsize=8)


def speedup_vs_size(df: pd.DataFrame) -> plt.Figure:
    """Speedup of every student over the reference vs hidden size; stars mark each FP8 crossover,
    hollow markers the sizes where the student or the reference was unstable (not counted)."""
    ref = df["reference"].iloc[0]
    fig, panels = _panels(df, f"Train-step speedup vs {ref} (> 1: faster), stars: crossover")
    cross = crossover(df)
    for ax, tokens in panels:
        d = df[(df["tokens"] == tokens) & (df["student"] != ref) & df["status"].isin(RAN_OK)].dropna(subset=["speedup_vs_ref"])
        hollow = False
        for student, g in d.groupby("student"):
            color = plots.student_color(student)
            ax.plot(g["cfg_hidden"], g["speedup_vs_ref"], marker="o", label=student, color=color)
            hollow |= _hollow(ax, g, "cfg_hidden", "speedup_vs_ref", color)
            c = cross[(cross["tokens"] == tokens) & (cross["student"] == student)]
            if len(c) and pd.notna(c["crossover_hidden"].iloc[0]):
                ax.plot(c["crossover_hidden"].iloc[0], c["speedup_at_crossover"].iloc[0], marker="*",
                        markersize=16, color=color, markeredgecolor="black")
        ax.axhline(1.0, color="black", lw=1, ls="--")
        ax.set(title=f"{tokens} tokens / step", ylabel=f"{ref} step ms / student step ms")
        _size_axis(ax, df)
        if d.empty:
            _unknown(ax, "speedup")
        else:
            _legend(ax, hollow)
    fig.tight_layout()
    return fig


def _metric_vs_size(df: pd.DataFrame, col: str, title: str, ylabel: str, unknown: str,
                    whiskers: tuple[str, str] | None = None, scale: float = 1.0) -> plt.Figure:
    """One line per student of `col` / `scale` against hidden size, a panel per token count (log y,
    plain tick labels); unstable rows hollow."""
    fig, panels = _panels(df, title)
    for ax, tokens in panels:
        d = df[(df["tokens"] == tokens) & df["status"].isin(RAN_OK)].dropna(subset=[col])
        hollow = False
        for student, g in d.groupby("student"):
            g = g.assign(_y=g[col] / scale)
            err = None
            if whiskers:
                lo, hi = whiskers
                err = [(g["_y"] - g[lo] / scale).clip(lower=0), (g[hi] / scale - g["_y"]).clip(lower=0)]
            color = plots.student_color(student)
            ax.errorbar(g["cfg_hidden"], g["_y"], yerr=err, marker="o", capsize=3, label=student, color=color)
            hollow |= _hollow(ax, g, "cfg_hidden", "_y", color)
        ax.set_yscale("log")
        plots.plain_log_axis(ax.yaxis)
        ax.set(title=f"{tokens} tokens / step", ylabel=ylabel)
        _size_axis(ax, df)
        _legend(ax, hollow) if not d.empty else _unknown(ax, unknown)
    fig.tight_layout()
    return fig


def step_time_vs_size(df: pd.DataFrame) -> plt.Figure:
    return _metric_vs_size(df, "step_ms_median", "Student train step (median; whiskers p20–p80)", "ms (log scale)",
                           "step time", whiskers=("step_ms_p20", "step_ms_p80"))


def peak_memory_vs_size(df: pd.DataFrame) -> plt.Figure:
    return _metric_vs_size(df, "peak_mem_allocated_mb", "Peak allocated memory in the timed loop", "GiB (log scale)",
                           "peak memory (CUDA only)", scale=plots.GIB)


def loss_band_vs_size(df: pd.DataFrame) -> plt.Figure:
    """Final train loss of each FP8 student over the reference's; the band spans the FP8 students at
    the comparable sizes; hollow markers where the student or the reference was unstable."""
    ref = df["reference"].iloc[0]
    fig, panels = _panels(df, f"FP8-vs-{ref} loss band (final train loss ratio; 1 = same loss)")
    band = loss_band(df)
    # the (shared) axis spans the comparable ratios: one against a diverged reference (0.27 "better")
    # must not squash the band; such a point sits hollow on the axis edge with its value beside it
    lo, hi = min(1.0, band["loss_ratio_min"].min()), max(1.0, band["loss_ratio_max"].max())
    lo, hi = lo - 0.15 * (hi - lo) - 0.02, hi + 0.15 * (hi - lo) + 0.02
    for ax, tokens in panels:
        b = band[band["tokens"] == tokens]
        if len(b):
            ax.fill_between(b["cfg_hidden"], b["loss_ratio_min"], b["loss_ratio_max"], alpha=0.2, color="grey",
                            label="FP8 min–max")
        d = df[(df["tokens"] == tokens) & low_precision(df) & df["status"].isin(RAN_OK)]
        d = d.dropna(subset=["final_loss_ratio_vs_ref"])
        hollow = False
        for student, g in d.groupby("student"):
            color = plots.student_color(student)
            ok = g[g["comparable"]]
            ax.plot(ok["cfg_hidden"], ok["final_loss_ratio_vs_ref"], marker="o", label=student, color=color)
            inset = 0.04 * (hi - lo)
            bad = g[~g["comparable"]].assign(y=lambda b: b["final_loss_ratio_vs_ref"].clip(lo + inset, hi - inset))
            hollow |= _hollow(ax, bad, "cfg_hidden", "y", color)
            for x, y, v in zip(bad["cfg_hidden"], bad["y"], bad["final_loss_ratio_vs_ref"]):
                if v != y:
                    ax.annotate(f"{v:.2f} (off scale)", (x, y), textcoords="offset points", xytext=(-10, 0),
                                ha="right", va="center", fontsize=8, color=color,
                                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": color, "lw": 0.5})
        ax.set_ylim(lo, hi)
        ax.axhline(1.0, color="black", lw=1, ls="--")
        ax.set(title=f"{tokens} tokens / step", ylabel=f"final loss / {ref} final loss")
        _size_axis(ax, df)
        _legend(ax, hollow) if len(d) else _unknown(ax, "FP8 loss ratio (no FP8 student ran)")
    fig.tight_layout()
    return fig


FIGURES = {"speedup_vs_size": speedup_vs_size, "step_time_vs_size": step_time_vs_size,
           "peak_memory_vs_size": peak_memory_vs_size, "loss_band_vs_size": loss_band_vs_size}


def multi_gpu(df: pd.DataFrame) -> pd.DataFrame:
    """The scaling table (workbench.results.scaling) of the points that ran over several GPUs; empty if none did."""
    spread = scaling.points(df)
    return spread if (spread["gpus"] > 1).any() else spread.iloc[0:0]


# ---- files -----------------------------------------------------------------------------------------
def default_out(sweep_dir: str | Path) -> Path:
    return Path(sweep_dir) / "report"


def write_files(df: pd.DataFrame, out_dir: str | Path, sweep_dir: str | Path | None = None) -> dict[str, Path]:
    """sweep.csv (every row + derived columns), crossover.csv, loss_band.csv, failed_points.csv, for points
    that ran over several GPUs scaling.csv (workbench.results.scaling), and every figure as PNG and SVG, each
    written atomically into `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {
        "sweep.csv": results.write_csv(out_dir / "sweep.csv", df),
        "crossover.csv": results.write_csv(out_dir / "crossover.csv", crossover(df)),
        "loss_band.csv": results.write_csv(out_dir / "loss_band.csv", loss_band(df)),
    }
    if sweep_dir is not None:
        written["failed_points.csv"] = results.write_csv(out_dir / "failed_points.csv", failed_points(sweep_dir))
    figures = dict(FIGURES)
    spread = multi_gpu(df)
    if len(spread):  # points that ran over several GPUs: their scaling, beside the sizes
        written["scaling.csv"] = results.write_csv(out_dir / "scaling.csv", spread)
        figures["scaling"] = lambda _df: scaling.figure(spread)
    for name, fn in figures.items():
        fig = fn(df)
        for path in results.write_figure(fig, out_dir, name):
            written[path.name] = path
        plt.close(fig)
    return written


def to_html(executed: str | Path, html_path: str | Path, title: str | None = None) -> Path:
    """The executed report notebook as a standalone HTML page, code hidden (a report, not a program)."""
    import nbformat

    from nbconvert import HTMLExporter  # `run` says what to install when it is missing

    nb = nbformat.read(str(executed), as_version=4)
    nb.metadata["title"] = title or "Sweep report"  # the page's <title>; nbconvert's default is "Notebook"
    body, _ = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True) \
        .from_notebook_node(nb)
    return results.write_bytes(Path(html_path), body.encode())


def run(sweep_dir: str | Path, reference: str = REFERENCE, out_dir: str | Path | None = None,
        progress: bool = False) -> Path:
    """Execute the report notebook on a sweep, then write report.html; returns the report folder."""
    import papermill as pm

    sweep_dir = Path(sweep_dir).resolve()
    if not point_dirs(sweep_dir):  # say so here rather than as a traceback from inside the kernel
        raise FileNotFoundError(f"no complete sweep point (students.csv + done.json) in {sweep_dir}")
    out_dir = Path(out_dir).resolve() if out_dir else default_out(sweep_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / REPORT_NOTEBOOK.name
    from workbench.notebook import kernel_uses_this_python

    kernel_uses_this_python()
    pm.execute_notebook(str(REPORT_NOTEBOOK), str(executed),
                        parameters={"sweep_dir": str(sweep_dir), "reference": reference, "out_dir": str(out_dir)},
                        kernel_name="python3", language="python", progress_bar=progress,
                        cwd=str(out_dir))
    if importlib.util.find_spec("nbconvert") is None:  # the report stands without its HTML page
        print(f"workbench report: report.html not written: it needs nbconvert ({NO_NBCONVERT}); the CSVs, plots "
              f"and the executed notebook are in {out_dir}", file=sys.stderr)
        return out_dir
    to_html(executed, out_dir / "report.html", title=f"Sweep report: {sweep_dir.name}")
    return out_dir


if __name__ == "__main__":  # python -m workbench.sweep.report SWEEP_DIR [REFERENCE]
    print(run(sys.argv[1], *sys.argv[2:3]))
