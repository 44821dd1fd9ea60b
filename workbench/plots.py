"""Plots of a run, read only from its result files (students.csv, losses.csv).

Each function returns a matplotlib Figure; `plot_run` saves all of them as PNG and SVG next to the data.
They read a run before its done.json too: the runner plots a run before it marks it complete.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt  # headless machines get Agg by default; notebooks keep inline
import pandas as pd

from workbench import results

RAN = ("ok", "fallback", "diverged")


def _title(df: pd.DataFrame, what: str) -> str:
    r = df.iloc[0]
    gpu = r.get("gpu_name") if isinstance(r.get("gpu_name"), str) else "CPU"
    return f"{what} — {gpu}, preset {r.get('cfg_preset')}, hidden {r.get('cfg_hidden')}, tokens {r.get('cfg_batch') * r.get('cfg_seq_len')}"


def _label(r) -> str:
    return r["student"] if r["status"] != "fallback" else f"{r['student']} (fallback)"


def loss_curves(run_dir: str | Path) -> plt.Figure:
    df, losses = results.load(run_dir, include_incomplete=True), results.load_losses(run_dir)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    styles = ["-", "--", ":", "-."]  # matched students often overlap exactly: keep every line visible
    for i, (_, r) in enumerate(df[df["status"].isin(RAN)].iterrows()):
        s = losses[losses["student"] == r["student"]]
        ax.plot(s["step"], s["loss"], marker=".", ls=styles[i % len(styles)], label=_label(r))
    ax.set(xlabel="training step", ylabel=f"train loss ({df['cfg_loss'].iloc[0]}, fp32)", title=_title(df, "Distillation loss"))
    finite = losses["loss"][losses["loss"] > 0]
    if len(finite) and finite.max() / finite.min() > 20:  # a diverging student: log scale keeps the rest readable
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _bars(ax, df: pd.DataFrame, col: str, err: tuple[str, str] | None = None) -> None:
    d = df[df["status"].isin(RAN)].dropna(subset=[col])
    labels = [_label(r) for _, r in d.iterrows()]
    kw = {}
    if err:
        lo, hi = d[col] - d[err[0]], d[err[1]] - d[col]
        kw = {"yerr": [lo.clip(lower=0).values, hi.clip(lower=0).values], "capsize": 4}
    bars = ax.bar(labels, d[col].values, **kw)
    ax.bar_label(bars, fmt=lambda v: f"{v:,.0f}" if v >= 100 else f"{v:.3g}", fontsize=8)
    ax.tick_params(axis="x", rotation=25, labelsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    if d.empty:  # e.g. memory on a CPU run: unknown is shown as unknown, not as a zero bar
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(0.5, 0.5, f"{col}: unknown here\n(torch tracks peak memory on CUDA devices only)",
                ha="center", va="center", transform=ax.transAxes)


def step_time(run_dir: str | Path) -> plt.Figure:
    df = results.load(run_dir, include_incomplete=True)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    _bars(ax, df, "step_ms_median", ("step_ms_p20", "step_ms_p80"))
    ax.set(ylabel="student train step, ms (median; whiskers p20–p80)", title=_title(df, "Step time"))
    fig.tight_layout()
    return fig


def peak_memory(run_dir: str | Path) -> plt.Figure:
    df = results.load(run_dir, include_incomplete=True)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    _bars(axes[0], df, "peak_mem_allocated_mb")
    _bars(axes[1], df, "peak_mem_reserved_mb")
    axes[0].set(ylabel="MiB", title="peak allocated (timed loop)")
    axes[1].set(ylabel="MiB", title="peak reserved (timed loop)")
    fig.suptitle(_title(df, "Peak memory"), fontsize=10)
    fig.tight_layout()
    return fig


PLOTS = {"loss_curves": loss_curves, "step_time": step_time, "peak_memory": peak_memory}


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
    """Write every plot of the run as PNG and SVG (atomically) and return the figures."""
    return _write_all(PLOTS, Path(run_dir), close)


# ---- bench (workbench.bench): read only bench.csv --------------------------------------------------
def _bench_frame(bench_dir: str | Path) -> pd.DataFrame:
    df = pd.read_csv(Path(bench_dir) / "bench.csv")
    d = df[df["status"].isin(RAN)].dropna(subset=["step_ms_median"]).sort_values("step_ms_median", ascending=False)
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
        ax.text(0.5, 0.5, "no student ran", ha="center", transform=ax.transAxes)
    else:
        lo = (d["step_ms_median"] - d["step_ms_p20"]).clip(lower=0)
        hi = (d["step_ms_p80"] - d["step_ms_median"]).clip(lower=0)
        bars = ax.barh(d["label"], d["step_ms_median"], xerr=[lo.values, hi.values], capsize=3,
                       color=[_PRECISION_COLORS.get(p, "grey") for p in d["precision"]])
        ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=3)
        ax.set_xscale("log")
    ax.set(xlabel="student train step, ms (median; whiskers p20–p80; log scale)",
           title=_bench_title(d, "Step time per backend"))
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


_PRECISION_COLORS = {"fp32": "tab:gray", "bf16": "tab:blue", "fp16": "tab:cyan", "fp8": "tab:orange"}


def bench_pct_of_peak(bench_dir: str | Path) -> plt.Figure:
    """Achieved TFLOP/s as % of the matmul peak measured in the same run and of the datasheet peak."""
    d = _bench_frame(bench_dir)
    fig, ax = plt.subplots(figsize=(10, 0.32 * max(len(d), 4) + 1.5))
    y = range(len(d))
    h = 0.4
    for off, col, name in ((-h / 2, "pct_of_measured_peak", "% of matmul peak measured in this run"),
                           (h / 2, "pct_of_datasheet_peak", "% of datasheet peak")):
        vals = d[col].astype(float) if col in d else pd.Series(dtype=float)
        bars = ax.barh([i + off for i in y], vals.fillna(0).values, height=h, label=name)
        ax.bar_label(bars, labels=["unknown" if pd.isna(v) else f"{v:.0f}" for v in vals], fontsize=7, padding=3)
    ax.set_yticks(list(y), d["label"].tolist() if len(d) else [])
    ax.tick_params(axis="y", labelsize=7)
    ax.set(xlabel="% of peak of the student's GEMM precision (fp32 / bf16 / fp8)",
           title=_bench_title(d, "Achieved TFLOP/s vs the ceiling"))
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2)  # off the bars (fp32 reaches ~100%)
    fig.tight_layout()
    return fig


BENCH_PLOTS = {"step_time_by_backend": bench_step_time, "pct_of_peak": bench_pct_of_peak}


def plot_bench(bench_dir: str | Path, close: bool = True) -> dict[str, plt.Figure]:
    return _write_all(BENCH_PLOTS, bench_dir, close)
