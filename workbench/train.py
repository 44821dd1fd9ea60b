"""Train, evaluate and time one student against precomputed teacher targets.

Every student sees the same batches in the same order (the lists in `Data`), starts from the same
weights (`init_state`), and its timed step contains only its own forward, loss, backward and
optimizer update: teacher targets were computed and synchronized before (REFERENCE §1.2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from workbench import distill, flops, timing
from workbench.backends import Backend, reference_state
from workbench.models import Student


@dataclass
class Data:
    """Token batches (on the device) and their teacher targets, shared by all students."""

    train: list[tuple[torch.Tensor, distill.Targets]]
    bench: list[tuple[torch.Tensor, distill.Targets]]
    eval: list[tuple[torch.Tensor, distill.Targets]]


class Diverged(RuntimeError):
    pass


def make_step(model: torch.nn.Module, opt: torch.optim.Optimizer, backend: Backend, loss_kind: str,
              scaler: Any = None) -> Callable[[torch.Tensor, distill.Targets], torch.Tensor]:
    """One optimizer step; returns the (fp32) loss tensor without synchronizing."""
    want_hidden = distill.needs_hidden(loss_kind)

    def step(tokens: torch.Tensor, targets: distill.Targets) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with backend.forward_context():  # wraps the forward only (TE: autocast must not wrap backward)
            out = model(tokens, return_hidden=want_hidden)
        loss = distill.loss(loss_kind, out, targets)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss.detach()

    return step


def initial_loss(model: torch.nn.Module, cfg, batch: tuple[torch.Tensor, distill.Targets]) -> float:
    """fp32 output-MSE of the student's *starting weights*, evaluated by the torch reference model.

    Backend arithmetic (bf16, FP8) differs by design; this isolates whether the weights are the same,
    which is what "matched students" promises.
    """
    ref = Student(cfg.model)
    ref.load_state_dict({k: v.float().cpu() for k, v in reference_state(model).items()})
    tokens, targets = batch
    ref = ref.to(tokens.device)
    with torch.no_grad():
        return float(distill.mse(ref(tokens), targets.out))


@torch.no_grad()
def evaluate(model: torch.nn.Module, backend: Backend, batches) -> float:
    """Mean output MSE against the teacher on held-out batches (the tutorial's eval), in fp32."""
    model.eval()
    vals = []
    for tokens, targets in batches:
        with backend.forward_context():
            pred = model(tokens)
        vals.append(float(distill.mse(pred, targets.out)))
    model.train()
    return sum(vals) / len(vals)


def run_student(backend: Backend, cfg, init_state: dict, data: Data, device: torch.device,
                on_step: Callable[[int, float], None] | None = None) -> tuple[dict, list[float]]:
    """Train, evaluate and time one student. Returns (metrics, per-step losses).

    Raises Diverged (with the losses so far in .losses) on a non-finite loss.
    """
    model = backend.build(cfg, init_state, device)
    model.train()
    metrics: dict[str, Any] = {"initial_loss": initial_loss(model, cfg, data.train[0])}
    fused = cfg.train.fused_optimizer and device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay,
                            **({"fused": True} if fused else {}))
    scaler = torch.amp.GradScaler(device.type) if backend.uses_grad_scaler else None
    step = make_step(model, opt, backend, cfg.distill.loss, scaler)

    losses: list[float] = []
    for i, (tokens, targets) in enumerate(data.train):
        loss = float(step(tokens, targets))  # .item() syncs: fine here, training is not timed
        losses.append(loss)
        if on_step:
            on_step(i + 1, loss)
        if not math.isfinite(loss):
            err = Diverged(f"non-finite loss {loss} at training step {i + 1}")
            err.losses, err.metrics = losses, metrics
            raise err
    metrics["first_step_loss"] = losses[0]
    metrics["final_train_loss"] = losses[-1]
    metrics["steps_run"] = len(losses)
    metrics["eval_mse"] = evaluate(model, backend, data.eval)

    # Timed region: identical bench batches, cycled; losses stay on the device (no sync inside).
    it = iter(range(10 ** 9))

    def timed_step():
        tokens, targets = data.bench[next(it) % len(data.bench)]
        step(tokens, targets)

    clock = timing.clock_for(device)
    t = timing.measure(timed_step, cfg.bench.warmup, cfg.bench.iters, clock,
                       before_timed=lambda: timing.reset_peak_memory(device))
    alloc, reserved = timing.peak_memory_mb(device)
    train_flops = flops.train_flops(cfg.model)
    metrics.update(
        {
            "step_ms_median": t.median, "step_ms_p20": t.p20, "step_ms_p80": t.p80, "step_ms_mean": t.mean,
            "tokens_per_s": flops.tokens_per_step(cfg.model) / (t.median * 1e-3) if t.median else None,
            "tflops": flops.tflops(train_flops, t.median),
            "peak_mem_allocated_mb": alloc, "peak_mem_reserved_mb": reserved,
        }
    )
    del model, opt, step
    return metrics, losses
