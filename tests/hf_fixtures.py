"""Hugging Face model folders for CPU tests, shared by the tests of several folders."""
import pytest


def tiny_llama(folder, vocab: int, layers: int):
    """A randomly initialised tiny Llama saved as a local Hugging Face model folder (skips without transformers)."""
    transformers = pytest.importorskip("transformers")
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=128)).save_pretrained(folder)
    return folder
