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
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/te-workbench/te-workbench/blob/main/notebooks/distill_benchmark.ipynb)
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
# The notebook names the kernel `te-workbench`, which `make` registers for its venv; elsewhere pick your
# environment's kernel in Jupyter, or give papermill `-k python3`.
#
# `papermill --help-notebook notebooks/distill_benchmark.ipynb` lists every parameter; the parameters cell
# (every config field, about 70 lines) opens collapsed: click its `…` to open it.

# %%
# Colab only (elsewhere this cell does nothing): install the workbench from its repository, leaving
# Colab's own ipykernel / ipython / ipywidgets as they are, then Transformer Engine. The installer runs
# in this kernel, so pip's output and its verdict show below: a T4 (compute capability 7.5) has neither
# bf16 nor FP8, the verdict says so, and the bf16 students run fp16 autocast with a GradScaler. After
# a successful TE install, restart the session (Runtime > Restart session) so TE is imported fresh.
import sys

if "google.colab" in sys.modules:
    # %pip install -q "te-workbench @ git+https://github.com/te-workbench/te-workbench"
    from workbench import cli

    cli.main(["install-te"])

# %% jupyter={"source_hidden": true} tags=["parameters"]
# Papermill parameters (`papermill --help-notebook` lists them), generated from workbench/config.py:
# edit the dataclasses there and run scripts/sync_notebooks.py, not this cell.
from typing import Optional

