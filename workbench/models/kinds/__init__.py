"""Model kinds (config model.kind) behind one registry: which task trains a kind and, for a causal LM, what
its architecture is.

    from workbench.models import kinds
    kinds.get("llama").task           # 'lm': causal-LM distillation (workbench.train.tasks.LMTask)
    kinds.get("llama").arch.norm      # 'rmsnorm': what workbench.models.lm.CausalLM builds
    kinds.is_lm(cfg.model.kind)       # instead of comparing with a kind's name

A kind is one file in this folder that calls `register(Kind(...))`; the files are discovered, as the
precision backends are. The tutorial's MLP (`mlp`) is trained by regression on the teacher's outputs; every
other kind is a decoder-only causal LM that `workbench.models.lm.CausalLM` builds from the kind's `Arch`.
A new architecture is a kind file declaring its `Arch`; a value no `Arch` field allows yet is that file plus
one block in workbench/models/lm.py (and the value added to the field's Literal here).
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass
from typing import Literal

from workbench.config import REGRESSION_KIND, ConfigError, choices, kind_task

TASKS = ("mlp", "lm")  # the tasks of workbench.train.tasks: regression on an MLP teacher, causal-LM distillation


@dataclass(frozen=True)
class Arch:
    """What a causal LM is made of, declared by its kind and read by workbench.models.lm (never the kind's name).

    Every block is pre-norm: x + attn(norm(x)), then x + mlp(norm(x)); a final norm before the LM head."""

    norm: Literal["layernorm", "rmsnorm"]
    """Every norm of the model: nn.LayerNorm (weight and bias) or nn.RMSNorm (weight only)."""
    mlp: Literal["gelu", "swiglu"]
    """The block's MLP: tanh-GELU between fc1 and fc2 (GPT-2), or SwiGLU's down(silu(gate) * up) (Llama)."""
    positions: Literal["learned", "rope"]
    """A learned absolute position table added to the embedding (GPT-2), or rotary embeddings on q and k."""
    bias: bool
    """Biases on the attention's and the MLP's Linears (the LM head never has one)."""
    rope_theta: float = 10000.0
    """The rotary embedding's base (positions 'rope' only)."""
    residual: Literal["pre_norm"] = "pre_norm"
    """How a block adds to the residual stream: pre-norm, the only form built so far."""

    def __post_init__(self):
        for name, allowed in choices(Arch).items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"Arch.{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class Kind:
    """One model.kind: the task that trains it and, for a causal LM, the architecture CausalLM builds."""

    name: str
    task: str
    arch: Arch | None = None

    def __post_init__(self):
        if self.task not in TASKS:
            raise ConfigError(f"model kind {self.name!r}: task {self.task!r} is not allowed; allowed: {list(TASKS)}")
        # the config (a leaf: it cannot ask this registry) checks every kind but its REGRESSION_KIND as a
        # language model, so the regression task keeps that one name: one rule (kind_task), in both places
        if self.task != kind_task(self.name):
            raise ConfigError(f"model kind {self.name!r}: task 'mlp' is the kind named {REGRESSION_KIND!r} alone "
                              "(the config checks every other kind as a causal LM); a new kind is task 'lm'")
        if (self.task == "lm") != isinstance(self.arch, Arch):
            raise ConfigError(f"model kind {self.name!r}: a causal LM declares its architecture (arch=Arch(...)), "
                              "and only a causal LM does")

    def lm_shape(self, **shape) -> LMShape:
        """The LMShape of this kind's causal LM for the shape's fields (vocab, hidden, …): the kind's
        architecture, the caller's sizes."""
        return LMShape(kind=self.name, **shape)


@dataclass(frozen=True)
class LMShape:
    """One causal LM (teacher or student): its kind, whose `Arch` says what it is made of, and its sizes.
    Its fields key the teacher cache (workbench.train.teacher.lm_teacher), so the architecture is looked up,
    not held."""

    kind: str = "gpt"  # a registered kind of task 'lm'
    vocab: int = 256
    hidden: int = 64
    intermediate: int = 256  # MLP width (SwiGLU: the gate/up width)
    layers: int = 2
    heads: int = 4
    seq_len: int = 64  # the longest sequence: sizes a learned position table and the attention FLOP term
    norm_eps: float = 1e-5

    def __post_init__(self):
        _load_all()
        declared = KINDS.get(self.kind)
        if declared is None or declared.task != "lm":
            lms = [n for n in names() if KINDS[n].task == "lm"]
            raise ConfigError(f"model kind {self.kind!r} is not allowed; allowed: {lms}")
        if self.hidden % self.heads:
            raise ConfigError(f"hidden={self.hidden} must be a multiple of heads={self.heads}")
        if self.arch.positions == "rope" and self.head_dim % 2:
            raise ConfigError(f"{self.kind}'s rotary embedding needs an even head size; hidden/heads={self.head_dim}")

    @property
    def arch(self) -> Arch:
        return get(self.kind).arch

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
    KINDS[kind.name] = kind
    return kind


def names() -> list[str]:
    """Every model.kind the registry knows."""
    _load_all()
    return sorted(KINDS)


def get(name: str) -> Kind:
    """The kind named by model.kind; an unknown name raises ConfigError listing what exists."""
    _load_all()
    if name not in KINDS:
        raise ConfigError(f"model.kind must be one of {names()}, got {name!r}")
    return KINDS[name]


def is_lm(name: str) -> bool:
    """Whether model.kind is a causal LM (trained by LM distillation, with a vocabulary and an LM head)."""
    return get(name).task == "lm"


@functools.lru_cache(maxsize=1)
def _load_all() -> None:
    """Import every kind file of this folder; each registers its kinds ('_' files are private helpers)."""
    for mod in pkgutil.iter_modules(__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")
