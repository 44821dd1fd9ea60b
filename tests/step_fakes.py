"""Stand-ins (fakes) for train.loop.prepare_step's CPU tests: the task, data and student holder reduced to the
interfaces it reads, torch.compile on dynamo's eager backend, and capture_step recorded instead of capturing (a CUDA
graph needs a GPU)."""
import contextlib
import functools
import types

import torch


def prepare(monkeypatch, model, scope: str, tokens: torch.Tensor):
    """(step, metrics, captures) of prepare_step for `model` compiled at `scope` with a whole-step graph asked for;
    captures lists the capture_step calls."""
    from workbench import config
    from workbench.backends import StepPolicy
    from workbench.train import loop

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    captures = []
    monkeypatch.setattr(loop, "capture_step", lambda *a: captures.append(a) or (lambda tokens, targets: None))
    task = types.SimpleNamespace(forward=lambda m, t: m(t), loss=lambda out, targets: out.float().pow(2).mean())
    data = types.SimpleNamespace(train=[(tokens, None)] * 2)
    student = types.SimpleNamespace(model=model, policy=StepPolicy(compile=True, graph="step"),
                                    forward_context=contextlib.nullcontext)
    cfg = config.from_preset("cpu-smoke", compile=True, compile_scope=scope, device="cpu")
    step, metrics = loop.prepare_step(student, cfg, task, data, torch.device("cpu"))
    return step, metrics, captures
