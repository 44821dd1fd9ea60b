"""Plain PyTorch in fp32: the numerical reference every other student is compared with."""
from workbench.backends import Backend, register


@register
class TorchFP32(Backend):
    name = "torch_fp32"
    mode = "PyTorch-FP32"
