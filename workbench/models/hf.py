"""The user's own Hugging Face causal LM as teacher or student, offline (needs the `lm` extra: transformers).

`load_causal_lm` reads a local model folder (never the Hub: `local_files_only=True`) or builds a randomly
initialised model from a config object, in fp32 on the CPU like every reference model, and wraps it so it
has CausalLM's interface: `forward(tokens, return_hidden=False)`, `train_flops_per_token()`, and the
reference-state pair the students' matched init uses. Precision backends convert a copy of it like any
torch model: `convert_to_te` replaces each decoder layer of a known family by one te.TransformerLayer
(workbench.backends.hf_families), or swaps its Linear / RMSNorm layers one by one.
"""
from __future__ import annotations

import functools
import json
import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError
from torch import nn
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM, PretrainedConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from workbench.config import ConfigError
from workbench.models import shared_parameters
from workbench.models.lm import HeadFeatures, _head_input, lm_train_flops_per_token


class HFCausalLM(nn.Module):
    """A Hugging Face causal LM behind CausalLM's interface. `seq_len` is the training sequence length,
    which the attention FLOP term needs and a Hugging Face model does not know."""

    def __init__(self, model: nn.Module, seq_len: int | None = None):
        super().__init__()
        self.model = model
        self.seq_len = seq_len

    def forward(self, tokens: torch.Tensor, return_hidden: bool = False, features: bool = False):
        """logits [batch, seq, vocab], or (logits, [hidden per decoder layer]) as the model reports them
        (transformers 5: the last one is after the final norm; layers converted to TE's report theirs by hooks,
        each layer's output); with `features`, the base model's last hidden state and the output embedding's
        weight (HeadFeatures, for the head-fused loss: logits = h @ W^T, which holds for a head without bias,
        scaling or soft-capping)."""
        if features:
            head = self.model.get_output_embeddings()
            if getattr(head, "bias", None) is not None:
                raise ValueError("the head-fused loss computes logits = h @ W^T; this model's LM head has a bias")
            h = self.model.base_model(input_ids=tokens, use_cache=False).last_hidden_state
            return HeadFeatures((_head_input(h, tokens.device), head.weight))
        converted = [m for m in self.model.modules() if hasattr(m, "hf_state")]
        if not (return_hidden and converted):
            out = self.model(input_ids=tokens, use_cache=False, output_hidden_states=return_hidden)
            return (out.logits, list(out.hidden_states[1:])) if return_hidden else out.logits
        hidden: list[torch.Tensor] = []
        hooks = [m.register_forward_hook(lambda _m, _a, out: hidden.append(out)) for m in converted]
        try:
            logits = self.model(input_ids=tokens, use_cache=False).logits
        finally:
            for h in hooks:
                h.remove()
        return logits, hidden

    @property
    def masks_change_under_capture(self) -> bool:
        """Whether transformers' mask code still runs (not CAUSAL_SDPA): it hands the layers a mask tensor inside a
        CUDA graph capture where a warm-up handed None, so layers compiled in place would recompile there."""
        return self.model.config._attn_implementation != CAUSAL_SDPA

    def train_flops_per_token(self, seq_len: int | None = None) -> int:
        """nanochat's estimate (workbench.models.lm.lm_train_flops_per_token) from the model's weight
        matrices and its config's layers, heads and head size."""
        seq_len = seq_len or self.seq_len
        if not seq_len:
            raise ValueError("the attention FLOP term needs the sequence length: pass seq_len to load_causal_lm")
        c = self.model.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return lm_train_flops_per_token(self, c.num_hidden_layers, c.num_attention_heads * head_dim, seq_len)

    def converted_layers(self) -> dict[str, nn.Module]:
        """{name: layer} of the decoder layers a TE conversion replaced by one TE layer each (they know their
        mapping from and to the Hugging Face names: workbench.backends.hf_families)."""
        return {name: m for name, m in self.named_modules() if hasattr(m, "hf_state")}

    def from_reference_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The Hugging Face model's state (the reference's names) under this model's own names: converted
        layers' weights in TE's layout (fused QKV, gate/up), everything else as it is."""
        layers = self.converted_layers()
        out = {k: v for k, v in state.items() if not any(k.startswith(n + ".") for n in layers)}
        for name, layer in layers.items():
            own = {k[len(name) + 1:]: v for k, v in state.items() if k.startswith(name + ".")}
            out.update({f"{name}.{k}": v for k, v in layer.from_hf_state(own).items()})
        return out

    def to_reference_state(self, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """This model's state (`state`: one under its own names, e.g. gathered from shards; default its own)
        under the Hugging Face model's names: what every other student of the run starts from and is
        compared with. A converted layer's frozen zero biases (ones the model has none of) are left out."""
        state = {k: v for k, v in (self.state_dict() if state is None else state).items()
                 if not k.endswith("_extra_state")}
        layers = self.converted_layers()
        out = {k: v for k, v in state.items() if not any(k.startswith(n + ".") for n in layers)}
        for name, layer in layers.items():
            out.update({f"{name}.{k}": v for k, v in layer.hf_state(state, prefix=name + ".").items()})
        return out


