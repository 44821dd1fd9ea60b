"""The sweep report: its words (the headline, the environment, the definitions), its tables, its files
(CSVs and figures into <sweep>/report/) and report.html.

    from workbench.sweep import report
    report.run("results/sweeps/size_crossover")              # the report notebook -> <sweep>/report/
    python -m workbench sweep --name size_crossover --report-only      # the same from the shell
    python -m workbench.sweep.report SWEEP_DIR [REFERENCE]             # the same, without the sweep's checks

`run` executes notebooks/sweep_report.ipynb with papermill and converts it to report.html with
nbconvert (the same sweep gives the same bytes); the notebook calls `write_files` (CSVs and plots) and shows
the tables of workbench.sweep.analysis and the figures of workbench.sweep.figures.
"""
from __future__ import annotations

import hashlib
import importlib.util
import sys
import tempfile
from importlib import resources
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from workbench import results
from workbench.results import scaling
from workbench.run import slow_path
from workbench.sweep.analysis import (
    CROSSOVER_COLUMNS,
    FRAMEWORK_REFERENCES,
    REFERENCE,
    SPIKE,
    crossover,
    failed_points,
    loss_band,
    multi_gpu,
    point_dirs,
    sig3,
)
from workbench.sweep.figures import drawable

REPORT_NOTEBOOK = resources.files("workbench") / "notebooks" / "sweep_report.ipynb"  # package data
NO_NBCONVERT = "pip install 'nbconvert>=7.0'"  # the `report` extra; the same command for a wheel and a checkout

# ---- the words at the top of the report --------------------------------------------------------
_NAMES = {"te_fp8": "TE FP8", "te_bf16": "TE bf16", "torch_bf16": "torch bf16", "torch_fp16": "torch fp16",
          "torch_fp32": "torch fp32", "torchao_float8": "torchao float8", "jax": "JAX"}


def pretty(spec: str) -> str:
    """'te_fp8:delayed' -> 'TE FP8 (delayed)': the student as a reader says it."""
    name, _, recipe = spec.partition(":")
    return f"{_NAMES.get(name, name)} ({recipe})" if recipe else _NAMES.get(name, name)


def headline(cross: pd.DataFrame, gpu: str, reference: str = REFERENCE) -> str:
    """The sentence below for the PyTorch rows (against `reference`), then one per other framework's rows (the JAX
    comparator, against its own bf16 student: the crossover.csv `reference` column)."""
    if "reference" not in cross.columns or cross.empty:
        return _headline(cross, gpu, reference)
    others = [r for r in dict.fromkeys(cross["reference"]) if r != reference]
    mine = cross[cross["reference"] == reference]
    parts = [_headline(mine, gpu, reference)] if len(mine) or not others else []  # a JAX-only sweep: its own
    return " ".join(parts + [_headline(cross[cross["reference"] == r], gpu, r) for r in others])


