"""Gemma 3 (text) and Gemma 2: pre- *and* post-sublayer RMSNorms, each scaling by (1 + weight) (TE's
`zero_centered_gamma`), GeGLU with tanh-GELU (TE's 'geglu': TE's GELU is the tanh form), a per-head q/k RMSNorm
before RoPE (Gemma 3), sliding and global layers with their own window and RoPE theta (`layer_types`), and
attention scaled by query_pre_attn_scalar**-0.5. The embedding's sqrt(hidden) scale and the final norm stay
the model's own (they are not in the decoder layers).

TE's TransformerLayer has no post-sublayer norms, so a layer is built from TE's modules: MultiheadAttention
(its input RMSNorm fused with the QKV GEMM, the q/k norms, RoPE, fused attention, the output projection:
the same parameter names as in TransformerLayer, so the common mapping fills them), te.RMSNorm after it,
te.LayerNormMLP (the pre-feed-forward norm fused with fc1), te.RMSNorm after that, and the two residual adds."""
import torch
from torch import nn

from workbench.backends.hf_families import register
from workbench.backends.hf_families.common import LayerShape, TEDecoderLayer, TERope, rope_of
from workbench.backends.hf_families.llama import Llama

# HF's names of the two norms TE's layer lacks -> this layer's own; HF's pre-feed-forward norm is the MLP's
# input norm, which the common mapping knows as Llama's post_attention_layernorm
POST_NORMS = {"post_attention_layernorm.weight": "post_attention_norm.weight",
              "post_feedforward_layernorm.weight": "post_mlp_norm.weight"}


