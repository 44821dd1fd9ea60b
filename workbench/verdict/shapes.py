"""What a verdict reads from a model's config.json alone: its GEMMs (one decoder layer's and the LM head's), its
attention, its parameters and whether TE's decoder layer can hold its family, and the FP8 eligibility rules.

The model is built on the meta device (no weights read, no memory), so a 1B model's shape costs seconds on a
laptop. MODEL is a Hugging Face folder (read offline, never its own code) or an `hf-init` shape name.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from workbench.backends import hf_families
from workbench.backends.hf_families.common import decoder_layers
from workbench.config import ConfigError

# FP8 GEMM dimension rules, recipe family -> (multiple, why); every dimension of a GEMM (M tokens, K, N) is checked
TENSOR_MULTIPLE, BLOCK_MULTIPLE = 16, 128
RULES = {
    "tensor": (TENSOR_MULTIPLE, "tensor scaling (TE DelayedScaling / Float8CurrentScaling, torchao tensorwise) "
                                "needs every GEMM dimension a multiple of 16 (cuBLASLt's FP8 GEMMs)"),
    "block": (BLOCK_MULTIPLE, "block scaling (TE Float8BlockScaling; MXFP8 on Blackwell) quantises in 1x128 / "
                              "128x128 tiles: a dimension not a multiple of 128 leaves ragged tiles, counted here as "
                              "not eligible"),
}
FP8_ATTENTION_HEAD_DIM = 128  # measured on the H200 (TE 2.20, cuDNN 9.19): head_dim 64 has no FP8 attention backend
HOPPER = ("H100", "H200")  # the GPUs the FP8-attention rule was measured on (Hopper)


@dataclass(frozen=True)
class Gemm:
    name: str  # the Linear's name inside one decoder layer (e.g. 'self_attn.q_proj'), or 'lm_head'
    k: int  # in_features
    n: int  # out_features
    count: int  # how many decoder layers hold it (1 for the LM head)
    where: str  # 'layer' or 'head'


@dataclass
class ModelShape:
    source: str
    model_type: str
    hidden: int
    intermediate: int  # the MLP's width (config.intermediate_size)
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_head: bool
    parameters: int  # unique parameter tensors' elements (a tied head counted once)
    max_positions: int | None
    windows: list[int | None]  # per decoder layer: its sliding window, None for full causal attention
    gemms: list[Gemm] = field(default_factory=list)
    te_layers_refusal: str = ""  # why TE's decoder layer cannot hold this family ('' = it can)
    project_flops_per_token: int = 0  # workbench.models.lm.lm_train_flops_per_token at the run's seq_len

    @property
    def attn_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim


def hf_config(model: str):
    """The transformers config of a Hugging Face folder (offline, never its own code) or an hf-init shape name."""
    from workbench.models import hf, hf_init

    if model in hf_init.SHAPES:
        return hf_init.hf_config(model)
    if not (Path(model) / "config.json").is_file():
        raise ConfigError(f"verdict MODEL {model!r}: neither a folder with a config.json nor an hf-init shape "
                          f"({', '.join(hf_init.SHAPES)})")
    try:
        return hf.read_config(model)
    except (OSError, ValueError) as e:
        raise ConfigError(f"verdict MODEL {model!r}: its config.json does not load: {e}") from e


def meta_model(config) -> nn.Module:
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model_type {config.model_type!r} builds no causal LM here: {e}") from e


def layer_gemms(model: nn.Module) -> list[Gemm]:
    """One Gemm per distinct (name, K, N) Linear of the decoder layers, with how many layers hold it, then the
    LM head (its GEMM runs whether or not its weight is tied to the embedding)."""
    layers = decoder_layers(model)
    if layers is None:
        raise ConfigError(f"{type(model).__name__}: no decoder layer list (model.model.layers) to count GEMMs in")
    found: OrderedDict[tuple[str, int, int], int] = OrderedDict()
    for layer in layers:
        for name, m in layer.named_modules():
            if isinstance(m, nn.Linear):
                key = (name, m.in_features, m.out_features)
                found[key] = found.get(key, 0) + 1
    out = [Gemm(name, k, n, count, "layer") for (name, k, n), count in found.items()]
    head = model.get_output_embeddings()
    return [*out, Gemm("lm_head", head.in_features, head.out_features, 1, "head")]


def windows(config, layers: int) -> list[int | None]:
    """Each layer's sliding window (None: full causal), from config.layer_types where the config has them."""
    types = getattr(config, "layer_types", None) or ["full_attention"] * layers
    window = getattr(config, "sliding_window", None)
    return [window if t == "sliding_attention" and window else None for t in types]


