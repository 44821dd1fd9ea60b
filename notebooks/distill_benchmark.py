# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/<org>/te-workbench/blob/main/notebooks/distill_benchmark.ipynb)
#
# # Distillation benchmark: teacher, baseline student, Transformer Engine students
#
# One run of the workbench: a frozen teacher, a plain PyTorch student and TE students (bf16 / FP8
# recipes) start from **identical weights**, see **identical batches**, and are timed on their own
# train step (teacher targets are computed beforehand). Every number below comes from the run's result
# files (`results/<run_id>/`); change the parameters cell, or run it with papermill:
#
#     papermill notebooks/distill_benchmark.ipynb out.ipynb -p preset large -p backends "torch_bf16,te_fp8:current"
#
# `papermill --help-notebook notebooks/distill_benchmark.ipynb` lists every parameter.

# %%
# Colab only (elsewhere this cell does nothing): install the workbench from its repository and, on a
# GPU, Transformer Engine. A T4 (compute capability 7.5) has neither bf16 nor FP8: the bf16 students
# run fp16 autocast with a GradScaler and the FP8 rows say why they cannot run. The repository
# address is a placeholder until the project is published.
import os, subprocess, sys  # noqa: E401

if "google.colab" in sys.modules:
    REPO = "<org>/te-workbench"
    if not os.path.isdir("/content/te-workbench"):
        subprocess.run(["git", "clone", "-q", f"https://github.com/{REPO}", "/content/te-workbench"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", "/content/te-workbench"], check=True)
    sys.path.insert(0, "/content/te-workbench")  # this kernel started before the editable install
    os.chdir("/content/te-workbench")
    import torch

    if torch.cuda.is_available():
        subprocess.run([sys.executable, "-m", "workbench", "install-te"], check=False)  # prints its own outcome
        if not torch.cuda.is_bf16_supported():
            print(f"{torch.cuda.get_device_name()} (CC {'.'.join(map(str, torch.cuda.get_device_capability()))}): "
                  "no bf16 and no FP8 here, so bf16 students fall back to fp16 autocast + GradScaler.")

# %% tags=["parameters"]
# Which preset to start from: seed | cpu-smoke | large | auto (seed on a GPU, else cpu-smoke)
preset = "auto"
# Parent folder of the run folder, and the run folder name (None: <timestamp>-<preset>)
out = "results"
run_id = None
# Config overrides (workbench/config.py); None keeps the preset's value
vocab = None  # Vocabulary size of the token embedding (random tokens are drawn from it).
hidden = None  # Width of the residual stream (LayerNorm / Linear in-out features).
intermediate = None  # Width of each block's MLP (fc1 out / fc2 in).
layers = None  # Number of residual pre-LayerNorm MLP blocks.
seq_len = None  # Tokens per sequence.
batch = None  # Sequences per batch; tokens per step: batch * seq_len.
layout = None  # Student block layout: 'separate' (LayerNorm, Linear, GELU, Linear as in the tutorial) or 'fused' (one te.LayerNormMLP per block on TE; the same maths on torch).
param_dtype = None  # Student parameter storage: 'fp32' (master weights, the tutorial's) or 'bf16'.
steps = None  # Training steps per student (losses recorded for every one).
lr = None  # AdamW learning rate.
weight_decay = None  # AdamW weight decay.
seed = None  # Seeds the teacher, the students' shared initial weights and the batches.
eval_batches = None  # Held-out batches for the evaluation MSE against the teacher.
fused_optimizer = None  # Fused AdamW on CUDA (one kernel for the whole update).
warmup = None  # Untimed steps before the timed region (compilation, autotuning, FP8 amax history).
iters = None  # Timed training steps; median, p20, p80 and mean are reported over them.
compile = None  # torch.compile the PyTorch students (TE modules are not compiled: dynamo skips them).
graphs = None  # Capture the student's train step in a CUDA graph (GPU only; capture time reported apart).
repeats = None  # Timed blocks of `iters` steps per measured region (students and teacher); the first is reported, every block's median and their spread go to the row (`step_ms_repeat_spread_pct`).
profile = None  # One more timed block under torch.profiler per region: kernel-time sums in the student's row, the per-kernel breakdown in profile-<student>.json (on a CPU: CPU activity only, no kernel time).
loss = None  # Distillation objective on the teacher's output: 'mse' (the tutorial's), 'cosine' (1 - cosine similarity per token), or 'hidden' (output MSE + MSE of every block's hidden state).
teacher_precision = None  # Teacher forward precision: 'auto' (bf16 autocast on a bf16-capable GPU, else fp32), 'fp32', 'bf16' or 'fp16'.
backends = None  # Students to compare, as 'backend' or 'backend:recipe' (see `workbench.backends.BACKENDS`).
baseline = None  # Which student is the tutorial's 'baseline' in summary.json (must be in `backends`).
device = None  # 'auto' (CUDA when available, else CPU), 'cuda' or 'cpu'.
show_panel = None  # The widget panel at the end: True shows it, False hides it, None shows it unless papermill runs the notebook.

# %%
from workbench import notebook, plots, results

run_dir = notebook.run_cell(globals())

# %% [markdown]
# ## Students (one row each; `status` and `reason` say what ran, fell back or was skipped)

# %%
results.load(run_dir)[["student", "mode", "status", "reason", "initial_loss", "final_train_loss", "eval_mse",
                       "step_ms_median", "step_ms_p20", "step_ms_p80", "tflops", "peak_mem_allocated_mb",
                       "teacher_ms_median"]]

# %%
results.load_summary(run_dir)

# %% [markdown]
# ## Loss curves, step time, peak memory

# %%
plots.loss_curves(run_dir);

# %%
plots.step_time(run_dir);

# %%
plots.peak_memory(run_dir);

# %% [markdown]
# ## Interactive panel: pick preset, hidden sizes and backends, then Run
# Each size is the same `notebook.run_cell` call as above; headless (papermill) runs skip the panel.

# %%
from workbench import panel

panel.maybe_show(globals());
