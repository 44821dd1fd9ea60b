"""Transformer Engine student in bf16 (fp16 on GPUs without bf16): te.Linear / te.LayerNorm under
torch autocast. Without a usable TE the student runs the PyTorch autocast fallback, and says why."""
from __future__ import annotations

import torch

from workbench.backends import Backend, Context, _te, amp_dtype, autocast, load_matched, register


def te_usable(ctx: Context) -> tuple[bool, str]:
    te, _, why = _te.load()
    if te is None:
        return False, why
    if ctx.device.type != "cuda":
        return False, "Transformer Engine runs on CUDA GPUs only; this run's device is cpu"
    return True, ""


@register
class TEBF16(Backend):
    name = "te_bf16"
    mode = "TE-BF16/FP16"

    def availability(self, ctx: Context) -> tuple[bool, str]:
        ok, why = te_usable(ctx)
        if not ok:
            return ok, why
        te, _, _ = _te.load()
        ok, why = _te.check(getattr(te, "is_bf16_available", None), "bf16")
        return True, ("" if ok else f"no bf16 ({why}); running TE in fp16")

    def build(self, cfg, init_state, device):
        self.device = device
        self.dtype = amp_dtype(device)
        return build_te_student(cfg, init_state, device)

    def forward_context(self):
        return autocast(self.device, self.dtype)

    def fallback(self, ctx: Context, reason: str):
        if te_usable(ctx)[0]:
            return None  # TE works; whatever is missing (a recipe, a capability) is a skip, not a fallback
        from workbench.backends.torch_autocast import Fallback

        return Fallback()


def build_te_student(cfg, init_state, device):
    """The student module tree from TE layers, loaded with the shared initial weights."""
    te, _, _ = _te.load()
    from workbench.models import Student

    dtype = torch.bfloat16 if cfg.model.param_dtype == "bf16" else torch.float32
    model = Student(cfg.model, linear=te.Linear, norm=te.LayerNorm, params_dtype=dtype)
    return load_matched(model.to(device), {k: v.to(device) for k, v in init_state.items()})
