"""What every family adapter shares: the Llama-named layer state and TE's fused layout (pure functions on
tensors, which the CPU tests round-trip), TE's rotary embedding with a model's own frequencies, and the layer
that puts one te.TransformerLayer behind a Hugging Face decoder layer's call.

TE's parameters (TE 2.20, transformer.py / attention/multi_head_attention.py / module/layernorm_mlp.py), per
layer, with fuse_qkv_params=True, from a layer under Llama's names (a family with other names, e.g. Phi-3's
fused qkv_proj, renames to these first):
  self_attention.layernorm_qkv.layer_norm_weight  <- input_layernorm.weight
  self_attention.layernorm_qkv.weight / .bias     <- q_proj, k_proj, v_proj, interleaved per KV group as TE
                                                     splits them (qkv_weight_interleaved): for each of the
                                                     ng groups its np/ng query heads, its key head, its value head
  self_attention.q_norm.weight / k_norm.weight    <- self_attn.q_norm / k_norm (per-head RMSNorm, Qwen3, Gemma 3:
                                                     MultiheadAttention._create_qk_norm_modules makes both)
  self_attention.proj.weight / .bias              <- o_proj
  layernorm_mlp.layer_norm_weight                 <- post_attention_layernorm.weight
  layernorm_mlp.fc1_weight / fc1_bias             <- [gate_proj; up_proj] (TE's swiglu / geglu: act(first half) *
                                                     second)
  layernorm_mlp.fc2_weight / fc2_bias             <- down_proj
TE's layer has biases on all four GEMMs or none: a model with some (Qwen2: q, k, v) gets zero biases on the
others, frozen (requires_grad=False), so the maths and the trained parameters stay the model's own.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
QK_NORMS = {"self_attn.q_norm.weight": "self_attention.q_norm.weight",
            "self_attn.k_norm.weight": "self_attention.k_norm.weight"}
FROZEN_ZERO_BIASES = {  # TE bias parameter -> the HF projections whose bias it holds
    "self_attention.layernorm_qkv.bias": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attention.proj.bias": ("self_attn.o_proj",), "layernorm_mlp.fc1_bias": ("mlp.gate_proj", "mlp.up_proj"),
    "layernorm_mlp.fc2_bias": ("mlp.down_proj",)}


@dataclass(frozen=True)
class LayerShape:
    heads: int
    groups: int  # KV heads (num_gqa_groups)
    head_dim: int
    hidden: int
    intermediate: int
    biases: tuple[str, ...] = ()  # the HF projections that carry a bias (PROJECTIONS names)
    qk_norm: bool = False  # per-head RMSNorm on queries and keys (before RoPE)

    @property
    def te_bias(self) -> bool:
        return bool(self.biases)


def decoder_layers(hf_model: nn.Module) -> nn.ModuleList | None:
    """The decoder's layer list (LlamaForCausalLM.model.layers), or None."""
    layers = getattr(getattr(hf_model, "model", None), "layers", None)
    return layers if isinstance(layers, nn.ModuleList) else None


def rope_of(hf_model: nn.Module) -> tuple[str, nn.Module | None]:
    """(rope type, the model's rotary module); a model with one rope per layer type (Gemma 3) has a dict of
    types: the one they share, or 'mixed'."""
    rotary = getattr(getattr(hf_model, "model", None), "rotary_emb", None)
    kind = getattr(rotary, "rope_type", "default")
    if isinstance(kind, dict):
        kinds = set(kind.values())
        kind = kinds.pop() if len(kinds) == 1 else "mixed"
    return kind, rotary


