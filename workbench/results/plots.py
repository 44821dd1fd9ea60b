"""Plots of a run, read only from its result files (students.csv, losses.csv).

Each function returns a matplotlib Figure; `plot_run` saves all of them as PNG and SVG next to the data.
Every figure here and in workbench.sweep.figures draws a student in `student_color(spec)`, so a student keeps
its colour from one plot to the next and from one run to the next; axes use `plain_log_axis` and GiB.
They read a run before its done.json too: the runner plots a run before it marks it complete.
"""
from __future__ import annotations

import zlib
from pathlib import Path

import matplotlib.pyplot as plt  # headless machines get Agg by default; notebooks keep inline
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from workbench import results

# One colour per student spec. Keyed by spec (never by plotting order), so torchao is the same green in
# every figure of every run. Families share a hue (TE FP8 reds/oranges, torchao greens, torch greys/blues).
# A spec not named here (a backend added as one file) draws in a checksum colour from _OTHER_COLORS, which
# this table never uses: it needs no entry, an entry only picks its hue (tests/results/test_plots.py).
STUDENT_COLORS = {
    "torch_fp32": "#7f7f7f", "torch_bf16": "#1f77b4", "torch_fp16": "#17becf",
    "te_bf16": "#9467bd",
    "te_fp8:delayed": "#ff7f0e", "te_fp8:delayed_e4m3": "#ffbb78", "te_fp8:current": "#d62728",
    "te_fp8:block": "#8c564b", "te_fp8:mxfp8": "#e377c2", "te_fp8:nvfp4": "#bcbd22",
    "torchao_float8:tensorwise": "#2ca02c", "torchao_float8:rowwise": "#98df8a",
    # the JAX comparator: the darker twin of its PyTorch counterpart's colour
    "jax:fp32": "#525252", "jax:bf16": "#08519c", "jax:fp8_current": "#a50f15",
}
_OTHER_COLORS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354")
GIB = 1024.0  # MiB per GiB: result files keep MiB (peak_mem_*_mb), figures show GiB


def student_color(spec: str) -> str:
    """The colour of a student in every figure; specs not in the table get one from a checksum of
    the name, the same in every process (Python's hash() is salted per process)."""
    return STUDENT_COLORS.get(spec) or _OTHER_COLORS[zlib.crc32(spec.encode()) % len(_OTHER_COLORS)]


def _plain(v: float, _pos=None) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:g}"


def plain_log_axis(axis) -> None:
    """Log scale whose ticks read as plain numbers (20, 50, 100, 0.5), never as 10^x or 2x10^1."""
    axis.set_major_locator(LogLocator(base=10, subs=(1, 2, 3, 5)))
    axis.set_major_formatter(FuncFormatter(_plain))
    axis.set_minor_formatter(NullFormatter())


def wide(values, ratio: float = 5.0) -> bool:
    """A range wide enough that a linear axis would flatten the small values (fp32 vs FP8 steps)."""
    v = pd.Series(values, dtype=float).dropna()
    v = v[v > 0]
    return len(v) > 1 and v.max() / v.min() > ratio


def nothing_to_plot(ax, why: str) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, wrap=True)


def _no_student_ran(df: pd.DataFrame) -> str:
    states = ", ".join(f"{s}: {st}" for s, st in zip(df["student"], df["status"]))
    return f"nothing to plot: no student produced this number\n({states})"


CPU_TIMINGS = "CPU timings are a smoke test, not a comparison of the students"
"""The caveat under every figure of step times (or speedups) measured on a CPU: the run's, the sweep's, the panel's."""


def _title(df: pd.DataFrame, what: str, timings: bool = False) -> str:
    """`timings`: a figure of step times; on a CPU its title says they are a smoke test."""
    r = df.iloc[0]
    gpu = r.get("gpu_name") if isinstance(r.get("gpu_name"), str) else "CPU"
    tokens = r.get("cfg_batch") * r.get("cfg_seq_len")
    title = f"{what} — {gpu}, preset {r.get('cfg_preset')}, hidden {r.get('cfg_hidden')}, tokens {tokens}"
    return title + (f"\n{CPU_TIMINGS}" if timings and gpu == "CPU" else "")


def _label(r) -> str:
    label = r["student"] if r["status"] != "fallback" else f"{r['student']} (fallback)"
    return f"{label} (cross-entropy only)" if str(r["student"]).endswith(":no_kd") else label


