"""The decoder-layer TE conversion of Hugging Face models on the CPU, with the named fake TE (tests/fake_te.py:
TE's parameter names and shapes, TE's maths in torch): every mapped tensor round-trips HF -> TE -> HF bit for bit,
the converted model's logits equal the HF model's, and what it cannot convert falls back with the reason."""
import re

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[lm]')")

from fake_te import FakeRecipes, FakeTEModules  # noqa: E402
from transformers import (  # noqa: E402
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    Olmo2Config,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
    SmolLM3Config,
)

from workbench import backends, config  # noqa: E402
from workbench.backends import hf_families  # noqa: E402
from workbench.backends.hf_families import common, gemma3  # noqa: E402
from workbench.config import ConfigError  # noqa: E402
from workbench.env import te as _te  # noqa: E402
from workbench.models.hf import load_causal_lm  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, max_position_embeddings=64)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
FAMILIES = {
    "llama": (LlamaConfig, {}),
    "qwen2": (Qwen2Config, {}),
    "mistral": (MistralConfig, {}),
    "llama-mha-untied": (LlamaConfig, {"num_key_value_heads": 4, "tie_word_embeddings": False}),
    "llama3-rope": (LlamaConfig, {"rope_parameters": LLAMA3_ROPE, "tie_word_embeddings": True}),
    "llama-linear-rope": (LlamaConfig, {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}),
    "llama-biases": (LlamaConfig, {"attention_bias": True, "mlp_bias": True}),
    # one row per family: its config class and what sets it apart (the shapes are TINY's)
    "mistral-window": (MistralConfig, {"sliding_window": 8}),  # shorter than the sequence (16): TE's window_size
    "qwen3": (Qwen3Config, {"head_dim": 32}),  # q/k norms, head_dim apart from hidden / heads
    "qwen3-sliding": (Qwen3Config, {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1}),
    "phi3": (Phi3Config, {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                              "partial_rotary_factor": 0.5}, "pad_token_id": 0}),
    "gemma3": (Gemma3TextConfig, {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 8,
                                  "layer_types": ["sliding_attention", "full_attention"]}),
    "gemma2": (Gemma2Config, {"head_dim": 16, "query_pre_attn_scalar": 16, "attn_logit_softcapping": None,
                              "final_logit_softcapping": None, "sliding_window": 8}),
    "smollm3": (SmolLM3Config, {"no_rope_layers": [1, 0], "pad_token_id": 0, "bos_token_id": 0,  # the second
                                "eos_token_id": 0}),  # layer has no positions
}


@pytest.fixture(autouse=True)
def fake_te(monkeypatch):
    monkeypatch.setattr(_te, "load", lambda: (FakeTEModules, FakeRecipes, ""))


def reference(family: str, **changes):
    """A tiny random HF model whose every weight (biases and norms too) is random, so a mapping error shows."""
    cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    lm = load_causal_lm(cls(**{**TINY, **extra, **changes}), seq_len=16)
    with torch.no_grad():
        for p in lm.parameters():
            p.normal_(0, 0.2)
    return lm


def cfg(**kw):
    return config.from_preset("cpu-smoke", **kw)


def kept(student) -> list[str]:
    """What its conversion left in torch, as its row names it."""
    return (student.describe()["kept_torch_modules"] or "").split("; ")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_decoder_layer_becomes_one_te_layer_with_the_same_logits(family):
    ref = reference(family)
    student = backends.make("te_bf16").prepare(ref, cfg(), torch.device("cpu"))
    model = student.model
    assert student.describe()["te_conversion"] == "layer" and "te_conversion_note" not in student.describe()
    layers = model.model.model.layers
    want_block = gemma3.GemmaBlock if family.startswith("gemma") else FakeTEModules.TransformerLayer
    assert all(type(layer.block) is want_block for layer in layers)
    assert list(student.converted[:2]) == ["model.model.layers.0", "model.model.layers.1"]
    # the final norm, swapped alone (Gemma's scales by 1 + weight, which te.RMSNorm without zero_centered_gamma
    # does not: it stays torch)
    assert (type(model.model.model.norm) is FakeTEModules.RMSNorm) != family.startswith("gemma")
    assert type(model.model.lm_head) is torch.nn.Linear  # the head stays bf16 torch by default
    assert not any("Attention" in k or "DecoderLayer" in k or "MLP" in k for k in kept(student))
    tokens = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), ref(tokens), rtol=1e-5, atol=1e-5)
        _, hidden = model(tokens, return_hidden=True)
        _, want = ref(tokens, return_hidden=True)
    assert len(hidden) == len(want) == 2
    torch.testing.assert_close(hidden[0], want[0], rtol=1e-5, atol=1e-5)  # the first layer's output


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_mapped_tensor_round_trips_bit_for_bit(family):
    ref = reference(family)
    model = backends.make("te_bf16").prepare(ref, cfg(), torch.device("cpu")).model
    want = ref.state_dict()
    back = model.to_reference_state()
    assert set(back) == set(want)
    assert all(torch.equal(back[k], want[k]) for k in want), [k for k in want if not torch.equal(back[k], want[k])]
    # and the other way: the reference's state under the TE names is exactly what the student holds
    own = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    mapped = model.from_reference_state(want)
    assert set(mapped) == set(own) and all(torch.equal(mapped[k], own[k]) for k in own)
    backends.check_matched(model, ref)


