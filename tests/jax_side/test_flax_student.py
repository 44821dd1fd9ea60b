"""The Flax student against the torch one, where jax, flax and optax are installed (pip install -e '.[jax]')."""
import contextlib
import math
import sys
import types

import numpy as np
import pytest
import torch

from workbench import config
from workbench.backends import reference_state
from workbench.jax_side import convert, runner
from workbench.models.mlp import Student
from workbench.train import loop, tasks

jax = pytest.importorskip("jax", reason="jax is not installed: pip install -e '.[jax]'")
pytest.importorskip("flax", reason="flax is not installed: pip install -e '.[jax]'")
pytest.importorskip("optax", reason="optax is not installed: pip install -e '.[jax]'")
import flax.linen as flax_nn  # noqa: E402

from workbench.jax_side import student  # noqa: E402  (imports jax: only after the skips above)


@pytest.fixture(scope="module")
def mlp():
    """A tiny MLP run's config, task (teacher, reference student) and data (teacher targets computed once), on
    the CPU: what the torch rows train on; and the shared initial weights under the reference layout's names."""
    cfg = config.from_preset("cpu-smoke", steps=12)
    task = tasks.for_config(cfg, torch.device("cpu"), None, cache_dir="unused")
    return cfg, task, task.make_data(), reference_state(task.reference)


def _flax_fns(cfg, kind=None):
    model, tx = student.for_model(cfg.model), student.adamw(cfg.train)
    return model, tx, *student.make_fns(model, kind or cfg.distill.loss, tx)


def test_the_flax_forward_is_the_torch_forward(mlp):
    cfg, task, data, init = mlp
    tokens = data.train[0][0]
    params = convert.to_flax(init)
    out, hidden = student.for_model(cfg.model).apply({"params": params}, tokens.numpy())
    with torch.no_grad():
        ref_out, ref_hidden = task.reference(tokens, return_hidden=True)
    np.testing.assert_allclose(np.asarray(out), ref_out.numpy(), atol=1e-5, rtol=1e-5)
    for h, r in zip(hidden, ref_hidden):
        np.testing.assert_allclose(np.asarray(h), r.numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["mse", "cosine", "hidden"])
def test_the_initial_loss_is_the_torch_students(mlp, kind):
    cfg, task, data, init = mlp
    tokens, targets = data.train[0]
    if kind == "hidden":  # the teacher's block states, as the task computes them for loss='hidden'
        with torch.no_grad():
            out, hidden = task.teacher(tokens, return_hidden=True)
        targets = type(targets)(out.float(), [h.float() for h in hidden])
    task.kind, task.needs_hidden = kind, kind == "hidden"
    try:
        torch_loss = loop.initial_loss(task.reference, task, (tokens, targets))
    finally:
        task.kind, task.needs_hidden = cfg.distill.loss, False
    *_, loss_fn = _flax_fns(cfg, kind)
    flax_loss = float(loss_fn(convert.to_flax(init), *runner._batch(tokens, targets)))
    assert flax_loss == pytest.approx(torch_loss, rel=1e-5)


def test_one_adamw_step_moves_the_weights_as_torch_adamw_does(mlp):
    cfg, task, data, init = mlp
    tokens, targets = data.train[0]
    model = Student(cfg.model)
    model.load_state_dict(init)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    task.loss(task.forward(model, tokens), targets).backward()
    opt.step()
    _, tx, step, _ = _flax_fns(cfg)
    params = convert.to_flax(init)
    params, _, _ = step(params, tx.init(params), *runner._batch(tokens, targets))
    stepped = convert.to_torch(jax.device_get(params))
    for k, v in reference_state(model).items():
        np.testing.assert_allclose(stepped[k], v.detach().numpy(), atol=1e-6, rtol=1e-5, err_msg=k)


