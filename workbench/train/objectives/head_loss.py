"""The head-fused logit loss (distill.loss_impl=fused_head): the LM head's GEMM, forward_kl + CE and their
gradients, chunk by chunk over tokens, so the student's [tokens, vocab] logits never exist.

The fused loss of lm_objectives still takes the student's logits: at vocab 128256 and 8192 tokens they are
2.1 GB in bf16, and its kept gradient as much again. Here the student hands over its final hidden states h
[tokens, hidden] (after the final norm) and the head's weight W [vocab, hidden]; each chunk of `chunk_tokens`
rows computes its logits h_c @ W^T, the loss and the closed-form d(loss)/d(logits) (lm_objectives'
compiled chunk), and from that at once d/dh_c = g_c @ W and d/dW += g_c^T @ h_c, the latter summed over chunks
in fp32 (inside the GEMM on CUDA). The forward keeps only grad_h [tokens, hidden] and grad_W [vocab, hidden]
(fp32); the backward scales them. Its extra memory: one chunk's [chunk_tokens, vocab] logits and gradient in
h's dtype, whatever the token count.

Like Liger-Kernel's fused linear losses and Apple's cut-cross-entropy, but with no host sync and no branch on
data (the chunk count follows from shapes alone, the token count stays on the device), so a whole-step CUDA
graph captures it. The head GEMM runs in torch in the dtype of h (the forward's autocast dtype, as the model
hands it over), not in a precision backend's FP8: the rows say loss_impl=fused_head.
"""
from __future__ import annotations

import functools

import torch

from workbench.config import DistillConfig
from workbench.models.lm import HeadFeatures
from workbench.train.objectives.lm_objectives import IGNORE_INDEX, _chunk_fn, chunk_scalars, kept_grads_once


def _chunks(h, w, t, y, d: DistillConfig, with_grad: bool):
    """(loss, grad_h, grad_w) over every chunk; the gradients are None without `with_grad`."""
    counted = (y != IGNORE_INDEX).sum().clamp(min=1).to(torch.float32)  # stays on the device: no sync
    c = chunk_scalars(d, counted, h.dtype)
    fn = _chunk_fn(h.device)
    wc = w.to(h.dtype)  # the head GEMM's operand, cast once (bf16 under autocast)
    grad_h = torch.empty_like(h) if with_grad else None
    grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if with_grad else None
    loss = h.new_zeros((), dtype=torch.float32)
    for start in range(0, h.shape[0], d.loss_chunk_tokens):
        part = slice(start, start + d.loss_chunk_tokens)
        hc = h[part]
        # the chunk's logits stay in h's dtype: the compiled chunk upcasts them inside its kernels, so no fp32
        # [chunk, vocab] copy is written, and its gradient comes back in that dtype for the two GEMMs below
        s = hc @ wc.t()
        tc = s if t is None else t[part]  # without a KD term (kd_w == 0) the teacher is never read
        value, g = fn(s, tc, y[part], c)
        if with_grad:
            torch.mm(g, wc, out=grad_h[part])
            _accumulate_weight_grad(grad_w, g, hc)
        loss = loss + value
    return loss, grad_h, grad_w


def _accumulate_weight_grad(grad_w: torch.Tensor, g: torch.Tensor, hc: torch.Tensor) -> None:
    """grad_w (fp32) += g^T @ hc. On CUDA the GEMM itself accumulates into grad_w (cuBLAS's bf16-in, fp32-out
    product with beta=1, as Megatron's gradient-accumulation fusion does), so no [vocab, hidden] temporary is
    written: a bf16 one is 0.5 GiB at vocab 128256 and hidden 2048, its fp32 copy 1 GiB. Elsewhere, or where
    this torch lacks that product, the chunk's product is added from a temporary in its own dtype. An fp32 chunk
    accumulates in place (addmm_: no temporary either)."""
    if g.dtype == grad_w.dtype:
        grad_w.addmm_(g.t(), hc)
    elif _fp32_out_gemm(g.device):
        torch.addmm(grad_w, g.t(), hc, out_dtype=grad_w.dtype, out=grad_w)
    else:
        grad_w += g.t() @ hc  # the sum over chunks stays fp32 (in-place promotion)


@functools.cache
def _fp32_out_gemm(device: torch.device) -> bool:
    """Whether this torch has addmm's out_dtype on `device` (CUDA only, torch >= 2.9). Asked once per device,
    on tiny tensors, by the first (eager) step, before any CUDA graph capture."""
    if device.type != "cuda":
        return False
    try:
        a = torch.ones(2, 2, device=device, dtype=torch.bfloat16)
        c = torch.zeros(2, 2, device=device)
        torch.addmm(c, a, a, out_dtype=torch.float32, out=c)
        return True
    except (RuntimeError, TypeError):
        return False


class _HeadFusedForwardKL(torch.autograd.Function):
    """forward_kl + CE of logits h @ W^T with the gradients wrt h and W computed in the forward."""

    @staticmethod
    def forward(ctx, h, w, t, y, d: DistillConfig):
        if t is not None and t.requires_grad:
            raise ValueError("the head-fused loss gives no gradient to the teacher's logits; detach them")
        loss, grad_h, grad_w = _chunks(h, w, t, y, d, with_grad=True)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.w_dtype, ctx.done = w.dtype, False
        return loss

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = kept_grads_once(ctx, "the head-fused loss")
        grad_h.mul_(grad_out.to(grad_h.dtype))
        grad_w.mul_(grad_out)
        return grad_h, grad_w.to(ctx.w_dtype), None, None, None


def head_fused_loss(features: HeadFeatures, teacher_logits: torch.Tensor | None, next_tokens: torch.Tensor,
                    d: DistillConfig) -> torch.Tensor:
    """Scalar fp32 (1 - d.ce_weight) * forward_kl(d.temperature) + d.ce_weight * CE of the logits
    features.hidden @ W^T, in chunks of d.loss_chunk_tokens, as lm_objectives.lm_loss computes it from logits
    (d.loss and d.loss_impl are not read: this is the forward_kl of loss_impl=fused_head). `teacher_logits`
    [..., vocab] may be None only when d.ce_weight == 1. Without a backward to come (no_grad, or nothing
    requiring grad) the same chunks run without their gradients."""
    h, w = features
    vocab = w.shape[0]
    if 1.0 - d.ce_weight > 0 and teacher_logits is None:
        raise ValueError("teacher logits are needed unless ce_weight == 1 (the student without distillation)")
    if h.shape[:-1] != next_tokens.shape or h.shape[-1] != w.shape[1]:
        raise ValueError(f"hidden states {tuple(h.shape)}, head weight {tuple(w.shape)} and next tokens "
                         f"{tuple(next_tokens.shape)} do not fit together")
    t = None if teacher_logits is None else teacher_logits.detach().reshape(-1, vocab)
    if t is not None and t.shape[0] != next_tokens.numel():
        raise ValueError(f"teacher logits {tuple(teacher_logits.shape)} do not match "
                         f"next tokens {tuple(next_tokens.shape)}")
    h2, y = h.reshape(-1, h.shape[-1]), next_tokens.reshape(-1)
    if torch.is_grad_enabled() and (h2.requires_grad or w.requires_grad):
        return _HeadFusedForwardKL.apply(h2, w, t, y, d)
    with torch.no_grad():
        return _chunks(h2, w, t, y, d, with_grad=False)[0]
