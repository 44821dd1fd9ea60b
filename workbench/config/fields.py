"""The configuration's sections: one dataclass per concern, a docstring on every field.

Field names are unique across sections, so `hidden=1024` and `model.hidden=1024` both address
`ModelConfig.hidden`. A field that takes one of a few words declares them as its `Literal` type: the
validation (`workbench.config.checks`), the CLI's messages and the notebook's parameters cell read the
allowed values from there. A leaf: it imports nothing of the package.
"""
from __future__ import annotations

import functools
import typing
from dataclasses import dataclass, field, fields
from typing import Literal

REGRESSION_KIND = "mlp"
"""The model.kind of the tutorial's MLP: the one kind trained by regression on the teacher's outputs (its losses
MLPLoss, its model.layout). Every other kind is a causal LM that a file in workbench/models/kinds/ declares, and
takes the lm section's path; that registry refuses a second regression kind. The configuration is a leaf (it
cannot ask the registry), so this one name is how its checks tell the two tasks apart (`checks.kind_task`)."""
MLPLoss = Literal["mse", "cosine", "hidden"]
"""distill.loss of model.kind 'mlp': regressions on the teacher's output."""
LMLoss = Literal["forward_kl", "reverse_kl", "jsd"]
"""distill.loss of a gpt/llama student: divergences on the logits."""


@dataclass
class ModelConfig:
    kind: str = "mlp"
    """The student architecture: 'mlp' (the tutorial's MLP blocks on random tokens, regressing the
    teacher's output), 'gpt' or 'llama' (decoder-only language models distilled on real text), or a kind
    added by a file in workbench/models/kinds/ (the run checks the name against that registry)."""
    vocab: int = 4096
    """Vocabulary size of the token embedding (mlp: random tokens are drawn from it; gpt/llama: the
    tokenizer's vocabulary, trained to this size; a multiple of 64). A Hugging Face lm.teacher / lm.student
    sets it: its embedding's rows (recorded in config.json)."""
    hidden: int = 512
    """Width of the residual stream (LayerNorm / Linear in-out features)."""
    intermediate: int = 2048
    """Width of each block's MLP (fc1 out / fc2 in)."""
    layers: int = 3
    """Number of residual pre-norm blocks (mlp: MLP blocks; gpt/llama: attention + MLP blocks)."""
    heads: int = 8
    """Attention heads of the gpt/llama student (hidden must be a multiple of it)."""
    seq_len: int = 128
    """Tokens per sequence."""
    batch: int = 8
    """Sequences per batch; tokens per step: batch * seq_len."""
    layout: Literal["separate", "fused"] = "separate"
    """Student block layout: 'separate' (LayerNorm, Linear, GELU, Linear as in the tutorial) or
    'fused' (one te.LayerNormMLP per block on TE; the same maths on torch)."""
    param_dtype: Literal["fp32", "bf16"] = "fp32"
    """Student parameter storage: 'fp32' (master weights, the tutorial's) or 'bf16'."""


@dataclass
class TrainConfig:
    steps: int = 25
    """Training steps per student (losses recorded for every one)."""
    lr: float = 2e-4
    """AdamW learning rate (the peak one under a schedule)."""
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    """The rate over the training steps: 'constant' (the tutorial's), or a 'cosine' / 'linear' decay to zero at
    the end of training, after lr_warmup_steps of linear warm-up (workbench/train/optim.py says why)."""
    lr_warmup_steps: int = 0
    """Steps of linear warm-up to train.lr (0: none), before the schedule's decay."""
    weight_decay: float = 1e-2
    """AdamW weight decay."""
    seed: int = 42
    """Seeds the teacher, the students' shared initial weights and the batches."""
    eval_batches: int = 8
    """Held-out batches for the evaluation against the teacher (mlp: output MSE; gpt/llama: perplexity, KL)."""
    eval_every: int = 0
    """Evaluate on the held-out batches every this many training steps too (0: only after training);
    the curve goes to eval_curve.csv."""
    fused_optimizer: bool = False
    """Fused AdamW on CUDA (one kernel for the whole update)."""
    optimizer: Literal["adamw", "te_fused_adam"] = "adamw"
    """'adamw' (torch's AdamW, the tutorial's) or 'te_fused_adam' (Transformer Engine's FusedAdam, AdamW
    mode, with fp32 master weights for bf16 or FP8 parameters; needs TE and a GPU, else AdamW and a note)."""
    moments_dtype: Literal["fp32", "bf16"] = "fp32"
    """Adam moments' storage: 'fp32' or 'bf16' (te_fused_adam only: less optimizer memory and traffic)."""


