"""Distillation objectives, all computed in fp32 whatever precision the student ran in.

The tutorial's `F.mse_loss(pred_bf16, target_fp32)` crashes on current torch (bf16 against fp32) and,
where it runs, reduces in low precision; casting both sides to fp32 first fixes both.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Targets:
    """Teacher outputs for one batch, computed once before any student trains."""

    out: torch.Tensor  # the teacher's output (mlp), its logits (lm), or its top-k logits (lm, teacher_mode=topk)
    hidden: list[torch.Tensor] | None = None  # per-block states, only for loss='hidden'
    next_tokens: torch.Tensor | None = None  # lm: the text's next tokens, for cross-entropy and metrics
    indices: torch.Tensor | None = None  # lm top-k: the vocabulary ids of `out`'s k logits per token
    rest_lse: torch.Tensor | None = None  # lm top-k: log-sum-exp of the other logits / T per token (fp32)

    def tensors(self) -> list[torch.Tensor]:
        extra = [t for t in (self.next_tokens, self.indices, self.rest_lse) if t is not None]
        return [self.out, *(self.hidden or []), *extra]

    def clone(self) -> "Targets":
        def c(t):
            return None if t is None else t.clone()

        return Targets(self.out.clone(), [h.clone() for h in self.hidden] if self.hidden else None,
                       c(self.next_tokens), c(self.indices), c(self.rest_lse))


def mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(pred.float(), target.float())


def cosine(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return 1.0 - F.cosine_similarity(pred.float(), target.float(), dim=-1).mean()


def needs_hidden(kind: str) -> bool:
    return kind == "hidden"


def loss(kind: str, student_out, targets: Targets) -> torch.Tensor:
    """`student_out` is the output tensor, or (output, hidden list) when `needs_hidden(kind)`."""
    if kind == "mse":
        return mse(student_out, targets.out)
    if kind == "cosine":
        return cosine(student_out, targets.out)
    if kind == "hidden":
        out, hidden = student_out
        per_block = torch.stack([mse(h, t) for h, t in zip(hidden, targets.hidden)])
        return mse(out, targets.out) + per_block.mean()
    raise ValueError(f"unknown distillation loss {kind!r}")