def test_fused_qkv_is_interleaved_per_kv_group_and_fc1_is_gate_then_up():
    """TE's layout, spelt out on one layer: 4 query heads in 2 KV groups, head size 16 -> rows
    [q0 q1 k0 v0 | q2 q3 k1 v1]; fc1 = [gate; up]."""
    ref = reference("llama")
    model = backends.make("te_bf16").prepare(ref, cfg(), torch.device("cpu")).model
    hf, te = ref.model.model.layers[0], model.model.model.layers[0].block
    q, k, v = (hf.self_attn.get_submodule(n).weight for n in ("q_proj", "k_proj", "v_proj"))
    head = lambda w, i: w[16 * i:16 * (i + 1)]  # noqa: E731
    want = torch.cat([head(q, 0), head(q, 1), head(k, 0), head(v, 0), head(q, 2), head(q, 3), head(k, 1), head(v, 1)])
    assert torch.equal(te.self_attention.layernorm_qkv.weight, want)
    assert torch.equal(te.layernorm_mlp.fc1_weight, torch.cat([hf.mlp.gate_proj.weight, hf.mlp.up_proj.weight]))
    assert torch.equal(te.self_attention.layernorm_qkv.layer_norm_weight, hf.input_layernorm.weight)
    assert torch.equal(te.layernorm_mlp.layer_norm_weight, hf.post_attention_layernorm.weight)


def test_qwen2s_qkv_bias_is_mapped_and_the_biases_it_lacks_are_zero_and_frozen():
    ref = reference("qwen2")
    model = backends.make("te_bf16").prepare(ref, cfg(), torch.device("cpu")).model
    te = model.model.model.layers[0].block
    hf = ref.model.model.layers[0].self_attn
    q, k, v = common.split_qkv(te.self_attention.layernorm_qkv.bias, model.model.model.layers[0].shape)
    assert torch.equal(q, hf.q_proj.bias) and torch.equal(k, hf.k_proj.bias) and torch.equal(v, hf.v_proj.bias)
    frozen = {n for n, p in te.named_parameters() if not p.requires_grad}
    assert frozen == {"self_attention.proj.bias", "layernorm_mlp.fc1_bias", "layernorm_mlp.fc2_bias"}
    assert all(not p.any() for n, p in te.named_parameters() if n in frozen)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_training_step_moves_the_same_weights_as_the_hf_model(family):
    """One SGD step on the same tokens: every HF weight of the converted student moves as the HF model's
    does (the fake's maths is TE's in fp32, so equal to rounding)."""
    ref = reference(family)
    model = backends.make("te_bf16").prepare(ref, cfg(), torch.device("cpu")).model
    tokens = torch.randint(0, 256, (2, 17))
    for m in (ref, model):
        opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1)
        logits = m(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        opt.step()
    after, want = model.to_reference_state(), ref.state_dict()
    for k in want:
        torch.testing.assert_close(after[k], want[k], rtol=1e-4, atol=1e-5, msg=k)


def test_what_it_cannot_convert_falls_back_to_per_linear_and_says_why():
    ref = reference("llama", rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0})
    student = backends.make("te_bf16").prepare(ref, cfg(), torch.device("cpu"))
    model = student.model
    row = student.describe()
    assert row["te_conversion"] == "linear" and "rope type 'yarn'" in row["te_conversion_note"]
    assert type(model.model.model.layers[0].self_attn.q_proj) is FakeTEModules.Linear
    row = student.describe()
    assert row["te_conversion"] == "linear" and "rope type 'yarn'" in row["te_conversion_note"]
    with pytest.raises(ConfigError, match="options.te_conversion='layer' cannot convert this model: rope type 'yarn'"):
        backends.make("te_bf16").prepare(ref, cfg(te_conversion="layer"), torch.device("cpu")).model
    for family, change, why in [
        ("llama", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ("gemma3", {"query_pre_attn_scalar": 32}, "query_pre_attn_scalar=32 differs from head_dim=16"),
        ("gemma2", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0"),
        ("phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 8,
                                      "long_factor": [1.0] * 8, "original_max_position_embeddings": 32}},
         "rope type 'longrope'"),
    ]:
        assert why in hf_families.refusal(reference(family, **change).model, 16)


