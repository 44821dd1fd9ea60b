"""TE distillation & benchmarking workbench.

Pipeline, one module per concern:
  env/ (probe, install, doctor, TE import) -> config -> models/ -> backends/ -> train/ (objectives, loop)
  -> timing, flops
  -> runner (one run) -> results (files) -> plots -> notebook (papermill driver) -> cli
"""
__version__ = "0.1.0"