# ---- the weight mapping (pure functions on tensors) ---------------------------------------------------------
def interleave_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: LayerShape) -> torch.Tensor:
    """[q; k; v] rows (weights [out, in] or biases [out]) in TE's fused QKV order: per KV group, its
    np/ng query heads, then its key head, then its value head."""
    rest = q.shape[1:]
    per = s.heads // s.groups
    parts = (q.reshape(s.groups, per, s.head_dim, *rest), k.reshape(s.groups, 1, s.head_dim, *rest),
             v.reshape(s.groups, 1, s.head_dim, *rest))
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def split_qkv(qkv: torch.Tensor, s: LayerShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rest = qkv.shape[1:]
    per = s.heads // s.groups
    x = qkv.reshape(s.groups, per + 2, s.head_dim, *rest)
    return (x[:, :per].reshape(-1, *rest), x[:, per].reshape(-1, *rest), x[:, per + 1].reshape(-1, *rest))


def to_te_state(hf: dict[str, torch.Tensor], s: LayerShape) -> dict[str, torch.Tensor]:
    """One decoder layer's state under Llama's names -> te.TransformerLayer's (zero where HF has no bias)."""
    def bias(name: str, rows: int, like: torch.Tensor) -> torch.Tensor:
        return hf[f"{name}.bias"] if name in s.biases else like.new_zeros(rows)

    w = {p: hf[f"{p}.weight"] for p in PROJECTIONS}
    out = {"self_attention.layernorm_qkv.layer_norm_weight": hf["input_layernorm.weight"],
           "self_attention.layernorm_qkv.weight": interleave_qkv(w["self_attn.q_proj"], w["self_attn.k_proj"],
                                                                 w["self_attn.v_proj"], s),
           "self_attention.proj.weight": w["self_attn.o_proj"],
           "layernorm_mlp.layer_norm_weight": hf["post_attention_layernorm.weight"],
           "layernorm_mlp.fc1_weight": torch.cat([w["mlp.gate_proj"], w["mlp.up_proj"]]),
           "layernorm_mlp.fc2_weight": w["mlp.down_proj"]}
    out.update({te: hf[name] for name, te in QK_NORMS.items() if name in hf})
    if s.te_bias:
        q, kv, ref = s.heads * s.head_dim, s.groups * s.head_dim, w["self_attn.q_proj"]
        out["self_attention.layernorm_qkv.bias"] = interleave_qkv(
            bias("self_attn.q_proj", q, ref), bias("self_attn.k_proj", kv, ref), bias("self_attn.v_proj", kv, ref), s)
        out["self_attention.proj.bias"] = bias("self_attn.o_proj", s.hidden, ref)
        out["layernorm_mlp.fc1_bias"] = torch.cat([bias("mlp.gate_proj", s.intermediate, ref),
                                                   bias("mlp.up_proj", s.intermediate, ref)])
        out["layernorm_mlp.fc2_bias"] = bias("mlp.down_proj", s.hidden, ref)
    return out


def to_hf_state(te: dict[str, torch.Tensor], s: LayerShape) -> dict[str, torch.Tensor]:
    """The inverse of `to_te_state`: Llama's names, without the biases HF does not have."""
    q, k, v = split_qkv(te["self_attention.layernorm_qkv.weight"], s)
    gate, up = te["layernorm_mlp.fc1_weight"].chunk(2)
    out = {"input_layernorm.weight": te["self_attention.layernorm_qkv.layer_norm_weight"],
           "self_attn.q_proj.weight": q, "self_attn.k_proj.weight": k, "self_attn.v_proj.weight": v,
           "self_attn.o_proj.weight": te["self_attention.proj.weight"],
           "post_attention_layernorm.weight": te["layernorm_mlp.layer_norm_weight"],
           "mlp.gate_proj.weight": gate, "mlp.up_proj.weight": up,
           "mlp.down_proj.weight": te["layernorm_mlp.fc2_weight"]}
    out.update({name: te[t] for name, t in QK_NORMS.items() if t in te})
    if s.te_bias:
        qb, kb, vb = split_qkv(te["self_attention.layernorm_qkv.bias"], s)
        gb, ub = te["layernorm_mlp.fc1_bias"].chunk(2)
        have = {"self_attn.q_proj": qb, "self_attn.k_proj": kb, "self_attn.v_proj": vb,
                "self_attn.o_proj": te["self_attention.proj.bias"], "mlp.gate_proj": gb, "mlp.up_proj": ub,
                "mlp.down_proj": te["layernorm_mlp.fc2_bias"]}
        out.update({f"{p}.bias": have[p] for p in s.biases})
    return out


# ---- the modules -------------------------------------------------------------------------------------------
class TERope(nn.Module):
    """TE's RotaryPositionEmbedding with a model's theta, scaling and rotary width (`dim`: head_dim, or its
    rotated part for a partial rotary); `inv_freq` replaces TE's frequencies where TE cannot compute the model's
    (llama3 scaling, one rope per layer type). The angles for a sequence length are made once per (length,
    device) and shared by every layer that uses this rope (one module, registered in each)."""

    def __init__(self, te, dim: int, theta: float, inv_freq: torch.Tensor | None = None, **te_kw):
        super().__init__()
        rope = te.RotaryPositionEmbedding(dim, rotary_base=theta, **te_kw)
        own = rope.inv_freq if inv_freq is None else inv_freq.detach().to(rope.inv_freq)
        del rope._buffers["inv_freq"]  # not a weight: out of the state dict, like HF's own inv_freq
        rope.register_buffer("inv_freq", own, persistent=False)
        self.rope, self._cache = rope, {}

    def forward(self, seq_len: int, device: torch.device) -> torch.Tensor:
        key = (seq_len, str(device))
        if key not in self._cache:
            self._cache[key] = self.rope(seq_len).to(device)
        return self._cache[key]

    def _apply(self, fn, recurse=True):  # .to(device/dtype): the cached angles are made again
        self._cache.clear()
        return super()._apply(fn, recurse)


class TEDecoderLayer(nn.Module):
    """One te.TransformerLayer behind a Hugging Face decoder layer's call: hidden states in, hidden states
    out ([batch, seq, hidden]). HF's mask, positions and cache are not read: training batches are whole causal
    sequences from position 0 (TE's causal mask, or its sliding window, and the rope angles of positions
    0..seq-1; `rope` None: a layer without positions, as SmolLM3's NoPE layers). `adapter` knows the family's
    names (its `to_llama_names` / `from_llama_names`); `te_kw` are the family's TransformerLayer arguments.

    `qkv_format` (options.te_qkv_format): the layout the block computes in. 'sbhd' layers pass sequence-first
    tensors to each other: the stack's first layer turns the model's [batch, seq, hidden] round once
    (`enters_sbhd`) and its last turns it back (`leaves_sbhd`), so the model's norm and head see what they
    always do (`convert_layers` sets both)."""

    qkv_format = "bshd"  # class defaults: a family's layer built without TEDecoderLayer.__init__ (Gemma) has them
    enters_sbhd = leaves_sbhd = False

    def __init__(self, te, shape: LayerShape, rope: TERope | None, adapter, eps: float, dtype: torch.dtype,
                 device, qkv_format: str = "bshd", **te_kw):
        super().__init__()
        self.shape, self.adapter, self.qkv_format = shape, adapter, qkv_format
        self.block = te.TransformerLayer(
            hidden_size=shape.hidden, ffn_hidden_size=shape.intermediate, num_attention_heads=shape.heads,
            num_gqa_groups=shape.groups, kv_channels=shape.head_dim, bias=shape.te_bias, layernorm_epsilon=eps,
            hidden_dropout=0.0, attention_dropout=0.0, fuse_qkv_params=True, normalization="RMSNorm",
            self_attn_mask_type="causal", attn_input_format=qkv_format, params_dtype=dtype, device=device,
            **{"activation": "swiglu", **te_kw})
        self.rope = rope

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        x = hidden_states.transpose(0, 1).contiguous() if self.enters_sbhd else hidden_states
        seq = x.shape[0 if self.qkv_format == "sbhd" else 1]
        freqs = None if self.rope is None else self.rope(seq, x.device)
        out = self.block(x, rotary_pos_emb=freqs)
        return out.transpose(0, 1).contiguous() if self.leaves_sbhd else out

    def te_names(self, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """An HF layer's state (its family's names) under this layer's TE names (no 'block.' prefix)."""
        return to_te_state(self.adapter.to_llama_names(hf, self.shape), self.shape)

    def hf_names(self, te: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.adapter.from_llama_names(to_hf_state(te, self.shape), self.shape)

    def load_hf_state(self, hf: dict[str, torch.Tensor]) -> None:
        """Copy an HF layer's weights in (into TE's own tensors: FP8 weights quantize on the copy); the
        biases HF does not have are zero and frozen."""
        want = self.te_names(hf)
        own = dict(self.block.named_parameters())
        missing = set(own) - set(want) - set(FROZEN_ZERO_BIASES)
        if missing:
            raise RuntimeError(f"the TE layer has parameters the HF layer does not fill: {sorted(missing)}")
        with torch.no_grad():
            for name, value in want.items():
                own[name].copy_(value)
        for name, owners in FROZEN_ZERO_BIASES.items():
            if name in own and not any(p in self.shape.biases for p in owners):
                own[name].requires_grad_(False)

    def from_hf_state(self, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """An HF layer's weights (HF's names) under this layer's own names ('block.' + TE's): the inverse of
        `hf_state`, so a model holding this layer translates a reference state without knowing TE's layout."""
        return {f"block.{k}": v for k, v in self.te_names(hf).items()}

    def hf_state(self, state: dict[str, torch.Tensor] | None = None, prefix: str = "") -> dict[str, torch.Tensor]:
        """This layer's weights under HF's names, from `state` (keys `prefix` + 'block.' + TE's) or its own."""
        if state is None:
            state, prefix = self.state_dict(), ""
        te_names = {k[len(prefix) + len("block."):]: v for k, v in state.items()
                    if k.startswith(prefix + "block.") and not k.endswith("_extra_state")}
        return self.hf_names(te_names)
