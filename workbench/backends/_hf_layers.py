"""A Hugging Face decoder's layers as Transformer Engine's own: each decoder layer of a Llama, Mistral or
Qwen2 model becomes one te.TransformerLayer (TE's te_llama recipe: RMSNorm, SwiGLU, GQA, RoPE, causal
attention in 'bshd'), its weights mapped in, so attention runs in TE's fused kernels and every projection's
norm, casts and bias live inside TE's fused modules. The TE backends call `convert_layers` (options.te_conversion);
a model it does not know (`refusal` says why) keeps the per-Linear conversion.

TE's parameters (TE 2.20, transformer.py / attention/multi_head_attention.py / module/layernorm_mlp.py), per
layer, with fuse_qkv_params=True:
  self_attention.layernorm_qkv.layer_norm_weight  <- input_layernorm.weight
  self_attention.layernorm_qkv.weight / .bias     <- q_proj, k_proj, v_proj, interleaved per KV group as TE
                                                     splits them (qkv_weight_interleaved): for each of the
                                                     ng groups its np/ng query heads, its key head, its value head
  self_attention.proj.weight / .bias              <- o_proj
  layernorm_mlp.layer_norm_weight                 <- post_attention_layernorm.weight
  layernorm_mlp.fc1_weight / fc1_bias             <- [gate_proj; up_proj] (TE's swiglu: silu(first half) * second)
  layernorm_mlp.fc2_weight / fc2_bias             <- down_proj
TE's layer has biases on all four GEMMs or none: a model with some (Qwen2: q, k, v) gets zero biases on the
others, frozen (requires_grad=False), so the maths and the trained parameters stay the model's own.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

FAMILIES = ("llama", "mistral", "qwen2")  # config.model_type of decoders with LlamaDecoderLayer's maths
# HF rope types TE's RotaryPositionEmbedding computes: its own (theta; linear = seq_len_interpolation_factor),
# llama3 through HF's scaled frequencies (a change of inv_freq only, no attention scaling)
ROPE_TYPES = ("default", "linear", "llama3")
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


@dataclass(frozen=True)
class LayerShape:
    heads: int
    groups: int  # KV heads (num_gqa_groups)
    head_dim: int
    hidden: int
    intermediate: int
    biases: tuple[str, ...]  # the HF projections that carry a bias (PROJECTIONS names)

    @property
    def te_bias(self) -> bool:
        return bool(self.biases)


def decoder_layers(hf_model: nn.Module) -> nn.ModuleList | None:
    """The decoder's layer list (LlamaForCausalLM.model.layers), or None."""
    layers = getattr(getattr(hf_model, "model", None), "layers", None)
    return layers if isinstance(layers, nn.ModuleList) else None


def rope_of(hf_model: nn.Module) -> tuple[str, nn.Module | None]:
    rotary = getattr(getattr(hf_model, "model", None), "rotary_emb", None)
    return getattr(rotary, "rope_type", "default"), rotary


def refusal(hf_model: nn.Module, seq_len: int | None) -> str:
    """Why this Hugging Face causal LM's layers cannot become te.TransformerLayers ('' when they can)."""
    c = hf_model.config
    kind = getattr(c, "model_type", None)
    if kind not in FAMILIES:
        return f"no decoder-layer conversion for model_type {kind!r} (known: {', '.join(FAMILIES)})"
    if getattr(c, "hidden_act", "silu") != "silu":
        return f"hidden_act={c.hidden_act!r}: TE's layer runs SwiGLU (silu) only"
    layers = decoder_layers(hf_model)
    if layers is None or not all(hasattr(layer, "input_layernorm") and hasattr(layer, "mlp") for layer in layers):
        return "its decoder layers are not Llama-style (input_layernorm, self_attn, mlp)"
    rope_type, rotary = rope_of(hf_model)
    if rotary is None or rope_type not in ROPE_TYPES:
        return f"rope type {rope_type!r}: TE's RotaryPositionEmbedding computes {', '.join(ROPE_TYPES)} only"
    if float(getattr(rotary, "attention_scaling", 1.0)) != 1.0:
        return f"rope type {rope_type!r} scales attention ({rotary.attention_scaling}), which TE's rope does not"
    window = getattr(c, "sliding_window", None)
    sliding = window is not None and (kind == "mistral"
                                      or "sliding_attention" in (getattr(c, "layer_types", None) or ()))
    if sliding and (seq_len is None or window < seq_len):
        return (f"sliding_window={window} is shorter than the sequence ({seq_len}): the converted layers run "
                "full causal attention")
    return ""


