"""Models, built once in plain torch: the tutorial's MLP teacher and student (mlp) and decoder-only
causal LMs (lm; a Hugging Face model through hf). Precision backends convert copies of them. Which
model.kind is which (task, architecture) says the registry in `kinds`. The names below are the package's face."""
import collections

from torch import nn

from workbench.models import kinds  # noqa: F401
from workbench.models.lm import CausalLM, LMShape, SDPACore, attention_masks  # noqa: F401
from workbench.models.mlp import FUSED_TO_SEPARATE, LayerNormMLP, Student, Teacher, load_matched, reference_student  # noqa: F401


def shared_parameters(model: nn.Module) -> set[int]:
    """ids of parameters that more than one module owns (tied weights: an LM head tied to the embedding).
    A TE conversion leaves their modules in torch (a copy would untie them), so no size check counts them."""
    owners = collections.Counter(id(p) for m in model.modules() for p in m.parameters(recurse=False))
    return {i for i, n in owners.items() if n > 1}
