"""A named *fake* of transformer_engine.pytorch's layer classes for CPU tests (real TE cannot exist on a
CPU machine; the real conversion runs on the H200): TE's constructor signatures, parameter names and
semantics (attention masks: True = masked out), torch's maths. Two pieces of TE's state are modelled as TE
keeps them (TE 2.20): delayed scaling's per-module scale and amax history (te.Linear under `autocast`), and
the process-wide attention selection `_attention_backends`, made from the NVTE_*_ATTN switches whenever it is
(re)made; and TE's deferred initialisation of layers made on the meta device (`_DeferredInit`, TE's FSDP2
recipe). `FakeRecipes` stands in for transformer_engine.common.recipe; `FakeTE` answers TE's capability
checks (is_*_available) only."""
import contextlib
import os

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from workbench.models import LayerNormMLP

E4M3_MAX = 448.0
# What this fake machine's TE can run (as on the H200: no flash-attn). Tests change it.
AVAILABLE = {"flash": False, "fused": True, "unfused": True}
# TE's cache of its last attention selection (dot_product_attention.py), same keys
_attention_backends = {"attention_params": None, "use_flash_attention": None, "flash_attention_backend": None,
                       "use_fused_attention": None, "fused_attention_backend": None, "use_unfused_attention": None,
                       "backend_selection_requires_update": False}


class FakeRecipes:
    """transformer_engine.common.recipe: recipes record what they were built with (and compare as dicts)."""

    class Format:
        HYBRID, E4M3 = "HYBRID", "E4M3"

    class DelayedScaling(dict):
        def __init__(self, **kw):
            super().__init__(kw)

        def delayed(self):
            return True

    class Float8CurrentScaling(dict):  # stateless: no amax history
        def delayed(self):
            return False

    class Float8BlockScaling(Float8CurrentScaling):
        pass

    class MXFP8BlockScaling(Float8CurrentScaling):
        pass

    class NVFP4BlockScaling(Float8CurrentScaling):
        pass


class _ScalingState:
    """One direction of TE's DelayedScalingRecipeState: the fields TE's get/reset_fp8_meta_tensors touch."""

    def __init__(self, history_len: int):
        self.scale = torch.ones(1)
        self.amax_history = torch.zeros(history_len, 1)


class _DeferredInit:
    """TE's deferred initialisation (module/base.py, TE 2.20): a layer made with device="meta" has no values until
    its reset_parameters materialises every parameter, an FSDP2 DTensor's local shard included, with TE's own
    random init (rewrapped in a new DTensor Parameter). The fake's weights stay plain tensors (not FP8); `log`
    records each call and whether the parameters were sharded by then."""

    log: list = []

    def reset_parameters(self):
        if torch.get_default_device().type == "meta":  # nn.Linear's constructor calling it: deferred, as in TE
            return None
        if not any(p.is_meta for p in self.parameters(recurse=False)):
            return super().reset_parameters()  # nn.Linear's own, at construction
        sharded = all(isinstance(p, DTensor) for p in self.parameters(recurse=False))
        _DeferredInit.log.append(("reset_parameters", type(self).__name__, sharded))
        for name, p in list(self.named_parameters(recurse=False)):
            local = torch.empty_like(p.to_local() if sharded else p, device="cpu").normal_()
            if sharded:
                local = DTensor.from_local(local, p.device_mesh, p.placements, shape=p.size(), stride=p.stride())
            setattr(self, name, torch.nn.Parameter(local))


def _on(device):
    """Where a fake TE layer is made: TE's device="meta" defers its initialisation (see _DeferredInit)."""
    return torch.device("meta") if str(device) == "meta" else contextlib.nullcontext()


