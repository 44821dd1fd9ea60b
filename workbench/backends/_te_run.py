"""How a Transformer Engine student's forward runs (`TERun`: torch autocast, TE's attention as
options.te_attention forces it, TE's FP8 autocast with the student's recipe), what keeps forwards that are not
training steps from moving FP8 scaling state, and the row cells a TE student reports (`describe`). Private: not
a backend."""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, ContextManager

import torch

from workbench.backends import PRECISION, Backend, autocast
from workbench.env import te as te_env


class AttentionUnavailable(RuntimeError):
    """The attention backend options.te_attention forces cannot run for this student here."""


@contextlib.contextmanager
def forced_attention(choice: str):
    """Wraps a TE student's forward: TE's attention switches set for `choice` (see `te_env.force_attention`),
    and TE's "no backend available" (what a forced backend that cannot run here gives) said in those words."""
    te_env.force_attention(choice)
    try:
        yield
    except ValueError as e:
        if choice == "auto" or "No dot product attention backend" not in str(e):
            raise
        raise AttentionUnavailable(
            f"options.te_attention={choice!r} forces TE's {choice} attention, which TE cannot run for this student "
            f"here (TE: {e}); `workbench probe` shows TE's reasons (te_attention.log), options.te_attention=auto "
            "lets TE pick") from e


def describe(report, attention: str | bool) -> dict:
    """What the conversion swapped and kept, and the attention backend TE selected for this student's last
    forward beside the one requested (options.te_attention): a slower one (unfused) silently costs TE its
    advantage, so the row says which ran."""
    out = {"converted_modules": len(report.swapped),
           "kept_torch_modules": "; ".join(report.kept_torch)[:1000] or None, "te_conversion": report.layout}
    if report.note:
        out["te_conversion_note"] = report.note
    if attention:  # options.te_attention of a student that runs TE's attention
        out["attention_requested"] = attention
        out["attention_backend"] = selected = te_env.describe_selection(te_env.last_attention_selection())
        ran = (selected or "").split(" ")[0]  # 'fused (sub-backend 1)' -> 'fused'
        if attention != "auto" and ran != attention:
            out["attention_warning"] = f"options.te_attention={attention!r} was requested, TE ran {selected}"
        elif ran == "unfused" and attention != "unfused":  # flash-attn absent, cuDNN's fused failed to load
            out["attention_warning"] = ("TE ran its unfused attention, the slowest; `workbench probe` shows "
                                        "TE's reasons (te_attention.log) and `workbench doctor` the fix")
    return out


def reset_fp8_scaling(model) -> None:
    """Back to fresh delayed-scaling state, in place: scale 1 and an empty amax history, as a new module
    has them (what TE's reset_fp8_meta_tensors() writes; done here per state, since that method assumes
    every state is a delayed-scaling one). Current and block scaling keep no state between steps."""
    with torch.no_grad():
        for m in model.modules():
            meta = getattr(m, "fp8_meta", None)
            for key in ("scaling_fwd", "scaling_bwd"):
                state = meta.get(key) if isinstance(meta, dict) else None
                if hasattr(state, "amax_history") and hasattr(state, "scale"):
                    state.scale.fill_(1.0)
                    state.amax_history.zero_()


