"""The user's own Hugging Face causal LM, offline: a tiny randomly initialised Llama saved to a folder and
loaded back runs as teacher and as student, counts its FLOPs, and converts to (fake) TE layers."""
import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[lm]')")

from fake_te import FakeTEModules  # noqa: E402
from test_lm import next_token_losses  # noqa: E402
from transformers import LlamaConfig  # noqa: E402

from workbench import backends, config  # noqa: E402
from workbench.config import ConfigError  # noqa: E402
from workbench.env import te as _te  # noqa: E402
from workbench.models.hf import load_causal_lm  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
            vocab_size=256, max_position_embeddings=64)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-llama")
    load_causal_lm(LlamaConfig(**TINY)).model.save_pretrained(folder)
    return folder


def test_loads_offline_and_runs_as_teacher(saved):
    teacher = load_causal_lm(saved, seq_len=16).eval().requires_grad_(False)
    again = load_causal_lm(saved, seq_len=16).eval()
    tokens = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        logits, hidden = teacher(tokens, return_hidden=True)
        assert logits.shape == (2, 16, 256) and logits.dtype == torch.float32
        assert len(hidden) == 2 and hidden[0].shape == (2, 16, 64)
        assert torch.equal(again(tokens), logits)  # the saved weights, not a new random init


def test_trains_as_student(saved):
    student = load_causal_lm(saved, seq_len=16)
    assert student.training
    losses = next_token_losses(student, torch.randint(0, 256, (4, 17)), steps=4)
    assert losses[-1] < losses[0]


def test_flops_from_its_weight_matrices_and_config(saved):
    h, f, v, L, s = 64, 128, 256, 2, 16
    want = 6 * (L * (4 * h * h + 3 * f * h) + v * h) + 12 * L * h * s  # q, k, v, o; gate, up, down; head
    assert load_causal_lm(saved, seq_len=s).train_flops_per_token() == want
    with pytest.raises(ValueError, match="pass seq_len"):
        load_causal_lm(saved).train_flops_per_token()


def test_a_missing_folder_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no Hugging Face causal LM loads from .*nowhere"):
        load_causal_lm(tmp_path / "nowhere")


def test_te_conversion_swaps_linear_and_rmsnorm_and_reports_what_stayed_torch(saved, monkeypatch):
    monkeypatch.setattr(_te, "load", lambda: (FakeTEModules, object(), ""))
    reference = load_causal_lm(saved, seq_len=16)
    cfg = config.from_preset("cpu-smoke", te_conversion="linear")  # per Linear (the decoder-layer one: test_hf_layers)
    te_bf16 = backends.make("te_bf16").prepare(reference, cfg, torch.device("cpu"))  # converts a copy
    model = te_bf16.model
    # per layer: 7 Linear, 2 RMSNorm; + final norm (the head stays bf16)
    assert len(te_bf16.converted) == 2 * (7 + 2) + 1
    assert type(model.model.model.layers[0].input_layernorm) is FakeTEModules.RMSNorm
    assert type(model.model.lm_head) is torch.nn.Linear
    kept = te_bf16.describe()["kept_torch_modules"].split("; ")
    assert "model.model.embed_tokens (Embedding)" in kept and "model.model.layers.1.self_attn (LlamaAttention)" in kept
    assert not any("proj" in k or "norm" in k for k in kept)
    tokens = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), reference(tokens))


def test_the_fp8_size_check_reads_a_hugging_face_students_own_linears(saved, tmp_path):
    """A Hugging Face student's GEMMs are its own Linears, not the config's model.hidden/intermediate/vocab
    (here all multiples of 16): an MLP width of 120 must skip the FP8 students, naming those layers."""
    from workbench.backends._gemm import misaligned

    torch.manual_seed(0)
    odd = tmp_path / "odd-llama"
    load_causal_lm(LlamaConfig(**{**TINY, "intermediate_size": 120})).model.save_pretrained(odd)
    lm = dict(kind="llama", vocab=256, tokenizer="bytes")
    assert misaligned(config.from_preset("gpt-cpu", **lm), 16) == []
    assert misaligned(config.from_preset("gpt-cpu", **lm, student=str(saved)), 16) == []
    bad = misaligned(config.from_preset("gpt-cpu", **lm, student=str(odd)), 16)
    assert bad == ["model.layers.0.mlp.gate_proj.out_features=120", "model.layers.0.mlp.up_proj.out_features=120",
                   "model.layers.0.mlp.down_proj.in_features=120", "model.layers.1.mlp.gate_proj.out_features=120",
                   "and 2 more"]
    with pytest.raises(ConfigError, match="no Hugging Face causal LM loads from .*nowhere"):
        misaligned(config.from_preset("gpt-cpu", **lm, student=str(tmp_path / "nowhere")), 16)


