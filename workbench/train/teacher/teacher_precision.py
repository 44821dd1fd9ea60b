"""The frozen teacher's forward precision (distill.teacher_precision), settled once the teacher exists.

'auto', 'fp32', 'bf16' and 'fp16' run the torch teacher under torch autocast (`runner.teacher_dtype`).
'fp8' runs it as TE FP8 inference: the teacher converted the way the TE students are (te_fp8's `prepare`, so
its weights are exactly the teacher's), under torch.no_grad, TE's autocast with current scaling (an
inference forward has no amax history to learn delayed scales from) inside bf16 torch autocast for what TE
does not run in FP8 (embeddings, GELU, residuals, attention). Its weights stay fp32 and are quantized in
every forward, so teacher_ms_median includes those casts (FP8-only teacher weights are not built). Where
that cannot run (a CPU, no usable TE, a GPU without FP8, GEMM dims that are not multiples of 16, a layer
TE's conversion refuses) the torch teacher runs in bf16 autocast (fp32 on a CPU) instead; `used` and
`reason` say so in task.json, every row and summary.json.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ContextManager

import torch
from torch import nn

from workbench import backends
from workbench.backends import te_fp8
from workbench.models import LayerNormMLP, shared_parameters

FP8_RECIPE = "current"  # Float8CurrentScaling: scales from this forward's own amaxes
NAMES = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass
class TeacherPrecision:
    """How the teacher's forward runs, and why it is not what was asked for (if it is not)."""

    requested: str  # distill.teacher_precision
    used: str  # 'fp32', 'bf16', 'fp16' or 'fp8'
    device: torch.device
    dtype: torch.dtype | None  # torch autocast around the forward (None: fp32); under FP8, for what TE keeps
    reason: str = ""
    fp8: backends.Student | None = None  # the teacher as TE FP8 prepared it: its forward context

    def forward(self) -> ContextManager:
        """Wraps every teacher forward: no autograd, and this precision's autocast(s)."""
        stack = contextlib.ExitStack()
        stack.enter_context(torch.no_grad())
        stack.enter_context(self.fp8.forward_context() if self.fp8 else backends.autocast(self.device, self.dtype))
        return stack

    def cells(self) -> dict[str, Any]:
        """What a row and summary.json say about it."""
        return {"teacher_precision_used": self.used, "teacher_precision_reason": self.reason}

    def info(self) -> dict[str, Any]:
        """What task.json says about it: what was asked for, too."""
        return {"teacher_precision": self.requested, **self.cells()}


def prepare(teacher: nn.Module, cfg, device: torch.device,
            dtype: torch.dtype | None) -> tuple[nn.Module, TeacherPrecision]:
    """The teacher to run (the TE FP8 conversion for 'fp8' where it can run, else `teacher` itself) and its
    precision. `dtype` is `runner.teacher_dtype`. Consumes none of the caller's random numbers (TE's layer
    constructors draw an init the conversion then overwrites): students built after it start the same."""
    requested = cfg.distill.teacher_precision
    if requested != "fp8":
        return teacher, TeacherPrecision(requested, NAMES[dtype], device, dtype)
    why = fp8_unavailable(teacher, cfg, device)
    if why:
        return teacher, TeacherPrecision(requested, NAMES[dtype], device, dtype,
                                         reason=f"{why} -> the teacher ran in {NAMES[dtype]} instead of fp8")
    fp8 = backends.make(f"te_fp8:{FP8_RECIPE}")
    # The teacher's exact weights: fp32 as trained, whatever the students' parameter dtype; TE picks its own
    # attention backend for it (never FP8 attention: options.te_fp8_dpa is a student switch, and where cuDNN has no
    # FP8 attention, head_dim 64 on Hopper, it would fail at the first forward, past this fallback), and
    # options.te_fp8_weights is a student switch (FP8 weights with master copies).
    own = cfg.replace(param_dtype="fp32", te_attention="auto", te_fp8_weights=False, te_fp8_dpa=False)
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            # Converted from a host copy: only the TE teacher ever lives on the GPU, never two teachers at once.
            student = fp8.prepare(teacher.cpu(), own, device)
    except Exception as e:  # e.g. a Hugging Face teacher with a layer TE cannot take: the torch teacher runs
        why = f"TE's FP8 conversion failed ({type(e).__name__}: {e})"
        return teacher.to(device), TeacherPrecision(requested, NAMES[dtype], device, dtype,
                                                    reason=f"{why} -> the teacher ran in {NAMES[dtype]} instead of fp8")
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the torch teacher's blocks back to the device: free memory sizes the logits' place
    return (student.model.eval().requires_grad_(False),
            TeacherPrecision(requested, "fp8", device, student.dtype, fp8=student))


def fp8_unavailable(teacher: nn.Module, cfg, device: torch.device) -> str:
    """'' when the teacher can run in TE FP8 here, else why not (TE's own words where TE gives them)."""
    dims = gemm_dims(teacher, cfg.model.batch * cfg.model.seq_len)
    return te_fp8.inference_refusal(backends.Context(device=device, cfg=cfg), FP8_RECIPE, dims, "the teacher's")


def gemm_dims(model: nn.Module, tokens: int) -> dict[str, int]:
    """Every GEMM dimension of `model` a TE conversion would run in FP8 (its Linear and LayerNormMLP layers; a
    tied weight stays torch), and its `tokens` rows, by name."""
    dims = {"tokens (batch*seq_len)": tokens}
    shared = shared_parameters(model)
    for name, m in model.named_modules():
        if any(id(p) in shared for p in m.parameters(recurse=False)):
            continue
        if isinstance(m, nn.Linear):
            dims.update({f"{name}.in_features": m.in_features, f"{name}.out_features": m.out_features})
        elif isinstance(m, LayerNormMLP):
            ffn, hidden = m.fc1_weight.shape
            dims.update({f"{name}.hidden": hidden, f"{name}.ffn": ffn})
    return dims
