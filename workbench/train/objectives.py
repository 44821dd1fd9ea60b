"""Distillation objectives, all computed in fp32 whatever precision the student ran in.

The tutorial's `F.mse_loss(pred_bf16, target_fp32)` crashes on current torch (REFERENCE §1.1) and,
where it runs, reduces in low precision; casting both sides to fp32 first fixes both.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Targets:
    """Teacher outputs for one batch, computed once before any student trains."""

    out: torch.Tensor  # the teacher's output (mlp) or its logits (lm)
    hidden: list[torch.Tensor] | None = None  # per-block states, only for loss='hidden'
    next_tokens: torch.Tensor | None = None  # lm: the text's next tokens, for cross-entropy and metrics

    def tensors(self) -> list[torch.Tensor]:
        return [self.out, *(self.hidden or []), *([] if self.next_tokens is None else [self.next_tokens])]

    def clone(self) -> "Targets":
        return Targets(self.out.clone(), [h.clone() for h in self.hidden] if self.hidden else None,
                       None if self.next_tokens is None else self.next_tokens.clone())


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
