"""Decoder-only causal language models in plain torch, built from a kind's declared `Arch` and an `LMShape`.

Built once in plain torch and converted per precision backend (TE, torchao, compile), like the MLP
students: every layer a backend swaps is a stock module (nn.Linear, nn.LayerNorm, nn.RMSNorm) or the
attention core `SDPACore`, so a conversion keeps the weights and their names.

    embedding (+ learned positions) -> L x [x + attn(norm(x)); x + mlp(norm(x))] -> norm -> LM head

What each block is made of is the kind's `Arch` (workbench.models.kinds), read field by field here:
gpt is LayerNorm, tanh-GELU MLP (fc1/fc2), biases, learned absolute positions (GPT-2); llama is RMSNorm,
SwiGLU MLP (gate/up/down), no biases, rotary embeddings on q and k. A new value of an `Arch` field is one
block here (a norm in NORMS, an MLP in MLPS, a position scheme in CausalLM / Attention).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from workbench.models.kinds import LMShape


class SDPACore(nn.Module):
    """Causal attention on q, k, v in 'bshd' layout ([batch, seq, heads, head_dim]) -> [batch, seq, heads*head_dim].

    A module of its own, with te.DotProductAttention's input/output layout, so a TE conversion swaps
    exactly this (workbench.backends._te); no parameters."""

    def __init__(self, heads: int, head_dim: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, s = q.shape[:2]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim)


def attention_masks(valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal + padding masks for a batch whose `valid` [batch, seq] is True on real tokens, as
    (sdpa_mask, te_mask), both [batch, 1, seq, seq]:

    * SDPA's boolean `attn_mask`: True = may attend;
    * TE's `attention_mask` (attn_mask_type="arbitrary"): True = masked OUT, the negation.

    A query attends to earlier-or-equal real keys. A padding query also attends to itself, so no softmax
    row is empty (an empty row is NaN in SDPA); its output is ignored by the loss anyway."""
    s = valid.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=valid.device).tril()
    sdpa = (causal & valid[:, None, None, :]) | torch.eye(s, dtype=torch.bool, device=valid.device)
    return sdpa, ~sdpa


