"""Precision backends behind one small interface; one file per backend.

A backend declares what it is (class attributes) and answers three questions (gpt-fast / torchtitan / torchao style):
  * `availability(ctx)` -> (ok, reason): can it run here, and if not, why, in words a user can act on;
  * `convert(model, cfg)` -> a torch model with its modules swapped for this backend's (TE layers,
    torchao Float8Linear, a parameter dtype), *keeping the weights*;
  * `prepare(reference, cfg, device)` -> a `Student`: a converted copy of one reference torch model, so matched
    init holds by construction, with everything the trainer asks about it: the context that wraps its forward,
    its `StepPolicy` (compile? CUDA graph of the whole step or of forward/backward? grad scaler?), the context of
    forwards that are not training steps, what to reset after a graph capture, its row cells. The student is a
    value (torchtitan's `parallelize`, ao's `convert_to_float8_training` return what they made): nothing about
    it is written onto the backend, so one backend prepares any number of students.
Adding a backend is adding one file in this folder that subclasses `Backend` and decorates it with
`@register`; the files are discovered. What a backend *is* it declares as class attributes (`family`,
`gemm_precision`, `bf16_counterparts`), and the run's summary, its distributed notes and the comparisons follow
from those, never from the backend's name. Shared helpers live in the private files ('_te', '_autocast', '_gemm'),
not in another backend's file.

A student is named by a spec 'backend' or 'backend:recipe' (e.g. 'te_fp8:current').
"""
from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import torch
from torch import nn

from workbench.config import ConfigError
from workbench.env.probe import native_bf16