class FakeTEModules:
    _recipe = None  # the recipe of the enclosing `autocast`
    quantized_model_init_calls: list = []  # (enabled, recipe) of each te.quantized_model_init

    @staticmethod
    @contextlib.contextmanager
    def quantized_model_init(enabled=True, recipe=None, preserve_high_precision_init_val=False):
        FakeTEModules.quantized_model_init_calls.append((enabled, recipe))
        yield

    @staticmethod
    @contextlib.contextmanager
    def autocast(enabled=True, calibrating=False, recipe=None, amax_reduction_group=None):
        previous, FakeTEModules._recipe = FakeTEModules._recipe, (recipe if enabled else None)
        try:
            yield
        finally:
            FakeTEModules._recipe = previous

    class Linear(_DeferredInit, torch.nn.Linear):
        """nn.Linear; under a delayed-scaling `autocast` its input is rounded through E4M3 with the scale of
        the amax history so far, and this forward's amax enters the history (TE updates at autocast exit)."""

        def __init__(self, in_features, out_features, bias=True, params_dtype=None, device="cuda"):
            with _on(device):
                super().__init__(in_features, out_features, bias=bias, dtype=params_dtype)
            self.fp8_meta = {}

        def forward(self, x):
            recipe = FakeTEModules._recipe
            if recipe is None or not recipe.delayed():
                return super().forward(x)
            if "scaling_fwd" not in self.fp8_meta:
                self.fp8_meta["scaling_fwd"] = _ScalingState(recipe.get("amax_history_len", 1024))
            meta = self.fp8_meta["scaling_fwd"]
            rounded = (x.float() * meta.scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() / meta.scale
            q = x + (rounded.to(x.dtype) - x).detach()  # straight-through, as FP8 training's gradient
            with torch.no_grad():
                meta.amax_history.copy_(meta.amax_history.roll(1, 0))
                meta.amax_history[0] = x.abs().max().float()
                recent = recipe.get("amax_compute_algo", "max") == "most_recent"
                amax = meta.amax_history[0] if recent else meta.amax_history.max(0).values
                meta.scale.copy_(E4M3_MAX / amax.clamp_min(1e-12))
            return F.linear(q, self.weight, self.bias)

        def get_fp8_meta_tensors(self):
            """TE's: clones of [scale, amax_history] per direction; None before the first FP8 forward."""
            if "scaling_fwd" not in self.fp8_meta:
                return None
            m = self.fp8_meta["scaling_fwd"]
            return {"scaling_fwd": [m.scale.clone(), m.amax_history.clone()]}

        def reset_fp8_meta_tensors(self, fp8_meta_tensors=None):
            """TE's: copied back into the same tensors; None resets to the initial scale 1, empty history."""
            m = self.fp8_meta.get("scaling_fwd")
            if m is None:
                return
            with torch.no_grad():
                if fp8_meta_tensors is None:
                    m.scale.fill_(1.0)
                    m.amax_history.zero_()
                else:
                    m.scale.copy_(fp8_meta_tensors["scaling_fwd"][0])
                    m.amax_history.copy_(fp8_meta_tensors["scaling_fwd"][1])

    class LayerNorm(torch.nn.LayerNorm):
        def __init__(self, hidden_size, eps=1e-5, params_dtype=None, device="cuda"):
            super().__init__(hidden_size, eps=eps, dtype=params_dtype)

    class RMSNorm(torch.nn.RMSNorm):
        """x / rms(x) * weight, or * (1 + weight) with zero_centered_gamma (TE's; its weight then starts at 0)."""

        def __init__(self, hidden_size, eps=1e-5, sequence_parallel=None, params_dtype=None,
                     zero_centered_gamma=False, device="cuda"):
            super().__init__(hidden_size, eps=eps, dtype=params_dtype)
            self.zero_centered_gamma = zero_centered_gamma
            if zero_centered_gamma:
                torch.nn.init.zeros_(self.weight)

        def forward(self, x):
            if not self.zero_centered_gamma:
                return super().forward(x)
            return _rms(x, 1.0 + self.weight.float(), self.eps).to(x.dtype)

    class LayerNormMLP(_DeferredInit, LayerNormMLP):
        """TE's LayerNormMLP: LayerNorm + tanh-GELU with biases (the workbench's fused layout), or, as the Hugging
        Face conversion builds it, RMSNorm (zero-centered or not) + a gated activation (fc1 = [gate; up],
        'swiglu' / 'geglu' with tanh-GELU, as TE's), with or without biases."""

        def __init__(self, hidden_size, ffn_hidden_size, eps=1e-5, bias=True, normalization="LayerNorm",
                     activation="gelu", zero_centered_gamma=False, params_dtype=None, device="cuda"):
            with _on(device):
                super().__init__(hidden_size, ffn_hidden_size, eps)
            self.normalization, self.activation = normalization, activation
            self.zero_centered_gamma = zero_centered_gamma
            if (normalization, activation, bias) == ("LayerNorm", "gelu", True):
                return
            assert normalization == "RMSNorm" and activation in ("swiglu", "geglu"), "the fake does these only"
            del self.layer_norm_bias
            if zero_centered_gamma:
                torch.nn.init.zeros_(self.layer_norm_weight)
            with _on(device):
                self.fc1_weight = torch.nn.Parameter(torch.empty(2 * ffn_hidden_size, hidden_size).normal_(0, 0.02))
            if not bias:
                del self.fc1_bias, self.fc2_bias
            else:
                self.fc1_bias = torch.nn.Parameter(torch.zeros(2 * ffn_hidden_size))
            if params_dtype is not None:
                self.to(params_dtype)

        def forward(self, x):
            if self.normalization == "LayerNorm":
                return super().forward(x)
            w = self.layer_norm_weight.float() + 1.0 if self.zero_centered_gamma else self.layer_norm_weight
            gate, up = F.linear(_rms(x, w, self.eps), self.fc1_weight, getattr(self, "fc1_bias", None)).chunk(2, -1)
            act = F.silu(gate) if self.activation == "swiglu" else F.gelu(gate, approximate="tanh")
            return F.linear((act * up).to(x.dtype), self.fc2_weight, getattr(self, "fc2_bias", None))

    class DotProductAttention(torch.nn.Module):
        """te.DotProductAttention: q, k, v [b, s, h, d] ('bshd') or [s, b, h, d] ('sbhd') -> [.., .., h*d];
        `attention_mask` is boolean with True = masked OUT ([b, 1, 1, s] for 'padding*', broadcastable to
        [b, h, s, s] for 'arbitrary'), the negation of SDPA's."""

        def __init__(self, num_attention_heads, kv_channels, num_gqa_groups=None, attention_dropout=0.0,
                     qkv_format="sbhd", attn_mask_type="causal", softmax_scale=None):
            super().__init__()
            assert attention_dropout == 0.0, "the fake has no dropout"
            self.qkv_format, self.attn_mask_type, self.scale = qkv_format, attn_mask_type, softmax_scale

        def forward(
            self, query_layer, key_layer, value_layer, attention_mask=None, qkv_format=None, attn_mask_type=None
        ):
            fmt, kind = qkv_format or self.qkv_format, attn_mask_type or self.attn_mask_type
            self._select((self.training, tuple(query_layer.shape), query_layer.dtype, fmt, kind))
            q, k, v = (
                x.transpose(1, 2) if fmt == "bshd" else x.permute(1, 2, 0, 3)
                for x in (query_layer, key_layer, value_layer)
            )
            keep = None if attention_mask is None else ~attention_mask  # TE: True = masked out; SDPA: True = attend
            if keep is not None and "causal" in kind:
                keep = keep & torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=keep is None and "causal" in kind,
                                                 scale=self.scale)
            out = out.transpose(1, 2) if fmt == "bshd" else out.permute(2, 0, 1, 3)
            return out.reshape(*out.shape[:2], -1)

        @staticmethod
        def _select(params):
            """TE's selection: made again only when the inputs change or the cache is marked stale, and then
            from the NVTE_*_ATTN switches (flash before fused before unfused); none left is TE's ValueError."""
            cache = _attention_backends
            if cache["attention_params"] != params:
                cache.update(attention_params=params, backend_selection_requires_update=True)
            if cache["backend_selection_requires_update"]:
                ok = {
                    name: AVAILABLE[name] and os.environ.get(f"NVTE_{name.upper()}_ATTN", "1") == "1"
                    for name in AVAILABLE
                }
                flash, fused = ok["flash"], ok["fused"] and not ok["flash"]
                cache.update(use_flash_attention=flash, flash_attention_backend="2.7.0" if flash else None,
                             use_fused_attention=fused, fused_attention_backend=1 if fused else None,
                             use_unfused_attention=ok["unfused"] and not (flash or fused),
                             backend_selection_requires_update=False)
            if not (cache["use_flash_attention"] or cache["use_fused_attention"] or cache["use_unfused_attention"]):
                raise ValueError(
                    "No dot product attention backend is available for the provided inputs. Please run "
                    "with NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2 to find out the reasons for disabling all backends."
                )


