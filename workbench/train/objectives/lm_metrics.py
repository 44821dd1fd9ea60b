"""Held-out metrics of a language-model student against the text and its teacher (fp32, chunked, no grad).

Every metric is a token-weighted mean over the counted next tokens (not IGNORE_INDEX), accumulated over
batches by `LMMetrics`, so a run's figure does not depend on how its held-out tokens were batched:
  heldout_ce_nats               the student's cross-entropy on the next tokens, nats per token
  heldout_ppl                   exp(heldout_ce_nats)
  teacher_heldout_ce_nats, teacher_heldout_ppl   the same for the teacher (the floor a student aims at)
  kl_teacher_student_t1_nats    KL(teacher || student) at temperature 1, nats per token
  top1_agreement                fraction of tokens where student and teacher rank the same token first
  heldout_tokens                how many tokens the means are over
Teacher metrics are None (unknown, never a fake number) when no teacher logits were given.

A student's row holds them after training and, for the metrics in `STEP0`, also before its first training
step (`<metric>_step0`: heldout_ppl_step0, kl_teacher_student_t1_nats_step0, top1_agreement_step0): the
converted student in its own precision (bf16, FP8, ...) on the same held-out batches, run as the evaluation
after training runs it (workbench.train.loop.step0_metrics). With pretrained weights this is what the precision
alone does to the model; `initial_loss` is not that (the fp32 reference model's loss of the same weights).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from workbench.train.objectives.lm_objectives import DEFAULT_CHUNK_TOKENS, IGNORE_INDEX, flatten, kd_per_token

# what a row keeps of the held-out evaluation before training (the teacher's own figures do not change)
STEP0 = ("heldout_ppl", "kl_teacher_student_t1_nats", "top1_agreement")


class LMMetrics:
    """Sums over batches; `result()` turns them into the token-weighted means above."""

    def __init__(self, chunk_tokens: int = DEFAULT_CHUNK_TOKENS):
        self.chunk_tokens = chunk_tokens
        self.tokens = 0
        self.sums = {"ce": 0.0, "teacher_ce": 0.0, "kl": 0.0, "agree": 0.0}
        self.with_teacher: bool | None = None

    @torch.no_grad()
    def add(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor | None,
            next_tokens: torch.Tensor) -> None:
        """One batch: logits [..., vocab] in any dtype, next tokens [...] int64."""
        if self.with_teacher is None:
            self.with_teacher = teacher_logits is not None
        elif self.with_teacher != (teacher_logits is not None):
            raise ValueError("give teacher logits for every batch or for none")  # else the means mix token sets
        s, t, y = flatten(student_logits, teacher_logits, next_tokens)
        for i in range(0, s.shape[0], self.chunk_tokens):
            sc, yc = s[i:i + self.chunk_tokens].float(), y[i:i + self.chunk_tokens]  # one chunk in fp32 at a time
            keep = yc != IGNORE_INDEX
            self.tokens += int(keep.sum())
            self.sums["ce"] += float(F.cross_entropy(sc, yc, ignore_index=IGNORE_INDEX, reduction="sum"))
            if t is None:
                continue
            tc = t[i:i + self.chunk_tokens].float()
            self.sums["teacher_ce"] += float(F.cross_entropy(tc, yc, ignore_index=IGNORE_INDEX, reduction="sum"))
            self.sums["kl"] += float((kd_per_token(sc, tc, "forward_kl") * keep).sum())
            self.sums["agree"] += float(((sc.argmax(-1) == tc.argmax(-1)) & keep).sum())

    def result(self) -> dict[str, float | int | None]:
        n = self.tokens
        if n == 0:
            raise ValueError("no held-out tokens were counted (every next token was IGNORE_INDEX, or no batch)")
        ce = self.sums["ce"] / n
        teacher_ce = self.sums["teacher_ce"] / n if self.with_teacher else None
        return {
            "heldout_ce_nats": ce,
            "heldout_ppl": math.exp(ce),
            "teacher_heldout_ce_nats": teacher_ce,
            "teacher_heldout_ppl": None if teacher_ce is None else math.exp(teacher_ce),
            "kl_teacher_student_t1_nats": self.sums["kl"] / n if self.with_teacher else None,
            "top1_agreement": self.sums["agree"] / n if self.with_teacher else None,
            "heldout_tokens": n,
        }


def lm_metrics(student_logits: torch.Tensor, teacher_logits: torch.Tensor | None, next_tokens: torch.Tensor,
               chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> dict[str, float | int | None]:
    """The metrics of one batch (see the module docstring); `LMMetrics` for several."""
    acc = LMMetrics(chunk_tokens)
    acc.add(student_logits, teacher_logits, next_tokens)
    return acc.result()
