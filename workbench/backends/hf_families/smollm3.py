"""SmolLM3: Llama's maths with RoPE off on the layers its config marks (`no_rope_layers[i] == 0`: NoPE
layers, every fourth by default); those TE layers get no rotary angles."""
from workbench.backends.hf_families import register
from workbench.backends.hf_families.llama import Llama


@register
class SmolLM3(Llama):
    model_types = ("smollm3",)

    def rope_key(self, config, index: int) -> str | None:
        flags = getattr(config, "no_rope_layers", None)
        return "default" if flags is None or flags[index] else None

    def window(self, config, index: int) -> int | None:
        return super().window(config, index) if getattr(config, "use_sliding_window", False) else None