@dataclasses.dataclass(frozen=True)
class TERun:
    """How a TE student's forward runs: torch autocast in `dtype` on `device`, TE's attention forced as
    `attention` (options.te_attention) asks, and for the FP8 students TE's autocast with `recipe`."""

    device: torch.device
    dtype: torch.dtype
    attention: str = "auto"
    te_attention: bool = False  # whether the student runs TE's attention (else `attention` does not apply)
    recipe: Any = None  # TE's recipe object; None: no FP8
    group: Any = None  # the process group TE reduces amaxes over (None: TE's default)
    fp8_dpa: bool = False  # FP8 attention (options.te_fp8_dpa)

    def context(self) -> ContextManager:
        stack = contextlib.ExitStack()
        if self.te_attention:  # a few microseconds a step: only for students with TE's attention
            stack.enter_context(forced_attention(self.attention))
        stack.enter_context(autocast(self.device, self.dtype))
        if self.recipe is not None:  # exactly the bf16 students' autocast, then TE's FP8 one
            te, _, _ = te_env.load()
            stack.enter_context(te_env.autocast(te, self.recipe, self.group))
        if self.fp8_dpa and self.te_attention:
            stack.enter_context(fp8_attention_refusal())
        return stack

    def precision(self, backend: Backend) -> str:
        """The GEMM precision of a student run so: the FP8 students' recipe's, else this autocast's."""
        return backend.gemm_precision if self.recipe is not None else PRECISION[self.dtype]

    def outside_training(self, model) -> ContextManager:
        delayed = getattr(self.recipe, "delayed", None)
        return kept_fp8_scaling(model) if callable(delayed) and delayed() else contextlib.nullcontext()

    def make_graphed(self, model, sample_tokens):
        """te.make_graphed_callables over the whole student, captured under this student's autocast."""
        import inspect

        te, _, _ = te_env.load()
        params = inspect.signature(te.make_graphed_callables).parameters
        kw = {"num_warmup_iters": 3}
        if self.recipe is not None:  # TE >= 2.9 names them enabled/recipe, older fp8_enabled/fp8_recipe
            kw.update({"enabled": True, "recipe": self.recipe} if "recipe" in params
                      else {"fp8_enabled": True, "fp8_recipe": self.recipe})
        # TE keeps the sample arguments as the graph's static inputs and copies every later batch into
        # them: handing it the shared batch itself would overwrite the data every other student uses.
        sample = (sample_tokens.clone(),)
        # Capture selects TE's attention again (its inputs now say "graph"): under the forced backend too.
        # The warm-ups are forwards and backwards that are not training steps: FP8 state is kept as it was.
        with forced_attention(self.attention), self.outside_training(model), autocast(self.device, self.dtype):
            return te.make_graphed_callables(model, sample, **kw)


@contextlib.contextmanager
def fp8_attention_refusal():
    """TE's "no attention backend" under options.te_fp8_dpa, said in the option's words: FP8 attention runs in
    cuDNN's fused attention only, which refuses some shapes (on the H200 with TE 2.20 / cuDNN 9.19: head
    size 64), and TE's unfused attention does not do FP8."""
    try:
        yield
    except ValueError as e:
        if "No dot product attention backend" not in str(e):
            raise
        raise RuntimeError(
            "options.te_fp8_dpa=true: TE has no FP8 attention backend for this student's attention here (FP8 "
            "attention runs in cuDNN's fused attention only; NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2 prints TE's reasons, "
            f"`workbench probe` writes them to te_attention.log); set options.te_fp8_dpa=false (TE: {e})") from e


@contextlib.contextmanager
def kept_fp8_scaling(model):
    """Delayed scaling's state as it is on entry, put back on exit: every TE module's scale and amax
    history. Forwards that are not training steps (held-out evaluation, graph-capture warm-ups) record
    their amaxes there and would move the scales the next training steps quantise with.

    Through TE's own get_fp8_meta_tensors / reset_fp8_meta_tensors (what te.make_graphed_callables does
    around its warm-ups), which copy into the same tensors: a captured CUDA graph still reads them. Not
    get_extra_state / set_extra_state: that pickles (TE 2.20 refuses to load a delayed-scaling pickle
    without NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1), synchronizes the device and also overwrites the
    modules' bookkeeping in fp8_meta. A module not yet initialised for FP8 on entry returns to TE's
    initial state (scale 1, empty history), which is what its first training step would have found."""
    modules = [m for m in model.modules()
               if hasattr(m, "get_fp8_meta_tensors") and hasattr(m, "reset_fp8_meta_tensors")]
    saved = [m.get_fp8_meta_tensors() for m in modules]
    try:
        yield
    finally:
        for m, state in zip(modules, saved):
            m.reset_fp8_meta_tensors(state)
