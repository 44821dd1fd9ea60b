"""torch autocast as a student's whole precision recipe: the base of the torch autocast students (and of
torchao's float8, which runs its GEMMs inside bf16 autocast), and the fallback a TE student runs when TE
cannot. Private (a leading '_'): the registry does not load it as a backend."""
from __future__ import annotations

import torch

from workbench.backends import Backend, amp_dtype, autocast


class Autocast(Backend):
    """A student whose forward runs under torch autocast in `dtype`."""

    dtype = torch.bfloat16

    def forward_context(self):
        return autocast(self.device, self.dtype)


class Fallback(Autocast):
    """What a TE student runs when TE cannot: torch autocast in bf16, or fp16 + grad scaler on GPUs
    without bf16 (the tutorial's 'Fallback-PyTorch'). Not registered: reached only through TE backends."""

    name = "fallback"
    mode = "Fallback-PyTorch"

    def build(self, reference, cfg, device):
        self.dtype = amp_dtype(device)
        return super().build(reference, cfg, device)
