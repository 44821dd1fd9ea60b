"""Sweep report: from which model size on does each FP8 recipe beat bf16, at what memory and loss cost.

    from workbench import report
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
sweeps with backends as a grid axis. `run` executes notebooks/sweep_report.ipynb with papermill and
converts it to report.html with nbconvert; the notebook calls `write_files` (CSVs and plots).
"""
from __future__ import annotations

import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from workbench import results

REFERENCE = "torch_bf16"
REPORT_NOTEBOOK = resources.files("workbench") / "notebooks" / "sweep_report.ipynb"  # package data
RAN_OK = ("ok",)  # fallback rows ran another precision than their name says: not evidence about FP8
_LOW_PRECISION = re.compile(r"fp8|float8|fp4", re.I)
# config columns that name which students ran rather than what was run: not part of the match key
_NOT_KEY = {"cfg_backends", "cfg_baseline"}
REF_COLUMNS = ("step_ms_median", "final_train_loss", "eval_mse", "peak_mem_allocated_mb")


def low_precision(df: pd.DataFrame) -> pd.Series:
    """FP8 / FP4 rows (TE recipes, torchao float8): the ones a crossover is computed for. Read from the
    rows' `gemm_precision`; sweeps written before that column existed fall back to the student name."""
    if "gemm_precision" in df.columns:
        return df["gemm_precision"].isin(["fp8", "fp4"])
    return df["student"].map(lambda s: bool(_LOW_PRECISION.search(str(s))))


# ---- loading -----------------------------------------------------------------------------------
def point_dirs(path: str | Path) -> list[Path]:
    """The complete points of a sweep folder; any other folder: every run below it (e.g. panel runs)."""
    from workbench import sweep

    path = Path(path)
    if (path / sweep.SPEC_FILE).exists() or (path / sweep.INDEX_FILE).exists():
        return sweep.complete_points(path)
    return results.run_dirs(path)


def load_sweep(path: str | Path, reference: str = REFERENCE) -> pd.DataFrame:
    """Every student row of every complete point under `path`, with the derived columns."""
    dirs = point_dirs(path)
    if not dirs:
        raise FileNotFoundError(f"no complete sweep point (students.csv + done.json) in {path}")
    frames = [pd.read_csv(d / "students.csv").assign(point=d.name) for d in dirs]
    return add_derived(pd.concat(frames, ignore_index=True), reference)


def add_derived(df: pd.DataFrame, reference: str = REFERENCE) -> pd.DataFrame:
    df = df.copy()
    df["tokens"] = df["cfg_batch"] * df["cfg_seq_len"]
    df["size_label"] = [f"{h}/{i}" for h, i in zip(df["cfg_hidden"], df["cfg_intermediate"])]
    key = [c for c in df.columns if c.startswith("cfg_") and c not in _NOT_KEY]
    ref = df[(df["student"] == reference) & df["status"].isin(RAN_OK)]
    ref = ref[key + list(REF_COLUMNS)].drop_duplicates(subset=key, keep="last")
    ref = ref.rename(columns={c: f"ref_{c}" for c in REF_COLUMNS})
    df = df.drop(columns=[f"ref_{c}" for c in REF_COLUMNS], errors="ignore").merge(ref, on=key, how="left")
    df["speedup_vs_ref"] = df["ref_step_ms_median"] / df["step_ms_median"]
    df["final_loss_ratio_vs_ref"] = df["final_train_loss"] / df["ref_final_train_loss"]
    df["eval_mse_ratio_vs_ref"] = df["eval_mse"] / df["ref_eval_mse"]
    df["peak_mem_ratio_vs_ref"] = df["peak_mem_allocated_mb"] / df["ref_peak_mem_allocated_mb"]
    df["reference"] = reference
    return df.sort_values(["tokens", "cfg_hidden", "student"], kind="stable").reset_index(drop=True)


def failed_points(sweep_dir: str | Path) -> pd.DataFrame:
    """Points whose notebook did not finish (from index.csv), with their error."""
    from workbench import sweep

    idx = sweep.read_index(sweep_dir)
    wanted = sweep.planned_ids(sweep_dir)  # rows of an earlier spec's points are history, not failures
    bad = idx[(idx["status"] != "done") & (idx["point"].isin(wanted) if wanted is not None else True)]
    cols = ["point", "status", "error_kind", "error"] + [c for c in idx.columns if c.startswith("grid_")]
    return bad[[c for c in cols if c in bad.columns]].reset_index(drop=True)


def overview(df: pd.DataFrame) -> pd.DataFrame:
    """One row per point: its size, tokens, GPU, and each student's status."""
    status = df.pivot_table(index="point", columns="student", values="status", aggfunc="first")
    first = df.groupby("point")[["cfg_hidden", "cfg_intermediate", "tokens", "gpu_name", "cfg_preset"]].first()
    return first.join(status).sort_values(["tokens", "cfg_hidden"])