def load_causal_lm(path_or_config: str | Path | PretrainedConfig, seq_len: int | None = None) -> HFCausalLM:
    """A local Hugging Face causal LM (a folder written by `save_pretrained`) with its weights, or, from a
    config object, a new one initialised from the caller's torch seed. fp32, CPU, train mode; a teacher
    is put in eval mode by its caller."""
    if isinstance(path_or_config, PretrainedConfig):
        model = AutoModelForCausalLM.from_config(path_or_config, dtype=torch.float32, trust_remote_code=False)
    else:
        refuse_remote_code(path_or_config)
        try:
            model = AutoModelForCausalLM.from_pretrained(path_or_config, dtype=torch.float32, **OFFLINE)
        except (OSError, ValueError, SafetensorError, pickle.UnpicklingError) as e:  # no such folder, no config /
            raise _not_loadable(path_or_config, e) from e  # weights, not a causal LM, damaged, a refused pickle
    if whole_causal_sequences_suffice(model.config, seq_len):  # (why: CAUSAL_SDPA below)
        model.set_attn_implementation(CAUSAL_SDPA)
    return HFCausalLM(model.train(), seq_len)


# Why an attention implementation of our own. The workbench hands a Hugging Face model whole causal sequences from
# position 0 (no padding, no packing: input_ids only), so its attention is SDPA with is_causal=True and no mask.
# transformers gets there at run time: its mask code checks the position ids for packed sequences with a
# data-dependent `.all()` (a host sync every eager step) and, where it cannot read that value -- inside
# torch.compile's trace and inside a CUDA graph capture (its is_tracing() counts a capturing stream) -- it builds
# the full [batch, 1, seq, seq] mask instead. SDPA with a mask cannot use its flash kernel nor native GQA, so the
# compiled and graphed bf16 students would run a slower attention than their eager twin, and a warm-up without
# the mask followed by a capture with it recompiles layers compiled in place inside the capture (which invalidates
# it: results/reference/cpu/hf_mask_under_capture.txt). A name transformers has no mask function for gets no mask
# (masking_utils returns None up front), and this function calls transformers' own SDPA attention without one.
CAUSAL_SDPA = "workbench_causal_sdpa"


def _causal_sdpa(module, query, key, value, attention_mask, **kwargs):
    return sdpa_attention_forward(module, query, key, value, None, **kwargs)


AttentionInterface.register(CAUSAL_SDPA, _causal_sdpa)


def whole_causal_sequences_suffice(config: PretrainedConfig, seq_len: int | None) -> bool:
    """Whether causal SDPA without a mask computes what the model's own masks would on whole sequences of
    `seq_len`: it uses SDPA (not eager or flash attention, which the user chose), and every layer attends to all
    earlier positions -- full attention, or a sliding window no shorter than the sequence (Gemma 3's, Mistral's,
    Phi-3's at a short seq_len); any other layer type (chunked attention) keeps transformers' masks."""
    if config._attn_implementation != "sdpa":
        return False
    types = set(getattr(config, "layer_types", None) or ())
    if types - {"full_attention", "sliding_attention"}:
        return False
    window = getattr(config, "sliding_window", None)
    if window is None or types == {"full_attention"}:
        return True
    return seq_len is not None and window >= seq_len


# Every transformers call: the local folder only, and never the folder's own Python (a config or tokenizer with an
# `auto_map` names modules in the folder, which transformers would otherwise offer to run, asking on a terminal)
OFFLINE = dict(local_files_only=True, trust_remote_code=False)
REMOTE_CODE_FILES = ("config.json", "tokenizer_config.json")


