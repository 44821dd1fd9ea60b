"""Transformer Engine student in bf16 (fp16 on GPUs without bf16): the model's layers swapped for TE's
under torch autocast (`_te.TEBackend`, which every TE student shares)."""
from workbench.backends import register
from workbench.backends._te import TEBackend


@register
class TEBF16(TEBackend):
    name = "te_bf16"
    mode = "TE-BF16/FP16"
