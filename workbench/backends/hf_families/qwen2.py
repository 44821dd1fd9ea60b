"""Qwen2 / Qwen2.5: Llama's layer with a bias on q, k and v (TE's layer then has biases on all four GEMMs:
the ones Qwen2 lacks are zero and frozen); sliding layers, where `use_sliding_window` makes some, by
`layer_types` as in Llama's adapter."""
from workbench.backends.hf_families import register
from workbench.backends.hf_families.llama import Llama


@register
class Qwen2(Llama):
    model_types = ("qwen2",)
