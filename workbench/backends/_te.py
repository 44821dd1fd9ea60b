"""What every Transformer Engine student shares (te_bf16, te_fp8 and any later TE backend): `TEBackend`, the
model's layers swapped for TE's (te.Linear, te.LayerNorm, te.RMSNorm, te.LayerNormMLP, te.DotProductAttention)
under torch autocast, and the conversion it runs. Without a usable TE the student runs the PyTorch autocast
fallback, and says why. With bench.graphs, options.te_graph picks what the CUDA graph covers: forward and
backward (te.make_graphed_callables) or the whole step (the trainer's capture_step, as for the torch students).
Private (a leading '_'): not a backend itself, so the registry does not load it as one."""
from __future__ import annotations

import copy
import dataclasses
import functools

import torch
from torch import nn

from workbench.backends import (
    PRECISION,
    Backend,
    Context,
    StepPolicy,
    Student,
    amp_dtype,
    check_matched,
    hf_families,
    replace_modules,
    step_policy,
    to_param_dtype,
)
from workbench.backends._autocast import Fallback
from workbench.backends._te_run import TERun, describe, reset_fp8_scaling
from workbench.backends.hf_families.common import TEDecoderLayer
from workbench.config import ConfigError
from workbench.env import te as te_env
from workbench.models import LayerNormMLP, SDPACore, kinds, shared_parameters


def te_usable(ctx: Context) -> tuple[bool, str]:
    te, _, why = te_env.load()
    if te is None:
        return False, why
    if ctx.device.type != "cuda":
        return False, "Transformer Engine runs on CUDA GPUs only; this run's device is cpu"
    return True, ""


class TEBackend(Backend):
    """A TE student in bf16 (fp16 on GPUs without bf16); the FP8 students add their recipe's autocast."""

    family = "te"
    bf16_counterparts = ("te_bf16", "torch_bf16")
    compiled = "never"  # dynamo skips TE modules (graph breaks); TE's speed-up route is CUDA graphs
    gemm_precision = "bf16"  # fp16 where the GPU has no bf16: the prepared student says
    quantized_weights = False  # whether options.te_fp8_weights applies (the FP8 students)

    def availability(self, ctx: Context) -> tuple[bool, str]:
        ok, why = te_usable(ctx)
        if not ok:
            return ok, why
        ok, why = attention_available(ctx.cfg)
        if not ok:
            return ok, why
        te, _, _ = te_env.load()
        ok, why = te_env.check(getattr(te, "is_bf16_available", None), "bf16")
        return True, ("" if ok else f"no bf16 ({why}); running TE in fp16")

    def convert(self, model, cfg):
        """TE's layers in place of the model's, made on the device the model is on."""
        device = next(model.parameters()).device
        to_te(model, cfg, device, head_fp8=head_fp8(cfg, self.gemm_precision))
        return model

    def prepare(self, reference, cfg, device, ranks=None) -> Student:
        dtype = amp_dtype(device)  # fp16 (+ grad scaler) on GPUs without bf16 (T4)
        model = copy.deepcopy(reference)
        report = to_te(model, cfg, device, head_fp8=head_fp8(cfg, PRECISION[dtype]))
        check_matched(model, reference)
        run = TERun(device, dtype, cfg.options.te_attention, report.te_attention)
        return self.student(model.to(device), cfg, run, report)

    def student(self, model, cfg, run: TERun, report: Conversion, **kw) -> Student:
        """The prepared TE student of `model` (converted as `report` says), its forward run as `run` says."""
        return Student(model, self.policy(cfg, run, report.layout), run.precision(self), dtype=run.dtype,
                       forward_context=run.context, outside_training=functools.partial(run.outside_training, model),
                       reset_after_capture=functools.partial(reset_fp8_scaling, model),
                       describe=functools.partial(describe, report, run.te_attention and run.attention),
                       make_graphed=run.make_graphed, converted=report.swapped, **kw)

    def policy(self, cfg, run: TERun, layout: str | None = None) -> StepPolicy:
        """The step policy of a student whose forward runs as `run` says and whose model was converted as `layout`
        says (Conversion.layout), with the notes on the TE switches that do not apply to it. options.te_graph:
        'step' captures the whole step like the torch students (capture_step), 'fwd_bwd' graphs forward and
        backward through te.make_graphed_callables."""
        scope = cfg.options.te_graph
        why = ""
        if cfg.options.te_fp8_weights and self.quantized_weights:
            # TE's FusedAdam refuses capturable=True with FP8 weights, and an eager update of FP8 weights
            # between replays of a forward/backward graph is a path TE does not document
            why = "FP8 weights (options.te_fp8_weights) are updated by TE's FusedAdam outside any graph"
        elif cfg.distill.loss == "hidden" and scope == "fwd_bwd":
            why = "the hidden-state loss returns per-block tensors; TE graphs are captured for the output only"
        p = step_policy(self, cfg, run.device, run.dtype, (scope, why), te_attention=run.te_attention)
        notes = []
        if cfg.options.te_fp8_weights and not self.quantized_weights:
            notes.append("options.te_fp8_weights not applied: a bf16 student has no FP8 weights")
        if cfg.options.te_fp8_dpa and (run.recipe is None or not run.te_attention):
            notes.append("options.te_fp8_dpa not applied: " + ("a bf16 student runs no FP8" if run.recipe is None
                         else "this student does not run TE's attention"))
        if cfg.options.te_qkv_format != "bshd" and layout != "layer":  # a switch of TE's decoder layers
            notes.append(f"options.te_qkv_format={cfg.options.te_qkv_format!r} not applied: it applies to Hugging Face "
                         "students converted by decoder layer (options.te_conversion)")
        hf = bool(cfg.lm.student) and kinds.is_lm(cfg.model.kind)
        if cfg.options.te_head_precision == "fp8" and (not hf or run.precision(self) == "bf16"):
            notes.append("options.te_head_precision='fp8' not applied: " + (
                "a bf16 student runs no FP8" if hf else "it applies to Hugging Face students (lm.student)"))
        return dataclasses.replace(p, notes=p.notes + tuple(notes)) if notes else p

    def fallback(self, ctx: Context, reason: str):
        if te_usable(ctx)[0]:
            return None  # TE works; whatever is missing (a recipe, a capability) is a skip, not a fallback
        return Fallback()


