"""A Hugging Face decoder's layers as Transformer Engine's own, one adapter per model family (one file each,
registered by its `model_types`): each decoder layer becomes one te.TransformerLayer (or, where TE's layer
cannot hold the family's maths, the TE modules that can: Gemma 3), its weights mapped in, so attention runs
in TE's fused kernels and every projection's norm, casts and bias live inside TE's fused modules. The TE
backends call `refusal` and `convert_layers` (options.te_conversion); a model `refusal` names a reason for
keeps the per-Linear conversion under 'auto'.

Adding a family is one file here: a class extending `llama.Llama` (the common maths) with `@register`; the
files are discovered. What a family cannot do in TE is said by name (`REFUSED`, an adapter's `refusal`).
"""
from __future__ import annotations

import importlib
import pkgutil

import torch
from torch import nn

from workbench.backends.hf_families.common import decoder_layers

ADAPTERS: dict[str, object] = {}  # config.model_type -> its adapter (an instance of a `register`ed class)
# Families whose layers TE's modules cannot hold, and why (said in the row; 'auto' falls back to per-Linear)
REFUSED = {
    "olmo2": "OLMo2 normalises each sublayer's output (post-norm) and q/k across all heads; TE's "
             "TransformerLayer is pre-norm with per-head q/k norms",
    "mixtral": "a mixture-of-experts MLP (router and experts); TE's TransformerLayer has one dense MLP",
    "qwen2_moe": "a mixture-of-experts MLP (router, experts, shared expert); TE's TransformerLayer has one dense MLP",
    "qwen3_moe": "a mixture-of-experts MLP (router and experts); TE's TransformerLayer has one dense MLP",
}
MOE_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")


def register(cls: type) -> type:
    for kind in cls.model_types:
        ADAPTERS[kind] = cls()
    return cls


def _discover() -> None:
    """Import every family file of this folder; each registers itself ('common' is the shared part)."""
    for mod in pkgutil.iter_modules(__path__):
        if mod.name != "common":
            importlib.import_module(f"{__name__}.{mod.name}")


def refusal(hf_model: nn.Module, seq_len: int | None) -> str:
    """Why this Hugging Face causal LM's layers cannot become TE layers ('' when they can)."""
    kind = getattr(hf_model.config, "model_type", None)
    if kind in REFUSED:
        return f"model_type {kind!r}: {REFUSED[kind]}"
    if any(getattr(hf_model.config, f, None) for f in MOE_FIELDS):
        return f"model_type {kind!r} has mixture-of-experts layers; TE's TransformerLayer has one dense MLP"
    if kind not in ADAPTERS:
        return f"no decoder-layer conversion for model_type {kind!r} (known: {', '.join(sorted(ADAPTERS))})"
    return ADAPTERS[kind].refusal(hf_model, seq_len)


def convert_layers(te, lm: nn.Module, dtype: torch.dtype, device, qkv_format: str = "bshd") -> list[str]:
    """Replace every decoder layer of `lm` (an HFCausalLM) by its family's TE layer holding its weights; returns
    the replaced modules' names (as `replace_modules` names them). Call after `refusal` said ''.
    `qkv_format`: options.te_qkv_format (TEDecoderLayer says how)."""
    hf = lm.model
    adapter = ADAPTERS[hf.config.model_type]
    shape, seq_len = adapter.shape(hf), getattr(lm, "seq_len", None)
    ropes = adapter.ropes(te, hf, shape, seq_len)
    layers = decoder_layers(hf)
    done = []
    for i, old in enumerate(layers):
        key = adapter.rope_key(hf.config, i)
        new = adapter.make_layer(te, hf, shape, None if key is None else ropes[key], i, dtype, device, seq_len,
                                 qkv_format=qkv_format)
        new.load_hf_state(dict(old.state_dict()))
        layers[i] = new
        done.append(f"model.model.layers.{i}")
    if qkv_format == "sbhd" and len(layers):  # the stack turns sequence-first once, and back once
        layers[0].enters_sbhd = layers[-1].leaves_sbhd = True
    return done


_discover()
