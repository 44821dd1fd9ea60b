"""Qwen3: Llama's layer with a per-head RMSNorm on queries and keys before RoPE (TE 2.20's
`qk_norm_type="RMSNorm", qk_norm_before_rope=True`, whose weights are self_attention.q_norm / k_norm),
head_dim 128 set apart from hidden / heads (so FP8 attention is eligible on Hopper), no QKV bias by default
(`attention_bias` adds all four, as in Llama)."""
from torch import nn

from workbench.backends.hf_families import register
from workbench.backends.hf_families.llama import Llama


@register
class Qwen3(Llama):
    model_types = ("qwen3",)

    def refusal(self, hf_model: nn.Module, seq_len: int | None) -> str:
        why = super().refusal(hf_model, seq_len)
        if not why and not self.shape(hf_model).qk_norm:
            return "its attention has no q_norm / k_norm, which every Qwen3 layer has"
        return why
