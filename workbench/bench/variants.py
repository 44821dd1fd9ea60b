"""The bench's variant catalogue: each variant a set of config overrides (eager / compile / graphs, layout,
parameter dtype, fused optimizer) and the students worth running under it. A new variant is one entry in
VARIANTS (and, to run by default, its name in a preset's DEFAULT_VARIANTS); nothing else names them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench import config as config_mod
from workbench.config import ConfigError

TE = ("te_bf16", "te_fp8:delayed", "te_fp8:current", "te_fp8:block")
TORCHAO = ("torchao_float8:tensorwise", "torchao_float8:rowwise")
BF16 = {"param_dtype": "bf16", "fused_optimizer": True}
FUSED_BF16 = {"layout": "fused", **BF16}
STEP = {"graphs": True, "te_graph": "step"}  # TE students graph their whole step, like the torch students
TE_ADAM = {"optimizer": "te_fused_adam"}


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: dict[str, Any]
    """Config overrides (flat field names) on top of the preset and the user's --set."""
    backends: tuple[str, ...]
    """Students run under this variant (the first is the run's baseline)."""
    doc: str = ""


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("tutorial", {}, ("torch_bf16", "te_fp8:delayed_e4m3"),
            "the tutorial's two students as it runs them (eager, its layout, fp32 master weights, bf16 autocast; "
            "TE delayed E4M3): every '× tutorial' ratio of the bench divides by these, measured in the same run"),
    Variant("eager", {}, ("torch_fp32", "torch_bf16") + TE,
            "the tutorial's layout and fp32 master weights, no compile, no graphs"),
    Variant("eager-fused-bf16", FUSED_BF16, ("torch_bf16",) + TE,
            "fused block (te.LayerNormMLP / torch equivalent), bf16 parameters, fused AdamW"),
    Variant("smoke", {}, ("torch_fp32", "torch_bf16", "te_fp8:delayed"),
            "the cpu-smoke preset's students: seconds on a CPU (tests, `make bench` without a GPU)"),
    # torchao converts nn.Linear modules, so its students live in the separate layout
    Variant("compile", {"compile": True}, ("torch_bf16",) + TORCHAO,
            "torch.compile of the torch students, tutorial layout, fp32 masters (torchao always runs compiled)"),
    Variant("compile-bf16", {"compile": True, **BF16}, ("torch_bf16",) + TORCHAO,
            "compiled, tutorial layout, bf16 parameters, fused AdamW"),
    Variant("compile-graphs-bf16", {"compile": True, "graphs": True, **BF16}, ("torch_bf16",) + TORCHAO,
            "compiled and graphed, tutorial layout, bf16 parameters, fused AdamW"),
    Variant("compile-fused-bf16", {"compile": True, **FUSED_BF16}, ("torch_bf16",),
            "compiled, fused layout, bf16 parameters, fused AdamW"),
    Variant("compile-graphs-fused-bf16", {"compile": True, "graphs": True, **FUSED_BF16}, ("torch_bf16",),
            "compiled and graphed, fused layout, bf16 parameters, fused AdamW (P1's fastest path)"),
    Variant("graphs", {"graphs": True}, ("torch_bf16",) + TE,
            "CUDA graphs (whole torch step; TE via make_graphed_callables), tutorial layout, fp32 masters"),
    Variant("graphs-fused-bf16", {"graphs": True, **FUSED_BF16}, ("torch_bf16",) + TE,
            "CUDA graphs, fused layout, bf16 parameters, fused AdamW"),
    Variant("graphs-step", STEP, TE,
            "the whole TE step (forward, loss, backward, AdamW, FP8 scale updates) in one CUDA graph, tutorial "
            "layout, fp32 masters"),
    Variant("graphs-step-fused-bf16", {**STEP, **FUSED_BF16}, ("torch_bf16",) + TE,
            "the whole step in one CUDA graph for every student, fused layout, bf16 parameters, fused AdamW"),
    Variant("te-adam-graphs-step-fused-bf16", {**STEP, **FUSED_BF16, **TE_ADAM},
            ("torch_bf16", "te_fp8:delayed", "te_fp8:current"),
            "whole-step graphs, fused layout, bf16 parameters, TE's FusedAdam with fp32 master weights"),
    Variant("te-adam-bf16-moments-graphs-step-fused-bf16", {**STEP, **FUSED_BF16, **TE_ADAM, "moments_dtype": "bf16"},
            ("torch_bf16", "te_fp8:delayed", "te_fp8:current"),
            "as te-adam-graphs-step-fused-bf16 with the Adam moments in bf16"),
    Variant("fp8-weights-fused-bf16", {**FUSED_BF16, **TE_ADAM, "te_fp8_weights": True},
            ("te_fp8:delayed", "te_fp8:current"),
            "FP8 primary weights (te.quantized_model_init) with TE FusedAdam's fp32 masters, fused layout, eager "
            "(FusedAdam cannot capture the update of FP8 weights)"),
    # decoder stacks (lm-a, lm-b): the previous LM table's students, then the levers
    Variant("lm-compile", {"compile": True}, ("torch_bf16", "torchao_float8:tensorwise"),
            "compiled torch bf16 and torchao float8 students (fp32 masters, fused AdamW)"),
    Variant("lm-te", {}, ("te_bf16", "te_fp8:delayed"), "TE students, eager"),
    Variant("lm-te-step", STEP, ("te_fp8:delayed",), "the whole TE FP8 step in one CUDA graph"),
    Variant("lm-te-fp8-weights", {**TE_ADAM, "te_fp8_weights": True}, ("te_fp8:delayed",),
            "FP8 primary weights with TE FusedAdam's fp32 masters, eager"),
    # the logit loss as it ran before loss_impl=auto picked the fused one for forward_kl: the lever measured
    Variant("lm-checkpointed-loss", {"compile": True, "loss_impl": "checkpointed"}, ("torch_bf16", "te_fp8:delayed"),
            "the logit loss under autograd (each chunk recomputed in the backward), not fused: compiled torch bf16 "
            "and eager TE FP8"),
    Variant("lm-te-step-checkpointed-loss", {**STEP, "loss_impl": "checkpointed"}, ("te_fp8:delayed",),
            "the whole TE FP8 step in one CUDA graph, with the checkpointed logit loss"),
    # your own Hugging Face decoder (--set lm.student=DIR): how TE converts it, and the precision levers
    Variant("hf-compile", {"compile": True}, ("torch_bf16", "torchao_float8:tensorwise"),
            "the Hugging Face model compiled: torch bf16 and torchao float8 (fp32 masters, fused AdamW)"),
    # compiled and graphed: the bf16 denominator's strongest torch path (a TE row must beat this one too)
    Variant("hf-compile-step", {**STEP, "compile": True}, ("torch_bf16",),
            "the Hugging Face model compiled and its whole step in one CUDA graph: torch bf16"),
    Variant("hf-te-linear", {"te_conversion": "linear"}, ("te_bf16", "te_fp8:delayed"),
            "TE per Linear / RMSNorm (the model's own attention maths in torch), eager"),
    Variant("hf-te-layer", {"te_conversion": "layer"}, ("te_bf16", "te_fp8:delayed", "te_fp8:current"),
            "each decoder layer one te.TransformerLayer (fused QKV, SwiGLU, TE attention and RoPE), eager"),
    Variant("hf-te-layer-step", {**STEP, "te_conversion": "layer"}, ("te_bf16", "te_fp8:delayed", "te_fp8:current"),
            "TE decoder layers, the whole step in one CUDA graph"),
    Variant("hf-te-layer-fp8-dpa", {"te_conversion": "layer", "te_fp8_dpa": True}, ("te_fp8:delayed", "te_fp8:current"),
            "TE decoder layers with FP8 attention (fp8_dpa), eager; refused with TE's reason where cuDNN cannot"),
    Variant("hf-te-layer-fp8-head", {**STEP, "te_conversion": "layer", "te_head_precision": "fp8"},
            ("te_fp8:delayed", "te_fp8:current"),
            "TE decoder layers and an FP8 LM head (te.Linear; a tied head shares the embedding), whole-step graph"),
)}