REFUSED_FAMILIES = {  # a family TE's layers cannot hold: refused by name with 'layer', per-Linear with 'auto'
    "olmo2": (Olmo2Config, {}, "model_type 'olmo2': OLMo2 normalises each sublayer's output (post-norm)"),
    "qwen3_moe": (Qwen3MoeConfig, {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                   "head_dim": 16}, "model_type 'qwen3_moe': a mixture-of-experts MLP"),
    "mixtral": (MixtralConfig, {"num_local_experts": 4, "num_experts_per_tok": 2},
                "model_type 'mixtral': a mixture-of-experts MLP"),
}


@pytest.mark.parametrize("family", sorted(REFUSED_FAMILIES))
def test_a_family_te_cannot_hold_is_refused_by_name_and_auto_falls_back(family):
    cls, extra, why = REFUSED_FAMILIES[family]
    torch.manual_seed(0)
    ref = load_causal_lm(cls(**{**TINY, **extra}), seq_len=16)
    with pytest.raises(ConfigError, match=f"cannot convert this model: {re.escape(why)}"):
        backends.make("te_bf16").prepare(ref, cfg(te_conversion="layer"), torch.device("cpu")).model
    student = backends.make("te_bf16").prepare(ref, cfg(), torch.device("cpu"))
    model = student.model
    assert student.describe()["te_conversion"] == "linear" and why in student.describe()["te_conversion_note"]
    tokens = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), ref(tokens), rtol=1e-5, atol=1e-5)


def test_every_family_has_an_adapter_and_a_test_row():
    """Adding a family is one file in hf_families/ plus its row in FAMILIES above."""
    tested = {FAMILIES[f][0]().model_type for f in FAMILIES}
    assert set(hf_families.ADAPTERS) <= tested, set(hf_families.ADAPTERS) - tested
    want = {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3_text", "gemma2", "smollm3"}
    assert want <= set(hf_families.ADAPTERS)


def test_nope_layers_get_no_rotary_angles_and_sliding_layers_their_window():
    model = backends.make("te_bf16").prepare(reference("smollm3"), cfg(), torch.device("cpu")).model
    layers = model.model.model.layers
    assert layers[0].rope is not None and layers[1].rope is None
    g = backends.make("te_bf16").prepare(reference("gemma3"), cfg(), torch.device("cpu")).model.model.model.layers
    assert g[0].block.self_attention.window_size == (7, 0) and g[1].block.self_attention.window_size is None
    assert g[0].rope is not g[1].rope  # sliding and global layers: their own theta
    assert not torch.equal(g[0].rope.rope.inv_freq, g[1].rope.rope.inv_freq)
    g2 = backends.make("te_bf16").prepare(reference("gemma2"), cfg(), torch.device("cpu")).model.model.model.layers
    assert g2[0].rope is g2[1].rope  # Gemma 2: one rope for both layer types, its angles made once


def test_linear_conversion_on_request_and_the_row_says_which_ran():
    ref = reference("llama")
    student = backends.make("te_bf16").prepare(ref, cfg(te_conversion="linear"), torch.device("cpu"))
    assert student.describe()["te_conversion"] == "linear"
    assert "model.model.layers.0.self_attn (LlamaAttention)" in kept(student)
    with pytest.raises(ConfigError, match=r"options.te_conversion must be one of \['auto', 'layer', 'linear'\]"):
        cfg(te_conversion="block")
    with pytest.raises(ConfigError, match=r"options.te_head_precision must be one of \['bf16', 'fp8'\]"):
        cfg(te_head_precision="fp4")


@pytest.mark.parametrize("tied", [True, False])
def test_an_fp8_head_is_a_te_linear_and_a_tied_one_shares_the_embedding(tied):
    ref = reference("llama", tie_word_embeddings=tied)
    student = backends.make("te_fp8:current").prepare(ref, cfg(te_head_precision="fp8"), torch.device("cpu"))
    model = student.model
    head = model.model.lm_head
    assert type(head) is FakeTEModules.Linear and "model.lm_head" in student.converted
    assert (head.weight is model.model.model.embed_tokens.weight) == tied
    assert torch.equal(head.weight, ref.model.lm_head.weight)
    backends.check_matched(model, ref)
    tokens = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), ref(tokens), rtol=1e-5, atol=1e-5)


