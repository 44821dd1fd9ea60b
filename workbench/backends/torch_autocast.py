"""PyTorch autocast students: bf16 (the tutorial's baseline) and fp16 with a grad scaler."""
from __future__ import annotations

import torch

from workbench.backends import Context, register
from workbench.backends._autocast import Autocast
from workbench.env.probe import native_bf16


@register
class TorchBF16(Autocast):
    name = "torch_bf16"
    mode = "PyTorch-BF16"
    dtype = torch.bfloat16

    def availability(self, ctx: Context) -> tuple[bool, str]:
        if not native_bf16(ctx.device):
            return False, (f"{torch.cuda.get_device_name(ctx.device)} has no bf16 (compute capability < 8.0); "
                           "use torch_fp16")
        return True, ""


@register
class TorchFP16(TorchBF16):
    name = "torch_fp16"
    mode = "PyTorch-FP16"
    dtype = torch.float16

    def availability(self, ctx: Context) -> tuple[bool, str]:
        if ctx.device.type != "cuda":
            return False, "fp16 autocast with a grad scaler is a GPU path; on CPU use torch_bf16 or torch_fp32"
        return True, ""
