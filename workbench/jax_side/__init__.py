"""The JAX/Flax side of the bench: the tutorial's MLP student in Flax as a measured comparator of the torch rows.

Not a second workbench: the same teacher targets, the same batches, the same starting weights (converted from the
torch students' shared init, `convert`; checked by an equal initial loss), the same loss and AdamW settings, and
one ordinary row with `framework: "jax"` (`runner.run`), which a run asks for as the backends `jax:fp32` /
`jax:bf16` (workbench/backends/jax_flax.py). Where jax, flax or optax is missing the row is 'skipped'
with the reason (`workbench.env.jax.availability`); nothing here imports jax until a row runs.

Later, on a GPU: the te_flax student (DenseGeneral / LayerNormMLP under TE-JAX's fp8_autocast), which
`probe.Availability.fp8_reason` gates.
"""
