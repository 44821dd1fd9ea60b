"""Weights between the PyTorch MLP student and the Flax one, in numpy only (no jax, no torch needed).

The torch side is the reference layout's state (`workbench.backends.reference_state`: embed, norms.i, fc1.i,
fc2.i, head; the fused layout maps to these names too). The Flax side is `FlaxStudent`'s params tree. A torch
Linear keeps its weight as [out, in] and computes x @ W.T; a Flax Dense keeps its kernel as [in, out] and computes
x @ K, so K = W.T. Transposes and copies are exact: a round trip gives back the same bits.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np

_BLOCK_KEY = re.compile(r"norms\.(\d+)\.weight")


def _numpy(value: Any) -> np.ndarray:
    """A torch tensor (fp32: the reference state's dtype) or any array, as a numpy array of its own."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.array(value, copy=True)


def layers_of(state: dict[str, Any]) -> int:
    """How many MLP blocks a reference-layout state holds."""
    return len([k for k in state if _BLOCK_KEY.fullmatch(k)])


def _dense(state: dict[str, Any], name: str) -> dict[str, np.ndarray]:
    return {"kernel": np.ascontiguousarray(_numpy(state[f"{name}.weight"]).T), "bias": _numpy(state[f"{name}.bias"])}


def to_flax(state: dict[str, Any]) -> dict[str, dict[str, np.ndarray]]:
    """The torch student's reference-layout state -> FlaxStudent's params (fails on a missing or extra key)."""
    params: dict[str, dict[str, np.ndarray]] = {"embed": {"embedding": _numpy(state["embed.weight"])}}
    for i in range(layers_of(state)):
        params[f"norms_{i}"] = {"scale": _numpy(state[f"norms.{i}.weight"]), "bias": _numpy(state[f"norms.{i}.bias"])}
        params[f"fc1_{i}"] = _dense(state, f"fc1.{i}")
        params[f"fc2_{i}"] = _dense(state, f"fc2.{i}")
    params["head"] = _dense(state, "head")
    extra = set(state) - set(torch_names(layers_of(state)))
    if extra:  # a weight the Flax student has no place for: the students would not start identical
        raise ValueError(f"torch state has weights the Flax student lacks: {sorted(extra)[:5]}")
    return params


def torch_names(layers: int) -> list[str]:
    """The reference-layout weight names of a student with `layers` blocks: what to_flax has a place for."""
    per_block = [f"{m}.{i}.{p}" for i in range(layers) for m in ("norms", "fc1", "fc2") for p in ("weight", "bias")]
    return ["embed.weight", *per_block, "head.weight", "head.bias"]


def to_torch(params: dict[str, Any]) -> dict[str, np.ndarray]:
    """FlaxStudent's params -> the torch student's reference-layout state, as numpy arrays (torch.from_numpy
    each to load them)."""
    state = {"embed.weight": _numpy(params["embed"]["embedding"])}
    layers = len([k for k in params if k.startswith("norms_")])
    for i in range(layers):
        state[f"norms.{i}.weight"] = _numpy(params[f"norms_{i}"]["scale"])
        state[f"norms.{i}.bias"] = _numpy(params[f"norms_{i}"]["bias"])
        for fc in ("fc1", "fc2"):
            state[f"{fc}.{i}.weight"] = np.ascontiguousarray(_numpy(params[f"{fc}_{i}"]["kernel"]).T)
            state[f"{fc}.{i}.bias"] = _numpy(params[f"{fc}_{i}"]["bias"])
    state["head.weight"] = np.ascontiguousarray(_numpy(params["head"]["kernel"]).T)
    state["head.bias"] = _numpy(params["head"]["bias"])
    return state


# ---- the causal LM (workbench.models.lm.CausalLM <-> lm_student.FlaxCausalLM) ----------------------------------
# A module's Flax name is its torch path with '.' as '_' (blocks.0.attn.qkv -> blocks_0_attn_qkv); its parameters:
# an Embedding's weight is `embedding`, a Linear's [out, in] weight the [in, out] `kernel`, a norm's weight `scale`,
# every bias `bias`. Which is which follows from the name and the rank, so one rule serves gpt and llama.
LM_EMBEDDINGS = ("embed", "pos")


def _lm_param(module: str, param: str, rank: int) -> str:
    if param == "bias":
        return "bias"
    if module in LM_EMBEDDINGS:
        return "embedding"
    return "kernel" if rank == 2 else "scale"


def lm_to_flax(state: dict[str, Any]) -> dict[str, dict[str, np.ndarray]]:
    """A CausalLM's reference state (torch names) -> FlaxCausalLM's params."""
    params: dict[str, dict[str, np.ndarray]] = {}
    for name, value in state.items():
        module, _, param = name.rpartition(".")
        array = _numpy(value)
        flax_param = _lm_param(module, param, array.ndim)
        params.setdefault(module.replace(".", "_"), {})[flax_param] = (
            np.ascontiguousarray(array.T) if flax_param == "kernel" else array)
    return params


def lm_to_torch(params: dict[str, Any], names: list[str]) -> dict[str, np.ndarray]:
    """FlaxCausalLM's params -> the CausalLM state of the torch `names` (its state_dict's keys), as numpy arrays;
    fails on a name the params lack or a parameter no name takes."""
    state, used = {}, set()
    for name in names:
        module, _, param = name.rpartition(".")
        flax_module = module.replace(".", "_")
        kernel_or_other = [p for p in params.get(flax_module, {}) if p != "bias"]
        flax_param = "bias" if param == "bias" else (kernel_or_other[0] if len(kernel_or_other) == 1 else None)
        if flax_param is None or flax_param not in params.get(flax_module, {}):
            raise KeyError(f"the Flax params have no place for torch's {name!r}")
        array = _numpy(params[flax_module][flax_param])
        state[name] = np.ascontiguousarray(array.T) if flax_param == "kernel" else array
        used.add((flax_module, flax_param))
    unused = [f"{m}/{p}" for m, ps in params.items() for p in ps if (m, p) not in used]
    if unused:
        raise ValueError(f"Flax params with no torch name: {unused[:5]}")
    return state
