"""torch autocast as a student's whole precision recipe: the base of the torch autocast students (and of
torchao's float8, which runs its GEMMs inside bf16 autocast), and the fallback a TE student runs when TE
cannot. Private (a leading '_'): the registry does not load it as a backend."""
from __future__ import annotations

import functools

import torch

from workbench.backends import PRECISION, Backend, Student, amp_dtype, autocast, converted, step_policy


class Autocast(Backend):
    """A student whose forward runs under torch autocast in `dtype`."""

    dtype = torch.bfloat16

    @property
    def gemm_precision(self) -> str:
        return PRECISION[self.dtype]

    def prepare(self, reference, cfg, device, ranks=None) -> Student:
        return autocast_student(self, converted(self, reference, cfg, device), cfg, device, self.dtype,
                                self.gemm_precision)


def autocast_student(backend: Backend, model, cfg, device, dtype, precision: str) -> Student:
    return Student(model, step_policy(backend, cfg, device, dtype), precision, dtype=dtype,
                   forward_context=functools.partial(autocast, device, dtype))


class Fallback(Autocast):
    """What a TE student runs when TE cannot: torch autocast in bf16, or fp16 + grad scaler on GPUs
    without bf16 (the tutorial's 'Fallback-PyTorch'). Not registered: reached only through TE backends."""

    name = "fallback"
    mode = "Fallback-PyTorch"

    def prepare(self, reference, cfg, device, ranks=None) -> Student:
        dtype = amp_dtype(device)
        return autocast_student(self, converted(self, reference, cfg, device), cfg, device, dtype, PRECISION[dtype])