@dataclass
class BenchConfig:
    warmup: int = 5
    """Untimed steps before the timed region (compilation, autotuning, FP8 amax history)."""
    iters: int = 20
    """Timed training steps; median, p20, p80 and mean are reported over them."""
    compile: bool = False
    """torch.compile the PyTorch students (TE modules are not compiled: dynamo skips them)."""
    compile_scope: Literal["model", "layers"] = "model"
    """What one torch.compile covers: 'model' (the whole student, one graph) or 'layers' (each decoder layer on
    its own, regional compilation: the layers share one compiled code, so a deep model compiles in a fraction
    of the time; the embedding, final norm and head run eager). The real-teacher studies' torchao student, a
    30-layer model compiled as one graph, had not logged a step when a GPU call's limit cut its point. A
    Hugging Face model that keeps transformers' attention masks (a sliding window shorter than the sequence)
    then runs its step outside a CUDA graph, as its row's notes say: its masks change under a capture."""
    graphs: bool = False
    """Capture the student's train step in a CUDA graph (GPU only; capture time reported apart)."""
    repeats: int = 1
    """Timed blocks of `iters` steps per measured region (students and teacher); the first is reported,
    every block's median and their spread go to the row (`step_ms_repeat_spread_pct`)."""
    profile: bool = False
    """One more timed block under torch.profiler per region: kernel-time sums in the student's row, the
    per-kernel breakdown in profile-<student>.json (on a CPU: CPU activity only, no kernel time)."""


@dataclass
class DistillConfig:
    loss: Literal[MLPLoss, LMLoss] = "mse"
    """Distillation objective. mlp: 'mse' (the tutorial's), 'cosine' (1 - cosine similarity per token) or
    'hidden' (output MSE + MSE of every block's hidden state). gpt/llama: 'forward_kl' (teacher to
    student, Hinton), 'reverse_kl' or 'jsd' on the logits, mixed with cross-entropy by ce_weight."""
    teacher_precision: Literal["auto", "fp32", "bf16", "fp16", "fp8"] = "auto"
    """Teacher forward precision: 'auto' (bf16 autocast on a bf16-capable GPU, else fp32), 'fp32',
    'bf16', 'fp16' or 'fp8' (TE FP8 inference, current scaling; bf16 where TE or FP8 cannot run, fp32 on a
    CPU; rows say which ran in `teacher_precision_used`)."""
    temperature: float = 2.0
    """gpt/llama: softmax temperature of the logit distillation (the loss is scaled by its square)."""
    ce_weight: float = 0.5
    """gpt/llama: weight of the cross-entropy on the text's next tokens; the rest is the KD term."""
    jsd_beta: float = 0.5
    """gpt/llama, loss 'jsd': the generalized Jensen-Shannon mixture weight (0.5: symmetric)."""
    loss_chunk_tokens: int = 4096
    """gpt/llama: tokens per chunk of the fp32 loss, which bounds the logits' memory at large vocabularies."""
    loss_impl: Literal["auto", "checkpointed", "fused", "fused_head"] = "auto"
    """gpt/llama: how the logit loss runs: 'checkpointed' (autograd over the chunks, each recomputed in the
    backward; every loss), 'fused' (forward_kl only: each chunk's loss and closed-form gradient computed
    once in the forward, torch.compile'd on CUDA; the backward only scales the stored gradient), 'fused_head'
    (forward_kl only: the LM head's GEMM chunked together with the loss and its gradients, so the student's
    [tokens, vocab] logits never exist; the head GEMM runs in torch in the forward's autocast dtype, not in a
    backend's FP8) or 'auto' (fused for forward_kl where it can run compiled, else checkpointed; every row and
    task.json say which ran, `loss_impl`)."""
    no_kd_student: bool = True
    """gpt/llama: also train the baseline student on cross-entropy only, so the gain from distillation shows."""
    teacher_logits: Literal["auto", "gpu", "host"] = "auto"
    """gpt/llama: where the training batches' teacher logits live: 'gpu' (all on the GPU), 'host' (pinned host
    memory, each batch copied to the GPU one step ahead; the timed and held-out batches stay on the GPU, so
    step times are unchanged) or 'auto' (the GPU when they fit 60% of its free memory, else the host: 80% of
    its available memory, shared by every rank on it). The run refuses up front when neither can hold them;
    task.json records the placement."""
    teacher_mode: Literal["auto", "precomputed", "online", "topk"] = "auto"
    """gpt/llama: where the training batches' teacher targets come from. 'precomputed' (the teacher's full
    logits for every batch, computed once; placed as teacher_logits says), 'online' (the teacher's forward
    in every training step, in its precision; memory independent of train.steps; timed apart from the
    student, rows add teacher_step_ms_median and distill_step_ms_median), 'topk' (the teacher's top-k logits
    and the log-sum-exp of the rest per token, computed once and stored on disk in the cache folder, streamed
    to the GPU a step ahead; the KD loss runs over the k tokens plus one tail bucket) or 'auto' (precomputed
    where its store fits, else online; task.json and every row say which ran and why: teacher_mode_reason)."""
    topk: int = 64
    """gpt/llama, teacher_mode 'topk': how many of the teacher's largest logits are kept per token."""


