"""Precision backends behind one small interface; one file per backend.

A backend answers five questions (gpt-fast / torchtitan / torchao style):
  * `availability(ctx)` -> (ok, reason): can it run here, and if not, why, in words a user can act on;
  * `convert(model, cfg)` -> a torch model with its modules swapped for this backend's (TE layers,
    torchao Float8Linear, a parameter dtype), *keeping the weights*. Every student is a converted copy of
    one reference torch model (`build`), so matched init holds by construction;
  * `forward_context()` -> the context manager that wraps the student's forward;
  * `policy(cfg, device)` -> a `StepPolicy`: compile? CUDA graph of the whole step or of forward/backward?
    grad scaler? The trainer follows it without knowing backend names.
  * `outside_training(model)` -> the context of forwards that are not training steps (held-out evaluation,
    capture warm-ups): what they would change and training depends on (FP8 delayed scaling) is put back.
Adding a backend is adding one file in this folder that subclasses `Backend` and decorates it with
`@register`; the files are discovered. What a backend *is* it declares as class attributes (`family`, `fp8`,
`bf16_counterparts`), and the run's summary, its distributed notes and the comparisons follow from those,
never from the backend's name. Shared helpers live in the private files ('_te', '_autocast', '_gemm'), not
in another backend's file.

A student is named by a spec 'backend' or 'backend:recipe' (e.g. 'te_fp8:current').
"""
from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, ContextManager

import torch
from torch import nn

from workbench.config import ConfigError
from workbench.env.probe import native_bf16

BACKENDS: dict[str, type["Backend"]] = {}
# Attribute of a parameter built from the shared init by a path that does not keep it exactly (FP8 weights,
# options.te_fp8_weights; under FSDP2, every shard TE's recipe materialises): that init in fp32 (a CPU copy, or
# the rank's own shard on its GPU), which the optimizer's master weight starts at (then dropped).
MASTER_INIT = "workbench_master_init"


def register(cls: type["Backend"]) -> type["Backend"]:
    BACKENDS[cls.name] = cls
    return cls


@dataclass
class Context:
    """What a backend may look at to decide whether it can run: the resolved device and config."""

    device: torch.device
    cfg: Any  # workbench.config.Config


@dataclass(frozen=True)
class StepPolicy:
    """How the trainer runs one student's step; decided by its backend for this config and device."""

    compile: bool = False  # torch.compile the model
    graph: str | None = None  # None, "step" (forward, loss, backward, optimizer) or "fwd_bwd" (make_graphed)
    grad_scaler: bool = False  # fp16 loss scaling
    notes: tuple[str, ...] = ()  # requested speed switches that do not apply, and why


class Backend:
    name: str = ""
    recipes: tuple[str, ...] = ()  # allowed recipes; empty = takes none
    default_recipe: str | None = None
    mode: str = "PyTorch"  # the tutorial's mode name for rows that run this backend
    compilable = True  # torch.compile applies (config bench.compile)
    compile_required = False  # always compiled (torchao float8 is meant to run under torch.compile)
    runs_te_attention = False  # whether options.te_attention applies (TE students with TE's attention)
    # What the backend is, for the run's summary and notes:
    family: str | None = None  # 'te': a Transformer Engine student (the summary's TE path); None: its own
    fp8 = False  # low-precision GEMMs (FP8, FP4) whose losses the summary compares with a bf16 student's
    bf16_counterparts: tuple[str, ...] = ("torch_bf16",)  # that bf16 student: the first of these that ran

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

    def build(self, reference: nn.Module, cfg: Any, device: torch.device) -> nn.Module:
        """This backend's student: a converted copy of the reference torch model, on `device`."""
        self.claim()
        self.device = device
        model = self.convert(copy.deepcopy(reference), cfg)
        check_matched(model, reference)
        return model.to(device)

    def claim(self) -> None:
        """Mark this instance as the one student it builds. What `build` resolves for that student (device,
        dtype, TE's recipe and what its conversion swapped) lives on the instance, which `policy`, the forward
        context and `describe` then read: so every student gets a fresh instance (`make`), never a shared one."""
        if getattr(self, "_built", False):
            raise RuntimeError(f"backend {self.spec!r} already built its student: an instance holds that student's "
                               "state; backends.make(spec) makes one for the next")
        self._built = True

    def convert(self, model: nn.Module, cfg: Any) -> nn.Module:
        """Swap what this backend runs differently; the torch students only change the parameter dtype."""
        return to_param_dtype(model, cfg)

    def policy(self, cfg: Any, device: torch.device) -> StepPolicy:
        """The step this backend runs under `cfg.bench`'s switches (ask after `build`: fp16 is decided there)."""
        notes = []
        if cfg.options.te_attention != "auto" and not self.runs_te_attention:
            notes.append(f"options.te_attention={cfg.options.te_attention!r} not applied: this student does not "
                         "run TE's attention")
        compile_ = self.compile_required or (cfg.bench.compile and self.compilable)
        if cfg.bench.compile and not compile_:
            notes.append(f"compile not applied: {self.name} modules are skipped by dynamo")
        graph = None
        if cfg.bench.graphs:
            ok, why = self.can_graph(cfg, device)
            graph = self.graph_scope(cfg) if ok else None
            if not ok:
                notes.append(f"graphs not applied: {why}")
        return StepPolicy(compile=compile_, graph=graph, grad_scaler=self.uses_grad_scaler, notes=tuple(notes))

    def describe(self, model: nn.Module) -> dict[str, Any]:
        """Row cells about what this student ran as, read after it trained (e.g. TE's attention backend)."""
        return {}

    def graph_scope(self, cfg: Any) -> str:
        """What a CUDA graph of this student covers under `cfg`: "step" (the whole step, capture_step), or
        "fwd_bwd" (forward and backward through `make_graphed`)."""
        return "step"

    def reset_after_capture(self, model: nn.Module) -> None:
        """Undo what the capture's warm-up steps changed besides weights and optimizer state (TE: the
        delayed-scaling amax history and scales), in place: the graph keeps the tensors' addresses."""

    def can_graph(self, cfg: Any, device: torch.device) -> tuple[bool, str]:
        if device.type != "cuda":
            return False, "CUDA graphs need a GPU"
        if self.uses_grad_scaler:
            return False, "the fp16 grad scaler's inf checks and skipped steps are not graph-safe"
        return True, ""

    def forward_context(self) -> ContextManager:
        return contextlib.nullcontext()

    def outside_training(self, model: nn.Module) -> ContextManager:
        """Wraps forwards that are not training steps (held-out evaluation, capture warm-ups): state they
        would change and the training steps depend on (TE delayed scaling's amax history) is put back after."""
        return contextlib.nullcontext()

    def fallback(self, ctx: Context, reason: str) -> "Backend | None":
        """A backend to run instead when this one is unavailable (TE -> PyTorch autocast), or None."""
        return None


