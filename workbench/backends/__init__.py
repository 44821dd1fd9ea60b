"""Precision backends behind one small interface; one file per backend.

A backend answers three questions (gpt-fast / torchtitan style):
  * `availability(ctx)` -> (ok, reason): can it run here, and if not, why, in words a user can act on;
  * `build(cfg, init_state, device)` -> the student module, loaded with the shared initial weights;
  * `forward_context()` -> the context manager that wraps the student's forward.
Adding a backend is adding one file that subclasses `Backend` and decorates it with `@register`.

A student is named by a spec 'backend' or 'backend:recipe' (e.g. 'te_fp8:current').
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, ContextManager

import torch
from torch import nn

from workbench.config import ConfigError

BACKENDS: dict[str, type["Backend"]] = {}


def register(cls: type["Backend"]) -> type["Backend"]:
    BACKENDS[cls.name] = cls
    return cls


@dataclass
class Context:
    """What a backend may look at to decide whether it can run: the resolved device and config."""

    device: torch.device
    cfg: Any  # workbench.config.Config


class Backend:
    name: str = ""
    recipes: tuple[str, ...] = ()  # allowed recipes; empty = takes none
    default_recipe: str | None = None
    mode: str = "PyTorch"  # the tutorial's mode name for rows that run this backend
    compilable = True  # torch.compile applies (config bench.compile)
    compile_required = False  # always compiled (torchao float8 is meant to run under torch.compile)
    graph_whole_step = True  # CUDA graph: capture fwd+bwd+optimizer (False: backend.make_graphed)

    def __init__(self, recipe: str | None = None):
        self.recipe = recipe or self.default_recipe

    @property
    def uses_grad_scaler(self) -> bool:
        """fp16 autocast needs loss scaling: its narrow exponent range underflows small gradients."""
        return getattr(self, "dtype", None) is torch.float16

    @property
    def gemm_precision(self) -> str:
        """The precision its GEMMs run in ('fp32', 'bf16', 'fp16', 'fp8', 'fp4'): which peak a row is
        measured against, and which students a crossover is computed for."""
        dtype = getattr(self, "dtype", None)
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")

    @property
    def spec(self) -> str:
        return f"{self.name}:{self.recipe}" if self.recipe else self.name

    def availability(self, ctx: Context) -> tuple[bool, str]:
        return True, ""

    def build(self, cfg: Any, init_state: dict[str, torch.Tensor], device: torch.device) -> nn.Module:
        """The torch student with the shared initial weights, parameters in `model.param_dtype`."""
        from workbench.models import LayerNormMLP, Student

        self.device = device
        mlp = LayerNormMLP if cfg.model.layout == "fused" else None
        return to_param_dtype(load_matched(Student(cfg.model, mlp=mlp), init_state), cfg).to(device)

    def can_graph(self, cfg: Any, device: torch.device) -> tuple[bool, str]:
        if device.type != "cuda":
            return False, "CUDA graphs need a GPU"
        if self.uses_grad_scaler:
            return False, "the fp16 grad scaler's inf checks and skipped steps are not graph-safe"
        return True, ""

    def forward_context(self) -> ContextManager:
        return contextlib.nullcontext()

    def fallback(self, ctx: Context, reason: str) -> "Backend | None":
        """A backend to run instead when this one is unavailable (TE -> PyTorch autocast), or None."""
        return None


def load_matched(module: nn.Module, init_state: dict[str, torch.Tensor]) -> nn.Module:
    """Load the shared initial weights; every parameter must be covered (only TE's FP8 `_extra_state`
    may be missing), so students provably start identical."""
    init_state = module.from_reference_state(init_state)  # fused layout: the module's own keys
    missing, unexpected = module.load_state_dict(init_state, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise RuntimeError(f"student does not match the shared init: missing={missing} unexpected={unexpected}")
    return module


def to_param_dtype(module: nn.Module, cfg: Any) -> nn.Module:
    return module.to(torch.bfloat16) if cfg.model.param_dtype == "bf16" else module


def parse_spec(spec: str) -> tuple[str, str | None]:
    """'te_fp8:current' -> ('te_fp8', 'current'); unknown names raise ConfigError listing what exists."""
    _load_all()
    name, _, recipe = str(spec).partition(":")
    if name not in BACKENDS:
        raise ConfigError(f"unknown backend {name!r} in backends; allowed: {sorted(BACKENDS)}")
    cls = BACKENDS[name]
    if recipe and recipe not in cls.recipes:
        allowed = list(cls.recipes) if cls.recipes else "none (this backend takes no recipe)"
        raise ConfigError(f"unknown recipe {recipe!r} for backend {name!r}; allowed: {allowed}")
    return name, recipe or None


def all_specs() -> list[str]:
    """Every student spec the registry knows ('te_fp8:current', …), e.g. for a backends picker."""
    _load_all()
    return [s for name, cls in sorted(BACKENDS.items())
            for s in ([f"{name}:{r}" for r in cls.recipes] if cls.recipes else [name])]


def make(spec: str) -> Backend:
    name, recipe = parse_spec(spec)
    return BACKENDS[name](recipe)


@functools.lru_cache(maxsize=1)
def _load_all() -> None:
    """Import every backend file of this package; each registers itself. Files starting with '_' are
    helpers (e.g. _te.py), not backends. Discovery from the files is what makes a backend one file."""
    for mod in pkgutil.iter_modules(__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")


def autocast(device: torch.device, dtype: torch.dtype | None) -> ContextManager:
    """torch autocast for `device`, or a no-op for fp32."""
    if dtype is None:
        return contextlib.nullcontext()
    # No weight-cast cache: it is not valid inside CUDA graph capture, and every weight is used once per forward.
    return torch.autocast(device_type=device.type, dtype=dtype, cache_enabled=False)


def native_bf16(device: torch.device) -> bool:
    """Whether the hardware does bf16 (a CPU's autocast does; a GPU needs compute capability 8.0).
    Not torch.cuda.is_bf16_supported(): it counts emulation and says True on a Colab T4 (CC 7.5), where
    bf16 runs emulated and slow instead of the fp16 + grad scaler path."""
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device) >= (8, 0)


def amp_dtype(device: torch.device) -> torch.dtype:
    """bf16 where the hardware has it, else fp16 (e.g. a Colab T4, CC 7.5)."""
    return torch.bfloat16 if native_bf16(device) else torch.float16