def loss_curves(run_dir: str | Path) -> plt.Figure:
    df, losses = results.load(run_dir, include_incomplete=True), results.load_losses(run_dir)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    styles = ["-", "--", ":", "-."]  # matched students often overlap exactly: keep every line visible
    ran = df[df["status"].isin(results.STARTED) & df["student"].isin(losses["student"])]
    for i, (_, r) in enumerate(ran.iterrows()):
        s = losses[losses["student"] == r["student"]]
        ax.plot(s["step"], s["loss"], marker=".", ls=styles[i % len(styles)], label=_label(r),
                color=student_color(r["student"]))
    ax.set(
        xlabel="training step",
        ylabel=f"train loss ({df['cfg_loss'].iloc[0]}, fp32)",
        title=_title(df, "Distillation loss"),
    )
    if ran.empty:
        nothing_to_plot(ax, _no_student_ran(df))
        fig.tight_layout()
        return fig
    finite = losses["loss"][losses["loss"] > 0]
    if len(finite) and finite.max() / finite.min() > 20:  # a diverging student: log scale keeps the rest readable
        ax.set_yscale("log")
        plain_log_axis(ax.yaxis)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _bars(ax, df: pd.DataFrame, col: str, err: tuple[str, str] | None = None, scale: float = 1.0,
          unit: str = "", unknown: str = "") -> tuple[pd.DataFrame, list] | None:
    """One bar per student that produced `col` (divided by `scale`), its value written on it.
    A wide range gets a log axis; a narrow one (differences under a fifth of the value) an axis
    that starts near the smallest bar, said in the axis label, so 17.7 and 19.3 GiB do not look equal.
    Returns (the rows drawn, their bars), None when nothing was."""
    d = df[df["status"].isin(results.STARTED)].dropna(subset=[col])
    if d.empty:  # e.g. memory on a CPU run, or every student diverged: unknown is shown as unknown, not as 0
        nothing_to_plot(ax, unknown or _no_student_ran(df))
        return None
    v = d[col].astype(float) / scale
    kw = {}
    if err:
        lo, hi = v - d[err[0]] / scale, d[err[1]] / scale - v
        kw = {"yerr": [lo.clip(lower=0).values, hi.clip(lower=0).values], "capsize": 4}
    bars = ax.bar([_label(r) for _, r in d.iterrows()], v.values, color=[student_color(s) for s in d["student"]],
                  hatch=["//" if s == "fallback" else None for s in d["status"]], **kw)
    ax.bar_label(bars, labels=[f"{_plain(float(f'{x:.3g}'))}{unit}" for x in v], fontsize=8, padding=2)
    ax.tick_params(axis="x", rotation=25, labelsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    if wide(v):
        ax.set_yscale("log")
        plain_log_axis(ax.yaxis)
        ax.set_ylim(top=ax.get_ylim()[1] * 1.5)  # room for the top bar's value label
        ax.set_ylabel(f"{ax.get_ylabel()}, log scale")
    elif v.min() > 0 and v.max() - v.min() < 0.2 * v.max():
        bottom = max(0.0, v.min() - max(v.max() - v.min(), 0.05 * v.max()))
        ax.set_ylim(bottom, v.max() + 0.35 * (v.max() - bottom))  # headroom for the value labels
        ax.set_ylabel(f"{ax.get_ylabel()}\n(axis starts at {_plain(float(f'{bottom:.3g}'))}, not 0)")
    return d, list(bars)


def step_time(run_dir: str | Path) -> plt.Figure:
    df = results.load(run_dir, include_incomplete=True)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    ax.set_ylabel("train step, ms\n(median; whiskers p20–p80)")
    drawn = _bars(ax, df, "step_ms_median", ("step_ms_p20", "step_ms_p80"), unit=" ms")
    ax.set_title(_title(df, "Step time", timings=True))
    if drawn is not None:
        _mark_slow(fig, ax, *drawn)
    fig.tight_layout()
    return fig


SLOW_MARK = "⚠"


def _mark_slow(fig, ax, d: pd.DataFrame, bars: list) -> None:
    """A marker at the foot of every bar whose student ran a slower path than the machine offers (the row's
    `slow_path`, workbench.run.slow_path), and one line under the axes naming the first such student and why."""
    slow = [(r, b) for r, b in zip(d.to_dict("records"), bars) if isinstance(r.get("slow_path"), str)]
    for _, b in slow:
        ax.annotate(SLOW_MARK, (b.get_x() + b.get_width() / 2, 0), xycoords=("data", "axes fraction"),
                    xytext=(0, 4), textcoords="offset points", ha="center", va="bottom", color="#b00000", fontsize=14,
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "#b00000"})
    if slow:
        first = slow[0][0]
        more = f" (+{len(slow) - 1} more: summary.json slow_path)" if len(slow) > 1 else ""
        line = f"{SLOW_MARK} slower path than this machine offers — {first['student']}: {first['slow_path']}"
        fig.text(0.01, 0.005, (line[:150] + "…" if len(line) > 150 else line) + more, fontsize=7,
                 color="#b00000", ha="left", va="bottom")
        fig.subplots_adjust(bottom=0.25)


