"""Models, built once in plain torch: the tutorial's MLP teacher and student (mlp). Precision backends
convert copies of them. The names below are the package's face."""
from workbench.models.mlp import (  # noqa: F401
    FUSED_TO_SEPARATE, LayerNormMLP, Student, Teacher, load_matched, reference_student)
