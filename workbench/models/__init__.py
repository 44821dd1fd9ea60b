"""Models, built once in plain torch: the tutorial's MLP teacher and student (mlp) and decoder-only
causal LMs (lm; a Hugging Face model through hf). Precision backends convert copies of them. The names
below are the package's face."""
from workbench.models.mlp import (  # noqa: F401
    FUSED_TO_SEPARATE, LayerNormMLP, Student, Teacher, load_matched, reference_student)
from workbench.models.lm import CausalLM, LMShape, SDPACore, attention_masks  # noqa: F401