# ---- the crossover ------------------------------------------------------------------------------
def crossover(df: pd.DataFrame) -> pd.DataFrame:
    """Per token count and low-precision student: the smallest hidden size at which its step is faster
    than the reference's (`crossover_hidden`; empty where it never is), whether it stays faster at
    every larger size measured, and its speedups. Reads the derived columns of `load_sweep`."""
    rows: list[dict[str, Any]] = []
    # any other swept axis (layers, layout, param dtype, ...) gets its own crossover, never a merged one
    size_axes = {"cfg_hidden", "cfg_intermediate", "cfg_batch", "cfg_seq_len"} | _NOT_KEY
    other = [c for c in df.columns if c.startswith("cfg_") and c not in size_axes and df[c].nunique(dropna=False) > 1]
    for key, g in df[low_precision(df)].groupby(["tokens", *other, "student"]):
        tokens, student = key[0], key[-1]
        g = g.sort_values("cfg_hidden")
        ran = g[g["status"].isin(RAN_OK) & g["speedup_vs_ref"].notna()]
        row: dict[str, Any] = {"tokens": tokens, **dict(zip(other, key[1:-1])), "student": student,
                               "reference": g["reference"].iloc[0],
                               "sizes_measured": len(ran), "crossover_hidden": None,
                               "crossover_intermediate": None, "speedup_at_crossover": None,
                               "faster_at_all_larger_sizes": None, "max_speedup": None,
                               "hidden_at_max_speedup": None, "speedup_at_largest": None, "note": ""}
        if ran.empty:
            reasons = sorted({f"{s}: {r}" for s, r in zip(g["status"], g["reason"].fillna(""))})
            row["note"] = "never ran as itself: " + "; ".join(reasons)[:300]
            rows.append(row)
            continue
        wins = ran[ran["speedup_vs_ref"] > 1]
        best = ran.loc[ran["speedup_vs_ref"].idxmax()]
        row.update(max_speedup=best["speedup_vs_ref"], hidden_at_max_speedup=best["cfg_hidden"],
                   speedup_at_largest=ran["speedup_vs_ref"].iloc[-1])
        if len(wins):
            first = wins.iloc[0]
            row.update(crossover_hidden=first["cfg_hidden"], crossover_intermediate=first["cfg_intermediate"],
                       speedup_at_crossover=first["speedup_vs_ref"],
                       faster_at_all_larger_sizes=bool((ran[ran["cfg_hidden"] >= first["cfg_hidden"]]
                                                        ["speedup_vs_ref"] > 1).all()))
        else:
            row["note"] = f"slower than {row['reference']} at every size measured"
        rows.append(row)
    out = pd.DataFrame(rows)
    for c in ("crossover_hidden", "crossover_intermediate", "hidden_at_max_speedup"):
        if c in out:
            out[c] = out[c].astype("Int64")  # sizes are integers; missing stays empty, never a fake size
    return out


def loss_band(df: pd.DataFrame) -> pd.DataFrame:
    """Per token count and size: min / max over the low-precision students of final loss / reference loss."""
    d = df[low_precision(df) & df["status"].isin(RAN_OK)].dropna(subset=["final_loss_ratio_vs_ref"])
    g = d.groupby(["tokens", "cfg_hidden"])["final_loss_ratio_vs_ref"]
    return g.agg(loss_ratio_min="min", loss_ratio_max="max", students="count").reset_index()


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


def speedup_vs_size(df: pd.DataFrame) -> plt.Figure:
    """Speedup of every student over the reference vs hidden size; stars mark each FP8 crossover."""
    ref = df["reference"].iloc[0]
    fig, panels = _panels(df, f"Train-step speedup vs {ref} (> 1: faster), stars: crossover")
    cross = crossover(df)
    for ax, tokens in panels:
        d = df[(df["tokens"] == tokens) & (df["student"] != ref) & df["status"].isin(RAN_OK)].dropna(subset=["speedup_vs_ref"])
        for student, g in d.groupby("student"):
            line, = ax.plot(g["cfg_hidden"], g["speedup_vs_ref"], marker="o", label=student)
            c = cross[(cross["tokens"] == tokens) & (cross["student"] == student)] if len(cross) else cross
            if len(c) and pd.notna(c["crossover_hidden"].iloc[0]):
                ax.plot(c["crossover_hidden"].iloc[0], c["speedup_at_crossover"].iloc[0], marker="*",
                        markersize=16, color=line.get_color(), markeredgecolor="black")
        ax.axhline(1.0, color="black", lw=1, ls="--")
        ax.set(title=f"{tokens} tokens / step", ylabel=f"{ref} step ms / student step ms")
        _size_axis(ax, df)
        if d.empty:
            _unknown(ax, "speedup")
        else:
            ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _metric_vs_size(df: pd.DataFrame, col: str, title: str, ylabel: str, unknown: str,
                    whiskers: tuple[str, str] | None = None) -> plt.Figure:
    """One line per student of `col` against hidden size, a panel per token count (log y)."""
    fig, panels = _panels(df, title)
    for ax, tokens in panels:
        d = df[(df["tokens"] == tokens) & df["status"].isin(RAN_OK)].dropna(subset=[col])
        for student, g in d.groupby("student"):
            err = None
            if whiskers:
                lo, hi = whiskers
                err = [(g[col] - g[lo]).clip(lower=0), (g[hi] - g[col]).clip(lower=0)]
            ax.errorbar(g["cfg_hidden"], g[col], yerr=err, marker="o", capsize=3, label=student)
        ax.set_yscale("log")
        ax.set(title=f"{tokens} tokens / step", ylabel=ylabel)
        _size_axis(ax, df)
        ax.legend(fontsize=8) if not d.empty else _unknown(ax, unknown)
    fig.tight_layout()
    return fig