def rotary(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding of x [batch, seq, heads, head_dim] (Llama's rotate-half convention).

    The angles are computed per call, not kept as buffers: nothing to lose when a model is built on the
    meta device and materialised with to_empty, and it is seq x head_dim/2 work, nothing next to a GEMM.
    Computed in fp32 and returned in x's dtype, so TE's attention (bf16/fp16 only) gets what it takes."""
    s, d = x.shape[1], x.shape[-1]
    inv_freq = base ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv_freq)[None, :, None, :]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class Attention(nn.Module):
    """Fused qkv projection (one GEMM, one te.Linear when converted) -> [rotary] -> core -> output projection."""

    def __init__(self, shape: LMShape):
        super().__init__()
        arch = shape.arch
        self.heads, self.head_dim = shape.heads, shape.head_dim
        self.rope_theta = arch.rope_theta if arch.positions == "rope" else None
        self.qkv = nn.Linear(shape.hidden, 3 * shape.hidden, bias=arch.bias)
        self.core = SDPACore(shape.heads, shape.head_dim)
        self.proj = nn.Linear(shape.hidden, shape.hidden, bias=arch.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).unbind(2)
        if self.rope_theta is not None:
            q, k = rotary(q, self.rope_theta), rotary(k, self.rope_theta)
        return self.proj(self.core(q, k, v))


class GeluMLP(nn.Module):
    """GPT's MLP. tanh GELU: GPT-2's, and te.LayerNormMLP's 'gelu', so a fused TE layout keeps the maths."""

    def __init__(self, hidden: int, ffn: int, bias: bool):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, ffn, bias=bias), nn.Linear(ffn, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class SwiGLU(nn.Module):
    """Llama's MLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, ffn: int, bias: bool):
        super().__init__()
        self.gate, self.up = nn.Linear(hidden, ffn, bias=bias), nn.Linear(hidden, ffn, bias=bias)
        self.down = nn.Linear(ffn, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


NORMS = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm}  # Arch.norm -> the module, built (hidden, eps=)
MLPS = {"gelu": GeluMLP, "swiglu": SwiGLU}  # Arch.mlp -> the module, built (hidden, intermediate, bias)


def _norm(shape: LMShape) -> nn.Module:
    return NORMS[shape.arch.norm](shape.hidden, eps=shape.norm_eps)


class Block(nn.Module):
    """One pre-norm block (Arch.residual 'pre_norm', the only form so far)."""

    def __init__(self, shape: LMShape):
        super().__init__()
        self.norm1, self.norm2 = _norm(shape), _norm(shape)
        self.attn = Attention(shape)
        self.mlp = MLPS[shape.arch.mlp](shape.hidden, shape.intermediate, shape.arch.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class CausalLM(nn.Module):
    """Token ids [batch, seq] -> next-token logits [batch, seq, vocab] (in the compute dtype: the
    objectives cast to fp32). The LM head is untied: it is a GEMM a backend converts, the embedding a lookup.

    Learned positions (gpt's, GPT-2's) are a table: one lookup, nothing for a backend to convert, and at the
    small sizes a CPU preset trains, a model with positions learns faster than one without."""

    def __init__(self, shape: LMShape):
        super().__init__()
        self.shape = shape
        self.embed = nn.Embedding(shape.vocab, shape.hidden)
        learned = shape.arch.positions == "learned"
        self.pos = nn.Embedding(shape.seq_len, shape.hidden) if learned else None
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.norm = _norm(shape)
        self.head = nn.Linear(shape.hidden, shape.vocab, bias=False)
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2's init: N(0, 0.02) weights, zero biases, and the projections that write into the residual
        stream scaled by 1/sqrt(2 * layers) so its variance does not grow with depth. Deterministic
        given the caller's torch.manual_seed."""
        for name, p in self.named_parameters():
            if p.dim() == 1:  # biases 0; norm weights keep their 1
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                continue
            residual = name.endswith(("attn.proj.weight", "mlp.fc2.weight", "mlp.down.weight"))
            nn.init.normal_(p, std=0.02 / math.sqrt(2 * self.shape.layers) if residual else 0.02)

    def forward(self, tokens: torch.Tensor, return_hidden: bool = False, features: bool = False):
        """Logits [batch, seq, vocab] (and the per-block states with `return_hidden`), or with `features` the
        final normed hidden states and the head's weight in place of the logits (HeadFeatures, for the
        head-fused loss: the head's GEMM then runs inside the loss, chunked)."""
        x = self.embed(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        hidden = []
        for block in self.blocks:
            x = block(x)
            hidden.append(x)
        if features:
            return HeadFeatures((_head_input(self.norm(x), x.device), self.head.weight))
        logits = self.head(self.norm(x))
        return (logits, hidden) if return_hidden else logits

    def train_flops_per_token(self, seq_len: int | None = None) -> int:
        """nanochat's estimate of one training step's FLOPs per token (see `lm_train_flops_per_token`)."""
        s = self.shape
        return lm_train_flops_per_token(self, s.layers, s.heads * s.head_dim, seq_len or s.seq_len)

    def from_reference_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return state  # one layout: the reference names are the model's own

    def to_reference_state(self, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        return {k: v for k, v in (self.state_dict() if state is None else state).items()
                if not k.endswith("_extra_state")}


class HeadFeatures(tuple):
    """(hidden [..., hidden], head weight [vocab, hidden]): a student's output in place of its logits, for the
    head-fused loss. A tuple, so compile and graph capture pass it through like any output."""

    @property
    def hidden(self) -> torch.Tensor:
        return self[0]

    @property
    def weight(self) -> torch.Tensor:
        return self[1]

    def logits(self) -> torch.Tensor:
        """The logits the head would have produced (evaluation, reference tests): h @ W^T in h's dtype."""
        return self.hidden @ self.weight.to(self.hidden.dtype).t()


def _head_input(h: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The final hidden states as the head's GEMM would take them: in the autocast dtype where autocast is on
    (the norm itself runs in fp32 under autocast), so the head-fused loss's GEMM runs at the head's precision."""
    if torch.is_autocast_enabled(device.type):
        return h.to(torch.get_autocast_dtype(device.type))
    return h


def lm_train_flops_per_token(model: nn.Module, layers: int, attn_width: int, seq_len: int) -> int:
    """nanochat's `estimate_flops`: 6 x (weight-matrix parameters outside embeddings, LM head included)
    + 12 x layers x attn_width x seq_len, with attn_width = heads x head_dim.

    The first term: each weight matrix does 2 FLOPs per element per token forward and twice that backward
    (grads wrt input and weight). Embedding tables are lookups, no GEMM. The second: per layer and token,
    q@k^T and att@v are 2 x seq x attn_width FLOPs each forward, x3 for forward + backward; like nanochat
    it counts the full seq x seq square, not the causal half a fused kernel skips. Norms, activations and
    softmax are left out: TFLOP/s is useful GEMM work per second.

    Parameters are counted per owning module (not deduplicated by tensor), so an LM head whose weight is
    tied to the embedding still counts: its GEMM runs."""
    matmul = sum(p.numel() for m in model.modules() if not isinstance(m, nn.Embedding)
                 for p in m.parameters(recurse=False) if p.dim() == 2)
    return 6 * matmul + 12 * layers * attn_width * seq_len
