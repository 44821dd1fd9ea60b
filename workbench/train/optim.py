"""The student's optimizer: torch's AdamW (the tutorial's) or TE's FusedAdam, its reset after a graph capture,
and the learning rate over the training steps (train.lr_schedule, train.lr_warmup_steps).

One table of rates, computed here (`rates`), is what every framework reads: torch students set it before each
training step (`scheduled`), JAX students index it by optax's update count (`jax_side.student.adamw`). A constant
rate (the tutorial's) leaves the step untouched.

Why a decay at all: with a constant rate a held-out curve keeps moving at the end of any fixed step budget (a power
law falls by the same fraction over every last eighth), so two arms compared there differ partly by how fast they
learn, not by what they end at. Decaying to zero ends training where the curve has stopped: what the quality
studies' flattening rule asks for, and what distillation recipes do (cosine or linear decay after a warm-up).
A captured step (the whole step in one CUDA graph) would bake a float rate into the graph: there the rate is a
0-dim tensor on the device that the graph reads and `set_lr` fills before each replay.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from workbench.backends import MASTER_INIT
from workbench.env import te as _te


def make_optimizer(model: torch.nn.Module, cfg, device: torch.device, capturable: bool,
                   scaled: bool = False) -> tuple[torch.optim.Optimizer, str]:
    """(optimizer, note): AdamW as in the tutorial, or TE's FusedAdam (train.optimizer); the note says why
    a requested optimizer did not apply. AdamW is fused (one kernel) on request, capturable when the step is
    graphed. With a grad scaler on CUDA it is always fused: GradScaler.step then hands found_inf to the kernel
    instead of reading it on the host, which would put a sync into every timed step."""
    t = cfg.train
    note = ""
    if t.optimizer == "te_fused_adam":
        te, _, why = _te.load() if device.type == "cuda" else (None, None, "it needs a CUDA GPU")
        if te is not None and not scaled:
            return te_fused_adam(te, model, cfg, capturable), ""
        note = (f"optimizer te_fused_adam not applied ({why or 'the fp16 grad scaler drives torch optimizers'}); "
                "ran AdamW")
    kw: dict[str, Any] = {}
    if device.type == "cuda" and (t.fused_optimizer or scaled):
        kw["fused"] = True
    if capturable:
        kw["capturable"] = True  # optimizer state and step count live on the GPU, so replays update them
    return torch.optim.AdamW(model.parameters(), lr=t.lr, weight_decay=t.weight_decay, **kw), note


def te_fused_adam(te, model: torch.nn.Module, cfg, capturable: bool) -> torch.optim.Optimizer:
    """TE's FusedAdam in AdamW mode (torch's AdamW defaults: betas, eps), fp32 master weights whenever a
    parameter is not fp32 (bf16 or FP8 weights). An FP8 weight (options.te_fp8_weights) carries the shared
    init it was quantized from (`MASTER_INIT`): its master starts there, not at the FP8 rounding of it."""
    params = list(model.parameters())
    moments = {"fp32": torch.float32, "bf16": torch.bfloat16}[cfg.train.moments_dtype]
    opt = te.optimizers.FusedAdam(params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay, adam_w_mode=True,
                                  capturable=capturable, master_weights=any(p.dtype != torch.float32 for p in params)
                                  or any(hasattr(p, MASTER_INIT) for p in params),
                                  exp_avg_dtype=moments, exp_avg_sq_dtype=moments)
    for p in params:
        init = getattr(p, MASTER_INIT, None)
        if init is not None:
            opt.initialize_state(p, False)  # moments at zero, then the master from the exact init
            opt.set_scaled_state(p, "master_param", init.to(p.device, torch.float32))
            delattr(p, MASTER_INIT)
    return opt


def reset_optimizer(opt: torch.optim.Optimizer) -> None:
    """A fresh optimizer again, in place (a graph holds its tensors' addresses): zero moments and step
    counts (torch's in the per-parameter state, TE FusedAdam's capturable one in the param group), master
    weights equal to the (restored) parameters, TE's moment scales at one."""
    with torch.no_grad():
        for p, state in opt.state.items():
            for k, v in state.items():
                if not torch.is_tensor(v):
                    continue
                if k == "master_param":
                    v.copy_(p.detach().float())
                else:
                    v.zero_()
        for group in opt.param_groups:
            if torch.is_tensor(group.get("step")):
                group["step"].zero_()
        for scales in getattr(opt, "_scales", {}).values():  # TE FusedAdam: non-fp32 state scales start at 1
            for v in scales.values():
                v.fill_(1.0)


# ---- the learning rate over training
SCHEDULES = ("constant", "cosine", "linear")


def rates(schedule: str, lr: float, steps: int, warmup: int = 0) -> list[float]:
    """The rate of each of `steps` training steps (0-based): linear warm-up over `warmup` steps (step i at
    lr * (i + 1) / warmup, so the first step does not stand still), then constant, or a cosine or linear decay that
    reaches zero at the step after the last."""
    if schedule not in SCHEDULES:
        raise ValueError(f"train.lr_schedule must be one of {SCHEDULES}, got {schedule!r}")
    out = []
    for i in range(steps):
        if i < warmup:
            out.append(lr * (i + 1) / warmup)
            continue
        frac = (i - warmup) / max(1, steps - warmup)  # 0 at the first decayed step, < 1 at the last
        if schedule == "cosine":
            out.append(lr * 0.5 * (1 + math.cos(math.pi * frac)))
        elif schedule == "linear":
            out.append(lr * (1 - frac))
        else:
            out.append(lr)
    return out


def schedule(opt: torch.optim.Optimizer, t, steps: int, device: torch.device, captured: bool) -> list[float] | None:
    """The rates of train config `t` over `steps` training steps, None for one constant rate (the step is then
    left as it is). A `captured` step (one CUDA graph) gets its rate as a 0-dim fp32 tensor on `device`, before
    the capture: a graph replays what it read then, so its rate must be memory that `set_lr` changes in place.
    torch's AdamW (capturable or fused) takes a tensor rate; TE's FusedAdam in a graph is refused (ValueError:
    the student's row says why) rather than trained at its capture-time rate."""
    if t.lr_schedule == "constant" and t.lr_warmup_steps == 0:
        return None
    if captured:
        if not isinstance(opt, torch.optim.AdamW):
            raise ValueError(f"train.lr_schedule={t.lr_schedule!r} with train.optimizer={t.optimizer!r} in a "
                             "captured step: its rate would stay the capture's; use train.optimizer=adamw or "
                             "options.te_graph other than 'step'")
        for g in opt.param_groups:
            g["lr"] = torch.tensor(float(g["lr"]), dtype=torch.float32, device=device)
    return rates(t.lr_schedule, t.lr, steps, t.lr_warmup_steps)


def set_lr(opt: torch.optim.Optimizer, value: float) -> None:
    """Every param group's rate to `value`: in place when it is a tensor (a captured graph holds its address)."""
    for g in opt.param_groups:
        if torch.is_tensor(g["lr"]):
            g["lr"].fill_(value)
        else:
            g["lr"] = value


def scheduled(step: Callable, opt: torch.optim.Optimizer, table: list[float] | None) -> Callable:
    """`step` with the rate of `table` set before each of its first len(table) calls (the training steps); later
    calls (the timed steps; evaluation never steps) keep the last rate and add nothing to the timed region.
    No table: `step` itself."""
    if table is None:
        return step
    calls = 0

    def run(*args):
        nonlocal calls
        if calls < len(table):
            set_lr(opt, table[calls])
        calls += 1
        return step(*args)

    run.keep_alive = getattr(step, "keep_alive", None)  # a graphed step's model and optimizer (loop.capture_step)
    return run