def refuse_remote_code(path: str | Path) -> None:
    """ConfigError if the folder at `path` asks for its own code (`auto_map` in its config or tokenizer
    config): the workbench runs only transformers' own model classes. A missing or unreadable file is left to
    the loader that reads it (it says what is wrong)."""
    for name in REMOTE_CODE_FILES:
        try:
            auto_map = json.loads((Path(path) / name).read_text()).get("auto_map")
        except (OSError, ValueError, AttributeError):
            continue
        if auto_map:
            raise ConfigError(f"the Hugging Face folder {str(path)!r} asks to run its own code ({name}'s auto_map: "
                              f"{json.dumps(auto_map)[:200]}); the workbench never runs a model folder's code "
                              "(trust_remote_code=False): use a model of a family transformers ships")


POSITION_FIELDS = ("n_positions", "max_position_embeddings")  # GPT-2's name, and Llama's (most others')


def check_folder(path: str, field: str, seq_len: int) -> None:
    """ConfigError naming `field` unless `path` holds a Hugging Face causal LM config whose position limit
    (n_positions / max_position_embeddings, where it has one) covers `seq_len`: from the config alone,
    before any text is tokenized or any teacher trained."""
    try:
        config = read_config(path)
    except ConfigError as e:  # a folder that asks to run its own code: named by the field that points at it
        raise ConfigError(f"{field}: {e}") from e
    except (OSError, ValueError) as e:
        raise ConfigError(f"{field}: {_not_loadable(path, e)}") from e
    for name in POSITION_FIELDS:
        limit = getattr(config, name, None)
        if isinstance(limit, int) and limit < seq_len:
            raise ConfigError(f"{field}: the Hugging Face model at {path!r} has {name}={limit} positions, fewer than "
                              f"model.seq_len={seq_len}; set model.seq_len to at most {limit}")


@functools.lru_cache(maxsize=8)
def linear_shapes(path: str, tied_head: bool = False) -> dict[str, tuple[int, int]]:
    """{name: (in_features, out_features)} of every nn.Linear of the local causal LM at `path` but a tied one
    (`tied_head`: a tied LM head too, which an FP8 head runs as a GEMM), from its config alone (built on the
    meta device: no weights read, no memory): what a size check (FP8's multiples of 16) needs before any
    student exists. Names as in HFCausalLM.model."""
    try:
        config = read_config(path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise _not_loadable(path, e) from e
    shared = shared_parameters(model)  # a tied LM head stays torch: its vocabulary is no FP8 GEMM
    head = model.get_output_embeddings() if tied_head else None
    return {name: (m.in_features, m.out_features) for name, m in model.named_modules()
            if isinstance(m, nn.Linear)
            and (m is head or not any(id(p) in shared for p in m.parameters(recurse=False)))}


@functools.lru_cache(maxsize=8)
def config_vocab(path: str) -> int:
    """The embedding's rows (config.vocab_size) of the local causal LM at `path`, from its config alone: the
    run's model.vocab, which may exceed its tokenizer's vocabulary (a padded embedding)."""
    try:
        config = read_config(path)
    except (OSError, ValueError) as e:
        raise _not_loadable(path, e) from e
    vocab = getattr(config.get_text_config(), "vocab_size", None)
    if not vocab:
        raise ConfigError(f"the Hugging Face config in {path!r} names no vocab_size")
    return int(vocab)


PROVENANCE_FILES = ("hf_prune.json", "hf_import.json", "hf_init.json")  # what `workbench hf-*` wrote beside the weights


def provenance(path: str | Path) -> dict:
    """The folder and where it came from (hf-prune / hf-import / hf-init's json), for task.json."""
    out: dict = {"folder": str(path)}
    for name in PROVENANCE_FILES:
        try:
            out[name.removesuffix(".json")] = json.loads((Path(path) / name).read_text())
        except (OSError, ValueError):
            continue
    return out


def read_config(path: str | Path):
    """The folder's transformers config, offline, after the remote-code refusal."""
    refuse_remote_code(path)
    return AutoConfig.from_pretrained(path, **OFFLINE)


def _not_loadable(path, e: Exception) -> ConfigError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return ConfigError(f"no Hugging Face causal LM loads from {str(path)!r} (offline): {first}")
