"""TE students of the language-model path with the named fake TE (tests/fake_te.py; real TE runs on the H200,
tests/gpu/test_gpu.py): a forced attention backend (options.te_attention) and delayed scaling's state kept out
of the forwards that are not training steps (held-out evaluation, graph-capture warm-ups)."""
import contextlib
import dataclasses
import sys
import types

import fake_te
import pytest
import torch
from fake_te import FakeRecipes, FakeTEModules

from workbench import backends, config
from workbench.backends._te_run import AttentionUnavailable
from workbench.env import te as _te
from workbench.models import CausalLM, LMShape
from workbench.train import lm_task, loop

SHAPE = dict(kind="gpt", vocab=96, hidden=32, intermediate=64, layers=2, heads=4, seq_len=16)


@pytest.fixture
def fake(monkeypatch):
    """The fake TE loaded as the workbench loads TE, its attention module where TE's lives, a clean selection
    cache, and TE's NVTE_* switches as this process started with them afterwards."""
    monkeypatch.setattr(_te, "load", lambda: (FakeTEModules, FakeRecipes, ""))
    monkeypatch.setitem(sys.modules, _te.ATTENTION_MODULES[0], fake_te)
    monkeypatch.setitem(fake_te._attention_backends, "attention_params", None)
    yield fake_te
    _te.force_attention("auto")


def te_student(spec: str, **overrides):
    cfg = config.from_preset("gpt-cpu", **overrides)
    torch.manual_seed(0)
    b = backends.make(spec).prepare(CausalLM(LMShape(**SHAPE)), cfg, torch.device("cpu"))
    return b, b.model, cfg


def forward(b, model):
    with b.forward_context():
        return model(torch.randint(0, 96, (2, 16)))


def test_a_forced_backend_is_selected_and_the_next_auto_student_gets_tes_own_pick_again(fake):
    forced, model, _ = te_student("te_bf16", te_attention="unfused")
    forward(forced, model)
    row = forced.describe()
    assert (row["attention_requested"], row["attention_backend"]) == ("unfused", "unfused")
    assert "attention_warning" not in row  # asked for: no warning about the slowest backend
    # Same attention inputs, so TE would keep its cached (forced) selection: the switch back marks it stale.
    auto, model, _ = te_student("te_bf16")
    forward(auto, model)
    row = auto.describe()
    assert (row["attention_requested"], row["attention_backend"]) == ("auto", "fused (sub-backend 1)")


def test_a_forced_backend_that_cannot_run_here_is_one_clear_error(fake, monkeypatch):
    monkeypatch.setitem(fake.AVAILABLE, "fused", False)  # e.g. cuDNN's fused attention failed to load
    b, model, _ = te_student("te_fp8:current", te_attention="fused")
    with pytest.raises(AttentionUnavailable, match=r"options.te_attention='fused' forces TE's fused attention, which "
                                                   r"TE cannot run .*No dot product attention backend"):
        forward(b, model)


def test_forcing_flash_without_flash_attn_is_a_skip_with_its_reason(fake, monkeypatch):
    utils = types.SimpleNamespace(FlashAttentionUtils=types.SimpleNamespace(is_installed=False, v3_is_installed=False))
    monkeypatch.setitem(sys.modules, _te.ATTENTION_UTILS, utils)
    ctx = backends.Context(torch.device("cuda"), config.from_preset("gpt-cpu", te_attention="flash"))
    ok, why = backends.make("te_bf16").availability(ctx)
    assert not ok and "finds no flash-attn" in why
    ctx = backends.Context(torch.device("cuda"), config.from_preset("gpt-cpu", te_attention="fused"))
    assert backends.make("te_bf16").availability(ctx)[0]  # known only at the first forward


def test_students_without_tes_attention_note_that_the_option_does_not_apply(fake):
    cfg = config.from_preset("gpt-cpu", te_attention="unfused")
    notes = backends.make("torch_bf16").prepare(CausalLM(LMShape(**SHAPE)), cfg, torch.device("cpu")).policy.notes
    assert any("options.te_attention='unfused' not applied" in n for n in notes)
    b, _, cfg = te_student("te_bf16", te_attention="unfused")
    assert not b.policy.notes
    assert config.from_preset("gpt-cpu").options.te_attention == "auto"
    with pytest.raises(config.ConfigError, match=r"options.te_attention must be one of \['auto', 'flash', 'fused', "
                                                 r"'unfused'\], got 'fast'"):
        config.from_preset("gpt-cpu", te_attention="fast")


