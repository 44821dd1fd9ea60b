"""The GEMM dimensions a low-precision backend needs to be multiples of (FP8 kernels: 16, MXFP8: 32, NVFP4:
128), checked before a student is built; shared by every FP8 backend (TE's, torchao's). Private: not a backend."""
from __future__ import annotations

from workbench.models import kinds


def misaligned(cfg, multiple: int) -> list[str]:
    """Names of the GEMM dimensions that are not multiples of `multiple` (FP8 kernels need them). A Hugging
    Face student (lm.student) brings its own: every Linear's features are checked, not the config's fields."""
    m = cfg.model
    dims = {"tokens (batch*seq_len)": m.batch * m.seq_len}
    lm = kinds.is_lm(m.kind)
    if lm and cfg.lm.student:
        from workbench.models.hf import linear_shapes  # needs transformers (the `lm` extra), like lm.student

        head_fp8 = cfg.options.te_head_precision == "fp8"  # otherwise the LM head stays bf16: no FP8 GEMM
        for name, (fan_in, fan_out) in linear_shapes(cfg.lm.student, tied_head=head_fp8).items():
            if name == "lm_head" and not head_fp8:
                continue
            dims.setdefault(f"{name}.in_features", fan_in)
            dims.setdefault(f"{name}.out_features", fan_out)
    else:
        dims.update({"model.hidden": m.hidden, "model.intermediate": m.intermediate})
        if lm:  # the LM head is a GEMM over the vocabulary
            dims["model.vocab"] = m.vocab
    return not_multiples(dims, multiple)


def not_multiples(dims: dict[str, int], multiple: int) -> list[str]:
    """'name=value' for every dimension that is not a multiple of `multiple`: the first four and a count."""
    bad = [f"{k}={v}" for k, v in dims.items() if v % multiple]
    return bad if len(bad) <= 4 else [*bad[:4], f"and {len(bad) - 4} more"]
