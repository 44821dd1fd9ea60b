"""Validation of a whole `Config`, before any model is built: a bad value raises `ConfigError` naming the
field and what is allowed. The allowed words of a field are its `Literal` type (`fields.choices`); what
depends on several fields (a loss of the model's kind, an optimizer a storage needs) is checked here.

Which backends exist is not the configuration's knowledge: the run checks the students' names against
the backends' registry (`workbench.backends.check_specs`).
"""
from __future__ import annotations

import contextlib
import math
import re
from dataclasses import fields
from typing import Any

from workbench.config.errors import ConfigError
from workbench.config.fields import LM_LOSSES, MLP_LOSSES, REGRESSION_KIND, SECTIONS, LMConfig, choices

MAX_INT = 2**31 - 1  # every integer field's bound: an index or size torch takes in int32 arithmetic
FUSED_IMPLS = ("fused", "fused_head")  # loss_impl values that compute forward_kl from full teacher logits


def validate(cfg: Any) -> None:
    """Raise ConfigError on the first bad field of `cfg` (a workbench.config.Config). The checks a kind takes
    are its task's (`kind_task`); whether a kind's name exists is the kinds registry's check when a run starts
    (workbench.models.kinds), so a kind added in one file needs no edit here."""
    _sizes(cfg)
    lm = kind_task(cfg.model.kind) == "lm"
    _choices(cfg, lm)
    _train_and_bench(cfg)
    _distill(cfg, lm)
    if lm:
        with _checked_as_lm(cfg.model.kind):
            _lm(cfg)
    _options(cfg)
    _parallel(cfg)
    _students(cfg)


def kind_task(kind: str) -> str:
    """The task of model.kind, as workbench.train.tasks names it: 'mlp' (regression) for the tutorial's MLP,
    'lm' (causal-LM distillation) for every other kind. The kinds registry declares each kind's task and
    refuses one that disagrees with this rule (workbench.models.kinds.Kind); the configuration, a leaf, cannot
    ask the registry, so the rule is stated here, once."""
    return "mlp" if kind == REGRESSION_KIND else "lm"


@contextlib.contextmanager
def _checked_as_lm(kind: str):
    """The errors of the checks a causal LM takes say so: a mistyped 'mlp' trips them before the run's registry
    could say that no kind has that name."""
    try:
        yield
    except ConfigError as e:
        raise ConfigError(f"{e} (model.kind={kind!r} is checked as a causal LM, as every kind but "
                          f"{REGRESSION_KIND!r} is; a run refuses a kind no file in workbench/models/kinds/ "
                          "declares)") from e


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {list(allowed)}, got {value!r}")


def _finite(name: str, value: Any, low: float = 0.0, strict: bool = True) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and (value > low if strict else value >= low)):
        raise ConfigError(f"{name} must be a finite number {'>' if strict else '>='} {low:g}, got {value!r}")


def _sizes(cfg: Any) -> None:
    """Every integer within int32 (before any field is used: torch overflows on such sizes), the model's
    sizes positive."""
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            v = getattr(getattr(cfg, section), f.name)
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT:
                raise ConfigError(f"{section}.{f.name} must be at most {MAX_INT} (2**31 - 1), got {v}")
    for name in ("vocab", "hidden", "intermediate", "layers", "seq_len", "batch"):
        _positive(f"model.{name}", getattr(cfg.model, name))
    kind = cfg.model.kind
    if not (isinstance(kind, str) and re.fullmatch(r"[a-z][a-z0-9_]*", kind)):
        raise ConfigError("model.kind must be a kind's name: lowercase letters, digits and '_', a letter first "
                          f"(the kinds are the files of workbench/models/kinds/), got {kind!r}")


def _choices(cfg: Any, lm: bool) -> None:
    """Every Literal-typed field holds one of its words. distill.loss: one of the kind's task's losses; the
    lm section is the language models' (an MLP run ignores it)."""
    for section, cls in SECTIONS.items():
        for name, allowed in choices(cls).items():
            if section != "lm" and (section, name) != ("distill", "loss"):
                _choice(f"{section}.{name}", getattr(getattr(cfg, section), name), allowed)
    for name, allowed in choices(type(cfg)).items():
        _choice(name, getattr(cfg, name), allowed)
    if not lm:
        _choice("distill.loss", cfg.distill.loss, MLP_LOSSES)
        return
    with _checked_as_lm(cfg.model.kind):
        _choice("distill.loss", cfg.distill.loss, LM_LOSSES)
        for name, allowed in choices(LMConfig).items():
            _choice(f"lm.{name}", getattr(cfg.lm, name), allowed)