@pytest.mark.parametrize("compute", ["fp32", "bf16"])
def test_a_short_jitted_run_gives_a_jax_row(mlp, compute):
    cfg, task, data, init = mlp
    row = runner.run(cfg, init, data, compute=compute)
    assert row["status"] == "ok", row["reason"]
    assert row["backend"] == f"jax_{compute}" and row["gemm_precision"] == compute
    # matched init, as the torch rows check it: the same initial loss on the first held-out batch
    assert row["initial_loss"] == pytest.approx(loop.initial_loss(task.reference, task, data.eval[0]), rel=1e-5)
    assert row["framework"] == "jax" and row["mode"] == "JAX"
    assert row["steps_run"] == cfg.train.steps and row["jax_version"] == jax.__version__
    assert all(math.isfinite(row[k]) for k in ("initial_loss", "first_step_loss", "final_train_loss"))
    assert row["final_train_loss"] < row["first_step_loss"]
    for k in ("compile_ms", "step_ms_median", "step_ms_p20", "step_ms_p80", "step_ms_mean", "tokens_per_s"):
        assert row[k] is not None and row[k] > 0, k
    assert row["step_ms_p20"] <= row["step_ms_median"] <= row["step_ms_p80"]


def test_a_failing_run_is_an_error_row_not_a_crash(mlp):
    cfg, _, data, init = mlp
    row = runner.run(cfg, {k: v for k, v in init.items() if k != "head.bias"}, data)
    assert row["status"] == "error" and "head.bias" in row["reason"]


def test_the_fp8_row_is_skipped_without_te_jax_saying_what_to_build(mlp, monkeypatch):
    """jax:fp8_current needs TE's JAX extension and a GPU; here (the real probe) neither: a row saying so."""
    monkeypatch.setitem(sys.modules, "transformer_engine", None)  # TE absent, whatever this machine has
    cfg, _, data, init = mlp
    row = runner.run(cfg, init, data, compute="fp8_current")
    assert row["status"] == "skipped" and "NVTE_FRAMEWORK=jax" in row["reason"]
    assert row["gemm_precision"] == "fp8"


FAKE_AUTOCAST = {"inside": False}  # set while the fake autocast's context is open


class FakeDenseGeneral(flax_nn.Module):
    """FAKE of transformer_engine.jax.flax.DenseGeneral (TE-JAX cannot be built without a GPU): its parameter names
    and shapes (kernel [in, out], bias [out], fp32) and its contract of computing in its input's dtype, no FP8.
    The real one runs on the H200 (tests/gpu)."""

    features: int
    use_bias: bool = True

    @flax_nn.compact
    def __call__(self, x):
        assert FAKE_AUTOCAST["inside"], "a TE layer traced outside TE's autocast"
        kernel = self.param("kernel", flax_nn.initializers.lecun_normal(), (x.shape[-1], self.features))
        bias = self.param("bias", flax_nn.initializers.zeros, (self.features,))
        return x @ kernel.astype(x.dtype) + bias.astype(x.dtype)


def fake_te_jax(monkeypatch) -> list:
    """FAKE transformer_engine.jax (autocast records each entry), .flax (FakeDenseGeneral) and common.recipe."""
    entered = []

    @contextlib.contextmanager
    def autocast(enabled=False, recipe=None, mesh_resource=None):
        entered.append((enabled, type(recipe).__name__))
        FAKE_AUTOCAST["inside"] = True
        try:
            yield
        finally:
            FAKE_AUTOCAST["inside"] = False

    te = types.ModuleType("transformer_engine")
    te_jax = types.ModuleType("transformer_engine.jax")
    te_jax.autocast = autocast
    te_jax.flax = types.SimpleNamespace(DenseGeneral=FakeDenseGeneral)
    common = types.ModuleType("transformer_engine.common")
    common.recipe = types.SimpleNamespace(Float8CurrentScaling=type("Float8CurrentScaling", (), {}))
    te.jax, te.common = te_jax, common
    for name, mod in (("transformer_engine", te), ("transformer_engine.jax", te_jax),
                      ("transformer_engine.jax.flax", te_jax.flax), ("transformer_engine.common", common),
                      ("transformer_engine.common.recipe", common.recipe)):
        monkeypatch.setitem(sys.modules, name, mod)
    return entered


