"""The tutorial's MLP student in Flax, its distillation loss and its jitted AdamW step.

Imported only once `workbench.env.jax.availability()` says jax, flax and optax are here. The maths is the torch
student's (workbench.models.mlp.Student): embedding -> residual pre-LayerNorm blocks (LayerNorm eps 1e-5, Linear,
tanh GELU, Linear) -> linear head; the losses are workbench.train.objectives' (fp32, whatever the compute dtype);
the optimizer is optax.adamw with torch AdamW's defaults (betas 0.9 / 0.999, eps 1e-8, decoupled weight decay on every
parameter, as torch's AdamW decays every parameter it is given).
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

COMPUTE_DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16}
# TE-JAX recipes this student runs (its GEMMs in te_flax.DenseGeneral under te's autocast, from bf16 inputs): the
# stateless ones. Delayed scaling keeps its amax histories in a Flax variable collection that the step would have to
# carry and update (transformer_engine.jax.update_collections): not wired here yet.
TE_RECIPES = {"fp8_current": "Float8CurrentScaling"}


class FlaxStudent(nn.Module):
    """Parameter names follow convert.to_flax: embed, norms_i, fc1_i, fc2_i, head; params are fp32, `dtype` is
    what the layers compute in (bf16: the counterpart of the torch bf16 autocast student)."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    dtype: Any = jnp.float32
    te: bool = False
    """True: the GEMMs are TE-JAX's DenseGeneral (same parameter names and shapes as nn.Dense, fp32 parameters),
    computing in `dtype` from their cast inputs, in FP8 under transformer_engine.jax.autocast (`make_fns`)."""

    @nn.compact
    def __call__(self, tokens: jax.Array) -> tuple[jax.Array, list[jax.Array]]:
        if self.te:
            from transformer_engine.jax import flax as te_flax

            def dense(features: int, name: str):
                layer = te_flax.DenseGeneral(features, use_bias=True, name=name)
                return lambda v: layer(v.astype(self.dtype))  # TE computes in its input's dtype
        else:
            def dense(features: int, name: str):
                return nn.Dense(features, dtype=self.dtype, name=name)

        x = nn.Embed(self.vocab, self.hidden, name="embed")(tokens)
        hidden = []
        for i in range(self.layers):
            # torch's LayerNorm takes the variance as mean((x - mean)^2); Flax's fast variance (E[x^2] - E[x]^2)
            # rounds differently
            y = nn.LayerNorm(epsilon=1e-5, use_fast_variance=False, dtype=self.dtype, name=f"norms_{i}")(x)
            y = dense(self.intermediate, f"fc1_{i}")(y)
            x = x + dense(self.hidden, f"fc2_{i}")(jax.nn.gelu(y, approximate=True))
            hidden.append(x)
        return dense(self.hidden, "head")(x), hidden


def for_model(m, compute: str = "fp32") -> FlaxStudent:
    """The Flax student of a workbench ModelConfig (`m`), computing in `compute` ('fp32', 'bf16' or a TE_RECIPES
    name: TE-JAX's GEMMs from bf16 inputs)."""
    te = compute in TE_RECIPES
    return FlaxStudent(m.vocab, m.hidden, m.intermediate, m.layers, COMPUTE_DTYPES["bf16" if te else compute], te=te)


def te_recipe(compute: str):
    """The TE recipe object of a TE_RECIPES compute ('fp8_current' -> Float8CurrentScaling()), else None."""
    if compute not in TE_RECIPES:
        return None
    from transformer_engine.common import recipe

    return getattr(recipe, TE_RECIPES[compute])()


def _mse(pred: jax.Array, target: jax.Array) -> jax.Array:
    return jnp.mean(jnp.square(pred.astype(jnp.float32) - target.astype(jnp.float32)))


def _cosine(pred: jax.Array, target: jax.Array, eps: float = 1e-8) -> jax.Array:
    """1 - mean cosine similarity over the last axis, each norm clamped at eps as torch's cosine_similarity does."""
    p, t = pred.astype(jnp.float32), target.astype(jnp.float32)
    norms = jnp.maximum(jnp.linalg.norm(p, axis=-1), eps) * jnp.maximum(jnp.linalg.norm(t, axis=-1), eps)
    return 1.0 - jnp.mean(jnp.sum(p * t, axis=-1) / norms)


def objective(kind: str, out: jax.Array, hidden: list[jax.Array], target: jax.Array,
              target_hidden: tuple[jax.Array, ...]) -> jax.Array:
    """distill.loss `kind` ('mse', 'cosine', 'hidden') of the student's output (and block states) against the
    teacher's."""
    if kind == "mse":
        return _mse(out, target)
    if kind == "cosine":
        return _cosine(out, target)
    if kind == "hidden":
        return _mse(out, target) + jnp.mean(jnp.stack([_mse(h, t) for h, t in zip(hidden, target_hidden)]))
    raise ValueError(f"unknown distillation loss {kind!r}")


def adamw(t) -> optax.GradientTransformation:
    """torch.optim.AdamW(lr, weight_decay) of a workbench TrainConfig (`t`), in optax; under a schedule
    (t.lr_schedule, t.lr_warmup_steps) the torch students' own table of rates, indexed by optax's update count
    (the timed steps after training keep the last rate, as the torch students do)."""
    lr: Any = t.lr
    if t.lr_schedule != "constant" or t.lr_warmup_steps:
        from workbench.train.optim import rates  # one table for both frameworks

        table = jnp.asarray(rates(t.lr_schedule, t.lr, t.steps, t.lr_warmup_steps), jnp.float32)
        lr = lambda count: table[jnp.minimum(count, len(table) - 1)]  # noqa: E731
    return optax.adamw(learning_rate=lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=t.weight_decay)


def traced_apply(model: nn.Module, recipe: Any = None):
    """`apply(params, tokens)`: the model's forward, under TE-JAX's autocast of `recipe` (a `te_recipe`), entered
    while jax traces it: that is when its GEMMs pick their precision. A TE model (`model.te`) must have one."""
    if model.te and recipe is None:  # TE's layers without a recipe would quietly compute in bf16
        raise ValueError(f"a TE student ({type(model).__name__}.te) needs its recipe: student.te_recipe(compute)")

    def apply(params, tokens):
        if recipe is None:
            return model.apply({"params": params}, tokens)
        from transformer_engine.jax import autocast

        with autocast(enabled=True, recipe=recipe):
            return model.apply({"params": params}, tokens)

    return apply


def jitted_step(loss_fn, tx: optax.GradientTransformation):
    """jit(step(params, opt_state, *batch) -> (params, opt_state, loss)): an AdamW step on loss_fn(params, *batch)."""
    def step(params, opt_state, *batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step)


def make_fns(model: FlaxStudent, kind: str, tx: optax.GradientTransformation, recipe: Any = None):
    """(step, loss): jitted `step(params, opt_state, tokens, target, target_hidden) -> (params, opt_state, loss)`
    and `loss(params, tokens, target, target_hidden)`. `recipe`: a TE recipe (`te_recipe`) the forward runs under."""
    apply = traced_apply(model, recipe)

    def loss_fn(params, tokens, target, target_hidden):
        out, hidden = apply(params, tokens)
        return objective(kind, out, hidden, target, target_hidden)

    return jitted_step(loss_fn, tx), jax.jit(loss_fn)