def _train_and_bench(cfg: Any) -> None:
    t, b = cfg.train, cfg.bench
    _positive("train.steps", t.steps)
    _positive("train.eval_batches", t.eval_batches)
    if not isinstance(t.eval_every, int) or isinstance(t.eval_every, bool) or t.eval_every < 0:
        raise ConfigError(f"train.eval_every must be an integer >= 0 (0: only after training), got {t.eval_every!r}")
    _finite("train.lr", t.lr)
    w = t.lr_warmup_steps
    if not isinstance(w, int) or isinstance(w, bool) or not 0 <= w < t.steps:
        raise ConfigError(f"train.lr_warmup_steps must be an integer in [0, train.steps={t.steps}), got {w!r}")
    _finite("train.weight_decay", t.weight_decay, strict=False)
    if b.warmup < 0:
        raise ConfigError(f"bench.warmup must be >= 0, got {b.warmup!r}")
    _positive("bench.iters", b.iters)
    _positive("bench.repeats", b.repeats)
    if t.moments_dtype != "fp32" and t.optimizer != "te_fused_adam":
        raise ConfigError(f"train.moments_dtype={t.moments_dtype!r} needs train.optimizer='te_fused_adam' "
                          "(torch's AdamW keeps its moments in the parameters' dtype)")


def _distill(cfg: Any, lm: bool) -> None:
    d = cfg.distill
    if d.loss_impl in FUSED_IMPLS and lm and d.loss != "forward_kl":
        raise ConfigError(f"distill.loss_impl={d.loss_impl!r} computes forward_kl only, not distill.loss={d.loss!r}; "
                          "set distill.loss_impl=checkpointed")
    _positive("distill.topk", d.topk)
    # what a teacher mode refuses (top-k: k above the vocabulary, a fused loss) is the mode's own check, in its
    # registry (workbench.train.teacher_targets.check): this leaf checks only that the name is one of the Literal's


def _lm(cfg: Any) -> None:
    """The language-model path (model.kind gpt/llama): the student's and the teacher's shapes, the text."""
    m, lm, d = cfg.model, cfg.lm, cfg.distill
    _positive("model.heads", m.heads)
    if m.hidden % m.heads:
        raise ConfigError(f"model.hidden={m.hidden} must be a multiple of model.heads={m.heads}")
    if m.layout != "separate":
        raise ConfigError("model.layout must be 'separate' for gpt/llama (the fused layout is the MLP model's)")
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
    for name, v, lo, hi in (("lm.heldout_fraction", lm.heldout_fraction, 0.0, 0.5),
                            ("distill.ce_weight", d.ce_weight, 0.0, 1.0), ("distill.jsd_beta", d.jsd_beta, 0.0, 1.0)):
        if not (isinstance(v, (int, float)) and lo <= v <= hi) or (name == "lm.heldout_fraction" and v == 0):
            raise ConfigError(
                f"{name} must be in [{lo}, {hi}]{' and > 0' if name == 'lm.heldout_fraction' else ''}, got {v!r}"
            )
    for name, v in (("lm.corpus_mb", lm.corpus_mb), ("lm.teacher_lr", lm.teacher_lr),
                    ("distill.temperature", d.temperature)):
        _finite(name, v)


def _options(cfg: Any) -> None:
    o = cfg.options
    _positive("options.te_amax_history_len", o.te_amax_history_len)
    if not isinstance(o.te_fp8_dpa, bool):
        raise ConfigError(f"options.te_fp8_dpa must be true or false, got {o.te_fp8_dpa!r}")
    if o.te_fp8_weights and cfg.train.optimizer != "te_fused_adam":
        raise ConfigError("options.te_fp8_weights needs train.optimizer='te_fused_adam': FP8 weights keep their "
                          "fp32 master copy in TE's FusedAdam (torch's AdamW cannot update FP8 tensors)")


def _parallel(cfg: Any) -> None:
    p = cfg.parallel
    for name in ("nproc", "nnodes", "timeout_s"):
        _positive(f"parallel.{name}", getattr(p, name))
    if isinstance(p.node_rank, bool) or not isinstance(p.node_rank, int) or not 0 <= p.node_rank < p.nnodes:
        raise ConfigError(f"parallel.node_rank must be an integer in [0, {p.nnodes - 1}] (parallel.nnodes={p.nnodes}), "
                          f"got {p.node_rank!r}")
    if p.nnodes > 1 and not re.fullmatch(r"[^\s:]+:\d+", p.rdzv_endpoint):
        raise ConfigError(f"parallel.rdzv_endpoint must be host:port when parallel.nnodes > 1, got {p.rdzv_endpoint!r}")


def _students(cfg: Any) -> None:
    """The student list's own shape; whether each names a backend is the run's check."""
    if not cfg.backends:
        raise ConfigError("backends must list at least one student")
    if len(set(cfg.backends)) != len(cfg.backends):
        raise ConfigError(f"backends lists a student twice: {cfg.backends}")
    if cfg.baseline not in cfg.backends:
        raise ConfigError(f"baseline {cfg.baseline!r} must be one of backends {cfg.backends}")