def test_the_te_student_keeps_the_flax_names_and_traces_under_te_autocast(mlp, monkeypatch):
    """The TE student's GEMMs (here FAKE TE layers) take the plain student's converted weights unchanged, compute
    from bf16 inputs (= the bf16 Flax student, which the fake computes like), and its loss is traced inside TE's
    autocast with the recipe named by the compute."""
    entered = fake_te_jax(monkeypatch)
    cfg, _, data, init = mlp
    params = convert.to_flax(init)
    te_model, bf16 = student.for_model(cfg.model, "fp8_current"), student.for_model(cfg.model, "bf16")
    assert te_model.te and te_model.dtype == jax.numpy.bfloat16
    tokens, targets = data.train[0]
    with sys.modules["transformer_engine.jax"].autocast(enabled=True):
        init = te_model.init(jax.random.PRNGKey(0), tokens.numpy())["params"]
        te_out = te_model.apply({"params": params}, tokens.numpy())[0]
    assert jax.tree_util.tree_map(lambda a: a.shape, init) == jax.tree_util.tree_map(lambda a: a.shape, params)
    np.testing.assert_allclose(np.asarray(te_out, np.float32),
                               np.asarray(bf16.apply({"params": params}, tokens.numpy())[0], np.float32),
                               rtol=2e-2, atol=2e-2)
    entered.clear()
    tx = student.adamw(cfg.train)
    with pytest.raises(ValueError, match="needs its recipe"):
        student.make_fns(te_model, cfg.distill.loss, tx)
    _, loss = student.make_fns(te_model, cfg.distill.loss, tx, student.te_recipe("fp8_current"))
    batch = runner._batch(tokens, targets)
    assert math.isfinite(float(loss(params, *batch))) and math.isfinite(float(loss(params, *batch)))
    assert entered == [(True, "Float8CurrentScaling")]  # once: at the trace, not at every call


# ---- the causal LM -----------------------------------------------------------------------------------------------
from workbench.jax_side import lm_student  # noqa: E402


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_the_flax_lm_forward_is_the_torch_forward(kind):
    from workbench.models import CausalLM, kinds

    torch.manual_seed(0)
    shape = kinds.get(kind).lm_shape(vocab=64, hidden=32, intermediate=64, layers=2, heads=4, seq_len=16)
    model = CausalLM(shape)
    tokens = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        ref = model(tokens)
    out = lm_student.FlaxCausalLM(shape).apply({"params": convert.lm_to_flax(reference_state(model))},
                                               tokens.numpy().astype(np.int32))
    np.testing.assert_allclose(np.asarray(out), ref.numpy(), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("loss,ce_weight", [("forward_kl", 0.5), ("reverse_kl", 0.3), ("jsd", 0.0), ("jsd", 1.0)])
def test_the_jax_lm_loss_is_the_torch_lm_loss(loss, ce_weight):
    """lm_objective against lm_objectives.lm_loss (checkpointed: the reference maths), padding tokens left out."""
    from workbench.config import DistillConfig
    from workbench.train.objectives import lm_objectives

    d = DistillConfig(loss=loss, ce_weight=ce_weight, temperature=2.0, loss_impl="checkpointed")
    torch.manual_seed(1)
    s, t = torch.randn(2, 5, 11), torch.randn(2, 5, 11)
    y = torch.randint(0, 11, (2, 5))
    y[0, :2] = lm_objectives.IGNORE_INDEX
    want = float(lm_objectives.lm_loss(s, t, y, d))
    got = float(lm_student.lm_objective(d, s.numpy(), t.numpy(), y.numpy().astype(np.int32)))
    assert got == pytest.approx(want, rel=1e-5)


def test_the_te_lm_student_needs_its_recipe():
    from workbench.config import DistillConfig
    from workbench.models import kinds

    shape = kinds.get("gpt").lm_shape(vocab=64, hidden=32, intermediate=64, layers=1, heads=4, seq_len=16)
    with pytest.raises(ValueError, match="needs its recipe"):
        lm_student.make_fns(lm_student.FlaxCausalLM(shape, te=True), DistillConfig(loss="forward_kl"),
                            student.adamw(config.from_preset("gpt-cpu").train))
