"""Model kinds (config model.kind) behind one registry: which task trains a kind and what builds it.

    from workbench.models import kinds
    kinds.get("llama").task           # 'lm': causal-LM distillation (workbench.train.tasks.LMTask)
    kinds.is_lm(cfg.model.kind)       # instead of comparing with a kind's name

A kind is one file in this folder that calls `register(Kind(...))`; the files are discovered, as the
precision backends are. The tutorial's MLP (`mlp`) is trained by regression on the teacher's outputs; every
other kind shipped here is a decoder-only causal LM built by `workbench.models.lm.CausalLM`.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass

from workbench.config import ConfigError

TASKS = ("mlp", "lm")  # the tasks of workbench.train.tasks: regression on an MLP teacher, causal-LM distillation


@dataclass(frozen=True)
class Kind:
    """One model.kind: the task that trains it and, for a causal LM, the architecture CausalLM builds
    (`LMShape.kind`: 'gpt' learned positions, LayerNorm, GELU; 'llama' rotary, RMSNorm, SwiGLU)."""

    name: str
    task: str
    arch: str | None = None

    def __post_init__(self):
        if self.task not in TASKS:
            raise ConfigError(f"model kind {self.name!r}: task {self.task!r} is not allowed; allowed: {list(TASKS)}")
        # the config (a leaf: it cannot ask this registry) validates every kind but 'mlp' as a language model,
        # so the regression task keeps that one name: one rule, in both places
        if (self.task == "mlp") != (self.name == "mlp"):
            raise ConfigError(f"model kind {self.name!r}: task 'mlp' is the kind named 'mlp' alone (the config "
                              "checks every other kind as a causal LM); a new kind is task 'lm'")
        if self.task == "lm" and self.arch is None:
            raise ConfigError(f"model kind {self.name!r}: a causal LM names its architecture (arch)")

    def lm_shape(self, **shape):
        """The LMShape of this kind's causal LM for the shape's fields (vocab, hidden, …; see
        workbench.models.lm.LMShape): the kind's architecture, the caller's sizes."""
        from workbench.models.lm import LMShape

        return LMShape(kind=self.arch, **shape)

    def build_lm(self, **shape):
        """This kind's causal LM for the shape's fields (as `lm_shape` takes them)."""
        from workbench.models.lm import CausalLM

        return CausalLM(self.lm_shape(**shape))


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