def head_fp8(cfg, precision: str) -> bool:
    """Whether a Hugging Face student's LM head becomes a te.Linear (options.te_head_precision='fp8')."""
    return cfg.options.te_head_precision == "fp8" and precision != "bf16"


@dataclasses.dataclass(frozen=True)
class Conversion:
    """What a TE conversion swapped and kept: the report a row carries."""

    swapped: tuple[str, ...]  # the modules replaced by TE's, by name
    kept_torch: tuple[str, ...]  # 'name (Class)' of what stayed torch (`stayed_torch`)
    layout: str | None  # 'layer' or 'linear' for a Hugging Face model (`conversion_for`); None for ours
    note: str  # why options.te_conversion='auto' fell back to 'linear'
    te_attention: bool  # whether the student runs TE's attention


def to_te(model: nn.Module, cfg, device, meta: bool = False, head_fp8: bool = False,
          fp8_weights: bool = False) -> Conversion:
    """`convert_to_te` of `model`, in place, as options.te_conversion asks (`conversion_for`), and its report."""
    layout, note = conversion_for(model, cfg)
    swapped = convert_to_te(model, cfg, device, meta, layers=layout == "layer", head_fp8=head_fp8,
                            fp8_weights=fp8_weights)
    te_attention = any(isinstance(m, (TEAttention, TEDecoderLayer)) for m in model.modules())
    return Conversion(tuple(swapped), tuple(stayed_torch(model, swapped)), layout, note, te_attention)


def attention_available(cfg) -> tuple[bool, str]:
    """What can be said before any forward: a forced 'flash' needs flash-attn, which TE says it lacks.
    (Whether fused or unfused runs for these shapes TE decides at the first forward: `forced_attention`.)"""
    uses_te_attention = kinds.is_lm(cfg.model.kind) and not cfg.lm.student  # a Hugging Face model keeps its own
    if uses_te_attention and cfg.options.te_attention == "flash" and te_env.flash_attention_installed() is False:
        return False, ("options.te_attention='flash' forces TE's flash attention, but TE finds no flash-attn "
                       "installed (pip install flash-attn), or set options.te_attention=auto")
    return True, ""


