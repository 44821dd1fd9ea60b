"""What every Transformer Engine student shares (te_bf16, te_fp8 and any later TE backend): `TEBackend`, the
model's layers swapped for TE's (te.Linear, te.LayerNorm, te.RMSNorm, te.LayerNormMLP, te.DotProductAttention)
under torch autocast, and the conversion it runs. Without a usable TE the student runs the PyTorch autocast
fallback, and says why. With bench.graphs, options.te_graph picks what the CUDA graph covers: forward and
backward (te.make_graphed_callables) or the whole step (the trainer's capture_step, as for the torch students).
Private (a leading '_'): not a backend itself, so the registry does not load it as one."""
from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch import nn

from workbench.backends import Backend, Context, amp_dtype, autocast, hf_families, replace_modules, to_param_dtype
from workbench.backends._autocast import Fallback
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
    compilable = False  # dynamo skips TE modules (graph breaks); TE's speed-up route is CUDA graphs
    fp8_recipe = None
    quantized_weights = False  # whether options.te_fp8_weights applies (the FP8 students)
    dtype = torch.bfloat16  # until build() picks fp16 on GPUs without bf16
    attention = "auto"  # options.te_attention, set by convert()

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

    def build(self, reference, cfg, device):
        self.dtype = amp_dtype(device)  # fp16 (+ grad scaler) on GPUs without bf16 (T4)
        return super().build(reference, cfg, device)

    def convert(self, model, cfg, meta: bool = False):
        self.conversion, self.conversion_note = conversion_for(model, cfg)
        head_fp8 = cfg.options.te_head_precision == "fp8" and self.gemm_precision != "bf16"
        self.converted = convert_to_te(model, cfg, self.device, meta, layers=self.conversion == "layer",
                                       head_fp8=head_fp8, fp8_weights=bool(getattr(self, "fp8_weights", False)))
        self.kept_torch = stayed_torch(model, self.converted)
        self.runs_te_attention = any(isinstance(m, (TEAttention, TEDecoderLayer)) for m in model.modules())
        self.attention = cfg.options.te_attention
        return model

    def forward_context(self):
        stack = contextlib.ExitStack()
        if self.runs_te_attention:  # a few microseconds a step: only for students with TE's attention
            stack.enter_context(forced_attention(self.attention))
        for ctx in self.autocasts():
            stack.enter_context(ctx)
        return stack

    def autocasts(self) -> list:
        """The autocast contexts of this student's forward, outermost first."""
        return [autocast(self.device, self.dtype)]

    def describe(self, model):
        """What the conversion swapped and kept, and the attention backend TE selected for this student's
        last forward beside the one requested (options.te_attention): a slower one (unfused) silently costs
        TE its advantage, so the row says which ran."""
        out = {"converted_modules": len(getattr(self, "converted", [])),
               "kept_torch_modules": "; ".join(getattr(self, "kept_torch", []))[:1000] or None,
               "te_conversion": getattr(self, "conversion", None)}
        if getattr(self, "conversion_note", ""):
            out["te_conversion_note"] = self.conversion_note
        if self.runs_te_attention:
            out["attention_requested"] = self.attention
            out["attention_backend"] = selected = te_env.describe_selection(te_env.last_attention_selection())
            ran = (selected or "").split(" ")[0]  # 'fused (sub-backend 1)' -> 'fused'
            if self.attention != "auto" and ran != self.attention:
                out["attention_warning"] = f"options.te_attention={self.attention!r} was requested, TE ran {selected}"
            elif ran == "unfused" and self.attention != "unfused":  # flash-attn absent, cuDNN's fused failed to load
                out["attention_warning"] = ("TE ran its unfused attention, the slowest; `workbench probe` shows "
                                            "TE's reasons (te_attention.log) and `workbench doctor` the fix")
        return out

    def can_graph(self, cfg, device):
        if cfg.distill.loss == "hidden" and self.graph_scope(cfg) == "fwd_bwd":
            return False, "the hidden-state loss returns per-block tensors; TE graphs are captured for the output only"
        return super().can_graph(cfg, device)

    def graph_scope(self, cfg):
        """options.te_graph: 'step' captures the whole step like the torch students (capture_step), 'fwd_bwd'
        graphs forward and backward through te.make_graphed_callables."""
        return cfg.options.te_graph

    def policy(self, cfg, device):
        p = super().policy(cfg, device)
        notes = []
        if cfg.options.te_fp8_weights and not self.quantized_weights:
            notes.append("options.te_fp8_weights not applied: a bf16 student has no FP8 weights")
        if cfg.options.te_fp8_dpa and (self.fp8_recipe is None or not self.runs_te_attention):
            notes.append("options.te_fp8_dpa not applied: " + ("a bf16 student runs no FP8" if self.fp8_recipe is None
                         else "this student does not run TE's attention"))
        hf = bool(cfg.lm.student) and kinds.is_lm(cfg.model.kind)
        if cfg.options.te_head_precision == "fp8" and (not hf or self.gemm_precision == "bf16"):
            notes.append("options.te_head_precision='fp8' not applied: " + (
                "a bf16 student runs no FP8" if hf else "it applies to Hugging Face students (lm.student)"))
        return dataclasses.replace(p, notes=p.notes + tuple(notes)) if notes else p

    def reset_after_capture(self, model):
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

    def make_graphed(self, model, sample_tokens):
        """te.make_graphed_callables over the whole student, captured under this backend's autocast."""
        import inspect

        te, _, _ = te_env.load()
        params = inspect.signature(te.make_graphed_callables).parameters
        kw = {"num_warmup_iters": 3}
        if self.fp8_recipe is not None:  # TE >= 2.9 names them enabled/recipe, older fp8_enabled/fp8_recipe
            kw.update({"enabled": True, "recipe": self.fp8_recipe} if "recipe" in params
                      else {"fp8_enabled": True, "fp8_recipe": self.fp8_recipe})
        # TE keeps the sample arguments as the graph's static inputs and copies every later batch into
        # them: handing it the shared batch itself would overwrite the data every other student uses.
        sample = (sample_tokens.clone(),)
        # Capture selects TE's attention again (its inputs now say "graph"): under the forced backend too.
        # The warm-ups are forwards and backwards that are not training steps: FP8 state is kept as it was.
        with forced_attention(self.attention), self.outside_training(model), autocast(self.device, self.dtype):
            return te.make_graphed_callables(model, sample, **kw)

    def fallback(self, ctx: Context, reason: str):
        if te_usable(ctx)[0]:
            return None  # TE works; whatever is missing (a recipe, a capability) is a skip, not a fallback
        return Fallback()


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
    done = hf_families.convert_layers(te, model, dtype, gemm_kw["device"]) if layers else []
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