preset: str = "auto"  # Preset to start from: seed | cpu-smoke | large | gpt-cpu | lm-a | lm-b | lm-distill | hf-llama-4l | hf-llama-1b | hf-qwen2.5-0.5b | auto (seed on a GPU, else cpu-smoke).
out: Optional[str] = None  # Parent folder of the run folder (None: results/ at the repository root in a checkout, else ./results).
run_id: Optional[str] = None  # Run folder name (None: <timestamp>-<preset>).
# Config overrides; None keeps the preset's value
kind: Optional[str] = None  # The student architecture: 'mlp' (the tutorial's MLP blocks on random tokens, regressing the teacher's output), 'gpt' or 'llama' (decoder-only language models distilled on real text), or a kind added by a file in workbench/models/kinds/ (the run checks the name against that registry).
vocab: Optional[int] = None  # Vocabulary size of the token embedding (mlp: random tokens are drawn from it; gpt/llama: the tokenizer's vocabulary, trained to this size; a multiple of 64). A Hugging Face lm.teacher / lm.student sets it: its embedding's rows (recorded in config.json).
hidden: Optional[int] = None  # Width of the residual stream (LayerNorm / Linear in-out features).
intermediate: Optional[int] = None  # Width of each block's MLP (fc1 out / fc2 in).
layers: Optional[int] = None  # Number of residual pre-norm blocks (mlp: MLP blocks; gpt/llama: attention + MLP blocks).
heads: Optional[int] = None  # Attention heads of the gpt/llama student (hidden must be a multiple of it).
seq_len: Optional[int] = None  # Tokens per sequence.
batch: Optional[int] = None  # Sequences per batch; tokens per step: batch * seq_len.
layout: Optional[str] = None  # Student block layout: 'separate' (LayerNorm, Linear, GELU, Linear as in the tutorial) or 'fused' (one te.LayerNormMLP per block on TE; the same maths on torch).
param_dtype: Optional[str] = None  # Student parameter storage: 'fp32' (master weights, the tutorial's) or 'bf16'.
steps: Optional[int] = None  # Training steps per student (losses recorded for every one).
lr: Optional[float] = None  # AdamW learning rate (the peak one under a schedule).
lr_schedule: Optional[str] = None  # The rate over the training steps: 'constant' (the tutorial's), or a 'cosine' / 'linear' decay to zero at the end of training, after lr_warmup_steps of linear warm-up (workbench/train/optim.py says why).
lr_warmup_steps: Optional[int] = None  # Steps of linear warm-up to train.lr (0: none), before the schedule's decay.
weight_decay: Optional[float] = None  # AdamW weight decay.
seed: Optional[int] = None  # Seeds the teacher, the students' shared initial weights and the batches.
eval_batches: Optional[int] = None  # Held-out batches for the evaluation against the teacher (mlp: output MSE; gpt/llama: perplexity, KL).
eval_every: Optional[int] = None  # Evaluate on the held-out batches every this many training steps too (0: only after training); the curve goes to eval_curve.csv.
fused_optimizer: Optional[bool] = None  # Fused AdamW on CUDA (one kernel for the whole update).
optimizer: Optional[str] = None  # 'adamw' (torch's AdamW, the tutorial's) or 'te_fused_adam' (Transformer Engine's FusedAdam, AdamW mode, with fp32 master weights for bf16 or FP8 parameters; needs TE and a GPU, else AdamW and a note).
moments_dtype: Optional[str] = None  # Adam moments' storage: 'fp32' or 'bf16' (te_fused_adam only: less optimizer memory and traffic).
warmup: Optional[int] = None  # Untimed steps before the timed region (compilation, autotuning, FP8 amax history).
iters: Optional[int] = None  # Timed training steps; median, p20, p80 and mean are reported over them.
compile: Optional[bool] = None  # torch.compile the PyTorch students (TE modules are not compiled: dynamo skips them).
compile_scope: Optional[str] = None  # What one torch.compile covers: 'model' (the whole student, one graph) or 'layers' (each decoder layer on its own, regional compilation: the layers share one compiled code, so a deep model compiles in a fraction of the time; the embedding, final norm and head run eager). The real-teacher studies' torchao student, a 30-layer model compiled as one graph, had not logged a step when a GPU call's limit cut its point. A Hugging Face model that keeps transformers' attention masks (a sliding window shorter than the sequence) then runs its step outside a CUDA graph, as its row's notes say: its masks change under a capture.
graphs: Optional[bool] = None  # Capture the student's train step in a CUDA graph (GPU only; capture time reported apart).
repeats: Optional[int] = None  # Timed blocks of `iters` steps per measured region (students and teacher); the first is reported, every block's median and their spread go to the row (`step_ms_repeat_spread_pct`).
profile: Optional[bool] = None  # One more timed block under torch.profiler per region: kernel-time sums in the student's row, the per-kernel breakdown in profile-<student>.json (on a CPU: CPU activity only, no kernel time).
loss: Optional[str] = None  # Distillation objective. mlp: 'mse' (the tutorial's), 'cosine' (1 - cosine similarity per token) or 'hidden' (output MSE + MSE of every block's hidden state). gpt/llama: 'forward_kl' (teacher to student, Hinton), 'reverse_kl' or 'jsd' on the logits, mixed with cross-entropy by ce_weight.
teacher_precision: Optional[str] = None  # Teacher forward precision: 'auto' (bf16 autocast on a bf16-capable GPU, else fp32), 'fp32', 'bf16', 'fp16' or 'fp8' (TE FP8 inference, current scaling; bf16 where TE or FP8 cannot run, fp32 on a CPU; rows say which ran in `teacher_precision_used`).
temperature: Optional[float] = None  # gpt/llama: softmax temperature of the logit distillation (the loss is scaled by its square).
ce_weight: Optional[float] = None  # gpt/llama: weight of the cross-entropy on the text's next tokens; the rest is the KD term.
jsd_beta: Optional[float] = None  # gpt/llama, loss 'jsd': the generalized Jensen-Shannon mixture weight (0.5: symmetric).
loss_chunk_tokens: Optional[int] = None  # gpt/llama: tokens per chunk of the fp32 loss, which bounds the logits' memory at large vocabularies.
loss_impl: Optional[str] = None  # gpt/llama: how the logit loss runs: 'checkpointed' (autograd over the chunks, each recomputed in the backward; every loss), 'fused' (forward_kl only: each chunk's loss and closed-form gradient computed once in the forward, torch.compile'd on CUDA; the backward only scales the stored gradient), 'fused_head' (forward_kl only: the LM head's GEMM chunked together with the loss and its gradients, so the student's [tokens, vocab] logits never exist; the head GEMM runs in torch in the forward's autocast dtype, not in a backend's FP8) or 'auto' (fused for forward_kl where it can run compiled, else checkpointed; every row and task.json say which ran, `loss_impl`).
no_kd_student: Optional[bool] = None  # gpt/llama: also train the baseline student on cross-entropy only, so the gain from distillation shows.
teacher_logits: Optional[str] = None  # gpt/llama: where the training batches' teacher logits live: 'gpu' (all on the GPU), 'host' (pinned host memory, each batch copied to the GPU one step ahead; the timed and held-out batches stay on the GPU, so step times are unchanged) or 'auto' (the GPU when they fit 60% of its free memory, else the host: 80% of its available memory, shared by every rank on it). The run refuses up front when neither can hold them; task.json records the placement.
teacher_mode: Optional[str] = None  # gpt/llama: where the training batches' teacher targets come from. 'precomputed' (the teacher's full logits for every batch, computed once; placed as teacher_logits says), 'online' (the teacher's forward in every training step, in its precision; memory independent of train.steps; timed apart from the student, rows add teacher_step_ms_median and distill_step_ms_median), 'topk' (the teacher's top-k logits and the log-sum-exp of the rest per token, computed once and stored on disk in the cache folder, streamed to the GPU a step ahead; the KD loss runs over the k tokens plus one tail bucket) or 'auto' (precomputed where its store fits, else online; task.json and every row say which ran and why: teacher_mode_reason).
topk: Optional[int] = None  # gpt/llama, teacher_mode 'topk': how many of the teacher's largest logits are kept per token.
corpus_files: Optional[list[str]] = None  # Your own text files (paths or globs); empty: the built-in offline corpus (pydoc topics and the standard library's sources).
corpus_mb: Optional[float] = None  # How much of the built-in corpus to use, in MB of text.
tokenizer: Optional[str] = None  # 'auto' (the tokenizer saved in the Hugging Face lm.teacher / lm.student folder; without one, 'bpe' and a `tokenizer_warning` in every row), 'bpe' (byte-level BPE trained locally to model.vocab tokens) or 'bytes' (256 tokens).
heldout_fraction: Optional[float] = None  # Share of the text held out for perplexity, KL and agreement (split by document, fixed).
teacher: Optional[str] = None  # 'train' (a teacher trained here on the corpus, cached and reused), 'random' (untrained: for speed only), or the folder of your Hugging Face causal LM (loaded offline).
teacher_hidden: Optional[int] = None  # Teacher width (0: the student's); a distilled student is usually narrower.
teacher_layers: Optional[int] = None  # Teacher depth (0: the student's).
teacher_intermediate: Optional[int] = None  # Teacher MLP width (0: the student's ratio to hidden, applied to the teacher's hidden). Set it, and teacher_heads, to keep one teacher across a sweep over the student's sizes.
teacher_heads: Optional[int] = None  # Teacher attention heads (0: the student's head size, applied to the teacher's hidden).
teacher_steps: Optional[int] = None  # Training steps of a teacher trained here (teacher 'train').
teacher_lr: Optional[float] = None  # AdamW learning rate of a teacher trained here.
teacher_seed: Optional[int] = None  # Seed of the teacher (trained here: its init and batches; 'random': its weights) and of the held-out batches every student is measured on; -1: train.seed. Fix it so that runs of several seeds share one teacher (one cache entry) and one held-out set, the seed varying only the students' init and batches.
student: Optional[str] = None  # '' (a gpt/llama student built from the model fields) or the folder of a Hugging Face causal LM whose architecture and weights every student starts from.
te_amax_history_len: Optional[int] = None  # TE delayed scaling: steps of amax history the FP8 scale is computed from (TE's default is 1024; its tutorials use 16).
te_amax_compute_algo: Optional[str] = None  # TE delayed scaling: 'max' or 'most_recent' over the amax history.
te_attention: Optional[str] = None  # TE students' attention backend: 'auto' (TE picks: flash-attn, then cuDNN fused, then unfused) or force 'flash', 'fused' or 'unfused' (TE's NVTE_FLASH_ATTN / NVTE_FUSED_ATTN / NVTE_UNFUSED_ATTN). A student whose forced backend cannot run here is an error row that says so; rows record the requested and the selected backend. Students without TE's attention ignore it (a note). After a run the switches are the process's own again (as they were when workbench was imported).
te_graph: Optional[str] = None  # What bench.graphs captures for TE students: 'fwd_bwd' (te.make_graphed_callables: forward and backward, the loss and optimizer step eager) or 'step' (forward under TE autocast, loss, backward, the capturable optimizer step and the FP8 scale updates in one CUDA graph, like the torch students).
te_fp8_weights: Optional[bool] = None  # TE FP8 students keep their weights in FP8 (te.quantized_model_init), so the per-step weight casts disappear; the fp32 master weights live in the optimizer (needs train.optimizer te_fused_adam).
te_conversion: Optional[str] = None  # How a TE student converts a Hugging Face model (lm.student): 'layer' (each decoder layer of a Llama, Mistral, Qwen2/3, Phi-3, Gemma 2/3 or SmolLM3 model becomes TE's fused layer: fused QKV, gated MLP, TE's attention and RoPE; a model it cannot convert, e.g. OLMo2 or a mixture of experts, is an error row saying why), 'linear' (each Linear / RMSNorm swapped alone; the attention maths stays torch's) or 'auto' (layer where it applies, else linear, and the row says why). Rows record the conversion that ran (te_conversion).
te_fp8_dpa: Optional[bool] = None  # TE FP8 students (delayed and current scaling) run attention's two matmuls in FP8 too (the recipe's fp8_dpa; cuDNN's fused attention only): students with TE's attention. Where TE finds no FP8 attention backend for the shapes the row is an error with TE's reason.
te_head_precision: Optional[str] = None  # The LM head of a TE student of a Hugging Face model: 'bf16' (torch, under bf16 autocast, as every peer keeps it) or 'fp8' (a te.Linear inside the FP8 autocast; a head tied to the embedding shares its weight).
te_qkv_format: Optional[str] = None  # The activation layout of a Hugging Face student's TE decoder layers (options.te_conversion 'layer'): 'bshd' (batch first, as the model hands them over; TE's te_llama recipe) or 'sbhd' (sequence first, TE's and Megatron's native layout: the stack is transposed once before its first layer and once after its last, so the model's norm and head see batch-first tensors).
nproc: Optional[int] = None  # Processes per node, one GPU each; above 1 the run is launched under torchrun and every rank trains on its own batches (global batch: nproc x nnodes x model.batch sequences).
strategy: Optional[str] = None  # How a student is spread over the ranks: 'ddp' (DistributedDataParallel, a full copy per rank) or 'fsdp2' (fully_shard per block, then the whole model: parameters, gradients and optimizer state sharded).
nnodes: Optional[int] = None  # Nodes of a multi-node run; start the same command on every node, each with its node_rank.
node_rank: Optional[int] = None  # This node's rank among nnodes (node 0 writes the result files).
rdzv_endpoint: Optional[str] = None  # host:port of torchrun's c10d rendezvous, the same on every node (needed when nnodes is above 1).
scaling_reference: Optional[bool] = None  # Also train and time each student alone on rank 0 (world size 1, row '<student>@1gpu') while the other ranks wait: the reference of the scaling efficiency.
timeout_s: Optional[int] = None  # Seconds a rank waits for the others at a collective before the run fails (a rank that died or hangs); it must cover one student's one-GPU reference run.
backends: Optional[list[str]] = None  # Students to compare, as 'backend' or 'backend:recipe' (see `workbench.backends.BACKENDS`).
baseline: Optional[str] = None  # Which student is the tutorial's 'baseline' in summary.json (must be in `backends`).
device: Optional[str] = None  # 'auto' (CUDA when available, else CPU), 'cuda' or 'cpu'.
show_panel: Optional[bool] = None  # The widget panel at the end: True shows it, False hides it, None shows it unless papermill runs the notebook.

# %%
from workbench import notebook

run_dir = notebook.run_cell(globals())

# %%
print(notebook.versions_line(run_dir))
print(notebook.timings_note(run_dir))
notebook.readable(notebook.summary_table(run_dir))

# %% [markdown]
# ## Loss curves, step time, peak memory

# %%
notebook.plot(run_dir, "loss_curves");

# %%
notebook.plot(run_dir, "step_time");

# %%
notebook.peak_memory(run_dir);

# %%
notebook.language_model_plots(run_dir);

# %% [markdown]
# ## Details: every student's row (`reason` says why a student fell back or was skipped) and summary.json
# Four significant digits, empty where a student has no value; students.csv in the run folder has every column
# in full precision. summary.json opens on a click.

# %%
notebook.details_table(run_dir)

# %%
notebook.summary_json(run_dir)

# %% [markdown]
# ## Interactive panel: pick preset, hidden sizes and backends, then Run
# Each size is the same `notebook.run_cell` call as above; headless (papermill) runs skip the panel.

# %%
from workbench import panel

panel.maybe_show(globals());
