"""The JAX student's row: trained on the run's batches from the same starting weights, timed the JAX way.

    row = runner.run(cfg, reference_state, data)   # data: workbench.train.loop.Data, shared with the torch students

Training runs `data.train` (every loss recorded), then the timed region runs `data.bench` as the torch rows do:
`bench.warmup` untimed steps, then `bench.iters` steps each timed on its own, ended by `block_until_ready`
(JAX dispatches asynchronously: without it the clock would stop before the step ran). The step is compiled ahead
of time, so `compile_ms` is reported apart and no timed step includes it. Median / p20 / p80 / mean come from
workbench.measure.timing.Timing, the torch rows' statistics.

A language model (model.kind gpt / llama) trains workbench.jax_side.lm_student's FlaxCausalLM on the batches'
teacher logits (moved torch -> JAX through DLPack, no host round trip on a GPU) and is evaluated by the torch
rows' own held-out metrics (workbench.train.objectives.lm_metrics.LMMetrics, on its logits moved back), before
training too (`*_step0`). Top-k teacher targets are not taken (a row saying so).
"""
from __future__ import annotations

import contextlib
import itertools
import math
import time
from typing import Any

import numpy as np

from workbench import config
from workbench.env import jax as probe
from workbench.jax_side import convert
from workbench.measure import flops
from workbench.measure.timing import Timing


def new_row(compute: str = "fp32") -> dict[str, Any]:
    """The row before it runs: 'ok' until something says otherwise (workbench.run.rows' cells, plus `framework`)."""
    name = f"jax_{compute}"
    return {"student": name, "backend": name, "recipe": None, "mode": "JAX", "framework": "jax",
            "gemm_precision": compute.split("_")[0], "status": "ok", "reason": ""}


def skipped_row(reason: str, compute: str = "fp32") -> dict[str, Any]:
    return {**new_row(compute), "status": "skipped", "mode": None, "reason": reason}


def run(cfg, init_state: dict[str, Any], data, compute: str = "fp32", train_flops: int | None = None,
        shape=None) -> dict[str, Any]:
    """The row of a Flax student computing in `compute`, from the torch students' shared initial weights
    (`init_state`, reference layout); skipped with the reason where JAX is missing, 'error' where it failed.
    `train_flops`: one training step's FLOPs by the torch reference model's count (the row's tflops); `shape`: a
    language model's LMShape (workbench.models.lm.CausalLM.shape)."""
    avail = probe.availability()
    reason = avail.fp8_reason if compute.startswith("fp8") else avail.reason
    lm = config.kind_task(cfg.model.kind) == "lm"
    if not reason and lm and data.bench and data.bench[0][1].indices is not None:
        reason = ("the JAX LM student trains on the teacher's full logits, not top-k targets "
                  "(distill.teacher_mode 'topk'): run it with teacher_mode 'precomputed' or 'online'")
    if not reason and lm and shape is None:
        reason = ("the JAX LM student is workbench's own CausalLM (model.kind gpt / llama); a Hugging Face "
                  "student (lm.student) has no Flax counterpart here")
    if reason:
        return skipped_row(reason, compute)
    row = {**new_row(compute), **{f"{k}_version": v for k, v in avail.versions.items()}}
    try:
        with _matmul_precision(compute):
            row.update(_train_and_time_lm(cfg, shape, init_state, data, compute) if lm
                       else _train_and_time(cfg, init_state, data, compute))
        if train_flops and row.get("step_ms_median"):
            row.update(tflops=flops.tflops(train_flops, row["step_ms_median"]), train_gflop_per_step=train_flops / 1e9)
    except Exception as err:  # a failed student is a row saying why, never the end of the run
        row.update(status="error", reason=f"{type(err).__name__}: {err}".strip()[:2000])
    return row


def _matmul_precision(compute: str):
    """jax:fp32 computes its GEMMs in fp32, as torch_fp32 does: JAX's default on a GPU rounds fp32 GEMM inputs to
    TF32, torch's default does not, and the row would be a faster, less exact student under the same name."""
    if compute != "fp32":
        return contextlib.nullcontext()
    import jax

    return jax.default_matmul_precision("highest")


NOT_IN_ROW = ("student", "backend", "recipe")  # the run's row already names the student (`jax:fp32`)


def train(cfg, reference, data, compute: str) -> tuple[dict[str, Any], list[float]]:
    """(row cells, training losses) of the Flax student for a run's `jax:<compute>` row: the reference torch
    model's weights, the run's batches; status and reason say when it was skipped or failed."""
    from workbench.backends import reference_state

    train_flops = flops.tokens_per_step(cfg.model) * reference.train_flops_per_token()
    row = run(cfg, reference_state(reference), data, compute=compute, train_flops=train_flops,
              shape=getattr(reference, "shape", None))
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
    # their initial_loss, so the two agree when the weights are the same; fp32 GEMMs at full precision (JAX's
    # default on a GPU rounds fp32 inputs to TF32, torch's does not)
    with jax.default_matmul_precision("highest"):
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


