"""The causal LM student in Flax, its distillation loss and its jitted AdamW step: the JAX comparator at an LM shape.

Imported only once `workbench.env.jax.availability()` says jax, flax and optax are here. The maths is
workbench.models.lm.CausalLM's for the kind's `Arch` (gpt: LayerNorm, tanh-GELU MLP, biases, learned positions;
llama: RMSNorm, SwiGLU, no biases, rotary q/k): embedding (+ positions) -> L x [x + attn(norm1(x)); x + mlp(norm2(x))]
-> norm -> LM head. Parameter names are the torch names with '.' as '_' (convert.lm_to_flax), fp32; `dtype` is what
the layers compute in. Attention is jax.nn.dot_product_attention, causal, on [batch, seq, heads, head_dim] as torch's
SDPA / TE's fused attention take it: cuDNN's fused kernel on a GPU in bf16 (`attention_impl`), XLA's elsewhere.

With `te`, every GEMM (qkv, proj, the MLP's and the LM head: the TE PyTorch student converts every nn.Linear of
CausalLM, the head included) is TE-JAX's DenseGeneral from bf16 inputs, in FP8 under the recipe's autocast.

The loss is workbench.train.objectives.lm_objectives.lm_loss's: (1 - ce_weight) * KD + ce_weight * CE, per counted
token (next token != IGNORE_INDEX), in fp32 whatever the compute dtype; KD is forward KL, reverse KL or the
generalized JSD at temperature T, times T^2. Unchunked: XLA fuses the [tokens, vocab] maths itself, and an H200
holds the fp32 copies at the LM presets' 8192 tokens x 32768 vocab (1 GiB each).
"""
from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

IGNORE_INDEX = -100  # lm_objectives.IGNORE_INDEX (not imported: that module imports torch)


def attention_impl(dtype: Any) -> str:
    """jax.nn.dot_product_attention's implementation: cuDNN's fused kernel on a GPU in bf16 (the counterpart of the
    torch students' fused SDPA / TE attention), XLA's on a CPU or in fp32 (cuDNN's takes bf16 / fp16 only)."""
    on_gpu = jax.default_backend() == "gpu"
    return "cudnn" if on_gpu and dtype == jnp.bfloat16 else "xla"


def rotary(x: jax.Array, theta: float) -> jax.Array:
    """workbench.models.lm.rotary: Llama's rotate-half rotary embedding of x [batch, seq, heads, head_dim], in fp32,
    returned in x's dtype."""
    s, d = x.shape[1], x.shape[-1]
    inv_freq = theta ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)
    angles = jnp.outer(jnp.arange(s, dtype=jnp.float32), inv_freq)[None, :, None, :]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class FlaxCausalLM(nn.Module):
    """CausalLM of an LMShape (`shape`, a frozen dataclass) in Flax; returns the logits [batch, seq, vocab] in
    `dtype` (the losses cast to fp32)."""

    shape: Any
    dtype: Any = jnp.float32
    te: bool = False
    attention: str = "xla"

    def _dense(self, features: int, name: str, bias: bool):
        if self.te:
            from transformer_engine.jax import flax as te_flax

            layer = te_flax.DenseGeneral(features, use_bias=bias, name=name)
            return lambda v: layer(v.astype(self.dtype))  # TE computes in its input's dtype
        return nn.Dense(features, use_bias=bias, dtype=self.dtype, name=name)

    def _norm(self, name: str):
        s = self.shape
        if s.arch.norm == "rmsnorm":
            return nn.RMSNorm(epsilon=s.norm_eps, dtype=self.dtype, name=name)
        # torch's LayerNorm takes the variance as mean((x - mean)^2); Flax's fast variance rounds differently
        return nn.LayerNorm(epsilon=s.norm_eps, use_fast_variance=False, dtype=self.dtype, name=name)

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        s, arch = self.shape, self.shape.arch
        b, t = tokens.shape
        x = nn.Embed(s.vocab, s.hidden, name="embed")(tokens)
        if arch.positions == "learned":
            x = x + nn.Embed(s.seq_len, s.hidden, name="pos")(jnp.arange(t))
        for i in range(s.layers):
            p = f"blocks_{i}_"
            h = self._norm(p + "norm1")(x)
            qkv = self._dense(3 * s.hidden, p + "attn_qkv", arch.bias)(h).reshape(b, t, 3, s.heads, s.head_dim)
            q, k, v = (qkv[:, :, j].astype(self.dtype) for j in range(3))
            if arch.positions == "rope":
                q, k = rotary(q, arch.rope_theta), rotary(k, arch.rope_theta)
            a = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=self.attention)
            x = x + self._dense(s.hidden, p + "attn_proj", arch.bias)(a.reshape(b, t, s.hidden))
            h = self._norm(p + "norm2")(x)
            if arch.mlp == "gelu":
                m = self._dense(s.hidden, p + "mlp_fc2", arch.bias)(
                    jax.nn.gelu(self._dense(s.intermediate, p + "mlp_fc1", arch.bias)(h), approximate=True))
            else:  # swiglu: down(silu(gate(x)) * up(x))
                gate = self._dense(s.intermediate, p + "mlp_gate", arch.bias)(h)
                up = self._dense(s.intermediate, p + "mlp_up", arch.bias)(h)
                m = self._dense(s.hidden, p + "mlp_down", arch.bias)(jax.nn.silu(gate) * up)
            x = x + m
        return self._dense(s.vocab, "head", False)(self._norm("norm")(x))


