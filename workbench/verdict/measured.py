"""The verdict's GPU part, its seam: what `workbench verdict` measures on a CUDA GPU, beside the prediction.

Today it reports 'not run' and why. The GPU part (issue 35) goes here: the bench variants that matter for the
model (workbench.bench), the fastest bf16 path among them as the denominator, the FP8 recipes the prediction found
eligible, peak memory, the profiler split of the fastest FP8 row and each FP8 recipe's step-0 quality on the
model's own weights; it returns the dict that verdict.json keeps under `measured`.
"""
from __future__ import annotations

from typing import Any


def measure(model: str, prediction: dict[str, Any], cfg) -> dict[str, Any]:
    """verdict.json's `measured`: {'status': 'not run', 'reason': ...} until the GPU part lands."""
    import torch

    if not torch.cuda.is_available():
        return {"status": "not run", "reason": "no CUDA GPU here"}
    return {"status": "not run", "reason": (
        f"the GPU measurement of a verdict is not built yet (issue 35); meanwhile `workbench bench --preset "
        f"{cfg.preset or 'P'} --set lm.student={model}` measures the variants")}