def step_time_vs_size(df: pd.DataFrame) -> plt.Figure:
    return _metric_vs_size(df, "step_ms_median", "Student train step (median; whiskers p20–p80)", "ms",
                           "step time", whiskers=("step_ms_p20", "step_ms_p80"))


def peak_memory_vs_size(df: pd.DataFrame) -> plt.Figure:
    return _metric_vs_size(df, "peak_mem_allocated_mb", "Peak allocated memory in the timed loop", "MiB",
                           "peak memory (CUDA only)")


def loss_band_vs_size(df: pd.DataFrame) -> plt.Figure:
    """Final train loss of each FP8 student over the reference's; the band spans the FP8 students."""
    ref = df["reference"].iloc[0]
    fig, panels = _panels(df, f"FP8-vs-{ref} loss band (final train loss ratio; 1 = same loss)")
    band = loss_band(df)
    for ax, tokens in panels:
        b = band[band["tokens"] == tokens]
        if len(b):
            ax.fill_between(b["cfg_hidden"], b["loss_ratio_min"], b["loss_ratio_max"], alpha=0.2, color="grey",
                            label="FP8 min–max")
        d = df[(df["tokens"] == tokens) & low_precision(df) & df["status"].isin(RAN_OK)]
        for student, g in d.dropna(subset=["final_loss_ratio_vs_ref"]).groupby("student"):
            ax.plot(g["cfg_hidden"], g["final_loss_ratio_vs_ref"], marker="o", label=student)
        ax.axhline(1.0, color="black", lw=1, ls="--")
        ax.set(title=f"{tokens} tokens / step", ylabel=f"final loss / {ref} final loss")
        _size_axis(ax, df)
        ax.legend(fontsize=8) if len(b) else _unknown(ax, "FP8 loss ratio (no FP8 student ran)")
    fig.tight_layout()
    return fig


FIGURES = {"speedup_vs_size": speedup_vs_size, "step_time_vs_size": step_time_vs_size,
           "peak_memory_vs_size": peak_memory_vs_size, "loss_band_vs_size": loss_band_vs_size}


# ---- files -----------------------------------------------------------------------------------------
def default_out(sweep_dir: str | Path) -> Path:
    return Path(sweep_dir) / "report"


def write_files(df: pd.DataFrame, out_dir: str | Path, sweep_dir: str | Path | None = None) -> dict[str, Path]:
    """sweep.csv (every row + derived columns), crossover.csv, loss_band.csv, failed_points.csv and
    every figure as PNG and SVG, each written atomically into `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {
        "sweep.csv": results.write_csv(out_dir / "sweep.csv", df),
        "crossover.csv": results.write_csv(out_dir / "crossover.csv", crossover(df)),
        "loss_band.csv": results.write_csv(out_dir / "loss_band.csv", loss_band(df)),
    }
    if sweep_dir is not None:
        written["failed_points.csv"] = results.write_csv(out_dir / "failed_points.csv", failed_points(sweep_dir))
    for name, fn in FIGURES.items():
        fig = fn(df)
        for path in results.write_figure(fig, out_dir, name):
            written[path.name] = path
        plt.close(fig)
    return written


def to_html(executed: str | Path, html_path: str | Path, title: str | None = None) -> Path:
    """The executed report notebook as a standalone HTML page, code hidden (a report, not a program)."""
    import nbformat

    try:
        from nbconvert import HTMLExporter
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"{e}; the HTML report needs nbconvert: pip install -e '.[report]'") from None

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
    to_html(executed, out_dir / "report.html", title=f"Sweep report: {sweep_dir.name}")
    return out_dir


if __name__ == "__main__":  # python -m workbench.report SWEEP_DIR [REFERENCE]
    print(run(sys.argv[1], *sys.argv[2:3]))
