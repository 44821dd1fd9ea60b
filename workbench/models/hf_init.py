"""`workbench hf-init`: a randomly initialised Hugging Face causal LM at a real model's shape, with a tokenizer
trained here, so the whole Hugging Face path (`lm.student=DIR`, `lm.teacher=DIR`) runs offline, no download.

    python -m workbench hf-init llama-3.2-1b-4l --out models/llama-4l
    python -m workbench hf-init tiny-qwen2 --out /tmp/tiny-qwen2 --vocab 1024 --dtype fp32

The folder holds what `save_pretrained` writes (config.json, model.safetensors in --dtype), a byte-level BPE
tokenizer trained on the built-in corpus's train split (workbench.data.text: the held-out pieces stay unseen)
and saved as a PreTrainedTokenizerFast (tokenizer.json, tokenizer_config.json), and hf_init.json last (the
shape, seed, corpus and sizes; its presence says the folder is complete). The folder is written beside its
destination and renamed into place, so a stopped call leaves no half model. The tokenizer is trained to the
model's vocabulary and may come out smaller (the corpus runs out of merges): a padded embedding, as real
models have. Shapes follow the published configs; RoPE scaling (Llama 3's long-context rule, Phi-4-mini's
longrope) is left out: the models are random, their speed is what they are for. A `-4l` shape is the bench's
cut of its model: 4 layers, vocabulary 32768.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from workbench.config import ConfigError

# name -> the Hugging Face config fields (model_type first); numbers from the models' published config.json
_LLAMA_1B = dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                 num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256, rope_theta=500_000.0,
                 rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=True)
_QWEN3_06B = dict(model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                  rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=40960, tie_word_embeddings=True)
# Gemma 3 1B's text model: global layers RoPE theta 1e6, sliding (512) layers 1e4, five sliding to one global
_GEMMA3_1B = dict(model_type="gemma3_text", hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                  num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
                  query_pre_attn_scalar=256, sliding_window=512, rms_norm_eps=1e-6, max_position_embeddings=32768,
                  tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh",
                  rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}})
# Phi-4-mini: partial rotary (0.75 of head_dim 128); its long-context 'longrope' scaling is left out (below)
_PHI4_MINI = dict(model_type="phi3", hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                  num_attention_heads=24, num_key_value_heads=8, vocab_size=200064, rms_norm_eps=1e-5,
                  max_position_embeddings=131072, tie_word_embeddings=True, sliding_window=None,
                  rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.75})
# SmolLM3-3B: every fourth layer without RoPE (no_rope_layer_interval 4, the config's default)
_SMOLLM3_3B = dict(model_type="smollm3", hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                   num_attention_heads=16, num_key_value_heads=4, vocab_size=128256, rope_theta=5_000_000.0,
                   rms_norm_eps=1e-6, max_position_embeddings=65536, tie_word_embeddings=True)
_CUT = {"num_hidden_layers": 4, "vocab_size": 32768}  # the bench's cut: 4 layers, a 32768 vocabulary
_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=512, rms_norm_eps=1e-6, max_position_embeddings=512, tie_word_embeddings=True)
SHAPES: dict[str, dict] = {
    "llama-3.2-1b": _LLAMA_1B,
    "llama-3.2-1b-4l": {**_LLAMA_1B, "num_hidden_layers": 4, "vocab_size": 32768},  # the bench's cut
    # Qwen2's q/k/v projections carry a bias by construction (no config field)
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, rope_theta=1_000_000.0,
                         rms_norm_eps=1e-6, max_position_embeddings=32768, tie_word_embeddings=True),
    "qwen3-0.6b": _QWEN3_06B, "qwen3-0.6b-4l": {**_QWEN3_06B, **_CUT},
    # SmolLM2-135M: the config of the registry's GGUF as `workbench hf-import` writes it (results/reference/h200/real)
    "smollm2-135m": dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                         rope_theta=100_000.0, rms_norm_eps=1e-5, max_position_embeddings=8192,
                         tie_word_embeddings=True),
    "gemma-3-1b": _GEMMA3_1B,  # the cut keeps one global layer after its sliding ones, as the model has
    "gemma-3-1b-4l": {**_GEMMA3_1B, **_CUT, "layer_types": ["sliding_attention"] * 3 + ["full_attention"]},
    "phi-4-mini": _PHI4_MINI, "phi-4-mini-4l": {**_PHI4_MINI, **_CUT},
    "smollm3-3b": _SMOLLM3_3B, "smollm3-3b-4l": {**_SMOLLM3_3B, **_CUT},
    # CPU-sized, GQA (4 query heads, 2 KV heads) and tied like the real ones; each family's own trait kept
    "tiny-llama": dict(model_type="llama", **_TINY, rope_theta=500_000.0),
    "tiny-qwen2": dict(model_type="qwen2", **_TINY, rope_theta=1_000_000.0),
    "tiny-qwen3": dict(model_type="qwen3", **_TINY, head_dim=32, rope_theta=1_000_000.0),
    "tiny-gemma3": dict(model_type="gemma3_text", **{**_TINY, "num_hidden_layers": 3}, head_dim=16,
                        query_pre_attn_scalar=16, sliding_window=8, layer_types=["sliding_attention"] * 2 + [
                            "full_attention"], hidden_activation="gelu_pytorch_tanh",
                        rope_parameters=_GEMMA3_1B["rope_parameters"]),
    "tiny-phi3": dict(model_type="phi3", **_TINY, sliding_window=None,
                      rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.75}),
    "tiny-smollm3": dict(model_type="smollm3", **{**_TINY, "num_hidden_layers": 4}, rope_theta=5_000_000.0),
}
DTYPES = ("bf16", "fp32")


def hf_config(shape: str, vocab: int | None = None, eot_id: int = 0):
    """The transformers config of a named shape (vocab_size replaced by `vocab`), end of text at `eot_id`."""
    from transformers import AutoConfig

    if shape not in SHAPES:
        raise ConfigError(f"hf-init shape {shape!r} is not one of {', '.join(SHAPES)}")
    if vocab is not None and not vocab >= 320:
        raise ConfigError(f"hf-init --vocab {vocab}: at least 320 (256 bytes, end of text, merges)")
    fields = dict(SHAPES[shape], **({"vocab_size": vocab} if vocab else {}))
    model_type = fields.pop("model_type")
    if "rope_theta" in fields:
        fields["rope_parameters"] = {"rope_type": "default", "rope_theta": fields.pop("rope_theta")}
    return AutoConfig.for_model(model_type, **fields, bos_token_id=eot_id, eos_token_id=eot_id, pad_token_id=eot_id)


def train_tokenizer(vocab_size: int, corpus_mb: float = 4.0):
    """A byte-level BPE trained here on the built-in corpus's train split, as a PreTrainedTokenizerFast whose
    end-of-text token (also its BOS) separates texts."""
    from transformers import PreTrainedTokenizerFast

    from workbench.data import text

    spec = text.TextSpec(max_bytes=int(corpus_mb * 1e6))
    train = text.split_pieces(text.pieces(text.documents(spec)), spec.heldout_fraction)["train"]
    tok = text.train_bpe([t for _, t in train], vocab_size)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=text.EOT, bos_token=text.EOT)


def write(shape: str, out: str | Path, vocab: int | None = None, dtype: str = "bf16", seed: int = 0,
          corpus_mb: float = 4.0) -> Path:
    """Write the randomly initialised model of `shape` and its tokenizer to the new folder `out`; return it."""
    import torch
    from transformers import AutoModelForCausalLM

    from workbench.results import check_new_folder, staged_folder, write_json

    if dtype not in DTYPES:
        raise ConfigError(f"hf-init --dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    out = check_new_folder(out, "hf-init --out")
    t0 = time.monotonic()
    config = hf_config(shape, vocab)  # before the slow part: a bad shape or vocab fails at once
    tok = train_tokenizer(config.vocab_size, corpus_mb)
    config = hf_config(shape, vocab, eot_id=tok.eos_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
    with staged_folder(out) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        write_json(tmp / "hf_init.json", {
            "shape": shape, "model_type": config.model_type, "vocab_size": config.vocab_size,
            "tokenizer_vocab": len(tok), "parameters": sum(p.numel() for p in model.parameters()),
            "dtype": dtype, "seed": seed, "tokenizer_corpus_mb": corpus_mb, "write_s": round(time.monotonic() - t0, 2)})
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("shape", choices=list(SHAPES), help="the model shape to write")
    p.add_argument("--out", required=True, help="the new model folder (absent or empty)")
    p.add_argument("--vocab", type=int, default=None, help="vocab_size in place of the shape's (at least 320)")
    p.add_argument("--dtype", choices=DTYPES, default="bf16", help="weights' dtype in model.safetensors")
    p.add_argument("--seed", type=int, default=0, help="torch seed of the random initialisation")
    p.add_argument("--corpus-mb", type=float, default=4.0, help="MB of the built-in corpus the tokenizer is trained on")


def main(args: argparse.Namespace) -> int:
    import json

    folder = write(args.shape, args.out, vocab=args.vocab, dtype=args.dtype, seed=args.seed, corpus_mb=args.corpus_mb)
    print(json.dumps({"folder": str(folder), **json.loads((folder / "hf_init.json").read_text())}))
    return 0