def _rms(x, weight, eps):
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def _rotate(t, freqs):
    """TE's non-interleaved RoPE on [b, s, h, d] with angles [s, 1, 1, r]: the first r of each head rotated
    (t cos + rotate_half(t) sin), the rest passed through (a partial rotary when r < d)."""
    f = freqs.transpose(0, 1).to(torch.float32)  # [1, s, 1, r]
    rot, rest = t[..., :f.shape[-1]].float(), t[..., f.shape[-1]:]
    x1, x2 = rot.chunk(2, dim=-1)
    return torch.cat(((rot * f.cos() + torch.cat((-x2, x1), dim=-1) * f.sin()).to(t.dtype), rest), dim=-1)


class _Params(torch.nn.Module):
    """A TE module's parameters by TE's names and shapes (LayerNormLinear, Linear, LayerNormMLP), no maths."""

    def __init__(self, shapes: dict, dtype, device):
        super().__init__()
        with _on(device):
            for name, shape in shapes.items():
                self.register_parameter(name, torch.nn.Parameter(torch.zeros(shape, dtype=dtype)))


def _window_mask(s, window_size, device):
    """TE's window_size (left, 0) under a causal mask: query i sees keys [i - left, i] (True = attend)."""
    i = torch.arange(s, device=device)
    d = i[:, None] - i[None, :]
    return (d >= 0) & (d <= window_size[0])


