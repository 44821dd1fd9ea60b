"""The sweep report's figures, drawn from workbench.sweep.analysis's frame: speedup, step time, peak memory
and the FP8-vs-reference loss band against hidden size. Each returns a Figure with one panel per token
count; rows that are not comparable (the student or the reference unstable) are drawn hollow.

As a run's plots (workbench.results.plots.has_data), a figure is drawn only where it has data (`drawable`,
`show`): no empty "unknown here" frame of peak memory on a CPU, nor a loss band where no FP8 student ran;
figures of step times measured on a CPU carry the run's caveat (plots.CPU_TIMINGS) under their title."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D

from workbench.results import plots
from workbench.sweep.analysis import FRAMEWORK_REFERENCES, RAN_OK, crossover, loss_band, low_precision


def _gpu(df: pd.DataFrame) -> str:
    """Every GPU the rows ran on (a sweep resumed on another kind names both, as the report's environment does)."""
    names = sorted(df["gpu_name"].dropna().astype(str).unique()) if "gpu_name" in df else []
    return " + ".join(names) or "CPU"


def _panels(df: pd.DataFrame, what: str, timings: bool = False):
    """A figure with one panel per token count; `timings`: a figure of step times (the CPU caveat under it)."""
    tokens = sorted(df["tokens"].dropna().unique()) or [None]
    fig, axes = plt.subplots(1, len(tokens), figsize=(5.2 * len(tokens) + 1, 4.6), squeeze=False, sharey=True)
    gpu = _gpu(df)
    # one panel is ~6 inches, ~11 characters an inch at this size: a longer title (two references and a GPU's
    # full name) puts the GPU on its own line rather than past the figure's edge
    title = f"{what} — {gpu}" if len(what) + len(gpu) + 3 <= 11 * fig.get_figwidth() else f"{what}\n{gpu}"
    fig.suptitle(title + (f"\n{plots.CPU_TIMINGS}" if timings and gpu == "CPU" else ""), fontsize=11)
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


def _references(df: pd.DataFrame) -> list[str]:
    """The rows' references: the PyTorch bf16 one first, then another framework's own (FRAMEWORK_REFERENCES)."""
    return sorted(set(df["reference"].dropna()), key=lambda r: r in FRAMEWORK_REFERENCES.values())


def speedup_vs_size(df: pd.DataFrame) -> plt.Figure:
    """Speedup of every student over the reference vs hidden size; stars mark each FP8 crossover,
    hollow markers the sizes where the student or the reference was unstable (not counted)."""
    refs = _references(df)
    ref = " / ".join(refs)
    fig, panels = _panels(df, f"Train-step speedup vs {ref} (> 1: faster), stars: crossover", timings=True)
    cross = crossover(df)
    for ax, tokens in panels:
        d = df[(df["tokens"] == tokens) & ~df["student"].isin(refs) & df["status"].isin(RAN_OK)].dropna(
            subset=["speedup_vs_ref"]
        )
        hollow = False
        for (student, own), g in d.groupby(["student", "reference"]):
            color = plots.student_color(student)
            label = student if own == refs[0] else f"{student} (vs {own})"
            ax.plot(g["cfg_hidden"], g["speedup_vs_ref"], marker="o", label=label, color=color)
            hollow |= _hollow(ax, g, "cfg_hidden", "speedup_vs_ref", color)
            c = cross[(cross["tokens"] == tokens) & (cross["student"] == student)]
            if len(c) and pd.notna(c["crossover_hidden"].iloc[0]):
                ax.plot(c["crossover_hidden"].iloc[0], c["speedup_at_crossover"].iloc[0], marker="*",
                        markersize=16, color=color, markeredgecolor="black")
        ax.axhline(1.0, color="black", lw=1, ls="--")
        ax.set(title=f"{tokens} tokens / step", ylabel="reference step ms / student step ms")
        _size_axis(ax, df)
        if d.empty:
            _unknown(ax, "speedup")
        else:
            _legend(ax, hollow)
    fig.tight_layout()
    return fig


def _metric_vs_size(df: pd.DataFrame, col: str, title: str, ylabel: str, unknown: str,
                    whiskers: tuple[str, str] | None = None, scale: float = 1.0, timings: bool = False) -> plt.Figure:
    """One line per student of `col` / `scale` against hidden size, a panel per token count (log y,
    plain tick labels); unstable rows hollow."""
    fig, panels = _panels(df, title, timings)
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
                           "step time", whiskers=("step_ms_p20", "step_ms_p80"), timings=True)


def peak_memory_vs_size(df: pd.DataFrame) -> plt.Figure:
    return _metric_vs_size(df, "peak_mem_allocated_mb", "Peak allocated memory in the timed loop", "GiB (log scale)",
                           "peak memory (CUDA only)", scale=plots.GIB)


def loss_band_vs_size(df: pd.DataFrame) -> plt.Figure:
    """Final train loss of each FP8 student over the reference's; the band spans the FP8 students at
    the comparable sizes; hollow markers where the student or the reference was unstable."""
    ref = " / ".join(_references(df))
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
# what each figure draws, said when it has nothing to draw (the has-data rule of a run's plots)
NEEDS = {"speedup_vs_size": "a speedup (a student and the reference both ran at a size)",
         "step_time_vs_size": "a step time", "peak_memory_vs_size": "a peak memory (measured on GPUs only)",
         "loss_band_vs_size": "an FP8 loss ratio (an FP8 student and the reference both ran)"}


def _drawn(df: pd.DataFrame, name: str) -> pd.DataFrame:
    """The rows figure `name` draws: the students that ran as themselves, with its number."""
    ok = df[df["status"].isin(RAN_OK)]
    if name == "speedup_vs_size":
        return ok[ok["student"] != ok["reference"]].dropna(subset=["speedup_vs_ref"])
    if name == "loss_band_vs_size":
        return ok[low_precision(ok)].dropna(subset=["final_loss_ratio_vs_ref"])
    col = {"step_time_vs_size": "step_ms_median", "peak_memory_vs_size": "peak_mem_allocated_mb"}[name]
    return ok.dropna(subset=[col]) if col in ok else ok.iloc[:0]


def has_data(df: pd.DataFrame, name: str) -> bool:
    """Whether figure `name` has anything to draw in the sweep's frame (a panel without data still says so)."""
    return not df.empty and not _drawn(df, name).empty


def drawable(df: pd.DataFrame) -> dict:
    """The figures that have something to draw, by name (those the report writes)."""
    return {name: fn for name, fn in FIGURES.items() if has_data(df, name)}


def show(df: pd.DataFrame, name: str) -> plt.Figure | None:
    """Figure `name` where it has data, else one line saying so instead of an empty frame; None then."""
    if has_data(df, name):
        return FIGURES[name](df)
    print(f"{name}: nothing to plot: no point has {NEEDS[name]}")
    return None