@dataclass
class LMConfig:
    """The language-model path (model.kind gpt/llama): the text, the teacher, and the student's source."""

    corpus_files: list[str] = field(default_factory=list)
    """Your own text files (paths or globs); empty: the built-in offline corpus (pydoc topics and the
    standard library's sources)."""
    corpus_mb: float = 4.0
    """How much of the built-in corpus to use, in MB of text."""
    tokenizer: Literal["auto", "bpe", "bytes"] = "auto"
    """'auto' (the tokenizer saved in the Hugging Face lm.teacher / lm.student folder; without one, 'bpe'
    and a `tokenizer_warning` in every row), 'bpe' (byte-level BPE trained locally to model.vocab tokens) or
    'bytes' (256 tokens)."""
    heldout_fraction: float = 0.05
    """Share of the text held out for perplexity, KL and agreement (split by document, fixed)."""
    teacher: str = "train"
    """'train' (a teacher trained here on the corpus, cached and reused), 'random' (untrained: for speed
    only), or the folder of your Hugging Face causal LM (loaded offline)."""
    teacher_hidden: int = 0
    """Teacher width (0: the student's); a distilled student is usually narrower."""
    teacher_layers: int = 0
    """Teacher depth (0: the student's)."""
    teacher_intermediate: int = 0
    """Teacher MLP width (0: the student's ratio to hidden, applied to the teacher's hidden). Set it, and
    teacher_heads, to keep one teacher across a sweep over the student's sizes."""
    teacher_heads: int = 0
    """Teacher attention heads (0: the student's head size, applied to the teacher's hidden)."""
    teacher_steps: int = 300
    """Training steps of a teacher trained here (teacher 'train')."""
    teacher_lr: float = 1e-3
    """AdamW learning rate of a teacher trained here."""
    teacher_seed: int = -1
    """Seed of the teacher (trained here: its init and batches; 'random': its weights) and of the held-out
    batches every student is measured on; -1: train.seed. Fix it so that runs of several seeds share one
    teacher (one cache entry) and one held-out set, the seed varying only the students' init and batches."""
    student: str = ""
    """'' (a gpt/llama student built from the model fields) or the folder of a Hugging Face causal LM
    whose architecture and weights every student starts from."""

    def hf_folders(self) -> dict[str, str]:
        """{'lm.teacher': folder, 'lm.student': folder} of the Hugging Face models named, the teacher first."""
        return {who: v for who, v in (("lm.teacher", self.teacher), ("lm.student", self.student))
                if v not in ("", "train", "random")}


