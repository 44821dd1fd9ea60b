"""PyTorch autocast students: bf16 (the tutorial's baseline) and fp16 with a grad scaler."""
from __future__ import annotations

import torch

from workbench.backends import Backend, Context, amp_dtype, autocast, register
from workbench.env.probe import native_bf16


@register
class TorchBF16(Backend):
    name = "torch_bf16"
    mode = "PyTorch-BF16"
    dtype = torch.bfloat16

    def availability(self, ctx: Context) -> tuple[bool, str]:
        if not native_bf16(ctx.device):
            return False, f"{torch.cuda.get_device_name(ctx.device)} has no bf16 (compute capability < 8.0); use torch_fp16"
        return True, ""

    def forward_context(self):
        return autocast(self.device, self.dtype)


@register
class TorchFP16(TorchBF16):
    name = "torch_fp16"
    mode = "PyTorch-FP16"
    dtype = torch.float16

    def availability(self, ctx: Context) -> tuple[bool, str]:
        if ctx.device.type != "cuda":
            return False, "fp16 autocast with a grad scaler is a GPU path; on CPU use torch_bf16 or torch_fp32"
        return True, ""


class Fallback(TorchBF16):
    """What a TE student runs when TE cannot: torch autocast in bf16, or fp16 + grad scaler on GPUs
    without bf16 (the tutorial's 'Fallback-PyTorch'). Not registered: reached only through TE backends."""

    name = "fallback"
    mode = "Fallback-PyTorch"

    def build(self, reference, cfg, device):
        self.dtype = amp_dtype(device)
        return super().build(reference, cfg, device)