def conversion_for(model: nn.Module, cfg) -> tuple[str | None, str]:
    """(conversion, note) for `model` under options.te_conversion: 'layer' or 'linear' for a Hugging Face model
    (None for the workbench's own models, whose TE layout is their own), and why 'auto' fell back to 'linear'.
    'layer' forced on a model it cannot convert raises, naming the field."""
    if not hasattr(model, "converted_layers"):
        return None, ""
    choice = cfg.options.te_conversion
    if choice == "linear":
        return "linear", ""
    why = hf_families.refusal(model.model, getattr(model, "seq_len", None))
    if not why:
        return "layer", ""
    if choice == "layer":
        raise ConfigError(f"options.te_conversion='layer' cannot convert this model: {why}; set "
                          "options.te_conversion to 'auto' or 'linear'")
    return "linear", f"per-Linear conversion: {why}"


def convert_to_te(model: nn.Module, cfg, device, meta: bool = False, layers: bool = False,
                  head_fp8: bool = False, fp8_weights: bool = False) -> list[str]:
    """Swap every layer TE has a counterpart for, copying the weights: nn.Linear -> te.Linear,
    nn.LayerNorm -> te.LayerNorm, RMSNorms (torch's, and a Hugging Face model's own) -> te.RMSNorm, the
    fused LayerNormMLP -> te.LayerNormMLP (TE's GELU is the tanh form, like ours) and the LMs' attention
    core SDPACore -> te.DotProductAttention. Generic, so it also converts a Hugging Face model; embeddings
    stay torch's, in the students' parameter dtype. Returns the names of what was swapped; `stayed_torch`
    names what was not. `meta`: the GEMM layers (te.Linear, te.LayerNormMLP, the ones with FP8 weights) are
    made on the meta device without their weights, which TE's FSDP2 recipe gives them after sharding.

    A Hugging Face model (`layers`: see `conversion_for`) first has each decoder layer replaced by one
    te.TransformerLayer (workbench.backends.hf_families); its LM head stays torch (bf16, as every peer keeps
    it) unless `head_fp8`: then it is a te.Linear, sharing the embedding's weight when the two are tied."""
    te, _, _ = te_env.load()
    dtype = torch.bfloat16 if cfg.model.param_dtype == "bf16" else torch.float32
    to_param_dtype(model, cfg)  # before the swap: TE modules keep FP8 state that a later .to(dtype) must not touch
    shared = shared_parameters(model)
    kw = {"params_dtype": dtype, "device": device}
    gemm_kw = {**kw, "device": "meta"} if meta else kw
    done = hf_families.convert_layers(te, model, dtype, gemm_kw["device"], qkv_format=cfg.options.te_qkv_format) \
        if layers else []
    head = model.model.get_output_embeddings() if hasattr(model, "converted_layers") else None
    if head is not None and head_fp8:
        done.append(_fp8_head(te, model, head, shared, gemm_kw, meta or fp8_weights))

    def swap(m: nn.Module):
        if head is not None and m is head:
            return None  # a Hugging Face model's LM head: bf16 torch, or already TE's (head_fp8)
        if any(id(p) in shared for p in m.parameters(recurse=False)):
            return None  # a tied weight (an LM head tied to the embedding): a copy would untie it
        if isinstance(m, SDPACore):
            return TEAttention(te, m.heads, m.head_dim)
        if isinstance(m, LayerNormMLP):
            new = te.LayerNormMLP(m.fc1_weight.shape[1], m.fc1_weight.shape[0], eps=m.eps, **gemm_kw)
        elif isinstance(m, nn.Linear):
            new = te.Linear(m.in_features, m.out_features, bias=m.bias is not None, **gemm_kw)
        elif isinstance(m, nn.LayerNorm) and m.weight is not None and m.bias is not None:
            new = te.LayerNorm(m.normalized_shape[0], eps=m.eps, **kw)
        elif (eps := rmsnorm_eps(m)) is not None:
            new = te.RMSNorm(m.weight.shape[0], eps=eps, **kw)
        else:
            return None
        if meta and isinstance(new, (te.Linear, te.LayerNormMLP)):
            return new
        missing, unexpected = new.load_state_dict(m.state_dict(), strict=False)
        if unexpected or [k for k in missing if not k.endswith("_extra_state")]:
            raise RuntimeError(f"TE {type(new).__name__} does not take {type(m).__name__}'s weights: "
                               f"{missing} {unexpected}")
        return new

    return done + replace_modules(model, swap, skip=tuple(done))


