"""Analytic FLOP count of one student train step (REFERENCE §4), for tokens/s and TFLOP/s.

Per token, each block runs two GEMMs (h x i and i x h: 2*2*h*i FLOPs forward) and the head one
(2*h*h). Training ~ 3x forward (forward, grad wrt input, grad wrt weight). Norms, GELU and the
optimizer are not counted: TFLOP/s here is "useful GEMM work per second".
"""
from __future__ import annotations

from workbench.config import ModelConfig


def tokens_per_step(m: ModelConfig) -> int:
    return m.batch * m.seq_len


def forward_flops(m: ModelConfig) -> int:
    per_token = m.layers * 2 * 2 * m.hidden * m.intermediate + 2 * m.hidden * m.hidden
    return tokens_per_step(m) * per_token


def train_flops(m: ModelConfig) -> int:
    return 3 * forward_flops(m)


def tflops(flops: int, ms: float | None) -> float | None:
    return None if not ms else flops / (ms * 1e-3) / 1e12
