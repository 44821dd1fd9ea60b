"""Plots of a run, read only from its result files (students.csv, losses.csv).

Each function returns a matplotlib Figure; `plot_run` saves all of them as PNG and SVG next to the data.
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
    df, losses = results.load(run_dir), results.load_losses(run_dir)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for _, r in df[df["status"].isin(RAN)].iterrows():
        s = losses[losses["student"] == r["student"]]
        ax.plot(s["step"], s["loss"], marker=".", label=_label(r))
    ax.set(xlabel="training step", ylabel=f"train loss ({df['cfg_loss'].iloc[0]}, fp32)", title=_title(df, "Distillation loss"))
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
    if d.empty:
        ax.text(0.5, 0.5, f"{col}: unknown here", ha="center", transform=ax.transAxes)


def step_time(run_dir: str | Path) -> plt.Figure:
    df = results.load(run_dir)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    _bars(ax, df, "step_ms_median", ("step_ms_p20", "step_ms_p80"))
    ax.set(ylabel="student train step, ms (median; whiskers p20–p80)", title=_title(df, "Step time"))
    fig.tight_layout()
    return fig


def peak_memory(run_dir: str | Path) -> plt.Figure:
    df = results.load(run_dir)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    _bars(axes[0], df, "peak_mem_allocated_mb")
    _bars(axes[1], df, "peak_mem_reserved_mb")
    axes[0].set(ylabel="MiB", title="peak allocated (timed loop)")
    axes[1].set(ylabel="MiB", title="peak reserved (timed loop)")
    fig.suptitle(_title(df, "Peak memory"), fontsize=10)
    fig.tight_layout()
    return fig


PLOTS = {"loss_curves": loss_curves, "step_time": step_time, "peak_memory": peak_memory}


def plot_run(run_dir: str | Path, close: bool = True) -> dict[str, plt.Figure]:
    """Write every plot of the run as PNG and SVG (atomically) and return the figures."""
    run_dir = Path(run_dir)
    figs = {}
    for name, fn in PLOTS.items():
        fig = fn(run_dir)
        for ext in ("png", "svg"):
            tmp = run_dir / f".{name}.tmp.{ext}"
            fig.savefig(tmp, dpi=110)
            tmp.replace(run_dir / f"{name}.{ext}")
        figs[name] = fig
        if close:
            plt.close(fig)
    return figs
