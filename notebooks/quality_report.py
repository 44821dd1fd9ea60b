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
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/te-workbench/te-workbench/blob/main/notebooks/quality_report.ipynb)
#
# # Distillation quality: does FP8 change what the student learns, beyond the noise?

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

study_dir: str = "results/studies/distill-quality"  # The study folder written by `workbench study` (results/studies/<name>).
headline_arm: Optional[str] = None  # The arm the headline speaks of, e.g. te_fp8_current (None: the study's, te_fp8_delayed).
headline_metric: Optional[str] = None  # Its metric: heldout_ppl, kl_teacher_student_t1_nats, top1_agreement or final_train_loss (None: KL).

# %%
from pathlib import Path

import pandas as pd
from IPython.display import Image, Markdown

from workbench.notebook import readable  # tables to four significant digits, empty where a value is missing
from workbench.study.report import report

head = report(study_dir, headline_arm, headline_metric)  # writes study.csv, arms.csv, gaps.csv, headline.json, README.md and the figures
Markdown(f"**{head['sentence']}**")

# %% [markdown]
# ## Arms: mean, sd and 95% interval over seeds; did the held-out curves flatten

# %%
readable(pd.read_csv(Path(study_dir) / "arms.csv"))

# %%
Image(str(Path(study_dir) / "heldout_curves.png"))

# %% [markdown]
# ## Gaps to the bf16 reference, paired by seed, against the bf16 noise floor
# (absent when the study refuses: a KD student ended better than its teacher)

# %%
gaps = Path(study_dir) / "gaps.csv"
readable(pd.read_csv(gaps)) if gaps.exists() else Markdown("no gaps: " + head["sentence"])

# %%
Image(str(Path(study_dir) / "gap_vs_noise.png")) if gaps.exists() else None

# %% [markdown]
# ## Every arm x seed (study.csv)

# %%
readable(pd.read_csv(Path(study_dir) / "study.csv"))

# %% [markdown]
# ## About this report
# It reads one study folder written by `workbench study` (`results/studies/<name>/`): every point of its sweep,
# mapped to arms and seeds. Every number comes from the result files; `workbench.study.report` does the
# statistics (`workbench.study.stats`), this notebook only shows them. `workbench study` executes it at the end;
# by hand:
#
#     python -m workbench study --name distill-quality --report-only
#     papermill notebooks/quality_report.ipynb out.ipynb -p study_dir results/studies/distill-quality
