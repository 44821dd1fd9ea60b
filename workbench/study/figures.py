"""A study's figures, drawn only from its tables (curves.csv, gaps.csv) and study.json: the held-out curves
per arm and the gaps beside the noise floor. `workbench.study.report` writes them beside the tables."""
from __future__ import annotations

from typing import Any

import pandas as pd

from workbench.study.spec import METRIC_NAMES, REFERENCE_ARM, Study


def _arm_style(study: Study, name: str) -> dict[str, Any]:
    from workbench.results import plots

    a = study.arm(name)
    color = plots.student_color(a.student if a and a.kd and not a.noise else name)
    return {"color": color, "ls": "--" if a and (a.noise or not a.kd) else "-"}


def heldout_curves(study: Study, curves: pd.DataFrame, teacher_ppl: float | None = None):
    """Held-out KL to the teacher and perplexity against the training step: per arm the mean over seeds,
    the band its min and max; the teacher's own held-out perplexity as a line (a distillation study refuses
    students below it; a fine-tuning one does not)."""
    from matplotlib.ticker import MaxNLocator

    from workbench.results import plots

    fig, axes = plots.plt.subplots(1, 2, figsize=(11, 4.8))
    if curves.empty:
        for ax in axes:
            plots.nothing_to_plot(ax, "no held-out curve (train.eval_every 0, or no point complete)")
        return fig
    for arm, c in curves.groupby("arm", sort=False):
        style = _arm_style(study, arm)
        for ax, m in zip(axes, ("kl_teacher_student_t1_nats", "heldout_ppl")):
            g = c.groupby("step")[m]
            mean, lo, hi = g.mean(), g.min(), g.max()
            ax.plot(mean.index, mean.values, marker=".", label=f"{arm} ({c['seed'].nunique()} seeds)", **style)
            ax.fill_between(mean.index, lo.values, hi.values, color=style["color"], alpha=0.15, lw=0)
    axes[0].set(xlabel="training step", ylabel="nats per token", title="KL(teacher ‖ student), T=1, held out")
    axes[1].set(xlabel="training step", ylabel="perplexity", title="held-out perplexity")
    for ax in axes:  # steps are whole numbers: no 12.5 on a short study's axis
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    if teacher_ppl:
        axes[1].axhline(teacher_ppl, color="black", ls=":", lw=1.2, label=f"teacher ({teacher_ppl:.2f})")
    axes[1].set_yscale("log")
    plots.plain_log_axis(axes[1].yaxis)
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Study {study.name}: mean over seeds, band min to max", fontsize=10)
    fig.tight_layout()
    return fig


def interval_xerr(r: dict | pd.Series) -> list[list[float]]:
    """A gap row's 95% interval as errorbar's xerr ([[below], [above]] the mean; 0 where a bound is missing)."""
    lo = r["gap_pct_mean"] - r["gap_pct_ci_low"] if pd.notna(r["gap_pct_ci_low"]) else 0
    hi = r["gap_pct_ci_high"] - r["gap_pct_mean"] if pd.notna(r["gap_pct_ci_high"]) else 0
    return [[lo], [hi]]


def gap_vs_noise(study: Study, gaps: pd.DataFrame):
    """Each arm's paired gap to the reference (mean, 95% interval) against the bf16 noise floor (the grey
    band, +- the floor): an interval inside the band or across 0 is noise."""
    from workbench.results import plots

    fig, axes = plots.plt.subplots(1, 2, figsize=(11, 0.6 * len(study.arms) + 2.2))
    for ax, m in zip(axes, ("kl_teacher_student_t1_nats", "heldout_ppl")):
        g = gaps[(gaps["metric"] == m) & gaps["gap_pct_mean"].notna()].reset_index(drop=True)
        floor = gaps[gaps["metric"] == m]["noise_floor_pct"].dropna()
        if len(floor):
            ax.axvspan(-floor.iloc[0], floor.iloc[0], color="#bbbbbb", alpha=0.4,
                       label=f"bf16 noise floor ±{floor.iloc[0]:.2f}%")
        ax.axvline(0, color="black", lw=0.8)
        for i, r in g.iterrows():
            ax.errorbar(r["gap_pct_mean"], i, xerr=interval_xerr(r), fmt="o", capsize=4,
                        color=_arm_style(study, r["arm"])["color"])
        ax.set_yticks(range(len(g)), [f"{r.arm}{' (noise)' if r.within_noise is True else ''}" for r in g.itertuples()])
        ax.invert_yaxis()
        ax.set(xlabel=f"gap to {REFERENCE_ARM}, % (95% interval over seeds)", title=METRIC_NAMES[m])
        ax.grid(True, axis="x", alpha=0.3)
        if len(floor):  # below the axes: inside, it covered the last arm's interval
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    fig.suptitle(f"Study {study.name}: paired gaps vs the bf16 noise floor", fontsize=10)
    fig.tight_layout()
    return fig