# ---- the language model ---------------------------------------------------------------------------------------
def _to_jax(t):
    """A torch tensor as a JAX array of its own on JAX's default device, through DLPack (a CUDA tensor's copy stays
    on the GPU, bf16 kept); host numpy where DLPack cannot carry it."""
    import jax
    import jax.numpy as jnp

    t = t.detach().contiguous()
    try:
        arr = jax.dlpack.from_dlpack(t)
    except Exception:  # a device or dtype this jax's DLPack does not take
        arr = (t.float() if t.is_floating_point() else t).cpu().numpy()
    return jax.device_put(jnp.array(arr, copy=True))  # a copy: torch may free or reuse its tensor


def _to_torch(x, device):
    """A JAX array as a torch tensor on `device` (DLPack, else through the host)."""
    import torch

    try:
        return torch.from_dlpack(x).to(device)
    except Exception:
        return torch.from_numpy(np.asarray(x.astype("float32"))).to(device)


def _lm_batch(tokens, targets) -> tuple:
    """One (tokens, Targets) LM batch as the jitted step's arguments: int32 tokens, the teacher's logits in their
    dtype, int32 next tokens (IGNORE_INDEX kept)."""
    import torch

    return (_to_jax(tokens.to(torch.int32)), _to_jax(targets.out), _to_jax(targets.next_tokens.to(torch.int32)))


def _train_and_time_lm(cfg, shape, init_state: dict[str, Any], data, compute: str) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    from workbench.jax_side import lm_student, student
    from workbench.train.objectives.lm_metrics import STEP0, LMMetrics

    te = compute in student.TE_RECIPES
    dtype = student.COMPUTE_DTYPES["bf16" if te else compute]
    model = lm_student.FlaxCausalLM(shape, dtype, te=te, attention=lm_student.attention_impl(dtype))
    tx, recipe, d = student.adamw(cfg.train), student.te_recipe(compute), cfg.distill
    params = jax.device_put(convert.lm_to_flax(init_state))
    opt_state = tx.init(params)
    device = data.eval[0][0].device
    held_out = [(_lm_batch(*b), b) for b in data.eval]
    # the fp32 loss of the converted starting weights on the first held-out batch, where the torch rows measure
    # their initial_loss; fp32 GEMMs at full precision (JAX's default on a GPU rounds fp32 inputs to TF32)
    _, fp32_loss, _ = lm_student.make_fns(lm_student.FlaxCausalLM(shape, jnp.float32), d, tx)
    with jax.default_matmul_precision("highest"):
        initial = float(fp32_loss(params, *held_out[0][0]))
    train = (_lm_batch(*b) for b in data.train)
    first = next(train, None)
    if first is None:
        return {"status": "error", "reason": "no training batch (train.steps 0)"}
    out: dict[str, Any] = {"initial_loss": initial}
    t0 = time.perf_counter()
    try:
        step, _, logits = lm_student.make_fns(model, d, tx, recipe)
        compiled = step.lower(params, opt_state, *first).compile()
    except Exception as err:  # cuDNN's fused attention refused this shape: XLA's, and the row says so
        if model.attention != "cudnn":
            raise
        out["attention_warning"] = f"cuDNN attention did not compile ({type(err).__name__}: {str(err)[:300]})"
        model = model.clone(attention="xla")
        step, _, logits = lm_student.make_fns(model, d, tx, recipe)
        compiled = step.lower(params, opt_state, *first).compile()
    out.update(compile_ms=(time.perf_counter() - t0) * 1e3, attention_backend=f"jax {model.attention}")

    def evaluate(p) -> dict[str, Any]:  # the torch rows' metrics, on this student's logits
        acc = LMMetrics(d.loss_chunk_tokens)
        for (tokens, _, _), (_, targets) in held_out:
            acc.add(_to_torch(logits(p, tokens), device), targets.out, targets.next_tokens)
        return acc.result()

    out.update({k + "_step0": v for k, v in evaluate(params).items() if k in STEP0})
    losses = []
    t_train = time.perf_counter()
    for batch in itertools.chain([first], train):
        params, opt_state, loss = compiled(params, opt_state, *batch)
        losses.append(loss)
    losses = [float(x) for x in jax.device_get(losses)]
    out.update(first_step_loss=losses[0], final_train_loss=losses[-1], steps_run=len(losses),
               train_wall_s=round(time.perf_counter() - t_train, 2), device=str(jax.devices()[0]), losses=losses)
    if not all(math.isfinite(x) for x in losses):
        return {**out, "status": "diverged", "reason": "non-finite training loss"}
    out.update(evaluate(params))
    bench = [_lm_batch(*b) for b in data.bench]
    t = Timing(_timed(compiled, params, opt_state, bench, cfg.bench))
    return {**out, **t.summary("step_ms"),
            "tokens_per_s": flops.tokens_per_step(cfg.model) / (t.median * 1e-3) if t.median else None}
