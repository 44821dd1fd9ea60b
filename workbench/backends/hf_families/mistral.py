"""Mistral: Llama's layer with one sliding window for every layer (config.sliding_window, None: full
attention), which TE's layer runs as its own window_size."""
from workbench.backends.hf_families import register
from workbench.backends.hf_families.llama import Llama


@register
class Mistral(Llama):
    model_types = ("mistral",)

    def window(self, config, index: int) -> int | None:
        return getattr(config, "sliding_window", None)
