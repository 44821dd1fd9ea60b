"""Phi-3 / Phi-4-mini: Llama's maths with fused projections, split into Llama's names (`qkv_proj` rows are
[q; k; v], `gate_up_proj` rows [gate; up], which TE fuses again in its own order), a partial rotary
(`partial_rotary_factor`: TE's angles of the rotated width only; TE rotates the first width of each head and
passes the rest, as HF does), and one sliding window for all layers (config.sliding_window). Long-context
rope ('longrope', two frequency sets and an attention scale) is refused by the rope check."""
import torch

from workbench.backends.hf_families import register
from workbench.backends.hf_families.common import LayerShape
from workbench.backends.hf_families.llama import Llama


@register
class Phi3(Llama):
    model_types = ("phi3",)

    def to_llama_names(self, hf: dict[str, torch.Tensor], shape: LayerShape | None) -> dict[str, torch.Tensor]:
        out = {k: v for k, v in hf.items() if k not in ("self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight")}
        qkv = hf["self_attn.qkv_proj.weight"]
        if shape is None:  # only the names are asked (`shape` itself): the split sizes do not matter
            q, k, v = qkv.chunk(3)
        else:
            q_rows, kv_rows = shape.heads * shape.head_dim, shape.groups * shape.head_dim
            q, k, v = qkv.split([q_rows, kv_rows, kv_rows])
        gate, up = hf["mlp.gate_up_proj.weight"].chunk(2)
        out.update({"self_attn.q_proj.weight": q, "self_attn.k_proj.weight": k, "self_attn.v_proj.weight": v,
                    "mlp.gate_proj.weight": gate, "mlp.up_proj.weight": up})
        return out

    def from_llama_names(self, state: dict[str, torch.Tensor], shape: LayerShape) -> dict[str, torch.Tensor]:
        fused = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "mlp.gate_proj.weight", "mlp.up_proj.weight")
        out = {k: v for k, v in state.items() if k not in fused}
        out["self_attn.qkv_proj.weight"] = torch.cat([state[k] for k in fused[:3]])
        out["mlp.gate_up_proj.weight"] = torch.cat([state[k] for k in fused[3:]])
        return out

    def window(self, config, index: int) -> int | None:
        return getattr(config, "sliding_window", None)