def _headline(cross: pd.DataFrame, gpu: str, reference: str) -> str:
    """One sentence from crossover.csv: from which size FP8 beats the reference at each token count
    (the earliest student there, with its speedup), and how much slower FP8 is below that."""
    ref = pretty(reference)
    if cross.empty or cross["sizes_measured"].fillna(0).eq(0).all():
        if len(cross) and cross["note"].fillna("").str.startswith(f"no {reference} row").any():
            return f"On {gpu}, no {ref} row ran beside its FP8 students, so there is no crossover with it to report."
        return f"On {gpu}, no FP8 student ran as itself, so there is no crossover with {ref} to report."
    groups = [c for c in cross.columns if c not in CROSSOVER_COLUMNS]  # tokens and any other swept axis
    wins, never = [], []
    for key, g in cross.groupby(groups, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        where = ", ".join(
            [f"{int(key[0]):,} tokens/step"] + [f"{c.removeprefix('cfg_')} {v}" for c, v in zip(groups[1:], key[1:])]
        )
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


def gpu_of(df: pd.DataFrame) -> str:
    """The GPU (or GPUs) the rows ran on, 'CPU' when none."""
    v = sorted(df["gpu_name"].dropna().astype(str).unique()) if "gpu_name" in df else []
    return ", ".join(v) or "CPU"


def environment(df: pd.DataFrame, sweep_dir: str | Path | None = None) -> dict[str, str]:
    """What the numbers were measured on: each point's line as its run says it (workbench.notebook.versions_line:
    'CPU · torch … · CUDA none · TE not installed · git …'), every distinct one (a sweep resumed on another machine
    or commit says so), and the points' finish times. Without the sweep folder, only the GPU."""
    from workbench.notebook import versions_line

    done = df["finished_at"].dropna() if "finished_at" in df else pd.Series(dtype=str)
    names = set(df["point"]) if "point" in df else set()
    lines = sorted({versions_line(d) for d in point_dirs(sweep_dir) if d.name in names}) if sweep_dir else []
    return {"measured on": " / ".join(lines) or gpu_of(df),
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


def intro(df: pd.DataFrame, sweep_dir: str | Path | None = None) -> str:
    """The report's opening, as Markdown: the headline, on a CPU the run's caveat on its timings, any unstable
    reference, the environment, the definitions."""
    env = environment(df, sweep_dir)
    # the PyTorch reference (rows sort by student name: 'jax:bf16' may come first)
    reference = next((r for r in df["reference"] if r not in FRAMEWORK_REFERENCES.values()), df["reference"].iloc[0])
    lines = [f"**{headline(crossover(df), gpu_of(df), reference)}**", ""]
    if gpu_of(df) == "CPU":  # the caveat every CPU run's summary carries: speedups here are noise
        lines += [f"⚠ {slow_path.CPU_NOTE}.", ""]
    bad = df[(df["student"] == df["reference"]) & df["unstable"]]  # every framework's reference
    for _, r in bad.iterrows():
        lines.append(
            f"- Not counted: at hidden {r['cfg_hidden']} / {r['tokens']:,} tokens the {pretty(r['student'])} "
            f"reference is unstable ({r['unstable_reason']}), so FP8's speedup and loss ratio there are no evidence."
        )
    lines += ["", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in env.items()] + [""]
    lines += [f"- **{k}**: {v}" for k, v in DEFINITIONS.items()]
    return "\n".join(lines)


_TABLE_CSS = [  # long snake_case headers may wrap after an underscore; long notes wrap: the table fits the page
    {"selector": "th", "props": "white-space: normal; max-width: 8em; vertical-align: bottom"},
    {"selector": "td", "props": "white-space: normal; max-width: 32em"},
]


def table(df: pd.DataFrame, caption: str = ""):
    """A table for the report: every row and column (never pandas' '...'), floats to 3 significant
    digits, headers allowed to wrap at underscores (a zero-width space after each)."""
    # the table's HTML id (and its CSS selectors) from its content, not pandas' random one: the same sweep
    # gives report.html with the same bytes
    style = df.style.set_uuid(hashlib.sha256(f"{caption}\n{df.to_csv()}".encode()).hexdigest()[:10])
    if df.empty:
        return style.hide(axis="index").hide(axis="columns").set_caption(caption or "none")
    text = [c for c in df.columns if not pd.api.types.is_numeric_dtype(df[c])]  # words left, numbers right
    return (style.format(sig3, na_rep="").hide(axis="index").set_properties(subset=text, **{"text-align": "left"})
            .format_index(lambda c: str(c).replace("_", "_\u200b"), axis=1)
            .set_table_styles(_TABLE_CSS).set_caption(caption))


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
    figures = drawable(df)  # no empty frame: a figure without data is not drawn (as a run's plots)
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
    for n, cell in enumerate(nb.cells):  # HTML ids: papermill gives its parameters cell a random one
        cell.id = f"cell-{n}"
    body, _ = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True) \
        .from_notebook_node(nb)
    return results.write_bytes(Path(html_path), body.encode())


def run(sweep_dir: str | Path, reference: str = REFERENCE, out_dir: str | Path | None = None,
        progress: bool = False) -> Path:
    """Execute the report notebook on a sweep, then write report.html; returns the report folder."""
    sweep_dir = Path(sweep_dir).resolve()
    if not point_dirs(sweep_dir):  # say so here rather than as a traceback from inside the kernel
        raise FileNotFoundError(f"no complete sweep point (students.csv + done.json) in {sweep_dir}")
    out_dir = Path(out_dir).resolve() if out_dir else default_out(sweep_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from workbench.notebook import kernel_uses_this_python, papermill_execute

    kernel_uses_this_python()
    # The executed notebook is executed outside the report folder: it is report.html's source, with this run's
    # times and absolute paths in it, so a rerun on the same sweep (a committed one included) changes no
    # byte there and adds no file. Kept as the report only where there is no nbconvert to make report.html.
    with tempfile.TemporaryDirectory(prefix="sweep_report_") as tmp:
        executed = Path(tmp) / REPORT_NOTEBOOK.name
        papermill_execute(str(REPORT_NOTEBOOK), str(executed), progress_bar=progress, cwd=str(out_dir),
                          parameters={"sweep_dir": str(sweep_dir), "reference": reference, "out_dir": str(out_dir)})
        if importlib.util.find_spec("nbconvert") is None:  # the report stands without its HTML page
            results.write_bytes(out_dir / executed.name, executed.read_bytes())
            print(f"workbench report: report.html not written: it needs nbconvert ({NO_NBCONVERT}); the CSVs, "
                  f"plots and the executed notebook are in {out_dir}", file=sys.stderr)
            return out_dir
        to_html(executed, out_dir / "report.html", title=f"Sweep report: {sweep_dir.name}")
    return out_dir


if __name__ == "__main__":  # python -m workbench.sweep.report SWEEP_DIR [REFERENCE]
    print(run(sys.argv[1], *sys.argv[2:3]))
