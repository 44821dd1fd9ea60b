"""What a run distils. A task owns the teacher, the reference student every backend converts a copy of,
the batches with the teacher's targets, the loss and the held-out evaluation; one trainer runs them all.

  MLPTask  the tutorial's: MLP blocks on random tokens, the student regresses the teacher's output.
  LMTask   a causal LM (gpt / llama, or your Hugging Face model) distilled on real text: KL on the
           logits mixed with cross-entropy; held-out perplexity, KL to the teacher, top-1 agreement
           (workbench.train.lm_task).

Teacher targets are computed once per batch before any student trains (distill.teacher_mode precomputed,
topk) or by the teacher's forward as a batch is fetched (online: teacher_targets), never inside a timed step.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from workbench.models import Student, Teacher, kinds, reference_student
from workbench.train import objectives
from workbench.train.lm_task import LMTask
from workbench.train.loop import Data
from workbench.train.task_setup import SHARD_SEED_STRIDE, check_teacher_output
from workbench.train.teacher import teacher_precision


def for_config(cfg, device: torch.device, tdtype, cache_dir: str | Path) -> "MLPTask | LMTask":
    """The task that trains model.kind (the kinds' registry says which: workbench.models.kinds)."""
    if kinds.is_lm(cfg.model.kind):
        return LMTask(cfg, device, tdtype, cache_dir)
    return MLPTask(cfg, device, tdtype)


class MLPTask:
    """The tutorial's set-up: random tokens, the teacher's output as the regression target."""

    step0_metrics: tuple[str, ...] = ()  # no held-out evaluation before training: the tutorial's rows stay as they were

    def __init__(self, cfg, device: torch.device, tdtype):
        self.cfg, self.device, self.tdtype = cfg, device, tdtype
        self.kind = cfg.distill.loss
        self.needs_hidden = objectives.needs_hidden(self.kind)
        torch.manual_seed(cfg.train.seed)
        self.teacher = Teacher(cfg.model).to(device).eval().requires_grad_(False)
        # The one torch model every student is a converted copy of (matched init by construction)
        self.reference = reference_student(cfg.model, Student(cfg.model).state_dict())
        self.teacher, self.teacher_precision = teacher_precision.prepare(self.teacher, cfg, device, tdtype)
        self.info: dict[str, Any] = self.teacher_precision.info()

    def cells(self) -> dict[str, Any]:
        """What every student row of the run carries from its task."""
        return self.teacher_precision.cells()

    def forward(self, model, tokens: torch.Tensor):
        """The student's output as the loss takes it (with every block's state for loss='hidden')."""
        return model(tokens, return_hidden=True) if self.needs_hidden else model(tokens)

    def loss(self, out, targets: objectives.Targets) -> torch.Tensor:
        return objectives.loss(self.kind, out, targets)

    matched_loss = loss  # the measure of a student's starting weights (see loop.initial_loss)

    def make_data(self, shard: int = 0) -> Data:
        """Random-token batches from a seeded generator and the teacher's targets, computed once. `shard`:
        a data-parallel rank's own training and timed batches (the held-out ones are every rank's)."""
        cfg, m = self.cfg, self.cfg.model
        gen = torch.Generator().manual_seed(cfg.train.seed + 1)

        def tokens(n: int):
            return [torch.randint(0, m.vocab, (m.batch, m.seq_len), generator=gen) for _ in range(n)]

        train, bench, held_out = (tokens(cfg.train.steps), tokens(cfg.bench.warmup + cfg.bench.iters),
                                  tokens(cfg.train.eval_batches))
        if shard:
            gen = torch.Generator().manual_seed(cfg.train.seed + 1 + SHARD_SEED_STRIDE * shard)
            train, bench = tokens(cfg.train.steps), tokens(cfg.bench.warmup + cfg.bench.iters)
        return Data(*([self._targets(t.to(self.device)) for t in part] for part in (train, bench, held_out)))

    def _targets(self, tokens: torch.Tensor):
        with self.teacher_precision.forward():
            y = self.teacher(tokens, return_hidden=self.needs_hidden)
        out, hidden = y if self.needs_hidden else (y, None)
        check_teacher_output(out, self.cfg)
        return tokens, objectives.Targets(out.float(), [h.float() for h in hidden] if hidden else None)

    @torch.no_grad()
    def evaluate(self, model, student, batches) -> dict[str, Any]:
        """Mean output MSE against the teacher on held-out batches (the tutorial's eval), in fp32."""
        vals = []
        for tokens, targets in batches:
            with student.forward_context():
                vals.append(float(objectives.mse(model(tokens), targets.out)))
        return {"eval_mse": sum(vals) / len(vals)}

    def no_kd(self) -> None:
        return None  # regression on the teacher's output has no teacher-free counterpart
