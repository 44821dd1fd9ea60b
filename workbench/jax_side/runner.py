"""The JAX student's row: trained on the run's batches from the same starting weights, timed the JAX way.

    row = runner.run(cfg, reference_state, data)   # data: workbench.train.loop.Data, shared with the torch students

Training runs `data.train` (every loss recorded), then the timed region runs `data.bench` as the torch rows do:
`bench.warmup` untimed steps, then `bench.iters` steps each timed on its own, ended by `block_until_ready`
(JAX dispatches asynchronously: without it the clock would stop before the step ran). The step is compiled ahead
of time, so `compile_ms` is reported apart and no timed step includes it. Median / p20 / p80 / mean come from
workbench.measure.timing.Timing, the torch rows' statistics.
"""
from __future__ import annotations

import itertools
import math
import time
from typing import Any

import numpy as np

from workbench.env import jax as probe
from workbench.jax_side import convert
from workbench.measure.timing import Timing


def new_row(compute: str = "fp32") -> dict[str, Any]:
    """The row before it runs: 'ok' until something says otherwise (workbench.run.rows' cells, plus `framework`)."""
    name = f"jax_{compute}"
    return {"student": name, "backend": name, "recipe": None, "mode": "JAX", "framework": "jax",
            "gemm_precision": compute.split("_")[0], "status": "ok", "reason": ""}


def skipped_row(reason: str, compute: str = "fp32") -> dict[str, Any]:
    return {**new_row(compute), "status": "skipped", "mode": None, "reason": reason}


def run(cfg, init_state: dict[str, Any], data, compute: str = "fp32") -> dict[str, Any]:
    """The row of a Flax student computing in `compute`, from the torch students' shared initial weights
    (`init_state`, reference layout); skipped with the reason where JAX is missing, 'error' where it failed."""
    avail = probe.availability()
    reason = avail.fp8_reason if compute.startswith("fp8") else avail.reason
    if reason:
        return skipped_row(reason, compute)
    row = {**new_row(compute), **{f"{k}_version": v for k, v in avail.versions.items()}}
    try:
        row.update(_train_and_time(cfg, init_state, data, compute))
    except Exception as err:  # a failed student is a row saying why, never the end of the run
        row.update(status="error", reason=f"{type(err).__name__}: {err}".strip()[:2000])
    return row


NOT_IN_ROW = ("student", "backend", "recipe")  # the run's row already names the student (`jax:fp32`)


def train(cfg, reference, data, compute: str) -> tuple[dict[str, Any], list[float]]:
    """(row cells, training losses) of the Flax student for a run's `jax:<compute>` row: the reference torch
    model's weights, the run's batches; status and reason say when it was skipped or failed."""
    from workbench.backends import reference_state

    row = run(cfg, reference_state(reference), data, compute=compute)
    losses = row.pop("losses", [])
    return {k: v for k, v in row.items() if k not in NOT_IN_ROW}, losses


def _batch(tokens, targets) -> tuple:
    """One (tokens, Targets) batch of the torch run as the jitted step's arguments (host numpy arrays)."""
    def host(t):
        return t.detach().float().cpu().numpy() if t.is_floating_point() else t.detach().cpu().numpy()

    return (host(tokens).astype(np.int32), host(targets.out), tuple(host(h) for h in targets.hidden or ()))


def _train_and_time(cfg, init_state: dict[str, Any], data, compute: str) -> dict[str, Any]:
    import jax  # only here: the module imports without jax, so a skipped row needs none

    from workbench.jax_side import student

    model, tx, recipe = student.for_model(cfg.model, compute), student.adamw(cfg.train), student.te_recipe(compute)
    step, _ = student.make_fns(model, cfg.distill.loss, tx, recipe)
    _, fp32_loss = student.make_fns(student.for_model(cfg.model, "fp32"), cfg.distill.loss, tx)
    _, eval_mse = student.make_fns(model, "mse", tx, recipe)  # the tutorial's eval, in the student's precision
    params = jax.device_put(convert.to_flax(init_state))
    opt_state = tx.init(params)
    # the training batches go to the device one step at a time (the torch run holds them all already: at `large`
    # a second full copy would take GBs); the few timed and held-out batches once, before the clock
    train = (jax.device_put(_batch(*b)) for b in data.train)
    bench = [jax.device_put(_batch(*b)) for b in data.bench]
    held_out = [jax.device_put(_batch(*b)) for b in data.eval]
    # the fp32 loss of the converted starting weights on the first held-out batch: where the torch rows measure
    # their initial_loss, so the two agree when the weights are the same
    initial = float(fp32_loss(params, *held_out[0]))
    first = next(train, None)
    if first is None:
        return {"status": "error", "reason": "no training batch (train.steps 0)"}
    t0 = time.perf_counter()
    compiled = step.lower(params, opt_state, *first).compile()
    compile_ms = (time.perf_counter() - t0) * 1e3
    losses = []
    for batch in itertools.chain([first], train):
        params, opt_state, loss = compiled(params, opt_state, *batch)
        losses.append(loss)  # kept on the device: no sync between training steps, as the torch loop
    losses = [float(x) for x in jax.device_get(losses)]
    out = {"initial_loss": initial, "first_step_loss": losses[0], "final_train_loss": losses[-1],
           "steps_run": len(losses), "compile_ms": compile_ms, "device": str(jax.devices()[0]), "losses": losses}
    if not all(math.isfinite(x) for x in losses):
        return {**out, "status": "diverged", "reason": "non-finite training loss"}
    out["eval_mse"] = float(np.mean([float(eval_mse(params, *b)) for b in held_out]))
    t = Timing(_timed(compiled, params, opt_state, bench, cfg.bench))
    tokens = cfg.model.batch * cfg.model.seq_len
    return {**out, **t.summary("step_ms"), "tokens_per_s": tokens / (t.median * 1e-3) if t.median else None}


def _timed(compiled, params, opt_state, bench: list, b) -> list[float]:
    """`b.warmup` untimed then `b.iters` timed steps over the bench batches, cycled; each ends ready."""
    import jax

    times = []
    for i in range(b.warmup + b.iters):
        batch = bench[i % len(bench)]
        start = time.perf_counter()
        params, opt_state, loss = compiled(params, opt_state, *batch)
        jax.block_until_ready((params, opt_state, loss))
        if i >= b.warmup:
            times.append((time.perf_counter() - start) * 1e3)
    return times