def test_fp8_attention_goes_into_the_recipe_for_delayed_and_current_only(monkeypatch):
    from workbench.backends import te_fp8
    from workbench.backends.te_fp8 import make_recipe

    assert make_recipe(FakeRecipes, "delayed", fp8_dpa=True)["fp8_dpa"] is True
    assert make_recipe(FakeRecipes, "current", fp8_dpa=True)["fp8_dpa"] is True
    assert "fp8_dpa" not in make_recipe(FakeRecipes, "delayed")
    monkeypatch.setattr(te_fp8, "te_usable", lambda ctx: (True, ""))  # as on a GPU with every recipe
    monkeypatch.setattr(_te, "check", lambda fn, what: (True, ""))
    ctx = backends.Context(torch.device("cuda"), cfg(te_fp8_dpa=True))
    ok, why = backends.make("te_fp8:block").availability(ctx)
    assert (
        not ok
        and why
        == "options.te_fp8_dpa: TE runs FP8 attention with delayed, delayed_e4m3, current scaling, not recipe block"
    )
    assert backends.make("te_fp8:current").availability(ctx) == (True, "")


def test_fp8_attention_without_a_backend_is_an_error_that_names_the_option():
    from workbench.backends._te_run import fp8_attention_refusal

    with pytest.raises(RuntimeError, match="options.te_fp8_dpa=true: TE has no FP8 attention backend.*TE: No dot"):
        with fp8_attention_refusal():
            raise ValueError("No dot product attention backend is available for the provided inputs.")
    with pytest.raises(ValueError, match="other"):
        with fp8_attention_refusal():
            raise ValueError("other")


def test_the_benchs_hf_variants_are_valid_configs_that_set_the_levers():
    from workbench.bench import variants

    names = [n for n in variants.VARIANTS if n.startswith("hf-")]
    assert names == ["hf-compile", "hf-compile-step", "hf-te-linear", "hf-te-layer", "hf-te-layer-step",
                     "hf-te-layer-fp8-dpa", "hf-te-layer-fp8-head"]
    for name in names:
        c, rejected = variants.variant_config("gpt-cpu", {}, variants.VARIANTS[name])
        assert rejected == [] and c is not None, (name, rejected)
    assert (
        variants.variant_config("gpt-cpu", {}, variants.VARIANTS["hf-te-layer-fp8-dpa"])[0].options.te_fp8_dpa is True
    )
    head = variants.variant_config("gpt-cpu", {}, variants.VARIANTS["hf-te-layer-fp8-head"])[0]
    assert (head.options.te_head_precision, head.options.te_conversion, head.options.te_graph) == (
        "fp8",
        "layer",
        "step",
    )


@pytest.mark.parametrize("family", ["llama", "gemma3", "smollm3"])
def test_sequence_first_layers_give_the_same_logits_and_gradients(family):
    """options.te_qkv_format='sbhd': every TE layer computes sequence-first, the stack is turned round once
    before its first layer and once after its last, and the model's logits and gradients are those of the
    batch-first layers (batch 3 != sequence 16: angles made for the wrong axis would not broadcast)."""
    ref = reference(family)
    tokens = torch.randint(0, 256, (3, 17))
    grads = {}
    for fmt in ("bshd", "sbhd"):
        model = backends.make("te_bf16").prepare(ref, cfg(te_qkv_format=fmt), torch.device("cpu")).model
        layers = model.model.model.layers
        attn = [layer.block.self_attention for layer in layers]
        assert all(a.qkv_format == fmt for a in attn)
        assert [(layer.enters_sbhd, layer.leaves_sbhd) for layer in layers] == (
            [(True, False), (False, True)] if fmt == "sbhd" else [(False, False)] * 2)
        seen = []
        hook = layers[1].register_forward_pre_hook(lambda m, args: seen.append(tuple(args[0].shape)))
        logits = model(tokens[:, :-1])
        hook.remove()
        assert seen == [(16, 3, 64) if fmt == "sbhd" else (3, 16, 64)]  # what the second layer is handed
        torch.testing.assert_close(logits, ref(tokens[:, :-1]), rtol=1e-5, atol=1e-5)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        grads[fmt] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(grads["sbhd"]) == set(grads["bshd"]) and grads["bshd"]
    for n, g in grads["bshd"].items():
        torch.testing.assert_close(grads["sbhd"][n], g, rtol=1e-5, atol=1e-6, msg=n)


def test_the_layout_switch_is_checked_and_says_where_it_does_not_apply():
    with pytest.raises(ConfigError, match=r"options.te_qkv_format must be one of \['bshd', 'sbhd'\]"):
        cfg(te_qkv_format="thd")
    student = backends.make("te_bf16").prepare(reference("llama"), cfg(te_conversion="linear", te_qkv_format="sbhd"),
                                               torch.device("cpu"))
    assert "options.te_qkv_format='sbhd' not applied" in " | ".join(student.policy.notes)
    plain = backends.make("te_bf16").prepare(reference("llama"), cfg(te_qkv_format="sbhd"), torch.device("cpu"))
    assert "not applied" not in " | ".join(plain.policy.notes)
