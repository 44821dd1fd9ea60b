"""The one configuration source: dataclasses, presets and validation.

Every consumer reads these dataclasses: the CLI (`--set field=value`), the notebook's papermill
`parameters` cell (one variable per field, same names) and every result row (flattened with
`flat()`). Field names are unique across sections, so `hidden=1024` and `model.hidden=1024` both
address `ModelConfig.hidden`. `tests/test_config.py` keeps the notebook and the dataclasses in
agreement.

Validation happens up front (`Config.validate`), before any model is built: a bad value raises
`ConfigError` naming the field and what is allowed.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field, fields, asdict
from typing import Any


from workbench.config.errors import ConfigError


@dataclass
class ModelConfig:
    kind: str = "mlp"
    """The student architecture: 'mlp' (the tutorial's MLP blocks on random tokens, regressing the
    teacher's output), 'gpt' or 'llama' (decoder-only language models distilled on real text)."""
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
    layout: str = "separate"
    """Student block layout: 'separate' (LayerNorm, Linear, GELU, Linear as in the tutorial) or
    'fused' (one te.LayerNormMLP per block on TE; the same maths on torch)."""
    param_dtype: str = "fp32"
    """Student parameter storage: 'fp32' (master weights, the tutorial's) or 'bf16'."""


@dataclass
class TrainConfig:
    steps: int = 25
    """Training steps per student (losses recorded for every one)."""
    lr: float = 2e-4
    """AdamW learning rate."""
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
    optimizer: str = "adamw"
    """'adamw' (torch's AdamW, the tutorial's) or 'te_fused_adam' (Transformer Engine's FusedAdam, AdamW
    mode, with fp32 master weights for bf16 or FP8 parameters; needs TE and a GPU, else AdamW and a note)."""
    moments_dtype: str = "fp32"
    """Adam moments' storage: 'fp32' or 'bf16' (te_fused_adam only: less optimizer memory and traffic)."""


@dataclass
class BenchConfig:
    warmup: int = 5
    """Untimed steps before the timed region (compilation, autotuning, FP8 amax history)."""
    iters: int = 20
    """Timed training steps; median, p20, p80 and mean are reported over them."""
    compile: bool = False
    """torch.compile the PyTorch students (TE modules are not compiled: dynamo skips them)."""
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
    loss: str = "mse"
    """Distillation objective. mlp: 'mse' (the tutorial's), 'cosine' (1 - cosine similarity per token) or
    'hidden' (output MSE + MSE of every block's hidden state). gpt/llama: 'forward_kl' (teacher to
    student, Hinton), 'reverse_kl' or 'jsd' on the logits, mixed with cross-entropy by ce_weight."""
    teacher_precision: str = "auto"
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
    loss_impl: str = "auto"
    """gpt/llama: how the logit loss runs: 'checkpointed' (autograd over the chunks, each recomputed in the
    backward; every loss), 'fused' (forward_kl only: each chunk's loss and closed-form gradient computed
    once in the forward, torch.compile'd on CUDA; the backward only scales the stored gradient), 'fused_head'
    (forward_kl only: the LM head's GEMM chunked together with the loss and its gradients, so the student's
    [tokens, vocab] logits never exist; the head GEMM runs in torch in the forward's autocast dtype, not in a
    backend's FP8) or 'auto' (fused for forward_kl where it can run compiled, else checkpointed; every row and
    task.json say which ran, `loss_impl`)."""
    no_kd_student: bool = True
    """gpt/llama: also train the baseline student on cross-entropy only, so the gain from distillation shows."""
    teacher_logits: str = "auto"
    """gpt/llama: where the training batches' teacher logits live: 'gpu' (all on the GPU), 'host' (pinned host
    memory, each batch copied to the GPU one step ahead; the timed and held-out batches stay on the GPU, so
    step times are unchanged) or 'auto' (the GPU when they fit 60% of its free memory, else the host: 80% of
    its available memory, shared by every rank on it). The run refuses up front when neither can hold them;
    task.json records the placement."""
    teacher_mode: str = "auto"
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
    tokenizer: str = "auto"
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
    te_amax_compute_algo: str = "max"
    """TE delayed scaling: 'max' or 'most_recent' over the amax history."""
    te_attention: str = "auto"
    """TE students' attention backend: 'auto' (TE picks: flash-attn, then cuDNN fused, then unfused) or force
    'flash', 'fused' or 'unfused' (TE's NVTE_FLASH_ATTN / NVTE_FUSED_ATTN / NVTE_UNFUSED_ATTN). A student whose
    forced backend cannot run here is an error row that says so; rows record the requested and the selected
    backend. Students without TE's attention ignore it (a note). After a run the switches are the process's
    own again (as they were when workbench was imported)."""
    te_graph: str = "fwd_bwd"
    """What bench.graphs captures for TE students: 'fwd_bwd' (te.make_graphed_callables: forward and
    backward, the loss and optimizer step eager) or 'step' (forward under TE autocast, loss, backward,
    the capturable optimizer step and the FP8 scale updates in one CUDA graph, like the torch students)."""
    te_fp8_weights: bool = False
    """TE FP8 students keep their weights in FP8 (te.quantized_model_init), so the per-step weight casts
    disappear; the fp32 master weights live in the optimizer (needs train.optimizer te_fused_adam)."""
    te_conversion: str = "auto"
    """How a TE student converts a Hugging Face model (lm.student): 'layer' (each decoder layer of a Llama,
    Mistral or Qwen2 model becomes one te.TransformerLayer: fused QKV, SwiGLU, TE's attention and RoPE; a
    model it cannot convert is an error row saying why), 'linear' (each Linear / RMSNorm swapped alone; the
    attention maths stays torch's) or 'auto' (layer where it applies, else linear, and the row says why).
    Rows record the conversion that ran (te_conversion)."""
    te_fp8_dpa: bool = False
    """TE FP8 students (delayed and current scaling) run attention's two matmuls in FP8 too (the recipe's
    fp8_dpa; cuDNN's fused attention only): students with TE's attention. Where TE finds no FP8 attention
    backend for the shapes the row is an error with TE's reason."""
    te_head_precision: str = "bf16"
    """The LM head of a TE student of a Hugging Face model: 'bf16' (torch, under bf16 autocast, as every peer
    keeps it) or 'fp8' (a te.Linear inside the FP8 autocast; a head tied to the embedding shares its weight)."""


@dataclass
class ParallelConfig:
    """One run over several processes (GPUs) with torchrun, data parallel (see workbench.run.parallel)."""

    nproc: int = 1
    """Processes per node, one GPU each; above 1 the run is launched under torchrun and every rank trains
    on its own batches (global batch: nproc x nnodes x model.batch sequences)."""
    strategy: str = "ddp"
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


DEFAULT_BACKENDS = ("torch_fp32", "torch_bf16", "te_bf16", "te_fp8:delayed", "te_fp8:current")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    lm: LMConfig = field(default_factory=LMConfig)
    options: BackendOptions = field(default_factory=BackendOptions)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    backends: list[str] = field(default_factory=lambda: list(DEFAULT_BACKENDS))
    """Students to compare, as 'backend' or 'backend:recipe' (see `workbench.backends.BACKENDS`)."""
    baseline: str = "torch_bf16"
    """Which student is the tutorial's 'baseline' in summary.json (must be in `backends`)."""
    device: str = "auto"
    """'auto' (CUDA when available, else CPU), 'cuda' or 'cpu'."""
    preset: str = "seed"
    """Name of the preset this config started from (recorded; set by `from_preset`)."""

    # ---- flat view -------------------------------------------------------------------------
    def flat(self) -> dict[str, Any]:
        """Every field as {name: value} with section-free names (the notebook/CLI/row names)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if dataclasses.is_dataclass(v):
                out.update(asdict(v))
            else:
                out[f.name] = list(v) if isinstance(v, (list, tuple)) else v
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def replace(self, **overrides: Any) -> "Config":
        """A copy with flat or dotted field overrides applied (values coerced to the field's type)."""
        cfg = Config.from_dict(self.to_dict())
        for key, value in overrides.items():
            section, name = locate(key)
            target = getattr(cfg, section) if section else cfg
            setattr(target, name, _coerce(key, _field_type(section, name), value))
        return cfg

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Config":
        known = {f.name for f in fields(Config)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown config keys {sorted(unknown)}; allowed: {sorted(known)}")
        kw = dict(d)
        for name, cls in SECTIONS.items():
            if name in kw and isinstance(kw[name], dict):
                sub = kw[name]
                allowed = {f.name for f in fields(cls)}
                bad = set(sub) - allowed
                if bad:
                    raise ConfigError(f"unknown fields {sorted(bad)} in '{name}'; allowed: {sorted(allowed)}")
                kw[name] = cls(**sub)
        return Config(**kw)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    # ---- validation ------------------------------------------------------------------------
    def validate(self) -> "Config":
        """Raise ConfigError on the first bad field; return self so calls can chain."""
        m, t, b, d = self.model, self.train, self.bench, self.distill
        for section, cls in SECTIONS.items():  # before any field is used: torch overflows on such sizes
            for f in fields(cls):
                v = getattr(getattr(self, section), f.name)
                if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT:
                    raise ConfigError(f"{section}.{f.name} must be at most {MAX_INT} (2**31 - 1), got {v}")
        for name in ("vocab", "hidden", "intermediate", "layers", "seq_len", "batch"):
            _positive(f"model.{name}", getattr(m, name))
        _choice("model.layout", m.layout, LAYOUTS)
        _choice("model.param_dtype", m.param_dtype, PARAM_DTYPES)
        _positive("train.steps", t.steps)
        _positive("train.eval_batches", t.eval_batches)
        if not isinstance(t.eval_every, int) or isinstance(t.eval_every, bool) or t.eval_every < 0:
            raise ConfigError(f"train.eval_every must be an integer >= 0 (0: only after training), got {t.eval_every!r}")
        if not (isinstance(t.lr, (int, float)) and math.isfinite(t.lr) and t.lr > 0):
            raise ConfigError(f"train.lr must be a finite number > 0, got {t.lr!r}")
        if not (isinstance(t.weight_decay, (int, float)) and math.isfinite(t.weight_decay) and t.weight_decay >= 0):
            raise ConfigError(f"train.weight_decay must be a finite number >= 0, got {t.weight_decay!r}")
        if b.warmup < 0:
            raise ConfigError(f"bench.warmup must be >= 0, got {b.warmup!r}")
        _positive("bench.iters", b.iters)
        _positive("bench.repeats", b.repeats)
        _choice("model.kind", m.kind, KINDS)
        _choice("distill.loss", d.loss, MLP_LOSSES if m.kind == "mlp" else LM_LOSSES)
        _choice("distill.loss_impl", d.loss_impl, LOSS_IMPLS)
        if d.loss_impl in ("fused", "fused_head") and m.kind != "mlp" and d.loss != "forward_kl":
            raise ConfigError(f"distill.loss_impl={d.loss_impl!r} computes forward_kl only, not distill.loss={d.loss!r}; "
                              "set distill.loss_impl=checkpointed")
        if m.kind != "mlp":
            self._validate_lm()
        _choice("distill.teacher_precision", d.teacher_precision, TEACHER_PRECISIONS)
        _positive("options.te_amax_history_len", self.options.te_amax_history_len)
        _choice("options.te_amax_compute_algo", self.options.te_amax_compute_algo, AMAX_ALGOS)
        _choice("options.te_attention", self.options.te_attention, TE_ATTENTION)
        _choice("distill.teacher_logits", d.teacher_logits, TEACHER_LOGITS)
        _choice("distill.teacher_mode", d.teacher_mode, TEACHER_MODES)
        _positive("distill.topk", d.topk)
        if m.kind != "mlp" and d.teacher_mode == "topk":
            if d.topk > m.vocab:
                raise ConfigError(f"distill.topk={d.topk} must be at most model.vocab={m.vocab}")
            if d.loss_impl in ("fused", "fused_head"):
                raise ConfigError(f"distill.teacher_mode='topk' runs the checkpointed loss over the top-k; "
                                  f"distill.loss_impl={d.loss_impl!r} needs full teacher logits: set "
                                  "distill.loss_impl=auto or checkpointed, or distill.teacher_mode=online")
        _choice("options.te_graph", self.options.te_graph, TE_GRAPHS)
        _choice("options.te_conversion", self.options.te_conversion, TE_CONVERSIONS)
        _choice("options.te_head_precision", self.options.te_head_precision, TE_HEAD_PRECISIONS)
        if not isinstance(self.options.te_fp8_dpa, bool):
            raise ConfigError(f"options.te_fp8_dpa must be true or false, got {self.options.te_fp8_dpa!r}")
        _choice("train.optimizer", t.optimizer, OPTIMIZERS)
        _choice("train.moments_dtype", t.moments_dtype, MOMENTS_DTYPES)
        if t.moments_dtype != "fp32" and t.optimizer != "te_fused_adam":
            raise ConfigError(f"train.moments_dtype={t.moments_dtype!r} needs train.optimizer='te_fused_adam' "
                              "(torch's AdamW keeps its moments in the parameters' dtype)")
        if self.options.te_fp8_weights and t.optimizer != "te_fused_adam":
            raise ConfigError("options.te_fp8_weights needs train.optimizer='te_fused_adam': FP8 weights keep their "
                              "fp32 master copy in TE's FusedAdam (torch's AdamW cannot update FP8 tensors)")
        _choice("device", self.device, DEVICES)
        self._validate_parallel()
        if not self.backends:
            raise ConfigError("backends must list at least one student")
        from workbench.backends import parse_spec  # late: backends import torch

        for spec in self.backends:
            parse_spec(spec)  # raises ConfigError naming the allowed backends / recipes
        if len(set(self.backends)) != len(self.backends):
            raise ConfigError(f"backends lists a student twice: {self.backends}")
        if self.baseline not in self.backends:
            raise ConfigError(f"baseline {self.baseline!r} must be one of backends {self.backends}")
        return self

    def _validate_parallel(self) -> None:
        p = self.parallel
        for name in ("nproc", "nnodes", "timeout_s"):
            _positive(f"parallel.{name}", getattr(p, name))
        _choice("parallel.strategy", p.strategy, STRATEGIES)
        if isinstance(p.node_rank, bool) or not isinstance(p.node_rank, int) or not 0 <= p.node_rank < p.nnodes:
            raise ConfigError(f"parallel.node_rank must be an integer in [0, {p.nnodes - 1}] (parallel.nnodes={p.nnodes}), "
                              f"got {p.node_rank!r}")
        if p.nnodes > 1 and not re.fullmatch(r"[^\s:]+:\d+", p.rdzv_endpoint):
            raise ConfigError(f"parallel.rdzv_endpoint must be host:port when parallel.nnodes > 1, got {p.rdzv_endpoint!r}")

    def _validate_lm(self) -> None:
        m, lm, d = self.model, self.lm, self.distill
        _positive("model.heads", m.heads)
        if m.hidden % m.heads:
            raise ConfigError(f"model.hidden={m.hidden} must be a multiple of model.heads={m.heads}")
        if m.layout != "separate":
            raise ConfigError("model.layout must be 'separate' for gpt/llama (the fused layout is the MLP model's)")
        _choice("lm.tokenizer", lm.tokenizer, TOKENIZERS)
        # a Hugging Face model brings its vocabulary (runner.run resolves model.vocab from it, LMTask checks it)
        if lm.tokenizer in ("auto", "bpe") and not lm.hf_folders() and (m.vocab % 64 or m.vocab < 320):
            raise ConfigError(f"model.vocab={m.vocab}: a bpe tokenizer needs a multiple of 64, at least 320")
        if lm.tokenizer == "bytes" and m.vocab < 256 and not lm.hf_folders():
            raise ConfigError(f"model.vocab={m.vocab}: the bytes tokenizer needs at least 256 (one token per byte)")
        t_hidden = lm.teacher_hidden or m.hidden
        t_heads = lm.teacher_heads or max(1, t_hidden // (m.hidden // m.heads))  # the rule LMTask.shape uses
        if t_hidden % t_heads:
            raise ConfigError(f"the teacher's width {t_hidden} must be a multiple of its {t_heads} heads; "
                              "set lm.teacher_heads (or lm.teacher_hidden)")
        for name in ("teacher_hidden", "teacher_layers", "teacher_intermediate", "teacher_heads"):
            if getattr(lm, name) < 0:
                raise ConfigError(f"lm.{name} must be >= 0 (0: the student's), got {getattr(lm, name)!r}")
        _positive("lm.teacher_steps", lm.teacher_steps)
        if isinstance(lm.teacher_seed, bool) or not isinstance(lm.teacher_seed, int) or lm.teacher_seed < -1:
            raise ConfigError(f"lm.teacher_seed must be an integer >= 0, or -1 (train.seed), got {lm.teacher_seed!r}")
        _positive("distill.loss_chunk_tokens", d.loss_chunk_tokens)
        for name, lo, hi in (("lm.heldout_fraction", 0.0, 0.5), ("distill.ce_weight", 0.0, 1.0),
                             ("distill.jsd_beta", 0.0, 1.0)):
            v = getattr(lm if name.startswith("lm.") else d, name.split(".")[1])
            if not (isinstance(v, (int, float)) and lo <= v <= hi) or (name == "lm.heldout_fraction" and v == 0):
                raise ConfigError(f"{name} must be in [{lo}, {hi}]{' and > 0' if name == 'lm.heldout_fraction' else ''}, got {v!r}")
        for name in ("lm.corpus_mb", "lm.teacher_lr", "distill.temperature"):
            v = getattr(lm if name.startswith("lm.") else d, name.split(".")[1])
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(f"{name} must be a finite number > 0, got {v!r}")


MAX_INT = 2**31 - 1  # every integer field's bound: an index or size torch takes in int32 arithmetic
LAYOUTS = ("separate", "fused")
AMAX_ALGOS = ("max", "most_recent")
TE_ATTENTION = ("auto", "flash", "fused", "unfused")
TEACHER_LOGITS = ("auto", "gpu", "host")
TEACHER_MODES = ("auto", "precomputed", "online", "topk")
TE_GRAPHS = ("fwd_bwd", "step")
TE_CONVERSIONS = ("auto", "layer", "linear")
TE_HEAD_PRECISIONS = ("bf16", "fp8")
OPTIMIZERS = ("adamw", "te_fused_adam")
MOMENTS_DTYPES = ("fp32", "bf16")
PARAM_DTYPES = ("fp32", "bf16")
MLP_LOSSES = ("mse", "cosine", "hidden")
LM_LOSSES = ("forward_kl", "reverse_kl", "jsd")
LOSS_IMPLS = ("auto", "checkpointed", "fused", "fused_head")
LOSSES = MLP_LOSSES + LM_LOSSES
KINDS = ("mlp", "gpt", "llama")
TOKENIZERS = ("auto", "bpe", "bytes")
TEACHER_PRECISIONS = ("auto", "fp32", "bf16", "fp16", "fp8")
DEVICES = ("auto", "cuda", "cpu")
STRATEGIES = ("ddp", "fsdp2")
SECTIONS = {"model": ModelConfig, "train": TrainConfig, "bench": BenchConfig, "distill": DistillConfig,
            "lm": LMConfig, "options": BackendOptions, "parallel": ParallelConfig}


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {list(allowed)}, got {value!r}")


# ---- presets ---------------------------------------------------------------------------------
def _seed() -> Config:
    """The tutorial exactly (its sizes, optimiser, seed and measurement counts)."""
    return Config(preset="seed")


def _cpu_smoke() -> Config:
    """Finishes in seconds on a CPU: tiny dims (multiples of 16, so FP8 rows are not skipped for size)."""
    c = Config(preset="cpu-smoke")
    c.model = ModelConfig(vocab=256, hidden=64, intermediate=256, layers=2, seq_len=32, batch=4)
    c.train = TrainConfig(steps=8, eval_batches=2)
    c.bench = BenchConfig(warmup=2, iters=5)
    c.backends = ["torch_fp32", "torch_bf16", "te_fp8:delayed"]
    return c


def _large() -> Config:
    """Where GEMMs dominate: hidden 4096, intermediate 16384, 8192 tokens per step."""
    c = Config(preset="large")
    c.model = ModelConfig(hidden=4096, intermediate=16384, layers=3, seq_len=512, batch=16)
    return c


def _gpt_cpu() -> Config:
    """A GPT student distilled from a deeper, wider GPT teacher on the offline corpus, on a CPU in well
    under a minute (the teacher is trained once and cached)."""
    c = Config(preset="gpt-cpu")
    c.model = ModelConfig(kind="gpt", vocab=512, hidden=64, intermediate=256, layers=2, heads=4, seq_len=64, batch=8)
    c.train = TrainConfig(steps=80, lr=2e-3, eval_batches=4)
    c.bench = BenchConfig(warmup=2, iters=5)
    # T=1: over a few dozen steps a softened target (T=2, DistillKit's default for long runs) teaches
    # slower than the text itself; at T=1 the KD student ends closer to the teacher than the no-KD one
    c.distill = DistillConfig(loss="forward_kl", temperature=1.0)
    c.lm = LMConfig(corpus_mb=0.5, teacher_hidden=128, teacher_layers=3, teacher_steps=200)
    c.backends = ["torch_fp32", "torch_bf16", "te_fp8:delayed"]
    c.baseline = "torch_fp32"
    return c


def _lm_shape(name: str, **model: Any) -> Config:
    """A decoder stack at a shape where FP8 has work to do (vocab 32768, KL on the logits at T=2);
    the teacher is the student's shape and untrained: these presets measure speed and memory."""
    c = Config(preset=name)
    c.model = ModelConfig(**{"kind": "gpt", "vocab": 32768, **model})
    c.train = TrainConfig(steps=10, eval_batches=2, fused_optimizer=True)
    c.bench = BenchConfig(warmup=5, iters=20)
    c.distill = DistillConfig(loss="forward_kl")
    c.lm = LMConfig(teacher="random")
    c.backends = ["torch_bf16", "te_bf16", "te_fp8:delayed", "te_fp8:current", "torchao_float8:tensorwise"]
    return c


def _lm_a() -> Config:
    """Shape A: hidden 2048, 16 heads, ffn 8192, 4 layers, seq 2048 x batch 4, vocab 32768."""
    return _lm_shape("lm-a", hidden=2048, heads=16, intermediate=8192, layers=4, seq_len=2048, batch=4)


def _lm_b() -> Config:
    """Shape B: hidden 4096, 32 heads, ffn 16384, 2 layers, seq 4096 x batch 2, vocab 32768."""
    return _lm_shape("lm-b", hidden=4096, heads=32, intermediate=16384, layers=2, seq_len=4096, batch=2)


def _lm_distill() -> Config:
    """Long enough to compare held-out perplexity curves of bf16 and FP8 students: a GPT student (hidden
    1024, 4 layers) distilled for 300 steps from a wider, deeper GPT teacher trained here, 8192 tokens per
    step, the held-out metrics every 50 steps. Run it with two seeds for the noise (--set seed=...)."""
    c = Config(preset="lm-distill")
    c.model = ModelConfig(kind="gpt", vocab=8192, hidden=1024, intermediate=4096, layers=4, heads=8, seq_len=512, batch=16)
    c.train = TrainConfig(steps=300, lr=1e-3, eval_batches=4, eval_every=50, fused_optimizer=True)
    c.bench = BenchConfig(warmup=5, iters=20)
    c.distill = DistillConfig(loss="forward_kl", temperature=1.0)
    c.lm = LMConfig(teacher_hidden=1536, teacher_layers=6, teacher_steps=600, teacher_lr=1e-3)
    c.backends = ["torch_bf16", "te_fp8:delayed", "te_fp8:current"]
    return c


def _hf_shape(name: str, **model: Any) -> Config:
    """lm-a's measurement for a Hugging Face model of a real shape, such as one `workbench hf-init` writes:
    set lm.student=DIR (and lm.teacher=DIR for a Hugging Face teacher; else the teacher is the workbench's
    llama, random, at these fields). The fields mirror the hf-init shape of the same name (a test keeps them
    in agreement), so the teacher and a run without lm.student have its width, depth and heads; the folder
    decides the student's architecture and model.vocab."""
    return _lm_shape(name, kind="llama", **model, seq_len=2048, batch=4)


def _hf_llama_4l() -> Config:
    """Llama-3.2-1B cut to 4 layers (hf-init llama-3.2-1b-4l): hidden 2048, 32 heads, ffn 8192, vocab 32768."""
    return _hf_shape("hf-llama-4l", hidden=2048, heads=32, intermediate=8192, layers=4, vocab=32768)


def _hf_llama_1b() -> Config:
    """Llama-3.2-1B (hf-init llama-3.2-1b): hidden 2048, 32 heads, ffn 8192, 16 layers, vocab 128256."""
    return _hf_shape("hf-llama-1b", hidden=2048, heads=32, intermediate=8192, layers=16, vocab=128256)


def _hf_qwen_05b() -> Config:
    """Qwen2.5-0.5B (hf-init qwen2.5-0.5b): hidden 896, 14 heads, ffn 4864, 24 layers, vocab 151936."""
    return _hf_shape("hf-qwen2.5-0.5b", hidden=896, heads=14, intermediate=4864, layers=24, vocab=151936)


PRESETS = {"seed": _seed, "cpu-smoke": _cpu_smoke, "large": _large, "gpt-cpu": _gpt_cpu, "lm-a": _lm_a, "lm-b": _lm_b,
           "lm-distill": _lm_distill, "hf-llama-4l": _hf_llama_4l, "hf-llama-1b": _hf_llama_1b,
           "hf-qwen2.5-0.5b": _hf_qwen_05b}


PRESET_CHOICES = (*PRESETS, "auto")


def preset_help() -> str:
    """The --preset help of every command, from the preset table."""
    return " | ".join(PRESETS) + " | auto (seed on a GPU, else cpu-smoke)"


def default_preset_name() -> str:
    """'seed' where a CUDA GPU is visible, else 'cpu-smoke' (what `make run` uses)."""
    import torch

    return "seed" if torch.cuda.is_available() else "cpu-smoke"


def from_preset(name: str = "seed", **overrides: Any) -> Config:
    """The named preset with flat or dotted overrides, validated. 'auto' picks `default_preset_name()`."""
    if name == "auto":
        name = default_preset_name()
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; allowed: {sorted(PRESETS)} or 'auto'")
    return PRESETS[name]().replace(**overrides).validate()


def parse_set(items: list[str]) -> dict[str, Any]:
    """Parse CLI `--set field=value` items into overrides (values coerced later, by field type)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects field=value, got {item!r}; fields: {sorted(flat_field_names())}")
        locate(key.strip())  # fails early on unknown names
        out[key.strip()] = value
    return out


# ---- field lookup and coercion ---------------------------------------------------------------
def flat_field_names() -> list[str]:
    return list(Config().flat())


def locate(key: str) -> tuple[str | None, str]:
    """'hidden' or 'model.hidden' -> ('model', 'hidden'); 'backends' -> (None, 'backends')."""
    if "." in key:
        section, _, name = key.partition(".")
        if section in SECTIONS and name in {f.name for f in fields(SECTIONS[section])}:
            return section, name
    else:
        for section, cls in SECTIONS.items():
            if key in {f.name for f in fields(cls)}:
                return section, key
        if key in {f.name for f in fields(Config)} and key not in SECTIONS:
            return None, key
    raise ConfigError(f"unknown config field {key!r}{did_you_mean(key)}; allowed: {sorted(flat_field_names())}")


def did_you_mean(key: str) -> str:
    """" (did you mean 'hidden'?)" for a near miss of a field name (difflib), else ''."""
    import difflib

    names = flat_field_names() + [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in fields(cls)]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _field_type(section: str | None, name: str) -> Any:
    cls = SECTIONS[section] if section else Config
    return {f.name: f.type for f in fields(cls)}[name]


def _coerce(key: str, ftype: Any, value: Any) -> Any:
    """Strings from the CLI / papermill become the field's type; a bad value names the field."""
    t = str(ftype)
    try:
        if t.startswith("list"):
            if isinstance(value, str):
                value = value.strip()
                if value.startswith("["):
                    return list(json.loads(value))
                return [v.strip() for v in value.split(",") if v.strip()]
            return list(value)
        if t == "bool":
            if isinstance(value, str):
                low = value.lower()
                if low not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(value)
                return low in ("true", "1", "yes")
            return bool(value)
        if t == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            if isinstance(value, bool):
                raise ValueError(value)
            return int(value) if not isinstance(value, str) else int(value.strip())
        if t == "float":
            return float(value)
        return str(value)
    except (ValueError, TypeError, json.JSONDecodeError):
        raise ConfigError(f"{key} expects a value of type {t}, got {value!r}") from None


def field_docs() -> dict[str, str]:
    """{flat field name: its docstring}, read from this file's attribute docstrings (one source)."""
    import ast
    import inspect
    import sys

    docs: dict[str, str] = {}
    tree = ast.parse(inspect.getsource(sys.modules[__name__]))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in {c.__name__ for c in (*SECTIONS.values(), Config)}:
            body = node.body
            for a, b in zip(body, body[1:]):
                if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
                    docs[a.target.id] = " ".join(str(b.value.value).split())
    return {k: docs.get(k, "") for k in flat_field_names()}