def layer_shape(hf_model: nn.Module) -> LayerShape:
    c = hf_model.config
    heads = c.num_attention_heads
    layer = decoder_layers(hf_model)[0]
    biases = tuple(p for p in PROJECTIONS if layer.get_submodule(p).bias is not None)
    return LayerShape(heads=heads, groups=getattr(c, "num_key_value_heads", None) or heads,
                      head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads, hidden=c.hidden_size,
                      intermediate=c.intermediate_size, biases=biases)


# ---- the weight mapping (pure functions on tensors: the CPU tests round-trip them) --------------------------
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
    """One HF decoder layer's state (its own names) -> the te.TransformerLayer's (zero where HF has no bias)."""
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
    """The inverse of `to_te_state`: the HF layer's names, without the biases HF does not have."""
    q, k, v = split_qkv(te["self_attention.layernorm_qkv.weight"], s)
    gate, up = te["layernorm_mlp.fc1_weight"].chunk(2)
    out = {"input_layernorm.weight": te["self_attention.layernorm_qkv.layer_norm_weight"],
           "self_attn.q_proj.weight": q, "self_attn.k_proj.weight": k, "self_attn.v_proj.weight": v,
           "self_attn.o_proj.weight": te["self_attention.proj.weight"],
           "post_attention_layernorm.weight": te["layernorm_mlp.layer_norm_weight"],
           "mlp.gate_proj.weight": gate, "mlp.up_proj.weight": up,
           "mlp.down_proj.weight": te["layernorm_mlp.fc2_weight"]}
    if s.te_bias:
        qb, kb, vb = split_qkv(te["self_attention.layernorm_qkv.bias"], s)
        gb, ub = te["layernorm_mlp.fc1_bias"].chunk(2)
        have = {"self_attn.q_proj": qb, "self_attn.k_proj": kb, "self_attn.v_proj": vb,
                "self_attn.o_proj": te["self_attention.proj.bias"], "mlp.gate_proj": gb, "mlp.up_proj": ub,
                "mlp.down_proj": te["layernorm_mlp.fc2_bias"]}
        out.update({f"{p}.bias": have[p] for p in s.biases})
    return out


FROZEN_ZERO_BIASES = {  # TE bias parameter -> the HF projections whose bias it holds
    "self_attention.layernorm_qkv.bias": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attention.proj.bias": ("self_attn.o_proj",), "layernorm_mlp.fc1_bias": ("mlp.gate_proj", "mlp.up_proj"),
    "layernorm_mlp.fc2_bias": ("mlp.down_proj",)}


# ---- the modules -------------------------------------------------------------------------------------------
class TERope(nn.Module):
    """TE's RotaryPositionEmbedding with the model's theta and scaling; the angles for a sequence length are
    made once per (length, device) and shared by every layer (one module, registered in each)."""

    def __init__(self, te, hf_model: nn.Module, head_dim: int, seq_len: int | None):
        super().__init__()
        rope_type, rotary = rope_of(hf_model)
        params = getattr(hf_model.config, "rope_parameters", None) or {}
        theta = float(params.get("rope_theta", getattr(hf_model.config, "rope_theta", 10000.0)))
        kw = {}
        if rope_type == "linear":  # TE scales positions by 1/factor while the sequence fits factor x pretrained
            longest = max(getattr(hf_model.config, "max_position_embeddings", 0) or 0, seq_len or 0)
            kw = {"seq_len_interpolation_factor": params["factor"], "pretrained_max_position_embeddings": longest}
        rope = te.RotaryPositionEmbedding(head_dim, rotary_base=theta, **kw)
        inv_freq = rope.inv_freq
        if rope_type == "llama3":  # TE has no llama3 scaling: its module with HF's scaled frequencies
            inv_freq = rotary.inv_freq.detach().to(inv_freq)
        del rope._buffers["inv_freq"]  # not a weight: out of the state dict, like HF's own inv_freq
        rope.register_buffer("inv_freq", inv_freq, persistent=False)
        self.rope, self.rope_type, self._cache = rope, rope_type, {}

    def forward(self, seq_len: int, device: torch.device) -> torch.Tensor:
        key = (seq_len, str(device))
        if key not in self._cache:
            self._cache[key] = self.rope(seq_len).to(device)
        return self._cache[key]

    def _apply(self, fn, recurse=True):  # .to(device/dtype): the cached angles are made again
        self._cache = {}
        return super()._apply(fn, recurse)


