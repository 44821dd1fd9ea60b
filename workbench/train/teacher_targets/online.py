"""distill.teacher_mode=online: the teacher's forward when a training batch is fetched, in its precision,
before the student's step (never inside its timed or graphed step). Holds the token windows only (int32),
nothing per vocabulary, so memory does not grow with train.steps; rows add teacher_step_ms_median and
distill_step_ms_median. The teacher's forward is a deterministic function of the batch (same weights, shapes
and kernels), so every student still sees the same targets."""
from __future__ import annotations

import collections.abc
from typing import Callable

import torch

from workbench.train.teacher_targets import TeacherMode, register


class OnlineBatches(collections.abc.Sequence):
    """Training batches whose teacher logits are computed when a batch is fetched: `targets(window)` runs the
    teacher in its precision and returns (tokens, Targets). The loop fetches a batch before calling the
    student's step, so the teacher's forward is never inside that step, its timing or its CUDA graph."""

    def __init__(self, windows: list[torch.Tensor], targets: Callable[[torch.Tensor], tuple]):
        self.windows = torch.stack(windows).to(torch.int32) if windows else torch.empty(0, dtype=torch.int32)
        self.targets = targets

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int):
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.targets(self.windows[i].long())

    def shared_tensors(self) -> list[torch.Tensor]:
        return [self.windows]


class Online(TeacherMode):
    name = "online"
    teacher_in_step = True

    def train_batches(self, task, windows, shard):
        return OnlineBatches(windows, task.targets)


register(Online())