BACKENDS: dict[str, type["Backend"]] = {}
# Attribute of a parameter built from the shared init by a path that does not keep it exactly (FP8 weights,
# options.te_fp8_weights; under FSDP2, every shard TE's recipe materialises): that init in fp32 (a CPU copy, or
# the rank's own shard on its GPU), which the optimizer's master weight starts at (then dropped).
MASTER_INIT = "workbench_master_init"
PRECISION = {None: "fp32", torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
LOW_PRECISION = ("fp8", "fp4")  # GEMM precisions whose losses the summary compares with a bf16 student's


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


@dataclass(frozen=True)
class Ranks:
    """How a distributed run spreads its students (workbench.run.parallel), for the backends whose student
    depends on it: TE FP8 reduces its amaxes over `group`; under FSDP2 its FP8 weights are sharded by TE's recipe."""

    group: Any  # the data-parallel process group
    shard: Callable[[nn.Module], nn.Module] | None = None  # FSDP2's fully_shard per block then the root; None: DDP


def _unchanged() -> ContextManager:
    return contextlib.nullcontext()


def _nothing() -> None:
    return None


def _no_cells() -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Student:
    """One prepared student (`Backend.prepare`): its model and all the trainer, the multi-GPU wrapper and the row
    ask about it. The callables are bound to this student's model and resolved settings."""

    model: nn.Module
    policy: StepPolicy
    gemm_precision: str  # 'fp32', 'bf16', 'fp16', 'fp8', 'fp4': the peak its row is measured against
    dtype: torch.dtype | None = None  # torch autocast around its forward (None: fp32); TE FP8's outer autocast
    forward_context: Callable[[], ContextManager] = _unchanged  # wraps the forward only (TE: never the backward)
    # wraps forwards that are not training steps (held-out evaluation, capture warm-ups): state they would change
    # and the training steps depend on (TE delayed scaling's amax history) is put back after
    outside_training: Callable[[], ContextManager] = _unchanged
    # undoes, in place, what a capture's warm-up steps changed besides weights and optimizer state (TE: the
    # delayed-scaling amax history and scales): the graph keeps the tensors' addresses
    reset_after_capture: Callable[[], None] = _nothing
    describe: Callable[[], dict[str, Any]] = _no_cells  # row cells read after it trained (TE's attention backend)
    make_graphed: Callable[[nn.Module, torch.Tensor], Any] | None = None  # forward+backward graphs ('fwd_bwd')
    converted: tuple[str, ...] = ()  # the modules its conversion swapped, by name (TE's report)
    sharded: bool = False  # already spread over the ranks by its backend (TE's FSDP2 recipe for FP8 weights)
    mem_floor_mb: float | None = None  # allocated before it existed (teacher, data, targets): the run's floor
    prepare_s: float = 0.0  # seconds its backend took to build and convert it (part of its row's setup_wall_s)


class Backend:
    """A precision backend: its declarations, and `availability`, `convert`, `prepare` (and `fallback`)."""

    name: str = ""
    recipes: tuple[str, ...] = ()  # allowed recipes, the first the default; empty = takes none
    mode: str = "PyTorch"  # the tutorial's mode name for rows that run this backend
    compiled = "if_asked"  # torch.compile: 'if_asked' (bench.compile), 'never' (dynamo skips its modules), 'always'
    # The precision its GEMMs run in ('fp32', 'bf16', 'fp16', 'fp8', 'fp4'): which peak a row is measured against,
    # which students a crossover is computed for, and (fp8, fp4) whose losses the summary compares with a bf16 one's
    gemm_precision: str = "fp32"
    family: str | None = None  # 'te': a Transformer Engine student (the summary's TE path); None: its own
    framework = "torch"  # another ('jax'): the runner hands the student to that framework's trainer (jax_side)
    bf16_counterparts: tuple[str, ...] = ("torch_bf16",)  # the bf16 student compared with: the first that ran

    def __init__(self, recipe: str | None = None):
        self.recipe = recipe or next(iter(self.recipes), None)

    def availability(self, ctx: Context) -> tuple[bool, str]:
        return True, ""

    def convert(self, model: nn.Module, cfg: Any) -> nn.Module:
        """Swap what this backend runs differently; the torch students only change the parameter dtype."""
        return to_param_dtype(model, cfg)

    def prepare(self, reference: nn.Module, cfg: Any, device: torch.device, ranks: Ranks | None = None) -> Student:
        """This backend's student: a converted copy of the reference torch model, on `device`."""
        return Student(converted(self, reference, cfg, device), step_policy(self, cfg, device), self.gemm_precision)

    def fallback(self, ctx: Context, reason: str) -> "Backend | None":
        """A backend to run instead when this one is unavailable (TE -> PyTorch autocast), or None."""
        return None


def converted(backend: Backend, reference: nn.Module, cfg: Any, device: torch.device) -> nn.Module:
    """`backend.convert` of a copy of the reference, checked to keep every weight, on `device`."""
    model = backend.convert(copy.deepcopy(reference), cfg)
    check_matched(model, reference)
    return model.to(device)


def step_policy(backend: Backend, cfg: Any, device: torch.device, dtype: torch.dtype | None = None,
                graph: tuple[str, str] = ("step", ""), te_attention: bool = False) -> StepPolicy:
    """The step a student of `backend` runs under `cfg.bench`'s switches. `dtype`: its autocast (fp16 needs a grad
    scaler: its narrow exponent range underflows small gradients); `graph`: what a CUDA graph of it covers ("step",
    capture_step, or "fwd_bwd", its `make_graphed`) and why it cannot be graphed ('' when it can); `te_attention`:
    whether it runs TE's attention (options.te_attention applies)."""
    notes = []
    if cfg.options.te_attention != "auto" and not te_attention:
        notes.append(f"options.te_attention={cfg.options.te_attention!r} not applied: this student does not "
                     "run TE's attention")
    compile_ = backend.compiled == "always" or (cfg.bench.compile and backend.compiled == "if_asked")
    if cfg.bench.compile and not compile_:
        notes.append(f"compile not applied: {backend.name} modules are skipped by dynamo")
    scaler = dtype is torch.float16
    scope, why = graph
    if not why and device.type != "cuda":
        why = "CUDA graphs need a GPU"
    elif not why and scaler:
        why = "the fp16 grad scaler's inf checks and skipped steps are not graph-safe"
    if cfg.bench.graphs and why:
        notes.append(f"graphs not applied: {why}")
    return StepPolicy(compile=compile_, graph=scope if cfg.bench.graphs and not why else None, grad_scaler=scaler,
                      notes=tuple(notes))


def low_precision(name: str) -> bool:
    """Whether the backend registered as `name` runs low-precision GEMMs (fp8, fp4) by default."""
    cls = declared(name)
    return cls is not None and cls().gemm_precision in LOW_PRECISION


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


