"""The user's own Hugging Face causal LM as teacher or student, offline (needs the `lm` extra: transformers).

`load_causal_lm` reads a local model folder (never the Hub: `local_files_only=True`) or builds a randomly
initialised model from a config object, in fp32 on the CPU like every reference model, and wraps it so it
has CausalLM's interface: `forward(tokens, return_hidden=False)`, `train_flops_per_token()`, and the
reference-state pair the students' matched init uses. Precision backends convert a copy of it like any
torch model (`convert_to_te` swaps its Linear / RMSNorm layers; its attention maths stays torch's).
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from workbench.errors import ConfigError
from workbench.models import shared_parameters
from workbench.models.lm import lm_train_flops_per_token


class HFCausalLM(nn.Module):
    """A Hugging Face causal LM behind CausalLM's interface. `seq_len` is the training sequence length,
    which the attention FLOP term needs and a Hugging Face model does not know."""

    def __init__(self, model: nn.Module, seq_len: int | None = None):
        super().__init__()
        self.model = model
        self.seq_len = seq_len

    def forward(self, tokens: torch.Tensor, return_hidden: bool = False, features: bool = False):
        """logits [batch, seq, vocab], or (logits, [hidden per decoder layer]) as the model reports them
        (transformers 5: the last one is after the final norm); with `features`, the base model's last
        hidden state and the output embedding's weight (HeadFeatures, for the head-fused loss: logits
        = h @ W^T, which holds for a head without bias, scaling or soft-capping)."""
        if features:
            from workbench.models.lm import _head_input
            from workbench.train.head_loss import HeadFeatures

            head = self.model.get_output_embeddings()
            if getattr(head, "bias", None) is not None:
                raise ValueError("the head-fused loss computes logits = h @ W^T; this model's LM head has a bias")
            h = self.model.base_model(input_ids=tokens, use_cache=False).last_hidden_state
            return HeadFeatures((_head_input(h, tokens.device), head.weight))
        out = self.model(input_ids=tokens, use_cache=False, output_hidden_states=return_hidden)
        return (out.logits, list(out.hidden_states[1:])) if return_hidden else out.logits

    def train_flops_per_token(self, seq_len: int | None = None) -> int:
        """nanochat's estimate (workbench.models.lm.lm_train_flops_per_token) from the model's weight
        matrices and its config's layers, heads and head size."""
        seq_len = seq_len or self.seq_len
        if not seq_len:
            raise ValueError("the attention FLOP term needs the sequence length: pass seq_len to load_causal_lm")
        c = self.model.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return lm_train_flops_per_token(self, c.num_hidden_layers, c.num_attention_heads * head_dim, seq_len)

    def from_reference_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return state

    def to_reference_state(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if not k.endswith("_extra_state")}


def load_causal_lm(path_or_config: str | Path | PretrainedConfig, seq_len: int | None = None) -> HFCausalLM:
    """A local Hugging Face causal LM (a folder written by `save_pretrained`) with its weights, or, from a
    config object, a new one initialised from the caller's torch seed. fp32, CPU, train mode; a teacher
    is put in eval mode by its caller."""
    if isinstance(path_or_config, PretrainedConfig):
        model = AutoModelForCausalLM.from_config(path_or_config, dtype=torch.float32)
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(path_or_config, local_files_only=True, dtype=torch.float32)
        except (OSError, ValueError) as e:  # no such folder, no config / weights in it, not a causal LM
            raise _not_loadable(path_or_config, e) from e
    return HFCausalLM(model.train(), seq_len)


@functools.lru_cache(maxsize=8)
def linear_shapes(path: str) -> dict[str, tuple[int, int]]:
    """{name: (in_features, out_features)} of every nn.Linear of the local causal LM at `path` but a tied one,
    from its config alone (built on the meta device: no weights read, no memory): what a size check (FP8's multiples
    of 16) needs before any student exists. Names as in HFCausalLM.model."""
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError) as e:
        raise _not_loadable(path, e) from e
    shared = shared_parameters(model)  # a tied LM head stays torch: its vocabulary is no FP8 GEMM
    return {name: (m.in_features, m.out_features) for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and not any(id(p) in shared for p in m.parameters(recurse=False))}


def _not_loadable(path, e: Exception) -> ConfigError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return ConfigError(f"no Hugging Face causal LM loads from {str(path)!r} (offline): {first}")