def read(model: str, seq_len: int) -> ModelShape:
    """The shape of MODEL for a run of `seq_len` tokens per sequence."""
    from workbench.models import shared_parameters
    from workbench.models.lm import lm_train_flops_per_token

    config = hf_config(model)
    text = config.get_text_config()
    hf = meta_model(config)
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    limit = getattr(text, "max_position_embeddings", None)
    if isinstance(limit, int) and limit < seq_len:
        raise ConfigError(f"{model!r} has max_position_embeddings={limit}, fewer than model.seq_len={seq_len}")
    shared = shared_parameters(hf)
    unique = {id(p): p.numel() for p in hf.parameters()}
    shape = ModelShape(
        source=str(model), model_type=config.model_type, hidden=text.hidden_size,
        intermediate=text.intermediate_size, layers=text.num_hidden_layers,
        heads=heads, kv_heads=getattr(text, "num_key_value_heads", None) or heads, head_dim=head_dim,
        vocab=text.vocab_size, tied_head=any(id(p) in shared for p in hf.get_output_embeddings().parameters()),
        parameters=sum(unique.values()), max_positions=limit, windows=windows(text, text.num_hidden_layers),
        gemms=layer_gemms(hf), te_layers_refusal=hf_families.refusal(hf, seq_len))
    shape.project_flops_per_token = lm_train_flops_per_token(hf, shape.layers, shape.attn_width, seq_len)
    return shape


# ---- eligibility rules (pure) -----------------------------------------------------------------
def gemm_eligible(m: int, k: int, n: int, rule: str) -> tuple[bool, str]:
    """(eligible, why not) of one GEMM (M tokens x K -> N) under a rule of RULES."""
    multiple, why = RULES[rule]
    bad = [f"{d}={v}" for d, v in (("M", m), ("K", k), ("N", n)) if v % multiple]
    return (not bad, "" if not bad else f"{', '.join(bad)} not a multiple of {multiple}: {why}")


def fp8_attention(head_dim: int, te_layers_refusal: str, gpu: str | None) -> tuple[bool | None, str]:
    """(eligible, why) of TE's FP8 attention (fp8_dpa, delayed or current scaling): None where unknown."""
    if te_layers_refusal:
        return False, f"needs TE's attention, and TE's decoder layer cannot hold this model: {te_layers_refusal}"
    if not gpu or not any(h in gpu.upper() for h in HOPPER):
        return None, (f"FP8 attention's shapes were measured on Hopper (H100/H200) only; on {gpu or 'an unknown GPU'} "
                      "unknown until measured")
    if head_dim != FP8_ATTENTION_HEAD_DIM:
        return False, (f"head_dim {head_dim}: on Hopper TE's FP8 attention (cuDNN fused attention, the only FP8 "
                       f"backend) was found for head_dim {FP8_ATTENTION_HEAD_DIM}; head_dim 64 has none (measured, "
                       "H200, TE 2.20, cuDNN 9.19)")
    return True, (f"head_dim {head_dim} on Hopper: cuDNN's fused FP8 attention (TE fp8_dpa, delayed or current "
                  "scaling)")


def te_layers(shape: ModelShape) -> dict:
    """TE decoder-layer conversion of the family: supported or not, and why (workbench.backends.hf_families)."""
    if shape.te_layers_refusal:
        return {"supported": False, "reason": shape.te_layers_refusal + "; TE backends fall back to per-Linear "
                                                                       "conversion (options.te_conversion=auto)"}
    return {"supported": True, "reason": f"model_type {shape.model_type!r} has a TE layer adapter "
                                         "(workbench.backends.hf_families): each decoder layer becomes one "
                                         "te.TransformerLayer"}
