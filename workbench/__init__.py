"""TE distillation & benchmarking workbench.

Pipeline, one module per concern:
  probe / install / doctor -> config -> models -> backends/ -> distill, train -> timing, flops
  -> runner (one run) -> results (files) -> plots -> notebook (papermill driver) -> cli
"""
__version__ = "0.1.0"