def peak_memory(run_dir: str | Path) -> plt.Figure:
    df = results.load(run_dir, include_incomplete=True)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    cpu = "unknown here\n(torch tracks peak memory on CUDA devices only)"
    for ax, col, what in (
        (axes[0], "peak_mem_allocated_mb", "allocated"),
        (axes[1], "peak_mem_reserved_mb", "reserved"),
    ):
        ax.set(ylabel="GiB", title=f"peak {what} (timed loop)")
        ran = df["status"].isin(results.RAN).any()  # else: say that no student ran, not "CPU"
        _bars(ax, df, col, scale=GIB, unit=" GiB", unknown=f"{col}: {cpu}" if ran else "")
    fig.suptitle(_title(df, "Peak memory"), fontsize=10)
    fig.tight_layout()
    return fig


def heldout_quality(run_dir: str | Path) -> plt.Figure:
    """Language models: each student's held-out perplexity and KL to its teacher (T=1), the teacher's own
    perplexity as a line; the losses of KD and no-KD students are not comparable, these are."""
    df = results.load(run_dir, include_incomplete=True)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    axes[0].set(ylabel="perplexity", title="held-out perplexity (lower is better)")
    axes[1].set(ylabel="nats per token", title="KL(teacher ‖ student), T=1, held out")
    _bars(axes[0], df, "heldout_ppl")
    _bars(axes[1], df, "kl_teacher_student_t1_nats")
    teacher = df["teacher_heldout_ppl"].dropna()
    if len(teacher):
        axes[0].axhline(float(teacher.iloc[0]), color="black", ls="--", lw=1, label=f"teacher {teacher.iloc[0]:.3g}")
        axes[0].legend(fontsize=8)
    fig.suptitle(_title(df, "Held-out quality"), fontsize=10)
    fig.tight_layout()
    return fig


def heldout_curves(run_dir: str | Path) -> plt.Figure:
    """Language models with train.eval_every: held-out perplexity and KL to the teacher against the
    training step, one line per student (eval_curve.csv)."""
    df = results.load(run_dir, include_incomplete=True)
    curve = results.read_csv(Path(run_dir) / "eval_curve.csv")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    styles = ["-", "--", ":", "-."]
    for i, (student, c) in enumerate(curve.groupby("student", sort=False)):
        r = df[df["student"] == student]
        label = _label(r.iloc[0]) if len(r) else student
        for ax, col in zip(axes, ("heldout_ppl", "kl_teacher_student_t1_nats")):
            ax.plot(
                c["step"], c[col], marker=".", ls=styles[i % len(styles)], color=student_color(student), label=label
            )
    axes[0].set(xlabel="training step", ylabel="perplexity", title="held-out perplexity")
    axes[1].set(xlabel="training step", ylabel="nats per token", title="KL(teacher ‖ student), T=1, held out")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(_title(df, "Held-out quality during training"), fontsize=10)
    fig.tight_layout()
    return fig


PLOTS = {"loss_curves": loss_curves, "step_time": step_time, "peak_memory": peak_memory}
LM_PLOTS = {"heldout_quality": heldout_quality}
# The column each run plot draws: a figure whose column no started student has is not drawn (no empty figures:
# peak memory on a CPU, anything when every student was skipped)
NEEDS = {"loss_curves": "losses.csv", "step_time": "step_ms_median", "peak_memory": "peak_mem_allocated_mb",
         "heldout_quality": "heldout_ppl"}


def has_data(run_dir: str | Path, name: str) -> bool:
    """Whether plot `name` of the run has anything to draw (see NEEDS)."""
    df = results.load(run_dir, include_incomplete=True)
    col = NEEDS.get(name)
    started = df[df["status"].isin(results.STARTED)]
    if col == "losses.csv":  # a diverged student's curve is worth drawing: it shows where it went
        return started["student"].isin(results.load_losses(run_dir)["student"]).any()
    return col is None or (col in started and started[col].notna().any())


def run_plots(run_dir: str | Path) -> dict:
    """The run's plots that have something to draw, by name."""
    lm = "heldout_ppl" in results.load(run_dir, include_incomplete=True)
    curves = {"heldout_curves": heldout_curves} if lm and (Path(run_dir) / "eval_curve.csv").exists() else {}
    return {k: fn for k, fn in {**PLOTS, **(LM_PLOTS if lm else {}), **curves}.items() if has_data(run_dir, k)}