def _fp8_head(te, model: nn.Module, head: nn.Linear, shared: set[int], kw: dict, fp8_weights: bool) -> str:
    """The Hugging Face model's LM head as a te.Linear (options.te_head_precision='fp8'), its weight copied, or,
    tied to the embedding, that very Parameter (so the two stay one tensor, trained as one)."""
    tied = id(head.weight) in shared
    meta = kw["device"] == "meta"
    if tied and fp8_weights:
        raise ConfigError("options.te_head_precision='fp8' with a head tied to the embedding shares the "
                          "embedding's weight, which cannot be an FP8 weight (options.te_fp8_weights): untie the "
                          "head in the model, or set options.te_head_precision='bf16'")
    new = te.Linear(head.in_features, head.out_features, bias=head.bias is not None, **kw)
    if tied:
        new.weight = head.weight  # the embedding's Parameter itself
    elif not meta:
        new.load_state_dict(head.state_dict(), strict=False)
    model.model.set_output_embeddings(new)
    return "model.lm_head"


class TEAttention(nn.Module):
    """te.DotProductAttention in SDPACore's place: causal, q/k/v in 'bshd', out [batch, seq, heads*head_dim].
    No dropout: students differ by precision only."""

    def __init__(self, te, heads: int, head_dim: int):
        super().__init__()
        self.attn = te.DotProductAttention(heads, head_dim, attn_mask_type="causal", qkv_format="bshd",
                                           attention_dropout=0.0)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, s = q.shape[:2]
        return self.attn(q, k, v).reshape(b, s, -1)


def rmsnorm_eps(m: nn.Module) -> float | None:
    """The epsilon of an RMSNorm te.RMSNorm computes exactly, or None if `m` is not one.

    torch.nn.RMSNorm with a weight; or a Hugging Face style one (class name ending in 'RMSNorm', a 1-D
    `weight`, `eps` or `variance_epsilon`) that, probed on a fixed input, computes x / rms(x) * weight:
    some (Gemma's) scale by (1 + weight) instead, and a swap would silently change the model."""
    if isinstance(m, nn.RMSNorm):
        if m.weight is None:
            return None
        # torch's default eps is the input dtype's machine epsilon; the parameters' dtype is the input's
        return m.eps if m.eps is not None else torch.finfo(m.weight.dtype).eps
    weight = getattr(m, "weight", None)
    eps = getattr(m, "eps", getattr(m, "variance_epsilon", None))
    if (not type(m).__name__.endswith("RMSNorm") or not isinstance(weight, torch.Tensor) or weight.dim() != 1
            or eps is None):
        return None
    # a fixed probe, not random: a conversion must not move the caller's RNG stream
    x = torch.linspace(-3.0, 2.0, 2 * weight.shape[0], device=weight.device).view(2, -1)
    with torch.no_grad():
        plain = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        tol = 1e-5 if weight.dtype == torch.float32 else 2e-2  # bf16/fp16 weights: their rounding
        plain_rms = torch.allclose(m(x.to(weight.dtype)).float(), plain, rtol=tol, atol=tol)
    return float(eps) if plain_rms else None


def stayed_torch(model: nn.Module, swapped: list[str]) -> list[str]:
    """What a TE conversion left in torch, as 'name (Class)': every leaf module it did not swap
    (embeddings, activations, rotary tables, a tied head) and every attention module with no TE core
    inside (a Hugging Face model's own attention maths: its projections are swapped, the softmax(QK^T)V
    between them runs in torch)."""
    done = tuple(swapped)

    def inside(name: str) -> bool:
        return any(name == s or name.startswith(s + ".") for s in done)

    kept = []
    for name, m in model.named_modules():
        if not name or inside(name):
            continue
        leaf = next(m.children(), None) is None
        torch_attention = "Attention" in type(m).__name__ and not any(isinstance(c, TEAttention) for c in m.modules())
        if leaf or torch_attention:
            kept.append(f"{name} ({type(m).__name__})")
    return kept