class TEDecoderLayer(nn.Module):
    """One te.TransformerLayer behind a Hugging Face decoder layer's call: hidden states in, hidden states
    out ([batch, seq, hidden]). HF's mask, positions and cache are not read: training batches are whole causal
    sequences from position 0 (TE's causal mask, the rope angles of positions 0..seq-1)."""

    def __init__(self, te, config, shape: LayerShape, rope: TERope, dtype: torch.dtype, device):
        super().__init__()
        self.shape = shape
        self.block = te.TransformerLayer(
            hidden_size=shape.hidden, ffn_hidden_size=shape.intermediate, num_attention_heads=shape.heads,
            num_gqa_groups=shape.groups, kv_channels=shape.head_dim, bias=shape.te_bias,
            layernorm_epsilon=config.rms_norm_eps, hidden_dropout=0.0, attention_dropout=0.0,
            fuse_qkv_params=True, normalization="RMSNorm", activation="swiglu", self_attn_mask_type="causal",
            attn_input_format="bshd", params_dtype=dtype, device=device)
        self.rope = rope

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        freqs = self.rope(hidden_states.shape[1], hidden_states.device)
        return self.block(hidden_states, rotary_pos_emb=freqs)

    def load_hf_state(self, hf: dict[str, torch.Tensor]) -> None:
        """Copy an HF layer's weights in (into TE's own tensors: FP8 weights quantize on the copy); the
        biases HF does not have are zero and frozen."""
        want = to_te_state(hf, self.shape)
        own = dict(self.block.named_parameters())
        with torch.no_grad():
            for name, value in want.items():
                own[name].copy_(value)
        for name, owners in FROZEN_ZERO_BIASES.items():
            if name in own and not any(p in self.shape.biases for p in owners):
                own[name].requires_grad_(False)

    def from_hf_state(self, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """An HF layer's weights (HF's names) under this layer's own names ('block.' + TE's): the inverse of
        `hf_state`, so a model holding this layer translates a reference state without knowing TE's layout."""
        return {f"block.{k}": v for k, v in to_te_state(hf, self.shape).items()}

    def hf_state(self, state: dict[str, torch.Tensor] | None = None, prefix: str = "") -> dict[str, torch.Tensor]:
        """This layer's weights under HF's names, from `state` (keys `prefix` + 'block.' + TE's) or its own."""
        if state is None:
            state, prefix = self.state_dict(), ""
        te_names = {k[len(prefix) + len("block."):]: v for k, v in state.items()
                    if k.startswith(prefix + "block.") and not k.endswith("_extra_state")}
        return to_hf_state(te_names, self.shape)


def convert_layers(te, lm: nn.Module, dtype: torch.dtype, device) -> list[str]:
    """Replace every decoder layer of `lm` (an HFCausalLM) by a TEDecoderLayer holding its weights; returns the
    replaced modules' names (as `replace_modules` names them). Call after `refusal` said ''."""
    hf = lm.model
    shape = layer_shape(hf)
    rope = TERope(te, hf, shape.head_dim, getattr(lm, "seq_len", None))
    layers = decoder_layers(hf)
    done = []
    for i, old in enumerate(layers):
        new = TEDecoderLayer(te, hf.config, shape, rope, dtype, device)
        new.load_hf_state({k: v for k, v in old.state_dict().items()})
        layers[i] = new
        done.append(f"model.model.layers.{i}")
    return done
