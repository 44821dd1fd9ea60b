"""GPU checks of the decoder-layer TE conversion of Hugging Face models with the real Transformer Engine (the
CPU tests prove the mapping against a fake, which cannot prove TE's layouts): the converted bf16 student's logits
equal the HF model's to bf16 tolerance, one training step moves the same weights, the FP8 students (FP8 head, FP8
attention) run or refuse in the option's words, and a whole run keeps the students matched. Run on the H200 with
scripts/gpu.sh hf (or scripts/gpu_tests.sh); skipped without CUDA or TE. Figures go to $OUT/hf_gpu_checks.json."""
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[lm]')")

from transformers import (  # noqa: E402
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
    SmolLM3Config,
)

from workbench import backends, config, results  # noqa: E402
from workbench.env import te as _te  # noqa: E402
from workbench.models.hf import load_causal_lm  # noqa: E402
from workbench.run import runner

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")]

CUDA = torch.device("cuda")
# GPU-sized but small: head size 64 (the Llama-3.2-1B / Qwen2.5-0.5B head size), 2 KV groups
SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=1024, max_position_embeddings=512)
FAMILIES = {"llama": (LlamaConfig, {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}),
            "qwen2": (Qwen2Config, {"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
            # one row per family adapter, each with what sets it apart (workbench/backends/hf_families/)
            "mistral-window": (MistralConfig, {"sliding_window": 32}),  # TE's window_size (sequence 128)
            "qwen3": (Qwen3Config, {"head_dim": 128}),  # q/k norms before RoPE
            "phi3": (Phi3Config, {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                      "partial_rotary_factor": 0.75}, "pad_token_id": 0}),
            "gemma3": (Gemma3TextConfig, {"head_dim": 128, "query_pre_attn_scalar": 128, "sliding_window": 32,
                                          "layer_types": ["sliding_attention", "full_attention"], "pad_token_id": 0}),
            "smollm3": (SmolLM3Config, {"no_rope_layers": [1, 0], "pad_token_id": 0, "bos_token_id": 0,
                                        "eos_token_id": 0})}
FIGURES: dict = {}


def _record(key, value):
    """Figures for the log folder (what tolerance each check met), written after every check."""
    FIGURES[key] = value
    out = os.environ.get("OUT")
    if out:
        results.write_json(Path(out) / "hf_gpu_checks.json", FIGURES)


def reference(family, seq_len=128, **changes):
    cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    lm = load_causal_lm(cls(**{**SHAPE, **extra, **changes}), seq_len=seq_len)
    with torch.no_grad():  # every weight random (HF zero-inits biases): a mapping error must show
        for name, p in lm.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.02)
    return lm


def cfg(**kw):
    return config.from_preset("gpt-cpu", **kw)


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def _forward(backend, model, tokens):
    with backend.forward_context():
        return model(tokens)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hf_layer_converted_bf16_logits_equal_the_hf_models(family):
    """te_bf16 (each decoder layer one te.TransformerLayer) against the same HF model under torch bf16
    autocast, both against fp32: TE's error is the bf16 student's, not a layout error (which is O(1))."""
    ref = reference(family)
    tokens = torch.randint(0, SHAPE["vocab_size"], (2, 128), device=CUDA)
    exact = ref.to(CUDA)
    with torch.no_grad():
        want = exact(tokens)
        te_b = backends.make("te_bf16").prepare(ref.cpu(), cfg(), CUDA)
        te_model = te_b.model
        assert te_b.describe()["te_conversion"] == "layer", te_b.describe()
        got = _forward(te_b, te_model, tokens)
        torch_b = backends.make("torch_bf16").prepare(ref.cpu(), cfg(), CUDA)
        torch_model = torch_b.model
        plain = _forward(torch_b, torch_model, tokens)
    e_te, e_torch = rel(got, want), rel(plain, want)
    agree = float((got.argmax(-1) == want.argmax(-1)).float().mean())
    agree_torch = float((plain.argmax(-1) == want.argmax(-1)).float().mean())
    _record(f"logits_{family}", {"rel_err_te_layer_bf16": e_te, "rel_err_torch_bf16": e_torch, "top1_agreement": agree,
                                 "top1_agreement_torch_bf16": agree_torch,
                                 "attention_backend": te_b.describe().get("attention_backend")})
    assert e_te < max(3 * e_torch, 2e-2), (e_te, e_torch)
    # top-1 against fp32 as bf16 itself allows: within 3 points of torch bf16's own (a layout error is far below)
    assert agree > min(0.97, agree_torch - 0.03), (agree, agree_torch)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hf_one_training_step_moves_the_same_weights(family):
    """One SGD step on the same tokens (fp32 weights, bf16 autocast): every HF weight of the TE layer student
    moves in the direction and by the size the HF model's own weight does (cosine, norm ratio per tensor)."""
    ref = reference(family)
    tokens = torch.randint(0, SHAPE["vocab_size"], (2, 129), device=CUDA)
    moved = {}
    for spec in ("torch_bf16", "te_bf16"):
        b = backends.make(spec).prepare(ref.cpu(), cfg(), CUDA)
        model = b.model
        before = {k: v.detach().float().clone() for k, v in backends.reference_state(model).items()}
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
        with b.forward_context():
            logits = model(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
        opt.step()
        after = backends.reference_state(model)
        moved[spec] = {k: after[k].float() - before[k] for k in before}
    worst = {}
    for k, want in moved["torch_bf16"].items():
        got = moved["te_bf16"][k]
        if want.norm() == 0:
            assert got.norm() == 0, k
            continue
        cos = float(torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0))
        ratio = float(got.norm() / want.norm())
        worst[k] = (cos, ratio)
        assert cos > 0.95 and 0.9 < ratio < 1.1, (k, cos, ratio)
    _record(f"step_{family}", {"min_cosine": min(c for c, _ in worst.values()),
                               "ratio_range": [min(r for _, r in worst.values()), max(r for _, r in worst.values())],
                               "tensors": len(worst)})