# Default variant list per preset, most telling first (a --budget-s cut drops the tail). `large` skips
# compile-heavy repeats (each torch.compile costs 30-60 s) and runs fp32 eager only (~416 ms/step on the
# H200). Variants sharing a model sit next to each other: inductor's on-disk cache then hits.
DEFAULT_VARIANTS: dict[str, tuple[str, ...]] = {
    "seed": ("eager", "graphs-step-fused-bf16", "compile-graphs-fused-bf16", "graphs-fused-bf16", "graphs-step",
             "te-adam-graphs-step-fused-bf16", "compile-fused-bf16", "compile-graphs-bf16", "compile-bf16",
             "eager-fused-bf16", "graphs", "compile"),
    "large": ("tutorial", "graphs-step-fused-bf16", "fp8-weights-fused-bf16", "te-adam-graphs-step-fused-bf16",
              "te-adam-bf16-moments-graphs-step-fused-bf16", "graphs-fused-bf16", "eager", "compile-bf16",
              "eager-fused-bf16"),
    "lm-a": ("lm-te-step", "lm-compile", "lm-te", "lm-te-fp8-weights", "lm-checkpointed-loss",
             "lm-te-step-checkpointed-loss"),
    "lm-b": ("lm-te-step", "lm-compile", "lm-te", "lm-te-fp8-weights", "lm-checkpointed-loss",
             "lm-te-step-checkpointed-loss"),
    "cpu-smoke": ("smoke",),
    # a Hugging Face folder as student: TE's best path first, its peers, then the levers and the slower TE paths
    **dict.fromkeys(("hf-llama-4l", "hf-llama-1b", "hf-qwen2.5-0.5b"),
                    ("hf-te-layer-step", "hf-compile", "hf-compile-step", "hf-te-layer-fp8-head", "hf-te-layer-fp8-dpa",
                     "hf-te-layer", "hf-te-linear")),
}


def resolve_variants(preset: str, names: list[str] | None) -> list[Variant]:
    """The named variants (default: the preset's list, else eager); an unknown name is a ConfigError."""
    names = list(names) if names else list(DEFAULT_VARIANTS.get(preset, ("eager",)))
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ConfigError(f"unknown bench variants {unknown}; allowed: {sorted(VARIANTS)}")
    return [VARIANTS[n] for n in names]


def variant_config(preset: str, overrides: dict[str, Any], v: Variant) -> tuple[Any, list[dict]]:
    """The variant's validated Config over the students the config accepts, and a row per rejected one."""
    from workbench import backends  # torch: only once a bench runs

    base = {**overrides, **v.overrides}
    ok, rejected = [], []
    for spec in v.backends:
        try:
            config_mod.from_preset(preset, **base, backends=[spec], baseline=spec)
            backends.check_specs([spec])  # the registry knows the backends, the config does not
            ok.append(spec)
        except ConfigError as e:
            rejected.append({"student": spec, "status": "error", "reason": f"config rejected: {e}"})
    if not ok:
        return None, rejected
    return config_mod.from_preset(preset, **base, backends=ok, baseline=ok[0]), rejected