# ---- delayed scaling's amax history ---------------------------------------------------------------
def fp8_state(model):
    return [m.get_fp8_meta_tensors() for m in model.modules() if isinstance(m, FakeTEModules.Linear)]


def same_state(a, b):
    return all((x is None and y is None) or all(torch.equal(p, q) for p, q in zip(x["scaling_fwd"], y["scaling_fwd"]))
               for x, y in zip(a, b))


def test_the_fakes_amax_history_moves_with_every_fp8_forward(fake):
    """The premise of the next tests: an evaluation forward under FP8 changes what training quantises with."""
    b, model, _ = te_student("te_fp8:delayed", te_amax_compute_algo="most_recent")
    forward(b, model)
    before = fp8_state(model)
    with torch.no_grad():
        forward(b, model.eval())
    assert not same_state(before, fp8_state(model))


def tiny_lm_task(tmp_path):
    """A one-block GPT on bytes with a random teacher, delayed scaling by the most recent amax."""
    cfg = config.from_preset("gpt-cpu", vocab=256, tokenizer="bytes", corpus_mb=0.1, teacher="random", hidden=32,
                             heads=4, intermediate=64, layers=1, seq_len=16, batch=4, steps=6, eval_batches=2,
                             warmup=0, iters=1, te_amax_compute_algo="most_recent")
    return cfg, lm_task.LMTask(cfg, torch.device("cpu"), None, tmp_path)


def test_training_is_the_same_with_and_without_held_out_evaluation_in_between(fake, tmp_path):
    """Held-out evaluations run FP8 forwards between training steps; with delayed scaling they would feed the
    amax history. Kept out, the losses are identical to the last bit, as for the torch students."""
    cfg, task = tiny_lm_task(tmp_path)
    data = task.make_data()
    losses = {}
    for every in (0, 1):
        run_cfg = cfg.replace(eval_every=every)
        student = loop.prepare(backends.make("te_fp8:delayed"), run_cfg, task, torch.device("cpu"))
        metrics, losses[every] = loop.run_student(student, run_cfg, task, data, torch.device("cpu"))
        assert metrics["heldout_ppl"] > 1
    assert len(metrics["curve"]) == cfg.train.steps  # eval_every=1: after every step, the last one included
    assert losses[0] == losses[1]


def test_the_step0_evaluation_leaves_delayed_scaling_as_the_first_training_step_finds_it(fake, tmp_path, monkeypatch):
    """Every LM student is evaluated in its own precision before its first training step (loop.step0_metrics):
    FP8 forwards that, let through, set the scales step 1 quantises with. Kept out, the losses are those of a
    run without that evaluation, to the last bit."""
    cfg, task = tiny_lm_task(tmp_path)
    data, cpu = task.make_data(), torch.device("cpu")
    def fp8_student():
        return loop.prepare(backends.make("te_fp8:delayed"), cfg, task, cpu)

    metrics, with_step0 = loop.run_student(fp8_student(), cfg, task, data, cpu)
    assert 0 <= metrics["top1_agreement_step0"] <= 1 and metrics["heldout_ppl_step0"] > 1
    assert metrics["kl_teacher_student_t1_nats_step0"] > 0
    # what the evaluation would do unprotected
    leaky = dataclasses.replace(fp8_student(), outside_training=contextlib.nullcontext)
    assert loop.run_student(leaky, cfg, task, data, cpu)[1][0] != with_step0[0]
    monkeypatch.setattr(loop, "step0_metrics", lambda *args: {})
    metrics, without = loop.run_student(fp8_student(), cfg, task, data, cpu)
    assert "heldout_ppl_step0" not in metrics
    assert with_step0 == without


def test_graph_capture_warm_ups_leave_the_fp8_state_as_it_was(fake, monkeypatch):
    """te.make_graphed_callables runs warm-up forwards and backwards under FP8 (TE 2.20 restores the state
    itself; older ones need not): the student's graph starts from the state its training reached."""
    def make_graphed_callables(model, sample_args, num_warmup_iters=3, enabled=False, recipe=None):
        for _ in range(num_warmup_iters):
            with FakeTEModules.autocast(enabled=enabled, recipe=recipe):
                model(*sample_args).float().sum().backward()
        return model

    monkeypatch.setattr(FakeTEModules, "make_graphed_callables", staticmethod(make_graphed_callables), raising=False)
    b, model, _ = te_student("te_fp8:delayed", te_amax_compute_algo="most_recent")
    forward(b, model)
    before = fp8_state(model)
    b.make_graphed(model, torch.randint(0, 96, (2, 16)) + 1)
    assert same_state(before, fp8_state(model))
