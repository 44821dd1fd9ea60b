"""The JAX/Flax student (`jax:fp32`, `jax:bf16`, and TE-JAX FP8 `jax:fp8_current`): the tutorial's MLP, or at an LM
shape (model.kind gpt / llama) the causal LM (workbench.jax_side.lm_student); a comparator row beside the torch
students, `framework: jax`. It trains on the same batches and teacher targets from the same
starting weights (the reference model's, converted) and is timed the JAX way (a compiled step, block_until_ready,
compile apart). Its framework trains it: the runner asks a student's `framework` and hands a 'jax' one to
workbench.jax_side (a layer above this one). Where jax, flax or optax is missing (for FP8: TE-JAX, a GPU), or jax
would run on the CPU beside a CUDA torch, its row is 'skipped' with the reason (workbench.env.jax)."""
from __future__ import annotations

from workbench import config
from workbench.backends import Backend, register
from workbench.env import jax as jax_env


@register
class JaxFlax(Backend):
    name = "jax"
    recipes = ("fp32", "bf16", "fp8_current")  # fp8_current: TE-JAX's Float8CurrentScaling (workbench.jax_side)
    mode = "JAX"
    framework = "jax"

    def __init__(self, recipe: str | None = None):
        super().__init__(recipe)
        # what its GEMMs compute in ('fp8_current': fp8): the peak its row is measured against
        self.gemm_precision = self.recipe.split("_")[0]

    def availability(self, ctx) -> tuple[bool, str]:
        cfg = ctx.cfg
        if config.kind_task(cfg.model.kind) == "lm" and cfg.lm.student:
            return False, ("the JAX LM student is workbench's own CausalLM (model.kind gpt / llama); a Hugging Face "
                           f"student (lm.student {cfg.lm.student!r}) has no Flax counterpart here")
        if ctx.cfg.parallel.nproc > 1:
            return False, "the JAX student runs on one process (parallel.nproc 1): it has no data-parallel wrapper"
        avail = jax_env.availability()
        reason = avail.fp8_reason if self.gemm_precision == "fp8" else avail.reason
        if not reason and ctx.device.type == "cuda" and not avail.gpu:  # its step would be timed on the CPU
            reason = ("jax sees no GPU (a CPU-only jax beside a CUDA torch): install jax's CUDA plugin "
                      "(pip install 'jax[cuda12]' or 'jax[cuda13]', as torch's CUDA)")
        return not reason, reason
