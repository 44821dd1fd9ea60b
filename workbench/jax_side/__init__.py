"""The JAX/Flax side of the bench: the tutorial's MLP student (student.py) and the causal LM (lm_student.py) in Flax,
measured comparators of the torch rows.

Not a second workbench: the same teacher targets, the same batches, the same starting weights (converted from the
torch students' shared init, `convert`; checked by an equal initial loss), the same loss and AdamW settings, and
one ordinary row with `framework: "jax"` (`runner.run`), which a run asks for as the backends `jax:fp32` /
`jax:bf16` (workbench/backends/jax_flax.py). Where jax, flax or optax is missing the row is 'skipped'
with the reason (`workbench.env.jax.availability`); nothing here imports jax until a row runs.

On a GPU with TE's JAX extension, `jax:fp8_current` runs the same student's GEMMs in TE-JAX's FP8 current scaling
(student.TE_RECIPES); `workbench.env.jax.Availability.fp8_reason` says why it cannot run where it cannot.
"""