@dataclass
class BackendOptions:
    """Knobs of one precision backend beyond its recipe name (the recipe picks the scheme; these tune it)."""

    te_amax_history_len: int = 16
    """TE delayed scaling: steps of amax history the FP8 scale is computed from (TE's default is 1024;
    its tutorials use 16)."""
    te_amax_compute_algo: Literal["max", "most_recent"] = "max"
    """TE delayed scaling: 'max' or 'most_recent' over the amax history."""
    te_attention: Literal["auto", "flash", "fused", "unfused"] = "auto"
    """TE students' attention backend: 'auto' (TE picks: flash-attn, then cuDNN fused, then unfused) or force
    'flash', 'fused' or 'unfused' (TE's NVTE_FLASH_ATTN / NVTE_FUSED_ATTN / NVTE_UNFUSED_ATTN). A student whose
    forced backend cannot run here is an error row that says so; rows record the requested and the selected
    backend. Students without TE's attention ignore it (a note). After a run the switches are the process's
    own again (as they were when workbench was imported)."""
    te_graph: Literal["fwd_bwd", "step"] = "fwd_bwd"
    """What bench.graphs captures for TE students: 'fwd_bwd' (te.make_graphed_callables: forward and
    backward, the loss and optimizer step eager) or 'step' (forward under TE autocast, loss, backward,
    the capturable optimizer step and the FP8 scale updates in one CUDA graph, like the torch students)."""
    te_fp8_weights: bool = False
    """TE FP8 students keep their weights in FP8 (te.quantized_model_init), so the per-step weight casts
    disappear; the fp32 master weights live in the optimizer (needs train.optimizer te_fused_adam)."""
    te_conversion: Literal["auto", "layer", "linear"] = "auto"
    """How a TE student converts a Hugging Face model (lm.student): 'layer' (each decoder layer of a Llama,
    Mistral, Qwen2/3, Phi-3, Gemma 2/3 or SmolLM3 model becomes TE's fused layer: fused QKV, gated MLP, TE's
    attention and RoPE; a model it cannot convert, e.g. OLMo2 or a mixture of experts, is an error row saying
    why), 'linear' (each Linear / RMSNorm swapped alone; the attention maths stays torch's) or 'auto' (layer
    where it applies, else linear, and the row says why).
    Rows record the conversion that ran (te_conversion)."""
    te_fp8_dpa: bool = False
    """TE FP8 students (delayed and current scaling) run attention's two matmuls in FP8 too (the recipe's
    fp8_dpa; cuDNN's fused attention only): students with TE's attention. Where TE finds no FP8 attention
    backend for the shapes the row is an error with TE's reason."""
    te_head_precision: Literal["bf16", "fp8"] = "bf16"
    """The LM head of a TE student of a Hugging Face model: 'bf16' (torch, under bf16 autocast, as every peer
    keeps it) or 'fp8' (a te.Linear inside the FP8 autocast; a head tied to the embedding shares its weight)."""
    te_qkv_format: Literal["bshd", "sbhd"] = "bshd"
    """The activation layout of a Hugging Face student's TE decoder layers (options.te_conversion 'layer'):
    'bshd' (batch first, as the model hands them over; TE's te_llama recipe) or 'sbhd' (sequence first, TE's
    and Megatron's native layout: the stack is transposed once before its first layer and once after its
    last, so the model's norm and head see batch-first tensors)."""


@dataclass
class ParallelConfig:
    """One run over several processes (GPUs) with torchrun, data parallel (see workbench.run.parallel)."""

    nproc: int = 1
    """Processes per node, one GPU each; above 1 the run is launched under torchrun and every rank trains
    on its own batches (global batch: nproc x nnodes x model.batch sequences)."""
    strategy: Literal["ddp", "fsdp2"] = "ddp"
    """How a student is spread over the ranks: 'ddp' (DistributedDataParallel, a full copy per rank) or
    'fsdp2' (fully_shard per block, then the whole model: parameters, gradients and optimizer state sharded)."""
    nnodes: int = 1
    """Nodes of a multi-node run; start the same command on every node, each with its node_rank."""
    node_rank: int = 0
    """This node's rank among nnodes (node 0 writes the result files)."""
    rdzv_endpoint: str = ""
    """host:port of torchrun's c10d rendezvous, the same on every node (needed when nnodes is above 1)."""
    scaling_reference: bool = True
    """Also train and time each student alone on rank 0 (world size 1, row '<student>@1gpu') while the other
    ranks wait: the reference of the scaling efficiency."""
    timeout_s: int = 900
    """Seconds a rank waits for the others at a collective before the run fails (a rank that died or
    hangs); it must cover one student's one-GPU reference run."""


SECTIONS = {"model": ModelConfig, "train": TrainConfig, "bench": BenchConfig, "distill": DistillConfig,
            "lm": LMConfig, "options": BackendOptions, "parallel": ParallelConfig}


def literal_values(annotation: typing.Any) -> tuple[str, ...] | None:
    """The words a `Literal[...]` annotation allows (nested Literals flattened), None for any other type."""
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    return None


@functools.cache
def choices(cls: type) -> dict[str, tuple[str, ...]]:
    """{field name: its allowed words} for every Literal-typed field of the dataclass `cls`."""
    hints = typing.get_type_hints(cls)
    return {f.name: v for f in fields(cls) if (v := literal_values(hints[f.name])) is not None}


def type_name(f: typing.Any) -> str:
    """A field's value type as the CLI coerces it and the notebook annotates it: 'int', 'list[str]', …;
    a Literal field is a 'str' (its words are checked by the validation, not by the type)."""
    t = str(f.type)
    return "str" if t.startswith("Literal[") else t


MLP_LOSSES, LM_LOSSES = typing.get_args(MLPLoss), typing.get_args(LMLoss)
LOSS_IMPLS = choices(DistillConfig)["loss_impl"]
