# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python (te-workbench)
#     language: python
#     name: te-workbench
# ---

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/te-workbench/te-workbench/blob/main/notebooks/sweep_report.ipynb)
#
# # Sweep report: from which model size on does FP8 win here?

# %%
# Colab only (elsewhere this cell does nothing): install the workbench from its repository, leaving
# Colab's own ipykernel / ipython / ipywidgets as they are (the report needs no Transformer Engine).
import sys

if "google.colab" in sys.modules:
    # %pip install -q "te-workbench @ git+https://github.com/te-workbench/te-workbench"
    pass  # the line above is an IPython magic; in this .py half it is a comment, and the block needs a statement

# %% tags=["parameters"]
# Papermill parameters (`papermill --help-notebook` lists them)
from typing import Optional

sweep_dir: str = "results/sweeps/size_crossover"  # The sweep folder written by `workbench sweep` (results/sweeps/<name>).
reference: str = "torch_bf16"  # The student every other student is compared with, at the same config.
out_dir: Optional[str] = None  # Where the report files go (None: <sweep_dir>/report).

# %%
from IPython.display import Markdown

from workbench.sweep import analysis, figures, report

df = analysis.load_sweep(sweep_dir, reference=reference)
written = report.write_files(df, out_dir or report.default_out(sweep_dir), sweep_dir=sweep_dir)
Markdown(report.intro(df, sweep_dir))

# %% [markdown]
# ## Crossover: smallest hidden size at which each FP8 student beats the reference
# Empty `crossover_hidden`: slower at every size measured (or did not run as itself: see `note`).
# Hollow markers: the student or the reference was unstable there, so that size is not counted.

# %%
report.table(analysis.crossover(df))

# %%
figures.show(df, "speedup_vs_size");

# %% [markdown]
# ## Step time, peak memory and the FP8-vs-bf16 loss band

# %%
figures.show(df, "step_time_vs_size");

# %%
figures.show(df, "peak_memory_vs_size");

# %%
figures.show(df, "loss_band_vs_size");

# %%
report.table(analysis.loss_band(df))

# %% [markdown]
# ## Points: size, tokens and each student's status

# %%
report.table(analysis.overview(df))

# %% [markdown]
# ## Scaling over GPUs (points that ran over several GPUs; their one-GPU point is timed in the same run)

# %%
report.table(analysis.multi_gpu(df), "none: no point ran over several GPUs")

# %% [markdown]
# ## Points that did not finish (their error; a restart of the sweep retries them)

# %%
report.table(analysis.failed_points(sweep_dir))

# %% [markdown]
# ## About this report
# It reads one sweep folder written by `workbench sweep` (`results/sweeps/<name>/`): every student of
# every complete point, compared with the reference student at the same config. Every number comes
# from the result files; `workbench.sweep.analysis` does the joins, this notebook only shows them. It writes
# `sweep.csv` (every row, with `unstable` / `comparable` flags), `crossover.csv`, `loss_band.csv`,
# `failed_points.csv` and the plots into `<sweep>/report/`; `workbench.sweep.report.run` (called at the end
# of every sweep) executes it with papermill and adds `report.html`:
#
#     python -m workbench sweep --name size_crossover --report-only
#     papermill notebooks/sweep_report.ipynb out.ipynb -p sweep_dir results/sweeps/size_crossover