class GemmaBlock(nn.Module):
    def __init__(self, te, shape: LayerShape, eps: float, window: tuple[int, int] | None, dtype, device,
                 qkv_format: str = "bshd"):
        super().__init__()
        kw = {"params_dtype": dtype, "device": device}
        self.self_attention = te.MultiheadAttention(
            shape.hidden, shape.heads, kv_channels=shape.head_dim, num_gqa_groups=shape.groups,
            attention_dropout=0.0, layernorm_epsilon=eps, attn_mask_type="causal", window_size=window,
            input_layernorm=True, fuse_qkv_params=True, zero_centered_gamma=True, bias=False,
            normalization="RMSNorm", qkv_format=qkv_format, **kw,
            **({"qk_norm_type": "RMSNorm", "qk_norm_eps": eps, "qk_norm_before_rope": True} if shape.qk_norm else {}))
        if shape.qk_norm:  # TE makes its q/k norms without zero_centered_gamma; Gemma's scale by (1 + weight)
            for name in ("q_norm", "k_norm"):
                setattr(self.self_attention, name, te.RMSNorm(shape.head_dim, eps=eps, zero_centered_gamma=True, **kw))
        self.post_attention_norm = te.RMSNorm(shape.hidden, eps=eps, zero_centered_gamma=True, **kw)
        self.layernorm_mlp = te.LayerNormMLP(shape.hidden, shape.intermediate, eps=eps, bias=False,
                                             normalization="RMSNorm", activation="geglu", zero_centered_gamma=True,
                                             **kw)
        self.post_mlp_norm = te.RMSNorm(shape.hidden, eps=eps, zero_centered_gamma=True, **kw)

    def forward(self, x: torch.Tensor, rotary_pos_emb: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.post_attention_norm(self.self_attention(x, rotary_pos_emb=rotary_pos_emb))
        return x + self.post_mlp_norm(self.layernorm_mlp(x))


class GemmaLayer(TEDecoderLayer):
    """A TEDecoderLayer whose block is GemmaBlock; the two post-norms are mapped beside the common names."""

    def __init__(self, te, shape: LayerShape, rope: TERope | None, adapter, eps: float, dtype, device,
                 window: tuple[int, int] | None = None, qkv_format: str = "bshd"):
        nn.Module.__init__(self)
        self.shape, self.adapter, self.rope, self.qkv_format = shape, adapter, rope, qkv_format
        self.block = GemmaBlock(te, shape, eps, window, dtype, device, qkv_format)

    def te_names(self, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        own = {POST_NORMS[k]: v for k, v in hf.items() if k in POST_NORMS}
        rest = {k: v for k, v in hf.items() if k not in POST_NORMS}
        rest["post_attention_layernorm.weight"] = rest.pop("pre_feedforward_layernorm.weight")
        return {**super().te_names(rest), **own}

    def hf_names(self, te: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        back = {v: k for k, v in POST_NORMS.items()}
        out = super().hf_names({k: v for k, v in te.items() if k not in back})
        out["pre_feedforward_layernorm.weight"] = out.pop("post_attention_layernorm.weight")
        return {**out, **{back[k]: v for k, v in te.items() if k in back}}


@register
class Gemma3(Llama):
    model_types = ("gemma3_text", "gemma2")
    hidden_act = "gelu_pytorch_tanh"
    activation = "geglu"
    rope_types = ("default", "linear")  # from HF's own frequencies per layer type: a change of inv_freq only

    def refusal(self, hf_model: nn.Module, seq_len: int | None) -> str:
        c = hf_model.config
        act = getattr(c, "hidden_activation", None) or getattr(c, "hidden_act", None)
        if act != self.hidden_act:
            return f"hidden_activation={act!r}: TE's GeGLU is tanh-GELU ({self.hidden_act}) only"
        if getattr(c, "attn_logit_softcapping", None):
            return f"attn_logit_softcapping={c.attn_logit_softcapping}: TE's fused attention has no soft-capping"
        if getattr(c, "use_bidirectional_attention", False):
            return "use_bidirectional_attention: the converted layers run causal attention"
        shape = self.shape(hf_model)
        if c.query_pre_attn_scalar != shape.head_dim:
            return (f"query_pre_attn_scalar={c.query_pre_attn_scalar} differs from head_dim={shape.head_dim}: TE's "
                    "MultiheadAttention scales attention by 1/sqrt(head_dim) and takes no other scale")
        _, rotary = rope_of(hf_model)
        kinds = getattr(rotary, "rope_type", None)
        kinds = kinds if isinstance(kinds, dict) else {"default": kinds or "default"}
        for layer_type, kind in kinds.items():
            scale = getattr(rotary, f"{layer_type}_attention_scaling", getattr(rotary, "attention_scaling", 1.0))
            if kind not in self.rope_types or float(scale) != 1.0:
                return f"rope type {kind!r} ({layer_type}, attention scale {scale}): TE's rope takes frequencies only"
        return ""

    def rope_key(self, config, index: int) -> str | None:
        types = getattr(config, "layer_types", None)
        return types[index] if types else "default"

    def ropes(self, te, hf_model: nn.Module, shape: LayerShape, seq_len: int | None) -> dict[str, TERope]:
        """One rope per layer type, with HF's frequencies for that type (its theta, its linear scaling)."""
        _, rotary = rope_of(hf_model)
        kinds = rotary.rope_type if isinstance(rotary.rope_type, dict) else None
        if kinds is None:  # one rope for every layer type (Gemma 2): one module, its angles made once
            rope = TERope(te, shape.head_dim, 1.0, rotary.inv_freq)
            return dict.fromkeys(getattr(hf_model.config, "layer_types", None) or ["default"], rope)
        return {t: TERope(te, shape.head_dim, 1.0, getattr(rotary, f"{t}_inv_freq")) for t in kinds}

    def make_layer(self, te, hf_model: nn.Module, shape: LayerShape, rope: TERope | None, index: int,
                   dtype: torch.dtype, device, seq_len: int | None, qkv_format: str = "bshd") -> nn.Module:
        c = hf_model.config
        window = self.te_kwargs(c, shape, index, seq_len).get("window_size")
        return GemmaLayer(te, shape, rope, self, c.rms_norm_eps, dtype, device, window=window, qkv_format=qkv_format)
