"""Llama (and the base every family adapter extends): pre-norm RMSNorm, SwiGLU, GQA, RoPE, causal attention
(TE's te_llama recipe), so each decoder layer is one te.TransformerLayer. A family that differs overrides the
method that says how: its names (`to_llama_names`), its activation or extra TE arguments (`te_kwargs`), which
layers have positions (`rope_key`), its sliding window (`window`), or its whole layer (`make_layer`)."""
from __future__ import annotations

import torch
from torch import nn

from workbench.backends.hf_families import register
from workbench.backends.hf_families.common import (
    PROJECTIONS,
    LayerShape,
    TEDecoderLayer,
    TERope,
    decoder_layers,
    rope_of,
)


@register
class Llama:
    model_types: tuple[str, ...] = ("llama",)
    hidden_act = "silu"  # the config's hidden_act TE's activation below computes
    activation = "swiglu"  # TE's name for it: act(fc1's first half) * second half
    # HF rope types TE's RotaryPositionEmbedding computes: its own (theta; linear = seq_len_interpolation_factor),
    # llama3 through HF's scaled frequencies (a change of inv_freq only, no attention scaling)
    rope_types = ("default", "linear", "llama3")

    # ---- can it be converted ------------------------------------------------------------------------------
    def refusal(self, hf_model: nn.Module, seq_len: int | None) -> str:
        """Why this model's layers cannot become TE layers ('' when they can)."""
        c = hf_model.config
        act = getattr(c, "hidden_act", None) or getattr(c, "hidden_activation", None) or self.hidden_act
        if act != self.hidden_act:
            return f"hidden_act={act!r}: TE's layer for {c.model_type} runs {self.activation} ({self.hidden_act}) only"
        layers = decoder_layers(hf_model)
        if layers is None or not all(hasattr(layer, "input_layernorm") and hasattr(layer, "mlp") for layer in layers):
            return "its decoder layers are not Llama-style (input_layernorm, self_attn, mlp)"
        rope_type, rotary = rope_of(hf_model)
        if rotary is None or rope_type not in self.rope_types:
            return f"rope type {rope_type!r}: TE's RotaryPositionEmbedding computes {', '.join(self.rope_types)} only"
        scaling = getattr(rotary, "attention_scaling", 1.0)
        if isinstance(scaling, (int, float)) and float(scaling) != 1.0:
            return f"rope type {rope_type!r} scales attention ({scaling}), which TE's rope does not"
        if getattr(c, "attn_logit_softcapping", None):
            return f"attn_logit_softcapping={c.attn_logit_softcapping}: TE's fused attention has no soft-capping"
        return ""

    def shape(self, hf_model: nn.Module) -> LayerShape:
        c = hf_model.config
        heads = c.num_attention_heads
        layer = self.to_llama_names(decoder_layers(hf_model)[0].state_dict(), None)
        biases = tuple(p for p in PROJECTIONS if f"{p}.bias" in layer)
        return LayerShape(heads=heads, groups=getattr(c, "num_key_value_heads", None) or heads,
                          head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads, hidden=c.hidden_size,
                          intermediate=c.intermediate_size, biases=biases,
                          qk_norm="self_attn.q_norm.weight" in layer)

    # ---- the family's names (Llama's are the common ones) --------------------------------------------------
    def to_llama_names(self, hf: dict[str, torch.Tensor], shape: LayerShape | None) -> dict[str, torch.Tensor]:
        return hf

    def from_llama_names(self, state: dict[str, torch.Tensor], shape: LayerShape) -> dict[str, torch.Tensor]:
        return state

    # ---- per layer ----------------------------------------------------------------------------------------
    def window(self, config, index: int) -> int | None:
        """The layer's sliding window (HF: a key j is seen from query i when i - j < window), or None."""
        types = getattr(config, "layer_types", None) or ()
        if index < len(types) and types[index] == "sliding_attention":
            return getattr(config, "sliding_window", None)
        return None

    def rope_key(self, config, index: int) -> str | None:
        """Which of `ropes` the layer uses; None: no positions in this layer."""
        return "default"

    def te_kwargs(self, config, shape: LayerShape, index: int, seq_len: int | None) -> dict:
        """TransformerLayer arguments beyond the common ones: the activation, the q/k norms, the window."""
        kw = {"activation": self.activation}
        if shape.qk_norm:  # Qwen3 / Gemma 3: RMSNorm per head on q and k, before RoPE (TE 2.20's qk_norm_*)
            kw.update(qk_norm_type="RMSNorm", qk_norm_eps=config.rms_norm_eps, qk_norm_before_rope=True)
        window = self.window(config, index)
        if window is not None and (seq_len is None or window < seq_len):
            kw["window_size"] = (window - 1, 0)  # TE: keys [i - left, i + right]; HF's window counts key i itself
        return kw

    def ropes(self, te, hf_model: nn.Module, shape: LayerShape, seq_len: int | None) -> dict[str, TERope]:
        """The rotary embeddings the layers share, by `rope_key`."""
        rope_type, rotary = rope_of(hf_model)
        c = hf_model.config
        params = getattr(c, "rope_parameters", None) or {}
        theta = float(params.get("rope_theta", getattr(c, "rope_theta", 10000.0)))
        dim = int(shape.head_dim * float(params.get("partial_rotary_factor", 1.0)))
        kw = {}
        if rope_type == "linear":  # TE scales positions by 1/factor while the sequence fits factor x pretrained
            longest = max(getattr(c, "max_position_embeddings", 0) or 0, seq_len or 0)
            kw = {"seq_len_interpolation_factor": params["factor"], "pretrained_max_position_embeddings": longest}
        # TE has no llama3 scaling: its module with HF's scaled frequencies
        inv_freq = rotary.inv_freq if rope_type == "llama3" else None
        return {"default": TERope(te, dim, theta, inv_freq, **kw)}

    def make_layer(self, te, hf_model: nn.Module, shape: LayerShape, rope: TERope | None, index: int,
                   dtype: torch.dtype, device, seq_len: int | None, qkv_format: str = "bshd") -> nn.Module:
        c = hf_model.config
        return TEDecoderLayer(te, shape, rope, self, c.rms_norm_eps, dtype, device, qkv_format=qkv_format,
                              **self.te_kwargs(c, shape, index, seq_len))
