"""A named *fake* of transformer_engine.pytorch's layer classes for CPU tests (real TE cannot exist on a
CPU machine; the real conversion runs on the H200): TE's constructor signatures, parameter names and
semantics (attention masks: True = masked out), torch's maths."""
import torch
import torch.nn.functional as F

from workbench.models import LayerNormMLP


class FakeTEModules:
    class Linear(torch.nn.Linear):
        def __init__(self, in_features, out_features, bias=True, params_dtype=None, device="cuda"):
            super().__init__(in_features, out_features, bias=bias, dtype=params_dtype)

    class LayerNorm(torch.nn.LayerNorm):
        def __init__(self, hidden_size, eps=1e-5, params_dtype=None, device="cuda"):
            super().__init__(hidden_size, eps=eps, dtype=params_dtype)

    class RMSNorm(torch.nn.RMSNorm):
        def __init__(self, hidden_size, eps=1e-5, sequence_parallel=None, params_dtype=None,
                     zero_centered_gamma=False, device="cuda"):
            assert not zero_centered_gamma, "the fake computes x / rms(x) * weight only"
            super().__init__(hidden_size, eps=eps, dtype=params_dtype)

    class LayerNormMLP(LayerNormMLP):
        def __init__(self, hidden_size, ffn_hidden_size, eps=1e-5, params_dtype=None, device="cuda"):
            super().__init__(hidden_size, ffn_hidden_size, eps)

    class DotProductAttention(torch.nn.Module):
        """te.DotProductAttention: q, k, v [b, s, h, d] ('bshd') or [s, b, h, d] ('sbhd') -> [.., .., h*d];
        `attention_mask` is boolean with True = masked OUT ([b, 1, 1, s] for 'padding*', broadcastable to
        [b, h, s, s] for 'arbitrary'), the negation of SDPA's."""

        def __init__(self, num_attention_heads, kv_channels, num_gqa_groups=None, attention_dropout=0.0,
                     qkv_format="sbhd", attn_mask_type="causal", softmax_scale=None):
            super().__init__()
            assert attention_dropout == 0.0, "the fake has no dropout"
            self.qkv_format, self.attn_mask_type, self.scale = qkv_format, attn_mask_type, softmax_scale

        def forward(self, query_layer, key_layer, value_layer, attention_mask=None, qkv_format=None, attn_mask_type=None):
            fmt, kind = qkv_format or self.qkv_format, attn_mask_type or self.attn_mask_type
            q, k, v = (x.transpose(1, 2) if fmt == "bshd" else x.permute(1, 2, 0, 3) for x in (query_layer, key_layer, value_layer))
            keep = None if attention_mask is None else ~attention_mask  # TE: True = masked out; SDPA: True = attend
            if keep is not None and "causal" in kind:
                keep = keep & torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=keep is None and "causal" in kind,
                                                 scale=self.scale)
            out = out.transpose(1, 2) if fmt == "bshd" else out.permute(2, 0, 1, 3)
            return out.reshape(*out.shape[:2], -1)
