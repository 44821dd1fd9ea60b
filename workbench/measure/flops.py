"""FLOPs and throughput of a student train step, for tokens/s and TFLOP/s.

The count comes from the model itself (`train_flops_per_token`), so a model of another shape brings
its own maths; this module only scales it by the tokens of a step.
"""
from __future__ import annotations

import torch

from workbench.config import ModelConfig


def tokens_per_step(m: ModelConfig) -> int:
    return m.batch * m.seq_len


def train_flops(m: ModelConfig) -> int:
    """One training step's GEMM FLOPs, from the student model of this config (built on the meta device)."""
    from workbench.models import reference_student

    with torch.device("meta"):
        model = reference_student(m)
    return tokens_per_step(m) * model.train_flops_per_token()


def tflops(flops: int, ms: float | None) -> float | None:
    return None if not ms else flops / (ms * 1e-3) / 1e12
