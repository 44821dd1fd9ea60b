"""train.lr_schedule: one table of rates, applied before each training step (in place where a graph reads it),
checked up front, and the same table in the JAX students' optax."""
import math

import pandas as pd
import pytest
import torch

from workbench import config
from workbench.config import ConfigError
from workbench.run import runner
from workbench.train import optim


def test_the_rates_warm_up_then_decay_to_zero_at_the_end():
    assert optim.rates("constant", 1e-3, 4) == [1e-3] * 4
    cos = optim.rates("cosine", 1.0, 8)
    assert cos[0] == 1.0 and all(a > b for a, b in zip(cos, cos[1:])) and 0 < cos[-1] < 0.05
    assert optim.rates("cosine", 1.0, 8)[4] == pytest.approx(0.5)  # half-way down at half-way
    assert optim.rates("linear", 1.0, 4) == pytest.approx([1.0, 0.75, 0.5, 0.25])
    warm = optim.rates("linear", 1.0, 6, warmup=2)
    assert warm == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25])  # the first step does not stand still
    with pytest.raises(ValueError, match="constant"):
        optim.rates("step", 1.0, 4)


def test_bad_schedule_fields_are_refused_naming_the_field_and_the_allowed_values():
    with pytest.raises(ConfigError, match=r"train.lr_schedule.*cosine"):
        config.from_preset("cpu-smoke", lr_schedule="cosin")
    with pytest.raises(ConfigError, match=r"train.lr_warmup_steps.*\[0, train.steps=3\)"):
        config.from_preset("cpu-smoke", steps=3, lr_warmup_steps=3)


def _opt(lr):
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def test_a_constant_rate_leaves_the_step_as_it_is():
    cfg = config.from_preset("cpu-smoke")
    opt = _opt(1e-3)
    assert optim.schedule(opt, cfg.train, 5, torch.device("cpu"), captured=True) is None
    assert isinstance(opt.param_groups[0]["lr"], float)  # no tensor rate: the graph reads what it always did

    def step():
        return "stepped"
    assert optim.scheduled(step, opt, None) is step


def test_a_captured_step_reads_its_rate_from_one_tensor_filled_in_place():
    cfg = config.from_preset("cpu-smoke", steps=4, lr=1.0, lr_schedule="linear")
    opt = _opt(1.0)
    table = optim.schedule(opt, cfg.train, 4, torch.device("cpu"), captured=True)
    lr = opt.param_groups[0]["lr"]
    assert torch.is_tensor(lr) and lr.dtype == torch.float32 and lr.dim() == 0
    seen = []
    step = optim.scheduled(lambda: seen.append((opt.param_groups[0]["lr"] is lr, float(lr))), opt, table)
    for _ in range(6):  # four training steps, then two timed ones: those keep the last rate
        step()
    assert [same for same, _ in seen] == [True] * 6  # the same memory every time (a graph's address)
    assert [v for _, v in seen] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.25, 0.25])


def test_te_fused_adam_in_a_captured_step_is_refused_rather_than_trained_at_one_rate():
    cfg = config.from_preset("cpu-smoke", lr_schedule="cosine")

    class FakeFusedAdam(torch.optim.Optimizer):  # a named fake: TE's FusedAdam is not a torch AdamW
        def __init__(self, params):
            super().__init__(params, {"lr": 1e-3})

    opt = FakeFusedAdam([torch.nn.Parameter(torch.zeros(2))])
    with pytest.raises(ValueError, match="captured step"):
        optim.schedule(opt, cfg.train, 5, torch.device("cpu"), captured=True)
    assert optim.schedule(opt, cfg.train, 5, torch.device("cpu"), captured=False) is not None  # eager: floats


def test_a_scheduled_run_trains_its_first_two_steps_as_the_constant_one_and_then_more_gently(tmp_path):
    """Cosine starts at train.lr: the loss before step 1 and after one full-rate update are the constant run's;
    from the third step on the smaller rates show (a schedule never applied would leave every loss equal, one
    applied a step late would change the second)."""
    def losses(run_id, **kw):
        cfg = config.from_preset("cpu-smoke", backends="torch_fp32", baseline="torch_fp32", steps=6, warmup=1,
                                 iters=2, eval_batches=1, lr=3e-3, **kw)
        df = pd.read_csv(runner.run(cfg, out=tmp_path, run_id=run_id, progress=False) / "losses.csv")
        return df[df["student"] == "torch_fp32"]["loss"].tolist()

    const, cos = losses("constant"), losses("cosine", lr_schedule="cosine")
    assert cos[:2] == pytest.approx(const[:2], rel=1e-6)
    assert all(not math.isclose(a, b, rel_tol=1e-6) for a, b in zip(cos[2:], const[2:])), (const, cos)


def test_the_jax_students_read_the_same_table():
    pytest.importorskip("optax")
    from workbench.jax_side import student

    cfg = config.from_preset("cpu-smoke", steps=4, lr=1.0, lr_schedule="linear", lr_warmup_steps=1,
                             weight_decay=0.0)
    tx = student.adamw(cfg.train)
    import jax.numpy as jnp
    import optax

    params = {"w": jnp.zeros(())}
    state = tx.init(params)
    seen = []
    for _ in range(5):  # a constant unit gradient, no decay: every Adam update is -lr
        updates, state = tx.update({"w": jnp.ones(())}, state, params)
        seen.append(-float(updates["w"]))
        params = optax.apply_updates(params, updates)
    want = optim.rates("linear", 1.0, 4, warmup=1)
    assert seen[:4] == pytest.approx(want, rel=1e-3) and seen[4] == pytest.approx(want[-1], rel=1e-2)