def test_a_tied_lm_head_is_no_fp8_gemm_so_an_odd_vocabulary_does_not_skip_the_student(tmp_path):
    """The LM head stays bf16 torch by default (options.te_head_precision): its vocabulary is no FP8 GEMM
    dimension, tied or not. An FP8 head (a te.Linear, sharing a tied embedding's weight) makes it one, named."""
    from workbench.backends._gemm import misaligned

    lm = dict(kind="llama", vocab=256, tokenizer="bytes")
    for tied in (True, False):
        folder = tmp_path / f"tied-{tied}"
        load_causal_lm(LlamaConfig(**{**TINY, "vocab_size": 250, "tie_word_embeddings": tied})).model.save_pretrained(
            folder
        )
        assert misaligned(config.from_preset("gpt-cpu", **lm, student=str(folder)), 16) == []
        fp8_head = config.from_preset("gpt-cpu", **lm, student=str(folder), te_head_precision="fp8")
        assert misaligned(fp8_head, 16) == ["lm_head.out_features=250"]


def _sdpa_calls(monkeypatch):
    """Every scaled_dot_product_attention call's (mask given, is_causal, enable_gqa)."""
    calls, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, *args, is_causal=False, enable_gqa=False, **kw):
        calls.append((attn_mask is not None, is_causal, enable_gqa))
        return sdpa(q, k, v, attn_mask, *args, is_causal=is_causal, enable_gqa=enable_gqa, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


def test_attention_is_causal_sdpa_without_a_mask_even_under_a_cuda_graph_capture(monkeypatch):
    """Whole causal sequences need no mask: the student computes what transformers' own SDPA path does, and
    keeps computing it that way where transformers would build a full mask (its is_tracing() counts a capturing
    CUDA stream: set here by hand, as a capture on the GPU sets it), with native GQA."""
    import transformers.utils.import_utils as iu

    torch.manual_seed(0)
    ours = load_causal_lm(LlamaConfig(**{**TINY, "num_key_value_heads": 2}), seq_len=16)
    theirs = load_causal_lm(LlamaConfig(**{**TINY, "num_key_value_heads": 2}), seq_len=16)
    theirs.model.set_attn_implementation("sdpa")
    theirs.load_state_dict(ours.state_dict())
    tokens = torch.randint(0, 256, (2, 16))
    calls = _sdpa_calls(monkeypatch)
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), theirs(tokens), rtol=1e-5, atol=1e-5)
        assert calls == [(False, True, True)] * 4  # both models, both layers: is_causal, no mask
        calls.clear()
        monkeypatch.setattr(iu, "is_cuda_stream_capturing", lambda: True)
        ours(tokens)
        theirs(tokens)
    assert calls[:2] == [(False, True, True)] * 2  # ours: the same kernel under capture
    assert calls[2:] == [(True, False, False)] * 2  # transformers' sdpa: a [b, 1, s, s] mask, no flash, no GQA


def test_layers_compiled_in_place_do_not_recompile_under_a_capture(monkeypatch):
    """The GPU failure this answers (results/reference/cpu/hf_mask_under_capture.txt): a warm-up handed the
    compiled layers no mask, the capture a mask tensor, and the recompile ran inside the capture."""
    import transformers.utils.import_utils as iu
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    m = load_causal_lm(LlamaConfig(**{**TINY, "num_key_value_heads": 2}), seq_len=16)
    for layer in m.model.model.layers:
        layer.compile(backend="eager")
    tokens = torch.randint(0, 256, (2, 16))
    torch._dynamo.reset()
    counters.clear()
    m(tokens).sum().backward()
    monkeypatch.setattr(iu, "is_cuda_stream_capturing", lambda: True)
    m(tokens).sum().backward()
    assert counters["stats"]["unique_graphs"] == 1 and not counters["recompiles"]


@pytest.mark.parametrize("window, seq_len, kept", [(None, 64, False), (64, 64, False), (32, 64, True)])
def test_a_sliding_window_shorter_than_the_sequence_keeps_transformers_masks(window, seq_len, kept):
    from transformers import MistralConfig

    cfg = MistralConfig(**{**TINY, "sliding_window": window})
    impl = load_causal_lm(cfg, seq_len=seq_len).model.config._attn_implementation
    assert impl == ("sdpa" if kept else "workbench_causal_sdpa")


def test_layers_compiled_in_place_with_transformers_masks_keep_the_step_out_of_a_cuda_graph(monkeypatch):
    """Where transformers' masks stay (a sliding window shorter than the sequence) its layers compiled in place
    would recompile inside a capture: the step runs eager, the row says why; with causal SDPA it is captured."""
    from step_fakes import prepare
    from transformers import MistralConfig

    tokens = torch.randint(0, 256, (2, 16))
    for window, graphed in ((8, False), (None, True)):
        model = load_causal_lm(MistralConfig(**{**TINY, "sliding_window": window}), seq_len=16)
        step, metrics, captures = prepare(monkeypatch, model, "layers", tokens)
        assert metrics["graphed"] is graphed, metrics["notes"]
        assert ("not applied: layers compiled in place and transformers' attention masks" in metrics["notes"]) \
            is not graphed
        assert len(captures) == int(graphed)
        if not graphed:
            before = [p.detach().clone() for p in model.parameters()]
            assert torch.isfinite(step(tokens, None))  # the eager step trains
            assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