def reference_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """A model's weights under the reference model's names (`to_reference_state`: a Hugging Face model
    whose decoder layers became TE layers maps its fused tensors back), without TE's `_extra_state`."""
    state = model.to_reference_state() if hasattr(model, "to_reference_state") else model.state_dict()
    return {k: v for k, v in state.items() if not k.endswith("_extra_state")}


def check_matched(student: nn.Module, reference: nn.Module) -> None:
    """A conversion must keep every weight of the reference (by name and shape, under the reference's
    names; values are copied)."""
    want = {k: tuple(v.shape) for k, v in reference_state(reference).items()}
    got = {k: tuple(v.shape) for k, v in reference_state(student).items()}
    if want != got:
        lost = sorted(set(want) - set(got)) or sorted(k for k in want if got.get(k) != want[k])
        raise RuntimeError(f"converted student does not match the reference model: {lost[:5]}")


def replace_modules(model: nn.Module, swap, skip: tuple[str, ...] = ()) -> list[str]:
    """Replace every submodule for which `swap(module)` returns a new module (whose weights the swap
    copied); return the replaced modules' names, the report of what a conversion touched. Modules under
    the names in `skip` (already converted) are left alone."""
    done = []
    for name, child in list(model.named_modules()):
        if any(name == s or name.startswith(s + ".") for s in skip):
            continue
        for cname, grandchild in list(child.named_children()):
            new = swap(grandchild)
            if new is not None:
                setattr(child, cname, new)
                done.append(f"{name}.{cname}".lstrip("."))
    return done


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


def check_specs(specs: list[str]) -> None:
    """Every student spec names a backend (and recipe) of this registry, else the ConfigError of
    `parse_spec` listing what exists. The run calls it once, before anything is built: the configuration
    checks the list's shape, it does not know the backends."""
    for spec in specs:
        parse_spec(spec)


def all_specs() -> list[str]:
    """Every student spec the registry knows ('te_fp8:current', …), e.g. for a backends picker."""
    _load_all()
    return [s for name, cls in sorted(BACKENDS.items())
            for s in ([f"{name}:{r}" for r in cls.recipes] if cls.recipes else [name])]


def names() -> list[str]:
    """Every registered backend's name."""
    _load_all()
    return sorted(BACKENDS)


def declared(name: str) -> type[Backend] | None:
    """The class a backend name is registered by (its declarations: family, fp8, …), or None for a name no
    backend has (a row of a run made by another version)."""
    _load_all()
    return BACKENDS.get(name)


def make(spec: str) -> Backend:
    name, recipe = parse_spec(spec)
    return BACKENDS[name](recipe)


@functools.lru_cache(maxsize=1)
def _load_all() -> None:
    """Import every backend file of this package; each registers itself. Files starting with '_' are
    private helpers, not backends. Discovery from the files is what makes a backend one file."""
    for mod in pkgutil.iter_modules(__path__):
        if not mod.name.startswith("_") and not mod.ispkg:  # a folder (hf_families) is a helper package
            importlib.import_module(f"{__name__}.{mod.name}")


def autocast(device: torch.device, dtype: torch.dtype | None) -> ContextManager:
    """torch autocast for `device`, or a no-op for fp32."""
    if dtype is None:
        return contextlib.nullcontext()
    # No weight-cast cache: it is not valid inside CUDA graph capture, and every weight is used once per forward.
    return torch.autocast(device_type=device.type, dtype=dtype, cache_enabled=False)


def amp_dtype(device: torch.device) -> torch.dtype:
    """bf16 where the hardware has it, else fp16 (e.g. a Colab T4, CC 7.5)."""
    return torch.bfloat16 if native_bf16(device) else torch.float16


