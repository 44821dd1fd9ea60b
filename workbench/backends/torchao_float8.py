"""torchao float8 training (a peer of TE FP8): nn.Linear layers swapped for Float8Linear, run under
torch.compile (torchao's float8 is designed to be compiled: eager it is much slower) and bf16 autocast.

Recipes: 'tensorwise' (one scale per tensor, CC >= 8.9) and 'rowwise' (per-row scales, CC >= 9.0).
"""
from __future__ import annotations

import torch
from torch import nn

from workbench.backends import Context, register
from workbench.backends._autocast import Autocast
from workbench.backends._gemm import misaligned

MIN_CC = {"tensorwise": (8, 9), "rowwise": (9, 0)}  # the first is the default recipe


@register
class TorchaoFloat8(Autocast):
    name = "torchao_float8"
    recipes = tuple(MIN_CC)
    mode = "torchao-Float8"
    compiled = "always"  # torchao's float8 is designed to run under torch.compile
    family = "torchao"
    dtype = torch.bfloat16  # its float8 GEMMs run inside bf16 autocast, as the bf16 students do
    gemm_precision = "fp8"

    def availability(self, ctx: Context) -> tuple[bool, str]:
        try:
            import torchao.float8  # noqa: F401
        except Exception as e:
            return False, f"torchao.float8 does not import: {type(e).__name__}: {e} (pip install torchao)"
        if ctx.device.type != "cuda":
            return False, "torchao float8 needs a CUDA GPU with FP8 tensor cores"
        cc = torch.cuda.get_device_capability(ctx.device)
        if cc < MIN_CC[self.recipe]:
            need = ".".join(map(str, MIN_CC[self.recipe]))
            return False, (f"torchao float8 {self.recipe} needs compute capability >= {need}; "
                           f"this GPU is {cc[0]}.{cc[1]}")
        if ctx.cfg.model.layout == "fused":
            return False, "torchao converts nn.Linear modules; the fused torch layout has none"
        bad = misaligned(ctx.cfg, 16)
        if bad:
            return False, f"float8 GEMMs need dims that are multiples of 16; not: {', '.join(bad)}"
        return True, ""

    def convert(self, model, cfg):
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        model = super().convert(model, cfg)  # the parameter dtype first, then torchao's swap keeps it
        return convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(self.recipe),
                                          module_filter_fn=float8_convertible)


def float8_convertible(linear: nn.Linear, fqn: str) -> bool:
    """torchao's float8 GEMMs need both dims multiples of 16. A layer that is not (an LM head over a
    vocabulary such as GPT-2's 50257) stays a bf16 nn.Linear instead of failing the whole student; the
    hidden and intermediate sizes are checked up front by `availability`."""
    return linear.in_features % 16 == 0 and linear.out_features % 16 == 0