class FakeMultiheadAttention(torch.nn.Module):
    """te.MultiheadAttention as the Hugging Face conversion builds it (TE 2.20: input RMSNorm, optionally zero-
    centered, fused with the QKV GEMM, QKV interleaved per KV group, GQA, q/k RMSNorm per head before RoPE,
    non-interleaved RoPE from `rotary_pos_emb`, causal attention with an optional window, output projection),
    in 'bshd' or 'sbhd' (`qkv_format`: its input and output are sequence-first, as TE's): TE's parameter names
    and shapes (q_norm / k_norm are modules TE makes and a caller may replace), that maths in torch."""

    def __init__(self, hidden_size, num_attention_heads, kv_channels=None, attention_dropout=0.1,
                 layernorm_epsilon=1e-5, attn_mask_type="causal", window_size=None, num_gqa_groups=None,
                 params_dtype=None, input_layernorm=False, fuse_qkv_params=False, zero_centered_gamma=False,
                 bias=True, normalization="LayerNorm", device="cuda", qkv_format="sbhd", qk_norm_type=None,
                 qk_norm_eps=1e-6, qk_norm_before_rope=False):
        super().__init__()
        assert (normalization, attn_mask_type) == ("RMSNorm", "causal") and qkv_format in ("bshd", "sbhd"), \
            "the fake does these only"
        self.qkv_format = qkv_format
        assert input_layernorm and fuse_qkv_params and attention_dropout == 0, "the fake does these only"
        assert qk_norm_type in (None, "RMSNorm") and (qk_norm_type is None or qk_norm_before_rope)
        self.heads, self.groups = num_attention_heads, num_gqa_groups or num_attention_heads
        self.head_dim, self.eps = kv_channels or hidden_size // num_attention_heads, layernorm_epsilon
        self.window_size, self.zero_centered_gamma = window_size, zero_centered_gamma
        dtype = params_dtype or torch.float32
        qkv = (self.heads + 2 * self.groups) * self.head_dim
        b = (lambda name, n: {name: (n,)}) if bias else (lambda name, n: {})
        self.layernorm_qkv = _Params({"layer_norm_weight": (hidden_size,), "weight": (qkv, hidden_size),
                                      **b("bias", qkv)}, dtype, device)
        self.proj = _Params({"weight": (hidden_size, self.heads * self.head_dim), **b("bias", hidden_size)},
                            dtype, device)
        self.q_norm = self.k_norm = None
        if qk_norm_type:
            self.q_norm = FakeTEModules.RMSNorm(self.head_dim, eps=qk_norm_eps, params_dtype=dtype)
            self.k_norm = FakeTEModules.RMSNorm(self.head_dim, eps=qk_norm_eps, params_dtype=dtype)

    def forward(self, hidden_states, attention_mask=None, rotary_pos_emb=None):
        if self.qkv_format == "sbhd":  # TE's sequence-first layout; the maths below is batch-first
            return self._forward(hidden_states.transpose(0, 1), rotary_pos_emb).transpose(0, 1)
        return self._forward(hidden_states, rotary_pos_emb)

    def _forward(self, x, rotary_pos_emb):
        a = self.layernorm_qkv
        bsz, s, _ = x.shape
        w = a.layer_norm_weight.float() + 1.0 if self.zero_centered_gamma else a.layer_norm_weight
        qkv = F.linear(_rms(x, w, self.eps).to(x.dtype), a.weight, getattr(a, "bias", None))
        per = self.heads // self.groups
        qkv = qkv.view(bsz, s, self.groups, per + 2, self.head_dim)
        q = qkv[:, :, :, :per].reshape(bsz, s, self.heads, self.head_dim)
        k, v = qkv[:, :, :, per], qkv[:, :, :, per + 1]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rotary_pos_emb is not None:
            q, k = _rotate(q, rotary_pos_emb), _rotate(k, rotary_pos_emb)
        mask = None if self.window_size is None else _window_mask(s, self.window_size, x.device)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=mask, is_causal=mask is None, enable_gqa=True)
        return F.linear(out.transpose(1, 2).reshape(bsz, s, -1), self.proj.weight, getattr(self.proj, "bias", None))