def _write_all(plots: dict, folder: str | Path, close: bool) -> dict[str, plt.Figure]:
    """Draw each plot from `folder`'s files, write it there as PNG and SVG (atomically), return the figures."""
    figs = {}
    for name, fn in plots.items():
        figs[name] = fig = fn(folder)
        results.write_figure(fig, folder, name)
        if close:
            plt.close(fig)
    return figs


def plot_run(run_dir: str | Path, close: bool = True) -> dict[str, plt.Figure]:
    """Write every plot of the run that has something to draw as PNG and SVG (atomically); return the figures."""
    return _write_all(run_plots(run_dir), Path(run_dir), close)


# ---- bench (workbench.bench): read only bench.csv --------------------------------------------------
def _bench_frame(bench_dir: str | Path) -> pd.DataFrame:
    df = results.read_csv(Path(bench_dir) / "bench.csv")
    d = (
        df[df["status"].isin(results.STARTED)]
        .dropna(subset=["step_ms_median"])
        .sort_values("step_ms_median", ascending=False)
    )
    return d.assign(label=d["variant"] + " / " + d["student"])


def _bench_title(df: pd.DataFrame, what: str) -> str:
    if df.empty:
        return what
    r = df.iloc[0]
    gpu = r.get("gpu_name") if isinstance(r.get("gpu_name"), str) else "CPU"
    return f"{what} — {gpu}, preset {r.get('preset')}"


def bench_step_time(bench_dir: str | Path) -> plt.Figure:
    """Median student step per (variant, student), log scale, whiskers p20–p80."""
    d = _bench_frame(bench_dir)
    fig, ax = plt.subplots(figsize=(10, 0.32 * max(len(d), 4) + 1.5))
    if d.empty:
        nothing_to_plot(ax, "nothing to plot: no student ran")
    else:
        lo = (d["step_ms_median"] - d["step_ms_p20"]).clip(lower=0)
        hi = (d["step_ms_p80"] - d["step_ms_median"]).clip(lower=0)
        bars = ax.barh(d["label"], d["step_ms_median"], xerr=[lo.values, hi.values], capsize=3,
                       color=[student_color(s) for s in d["student"]])
        ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=3)
        ax.set_xscale("log")
        plain_log_axis(ax.xaxis)
    ax.set(xlabel="student train step, ms (median; whiskers p20–p80; log scale)",
           title=_bench_title(d, "Step time per backend"))
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def bench_pct_of_peak(bench_dir: str | Path) -> plt.Figure:
    """Achieved TFLOP/s as % of the matmul peak measured in the same run (solid) and of the datasheet
    peak (hatched), each bar in its student's colour."""
    d = _bench_frame(bench_dir)
    fig, ax = plt.subplots(figsize=(10, 0.32 * max(len(d), 4) + 1.5))
    y = range(len(d))
    h = 0.4
    colors = [student_color(s) for s in d["student"]]
    for off, col, name, hatch in ((-h / 2, "pct_of_measured_peak", "% of matmul peak measured in this run", None),
                                  (h / 2, "pct_of_datasheet_peak", "% of datasheet peak", "//")):
        vals = d[col].astype(float) if col in d else pd.Series(dtype=float)
        bars = ax.barh([i + off for i in y], vals.fillna(0).values, height=h, label=name, color=colors,
                       hatch=hatch, edgecolor="white" if hatch else None)
        ax.bar_label(bars, labels=["unknown" if pd.isna(v) else f"{v:.0f}" for v in vals], fontsize=7, padding=3)
    ax.set_yticks(list(y), d["label"].tolist() if len(d) else [])
    ax.tick_params(axis="y", labelsize=7)
    ax.set(xlabel="% of peak of the student's GEMM precision (fp32 / bf16 / fp8)",
           title=_bench_title(d, "Achieved TFLOP/s vs the ceiling"))
    ax.grid(True, axis="x", alpha=0.3)
    if d.empty:
        nothing_to_plot(ax, "nothing to plot: no student ran")
    else:  # legend swatches in grey: the colour says the student, solid/hatched says which peak
        for patch in ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2).get_patches():
            patch.set_facecolor("lightgrey")
    fig.tight_layout()
    return fig


BENCH_PLOTS = {"step_time_by_backend": bench_step_time, "pct_of_peak": bench_pct_of_peak}


def plot_bench(bench_dir: str | Path, close: bool = True) -> dict[str, plt.Figure]:
    return _write_all(BENCH_PLOTS, bench_dir, close)
