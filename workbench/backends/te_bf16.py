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
    compilable = False  # dynamo skips TE modules (graph breaks); TE's speed-up route is CUDA graphs
    graph_whole_step = False  # te.make_graphed_callables graphs fwd+bwd (FP8 scaling state included)
    fp8_recipe = None
    dtype = torch.bfloat16  # until build() picks fp16 on GPUs without bf16

    def availability(self, ctx: Context) -> tuple[bool, str]:
        ok, why = te_usable(ctx)
        if not ok:
            return ok, why
        te, _, _ = _te.load()
        ok, why = _te.check(getattr(te, "is_bf16_available", None), "bf16")
        return True, ("" if ok else f"no bf16 ({why}); running TE in fp16")

    def build(self, cfg, init_state, device):
        self.device = device
        self.dtype = amp_dtype(device)  # fp16 (+ grad scaler) on GPUs without bf16 (T4)
        return build_te_student(cfg, init_state, device)

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


def build_te_student(cfg, init_state, device):
    """The student module tree from TE layers, loaded with the shared initial weights."""
    te, _, _ = _te.load()
    from workbench.models import Student

    dtype = torch.bfloat16 if cfg.model.param_dtype == "bf16" else torch.float32
    if cfg.model.layout == "fused":  # one te.LayerNormMLP per block (its GELU is the tanh form, like ours)
        model = Student(cfg.model, linear=te.Linear, mlp=te.LayerNormMLP, params_dtype=dtype)
    else:
        model = Student(cfg.model, linear=te.Linear, norm=te.LayerNorm, params_dtype=dtype)
    model.embed.to(dtype)  # nn.Embedding ignores params_dtype: keep it in the same dtype as the torch student's
    return load_matched(model.to(device), {k: v.to(device) for k, v in init_state.items()})