class FakeTransformerLayer(torch.nn.Module):
    """te.TransformerLayer as the decoder-layer conversion builds it (TE 2.20: pre-norm RMSNorm, the attention
    of FakeMultiheadAttention, SwiGLU with fc1 = [gate; up], biases on all four GEMMs or none): TE's parameter
    names and shapes, that maths in torch."""

    def __init__(self, hidden_size, ffn_hidden_size, num_attention_heads, num_gqa_groups=None, kv_channels=None,
                 bias=True, layernorm_epsilon=1e-5, hidden_dropout=0.1, attention_dropout=0.1, fuse_qkv_params=False,
                 normalization="LayerNorm", activation="gelu", self_attn_mask_type="causal", attn_input_format="sbhd",
                 window_size=None, qk_norm_type=None, qk_norm_eps=1e-6, qk_norm_before_rope=False,
                 params_dtype=None, device="cuda"):
        super().__init__()
        assert (normalization, activation) == ("RMSNorm", "swiglu") and hidden_dropout == 0, "the fake does these only"
        dtype = params_dtype or torch.float32
        self.eps = layernorm_epsilon
        self.self_attention = FakeMultiheadAttention(
            hidden_size, num_attention_heads, kv_channels=kv_channels, attention_dropout=attention_dropout,
            layernorm_epsilon=layernorm_epsilon, attn_mask_type=self_attn_mask_type, window_size=window_size,
            num_gqa_groups=num_gqa_groups, params_dtype=dtype, input_layernorm=True, fuse_qkv_params=fuse_qkv_params,
            bias=bias, normalization=normalization, device=device, qkv_format=attn_input_format,
            qk_norm_type=qk_norm_type, qk_norm_eps=qk_norm_eps, qk_norm_before_rope=qk_norm_before_rope)
        b = (lambda name, n: {name: (n,)}) if bias else (lambda name, n: {})
        self.layernorm_mlp = _Params(
            {
                "layer_norm_weight": (hidden_size,),
                "fc1_weight": (2 * ffn_hidden_size, hidden_size),
                **b("fc1_bias", 2 * ffn_hidden_size),
                "fc2_weight": (hidden_size, ffn_hidden_size),
                **b("fc2_bias", hidden_size),
            },
            dtype,
            device,
        )

    def forward(self, hidden_states, attention_mask=None, rotary_pos_emb=None):
        m = self.layernorm_mlp  # the MLP works on the last dimension: either layout
        x = hidden_states + self.self_attention(hidden_states, rotary_pos_emb=rotary_pos_emb)
        gate, up = F.linear(_rms(x, m.layer_norm_weight, self.eps), m.fc1_weight, getattr(m, "fc1_bias", None)).chunk(
            2, -1
        )
        return x + F.linear(F.silu(gate) * up, m.fc2_weight, getattr(m, "fc2_bias", None))


