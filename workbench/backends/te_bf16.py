"""Transformer Engine student in bf16 (fp16 on GPUs without bf16): te.Linear / te.LayerNorm under
torch autocast. Without a usable TE the student runs the PyTorch autocast fallback, and says why."""
from __future__ import annotations

import torch

from torch import nn

from workbench.backends import Backend, Context, amp_dtype, autocast, register, replace_modules, to_param_dtype
from workbench.env import te as _te
from workbench.models import LayerNormMLP


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
    compilable = False  # dynamo skips TE modules (graph breaks); TE's speed-up route is CUDA graphs
    graph_kind = "fwd_bwd"  # te.make_graphed_callables graphs fwd+bwd (FP8 scaling state included)
    fp8_recipe = None
    dtype = torch.bfloat16  # until build() picks fp16 on GPUs without bf16

    def availability(self, ctx: Context) -> tuple[bool, str]:
        ok, why = te_usable(ctx)
        if not ok:
            return ok, why
        te, _, _ = _te.load()
        ok, why = _te.check(getattr(te, "is_bf16_available", None), "bf16")
        return True, ("" if ok else f"no bf16 ({why}); running TE in fp16")

    def build(self, reference, cfg, device):
        self.dtype = amp_dtype(device)  # fp16 (+ grad scaler) on GPUs without bf16 (T4)
        return super().build(reference, cfg, device)

    def convert(self, model, cfg):
        self.converted = convert_to_te(model, cfg, self.device)
        return model

    def forward_context(self):
        return autocast(self.device, self.dtype)

    def can_graph(self, cfg, device):
        if cfg.distill.loss == "hidden":
            return False, "the hidden-state loss returns per-block tensors; TE graphs are captured for the output only"
        return super().can_graph(cfg, device)

    def make_graphed(self, model, sample_tokens):
        """te.make_graphed_callables over the whole student, captured under this backend's autocast."""
        import inspect

        te, _, _ = _te.load()
        params = inspect.signature(te.make_graphed_callables).parameters
        kw = {"num_warmup_iters": 3}
        if self.fp8_recipe is not None:  # TE >= 2.9 names them enabled/recipe, older fp8_enabled/fp8_recipe
            kw.update({"enabled": True, "recipe": self.fp8_recipe} if "recipe" in params
                      else {"fp8_enabled": True, "fp8_recipe": self.fp8_recipe})
        # TE keeps the sample arguments as the graph's static inputs and copies every later batch into
        # them: handing it the shared batch itself would overwrite the data every other student uses.
        sample = (sample_tokens.clone(),)
        with autocast(self.device, self.dtype):
            return te.make_graphed_callables(model, sample, **kw)

    def fallback(self, ctx: Context, reason: str):
        if te_usable(ctx)[0]:
            return None  # TE works; whatever is missing (a recipe, a capability) is a skip, not a fallback
        from workbench.backends.torch_autocast import Fallback

        return Fallback()


def convert_to_te(model: nn.Module, cfg, device) -> list[str]:
    """Swap nn.Linear, nn.LayerNorm and the fused LayerNormMLP for te.Linear, te.LayerNorm and
    te.LayerNormMLP (the same maths; TE's LayerNormMLP GELU is the tanh form, like ours), copying the
    weights; the embedding stays torch's, in the students' parameter dtype. Returns what was swapped."""
    te, _, _ = _te.load()
    dtype = torch.bfloat16 if cfg.model.param_dtype == "bf16" else torch.float32
    to_param_dtype(model, cfg)  # before the swap: TE modules keep FP8 state that a later .to(dtype) must not touch

    def swap(m: nn.Module):
        if isinstance(m, LayerNormMLP):
            new = te.LayerNormMLP(m.fc1_weight.shape[1], m.fc1_weight.shape[0], eps=m.eps, params_dtype=dtype, device=device)
        elif isinstance(m, nn.Linear):
            new = te.Linear(m.in_features, m.out_features, bias=m.bias is not None, params_dtype=dtype, device=device)
        elif isinstance(m, nn.LayerNorm):
            new = te.LayerNorm(m.normalized_shape[0], eps=m.eps, params_dtype=dtype, device=device)
        else:
            return None
        missing, unexpected = new.load_state_dict(m.state_dict(), strict=False)
        if unexpected or [k for k in missing if not k.endswith("_extra_state")]:
            raise RuntimeError(f"TE {type(new).__name__} does not take {type(m).__name__}'s weights: {missing} {unexpected}")
        return new

    return replace_modules(model, swap)