def divergence(ls: jax.Array, lt: jax.Array, kind: str, beta: float = 0.5) -> jax.Array:
    """lm_objectives.divergence: [n] divergence between the student's and the teacher's log-probabilities."""
    if kind == "forward_kl" or (kind == "jsd" and beta == 0.0):
        return jnp.sum(jnp.exp(lt) * (lt - ls), axis=-1)
    if kind == "reverse_kl" or (kind == "jsd" and beta == 1.0):
        return jnp.sum(jnp.exp(ls) * (ls - lt), axis=-1)
    lm = jnp.logaddexp(lt + math.log(beta), ls + math.log(1.0 - beta))
    return beta * jnp.sum(jnp.exp(lt) * (lt - lm), axis=-1) + (1.0 - beta) * jnp.sum(jnp.exp(ls) * (ls - lm), axis=-1)


def lm_objective(d, logits: jax.Array, teacher: jax.Array, next_tokens: jax.Array) -> jax.Array:
    """lm_objectives.lm_loss of the distill config `d`: (1 - ce_weight) * KD + ce_weight * CE over counted tokens."""
    vocab = logits.shape[-1]
    s, y = logits.reshape(-1, vocab).astype(jnp.float32), next_tokens.reshape(-1)
    keep = (y != IGNORE_INDEX).astype(jnp.float32)
    counted = jnp.maximum(jnp.sum(keep), 1.0)
    total = jnp.zeros((), jnp.float32)
    if d.ce_weight != 1:
        temp = d.temperature
        ls = jax.nn.log_softmax(s / temp, axis=-1)
        lt = jax.nn.log_softmax(teacher.reshape(-1, vocab).astype(jnp.float32) / temp, axis=-1)
        kd = divergence(ls, lt, d.loss, d.jsd_beta) * temp ** 2
        total = total + (1.0 - d.ce_weight) * jnp.sum(kd * keep)
    if d.ce_weight != 0:
        picked = jnp.take_along_axis(s, jnp.maximum(y, 0)[:, None], axis=-1)[:, 0]
        ce = jax.nn.logsumexp(s, axis=-1) - picked
        total = total + d.ce_weight * jnp.sum(ce * keep)
    return total / counted


def make_fns(model: FlaxCausalLM, d, tx: optax.GradientTransformation, recipe: Any = None):
    """(step, loss, logits): jitted `step(params, opt_state, tokens, teacher_logits, next_tokens) -> (params,
    opt_state, loss)`, `loss(params, tokens, teacher_logits, next_tokens)` and `logits(params, tokens)`.
    `recipe`: the TE recipe the forward is traced under (student.traced_apply)."""
    from workbench.jax_side.student import jitted_step, traced_apply

    apply = traced_apply(model, recipe)

    def loss_fn(params, tokens, teacher, next_tokens):
        return lm_objective(d, apply(params, tokens), teacher, next_tokens)

    return jitted_step(loss_fn, tx), jax.jit(loss_fn), jax.jit(apply)