class FakeRotaryPositionEmbedding(torch.nn.Module):
    """te.RotaryPositionEmbedding (attention/rope.py, TE 2.20), its maths as TE has it, on the CPU."""

    def __init__(self, dim, rotary_percent=1.0, seq_len_interpolation_factor=None,
                 pretrained_max_position_embeddings=None, rotary_base=10000.0, interleaved=False):
        super().__init__()
        assert rotary_percent == 1.0 and not interleaved
        self.seq_len_interpolation_factor, self.pretrained = (
            seq_len_interpolation_factor,
            pretrained_max_position_embeddings,
        )
        self.register_buffer("inv_freq", 1.0 / (rotary_base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)))

    def forward(self, max_seq_len, offset=0):
        seq = torch.arange(max_seq_len, device=self.inv_freq.device, dtype=self.inv_freq.dtype) + offset
        if self.pretrained is not None and self.seq_len_interpolation_factor is not None:
            if max_seq_len > self.pretrained * self.seq_len_interpolation_factor:
                seq *= 1 / (max_seq_len / self.pretrained)
            else:
                seq *= 1 / self.seq_len_interpolation_factor
        freqs = torch.einsum("i , j -> i j", seq, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.reshape(emb.size(0), 1, 1, emb.size(1))


FakeTEModules.TransformerLayer = FakeTransformerLayer
FakeTEModules.MultiheadAttention = FakeMultiheadAttention
FakeTEModules.RotaryPositionEmbedding = FakeRotaryPositionEmbedding


class FakeTE:
    """Stands in for transformer_engine.pytorch: capability checks answer like TE's, with reasons."""

    def __init__(self, fp8=(True, ""), block=(True, ""),
                 mxfp8=(False, "Device compute capability 10.0 or higher required for MXFP8 execution.")):
        self._fp8, self._block, self._mx = fp8, block, mxfp8

    def is_fp8_available(self, return_reason=False):
        return self._fp8

    def is_fp8_block_scaling_available(self, return_reason=False):
        return self._block

    def is_mxfp8_available(self, return_reason=False):
        return self._mx

    def is_nvfp4_available(self, return_reason=False):
        return False, "Device compute capability 10.0 or higher required for NVFP4 execution."

    def is_bf16_available(self, return_reason=False):
        return True, ""
