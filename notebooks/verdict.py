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
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/te-workbench/te-workbench/blob/main/notebooks/verdict.ipynb)
#
# # Does FP8 pay for your model? The verdict: predicted from its config, measured on your GPU

# %%
# Colab only (elsewhere this cell does nothing): install the workbench from its repository, leaving
# Colab's own ipykernel / ipython / ipywidgets as they are; on a GPU the measured part needs Transformer Engine
# (`python -m workbench install-te`), without it the TE rows say why they did not run.
import sys

if "google.colab" in sys.modules:
    # %pip install -q "te-workbench @ git+https://github.com/te-workbench/te-workbench"
    pass  # the line above is an IPython magic; in this .py half it is a comment, and the block needs a statement

# %% tags=["parameters"]
# Papermill parameters (`papermill --help-notebook` lists them)
from typing import Optional

model: str = "llama-3.2-1b"  # A Hugging Face model folder (its config.json) or an hf-init shape name.
preset: str = "hf-llama-1b"  # The run whose tokens a step (batch x seq_len) the verdict is for.
overrides: list = []  # Config overrides, e.g. ["model.batch=8"] (as `--set` takes them).
out: str = "results/verdict/llama-3.2-1b"  # The folder for verdict.json, verdict.md and the figure.
budget_s: float = 360.0  # The GPU part's bench: variants not started after this many seconds become rows saying so.
peak: Optional[str] = None  # A bench's peak.json: its measured GEMM peaks replace the datasheet's ideal times.
studies: list = []  # Study folders (`workbench study`): what FP8 does to what the student learns, against noise.

# %%
from pathlib import Path

from IPython.display import Image, Markdown

from workbench import config
from workbench.verdict.cli import run

verdict = run(model, preset, config.parse_set(overrides), out, peak=peak, budget_s=budget_s, studies=studies,
              command_line=f"papermill notebooks/verdict.ipynb out.ipynb -p model {model} -p preset {preset}"
              + (f" -y 'studies: {list(studies)}'" if studies else ""))
Markdown(f"**{verdict['headline']}**")

# %%
Image(str(Path(out) / "verdict.png"))

# %%
Markdown((Path(out) / "verdict.md").read_text())

# %% [markdown]
# ## About this page
# Everything above comes from `workbench.verdict` (this notebook only calls it and shows its files): the prediction
# reads the model's config.json on any machine; on a CUDA GPU the measured part benches the model with itself as
# teacher and takes the fastest bf16 row as the denominator. From a terminal:
#
#     python -m workbench verdict llama-3.2-1b --preset hf-llama-1b --out results/verdict/llama-3.2-1b
#     papermill notebooks/verdict.ipynb out.ipynb -p model llama-3.2-1b -p preset hf-llama-1b