def _train(b, model, tokens, steps=6) -> list[float]:
    """A few AdamW steps of next-token cross-entropy under the backend's forward context; the losses."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    losses = []
    for _ in range(steps):
        with b.forward_context():
            logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    return losses


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_hf_fp8_layer_student_of_every_family_trains(family, recipe):
    """Each family's TE layers under an FP8 recipe: logits near the fp32 model's, a few AdamW steps lower the loss."""
    ref = reference(family)
    b = backends.make(f"te_fp8:{recipe}").prepare(ref.cpu(), cfg(), CUDA)
    model = b.model
    assert b.describe()["te_conversion"] == "layer", b.describe()
    tokens = torch.randint(0, SHAPE["vocab_size"], (4, 129), device=CUDA)
    with torch.no_grad(), b.forward_context():
        err = rel(model(tokens[:, :-1]), ref.to(CUDA)(tokens[:, :-1]))
    losses = _train(b, model, tokens)
    _record(f"fp8_{recipe}_{family}", {"rel_err_vs_fp32": err, "losses": losses,
                                       "attention_backend": b.describe().get("attention_backend")})
    assert err < 0.2 and losses[-1] < losses[0], (err, losses)


@pytest.mark.parametrize("tied", [True, False])
def test_hf_fp8_layer_student_with_an_fp8_head_trains(tied):
    """te_fp8:delayed with options.te_head_precision='fp8': the head is a te.Linear (a tied one shares the
    embedding's Parameter through training), the logits stay near the fp32 model's, a few steps lower the loss."""
    ref = reference("llama", tie_word_embeddings=tied)
    c = cfg(te_head_precision="fp8")
    b = backends.make("te_fp8:delayed").prepare(ref.cpu(), c, CUDA)
    model = b.model
    te = _te.load()[0]
    head, embed = model.model.lm_head, model.model.model.embed_tokens
    assert isinstance(head, te.Linear) and (head.weight is embed.weight) == tied
    tokens = torch.randint(0, SHAPE["vocab_size"], (4, 129), device=CUDA)
    losses = _train(b, model, tokens)
    assert all(map(torch.isfinite, map(torch.tensor, losses))) and losses[-1] < losses[0], losses
    assert (model.model.lm_head.weight is model.model.model.embed_tokens.weight) == tied
    _record(f"fp8_head_tied_{tied}", {"losses": losses})


@pytest.mark.parametrize("recipe", ["delayed", "current"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_hf_fp8_attention_runs_or_refuses_in_the_options_words(recipe, head_dim):
    """options.te_fp8_dpa: TE runs both attention matmuls in FP8 through cuDNN where it can; where it cannot
    (REFERENCE: head size 64 on this H200) the student fails with the option named and TE's reason, never
    with an unexplained crash. Which one happened is recorded."""
    heads = SHAPE["hidden_size"] // head_dim
    ref = reference("llama", num_attention_heads=heads, num_key_value_heads=1, head_dim=head_dim)
    c = cfg(te_fp8_dpa=True)
    b = backends.make(f"te_fp8:{recipe}").prepare(ref.cpu(), c, CUDA)
    model = b.model
    tokens = torch.randint(0, SHAPE["vocab_size"], (2, 129), device=CUDA)
    try:
        with b.forward_context():
            logits = model(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
        outcome = {"ran": True, "attention_backend": b.describe().get("attention_backend")}
        with torch.no_grad():
            outcome["rel_err_vs_fp32"] = rel(logits, ref.to(CUDA)(tokens[:, :-1]))
        assert outcome["rel_err_vs_fp32"] < 0.2, outcome
    except RuntimeError as e:
        assert "options.te_fp8_dpa=true" in str(e), e
        outcome = {"ran": False, "reason": str(e)[:600]}
    _record(f"fp8_dpa_{recipe}_head{head_dim}", outcome)


def test_hf_run_keeps_layer_students_matched_eager_and_in_the_whole_step_graph(tmp_path):
    """`workbench run` with a saved HF Llama as student: the TE layer students (eager and with the whole step in
    one CUDA graph) start from the torch student's weights (initial_loss equal), train, and say which
    conversion ran; a per-Linear student sits beside them."""
    folder = tmp_path / "tiny-llama"
    reference("llama", vocab_size=256).model.save_pretrained(folder)
    rows = {}
    for run_id, kw in {"eager": {}, "step": {"graphs": True, "te_graph": "step"}}.items():
        c = cfg(kind="llama", vocab=256, tokenizer="bytes", corpus_mb=0.2, teacher="random", student=str(folder),
                steps=6, warmup=1, iters=3, eval_batches=1, no_kd_student=False,
                backends="torch_bf16,te_bf16,te_fp8:delayed", baseline="torch_bf16", **kw)
        df = results.load(runner.run(c, out=tmp_path, run_id=run_id, progress=False)).set_index("student")
        assert (df["status"] == "ok").all(), df["reason"].to_dict()
        for s in ("te_bf16", "te_fp8:delayed"):
            assert df.loc[s, "te_conversion"] == "layer"
            assert df.loc[s, "initial_loss"] == pytest.approx(df.loc["torch_bf16", "initial_loss"], rel=1e-5)
            assert df.loc[s, "final_train_loss"] < df.loc[s, "first_step_loss"]
        rows[run_id] = df[["initial_loss", "final_train_loss", "te_conversion", "attention_backend"]].to_dict("index")
    lin = cfg(kind="llama", vocab=256, tokenizer="bytes", corpus_mb=0.2, teacher="random", student=str(folder), steps=3,
              warmup=1, iters=2, eval_batches=1, backends="te_bf16", baseline="te_bf16", te_conversion="linear")
    df = results.load(runner.run(lin, out=tmp_path, run_id="linear", progress=False)).set_index("student")
    assert df.loc["te_bf16", "status"] == "ok" and df.loc["te_bf16", "te_conversion"] == "linear"
    assert "LlamaAttention" in df.loc["te_bf16", "kept_torch_modules"]
    _record("run", rows)


def test_hf_torchao_student_compiled_per_layer_trains_as_the_whole_model_compiled(tmp_path):
    """bench.compile_scope='layers' (the real-teacher studies' torchao student: its whole 30-layer model compiled as
    one graph had not logged a step when an H100 call's limit cut its point): a saved HF Llama of four layers trained by
    torchao float8, compiled per layer and whole, graphs asked for; both run, say which, and train the same loss curve
    to float8 tolerance. Both steps are one CUDA graph: at 7634e2f the per-layer capture was invalidated by a dynamo
    recompile inside it (transformers' mask under capture, answered by workbench.models.hf's causal SDPA).
    compile_ms and dynamo's graph and recompile counts go to the record (no timed assertion)."""
    from torch._dynamo.utils import counters

    # what dynamo compiles again and why (guard failures, graph breaks): in the failure's captured log (at 7634e2f
    # the log named four compiled frames, the last inside the capture, but not which functions or why)
    torch._logging.set_logs(recompiles=True, graph_breaks=True)
    try:
        folder = tmp_path / "tiny-llama"
        reference("llama", vocab_size=256, num_hidden_layers=4).model.save_pretrained(folder)
        rows = {}
        for scope in ("layers", "model"):
            c = cfg(kind="llama", vocab=256, tokenizer="bytes", corpus_mb=0.2, teacher="random", student=str(folder),
                    steps=6, warmup=1, iters=3, eval_batches=1, no_kd_student=False, graphs=True, te_graph="step",
                    backends="torchao_float8:tensorwise", baseline="torchao_float8:tensorwise", compile_scope=scope)
            counters.clear()
            df = results.load(runner.run(c, out=tmp_path, run_id=scope, progress=False)).set_index("student")
            row = df.loc["torchao_float8:tensorwise"]
            assert row["status"] == "ok", row["reason"]
            assert bool(row["compiled"]) and row["compile_ms"] > 0
            assert bool(row["graphed"]), row["notes"]
            assert ("compiled per layer (4 LlamaDecoderLayer" in row["notes"]) is (scope == "layers"), row["notes"]
            rows[scope] = {"compile_ms": float(row["compile_ms"]),
                           "capture_ms": float(row["capture_ms"]) if row["graphed"] else None,
                           "dynamo": {k: dict(v) for k, v in counters.items() if k in ("stats", "recompiles")},
                           "losses": results.read_csv(tmp_path / scope / "losses.csv")["loss"].tolist()}
            _record("torchao_compile_scope", rows)  # written per scope: a failure of the second keeps the first
    finally:
        torch._logging.set_logs()
    assert rows["layers"]["losses"] == pytest.approx(rows["model"]["losses"], rel=2e-2)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_hf_sequence_first_layers_compute_what_the_batch_first_ones_do(family):
    """options.te_qkv_format='sbhd' (the stack turned sequence-first once each way): the same logits and one
    step's gradients as the default layers, to bf16 tolerance (other kernels, same maths); Gemma 3 is built from
    TE's MultiheadAttention, the rest from TransformerLayer."""
    ref = reference(family)
    tokens = torch.randint(0, SHAPE["vocab_size"], (2, 129), device=CUDA)
    out = {}
    for fmt in ("bshd", "sbhd"):
        b = backends.make("te_bf16").prepare(ref.cpu(), cfg(te_qkv_format=fmt), CUDA)
        logits = _forward(b, b.model, tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
        grads = torch.cat([p.grad.float().flatten() for p in b.model.parameters() if p.grad is not None])
        out[fmt] = (logits.detach(), grads)
    figures = {"logits_rel": rel(out["sbhd"][0], out["bshd"][0]), "grads_rel": rel(out["sbhd"][1], out["bshd"][1])}
    _record(f"sbhd_{family}", figures)
    assert all(v < 2e-2 for v in figures.values()), figures  # a layout error is O(1)


def test_hf_sequence_first_students_train_in_the_whole_step_graph(tmp_path):
    """The layout lever's path: TE bf16 and FP8 delayed students, sequence-first, with the whole step in one CUDA
    graph, start from the torch student's weights and train."""
    folder = tmp_path / "tiny-llama"
    reference("llama", vocab_size=256).model.save_pretrained(folder)
    c = cfg(kind="llama", vocab=256, tokenizer="bytes", corpus_mb=0.2, teacher="random", student=str(folder),
            steps=6, warmup=1, iters=3, eval_batches=1, no_kd_student=False, graphs=True, te_graph="step",
            te_qkv_format="sbhd", backends="torch_bf16,te_bf16,te_fp8:delayed", baseline="torch_bf16")
    df = results.load(runner.run(c, out=tmp_path, run_id="sbhd", progress=False)).set_index("student")
    assert (df["status"] == "ok").all(), df["reason"].to_dict()
    for s in ("te_bf16", "te_fp8:delayed"):
        assert df.loc[s, "te_conversion"] == "layer" and bool(df.loc[s, "graphed"]), df.loc[s].to_dict()
        assert df.loc[s, "initial_loss"] == pytest.approx(df.loc["torch_bf16", "initial_loss"], rel=1e-5)
        assert df.loc[s, "final_train_loss"] < df.loc[s, "first_step_loss"]
    _record("sbhd_run", df[["initial_loss", "final_train_loss", "graphed", "notes"]].to_dict("index"))
