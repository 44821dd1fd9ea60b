"""Backend gating with a *fake* Transformer Engine (the real one cannot exist on a CPU machine; the
real path runs on the H200 via scripts/gpu.sh core). Only availability logic is exercised here."""
import pytest
import torch
from fake_te import FakeRecipes, FakeTE, FakeTEModules

from workbench import backends, config
from workbench.backends._te_run import TERun, reset_fp8_scaling
from workbench.env import te as _te


def ctx(device="cuda", **overrides):
    return backends.Context(device=torch.device(device), cfg=config.from_preset("seed", **overrides))


@pytest.fixture
def fake_te(monkeypatch):
    def install(te):
        monkeypatch.setattr(_te, "load", lambda: (te, object(), ""))
    return install


def test_fp8_dims_not_multiple_of_16_are_skipped_with_that_reason(fake_te):
    fake_te(FakeTE())
    b = backends.make("te_fp8:current")
    ok, why = b.availability(ctx(hidden=520))
    assert not ok and "multiples of 16" in why and "model.hidden=520" in why
    assert b.fallback(ctx(hidden=520), why) is None  # TE works: a skip, not a fallback
    assert b.availability(ctx())[0]


def test_each_recipe_is_gated_by_tes_own_check(fake_te):
    fake_te(FakeTE(fp8=(False, "Device compute capability 8.9 or higher required for FP8 execution.")))
    ok, why = backends.make("te_fp8:delayed").availability(ctx())
    assert not ok and "8.9 or higher" in why
    ok, why = backends.make("te_fp8:mxfp8").availability(ctx())
    assert not ok and "10.0 or higher" in why
    assert backends.make("te_fp8:block").availability(ctx())[0]
    ok, why = backends.make("te_fp8:nvfp4").availability(ctx())
    assert not ok and "NVFP4" in why


def test_mxfp8_needs_multiples_of_32(fake_te):
    fake_te(FakeTE(mxfp8=(True, "")))
    ok, why = backends.make("te_fp8:mxfp8").availability(ctx(hidden=528, intermediate=2112))
    assert not ok and "multiples of 32" in why


def test_te_on_a_cpu_device_falls_back(fake_te):
    fake_te(FakeTE())
    b = backends.make("te_bf16")
    ok, why = b.availability(ctx("cpu"))
    assert not ok and "CUDA" in why
    fb = b.fallback(ctx("cpu"), why)
    assert fb is not None and fb.mode == "Fallback-PyTorch"


def policy(spec: str, cfg, device: torch.device) -> backends.StepPolicy:
    """The step policy `spec`'s student gets under `cfg` on `device`, without building it (a CUDA device on a CPU
    machine): a torch student's from its autocast dtype, a TE student's from how its forward runs."""
    b = backends.make(spec)
    if b.family == "te":
        fp8 = b.gemm_precision != "bf16"
        return b.policy(cfg, TERun(device, torch.bfloat16, cfg.options.te_attention, recipe="r" if fp8 else None))
    return backends.step_policy(b, cfg, device, getattr(b, "dtype", None))


def test_cpu_graphs_and_fp16_reasons():
    graphs = config.from_preset("seed", graphs=True)
    assert policy("torch_fp16", graphs, torch.device("cuda")).notes == (
        "graphs not applied: the fp16 grad scaler's inf checks and skipped steps are not graph-safe",)
    assert policy("torch_bf16", graphs, torch.device("cpu")).notes == ("graphs not applied: CUDA graphs need a GPU",)


NEW_BACKEND = '''
"""A backend that exists only in this test: bf16 autocast under another name."""
from workbench.backends import register
from workbench.backends.torch_autocast import TorchBF16


@register
class MyBF16(TorchBF16):
    name = "my_bf16"
    mode = "Mine"
'''


# An FP8 backend declared as such (on the CPU it runs bf16 autocast): the summary's FP8-vs-bf16 ratios, the
# distributed notes and the plots follow from what it declares, not from its name.
NEW_FP8_BACKEND = '''
"""A backend that exists only in this test: it declares low-precision GEMMs and a bf16 counterpart."""
from workbench.backends import register
from workbench.backends._autocast import Autocast


@register
class MyFP8(Autocast):
    name = "my_fp8"
    mode = "Mine-FP8"
    gemm_precision = "fp8"
    bf16_counterparts = ("my_bf16",)
'''


def test_adding_a_backend_is_adding_one_file(tmp_path):
    """Copy the package, drop new files into backends/, and run them: no other file is edited. The FP8 one
    is in students.csv, in summary.json's FP8-vs-bf16 ratios (against the counterpart it declares) and in the
    run's plots, in a colour of its own."""
    import pathlib
    import shutil
    import subprocess
    import sys

    import matplotlib.colors as mcolors
    import pandas as pd

    import workbench
    from workbench import results
    from workbench.results import plots

    pkg = tmp_path / "src" / "workbench"
    shutil.copytree(pathlib.Path(workbench.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "backends" / "my_bf16.py").write_text(NEW_BACKEND)
    (pkg / "backends" / "my_fp8.py").write_text(NEW_FP8_BACKEND)
    env = {"PYTHONPATH": str(tmp_path / "src"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    p = subprocess.run([sys.executable, "-m", "workbench", "run", "--preset", "cpu-smoke",
                        "--out", str(tmp_path / "out"), "--run-id", "r",
                        "--set", "backends=torch_fp32,my_bf16,my_fp8", "--set", "baseline=torch_fp32",
                        "--set", "steps=2", "--set", "iters=2", "--set", "warmup=1", "--set", "eval_batches=1"],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    run = tmp_path / "out" / "r"
    df = pd.read_csv(run / "students.csv").set_index("student")
    assert df.loc["my_bf16", "status"] == "ok" and df.loc["my_bf16", "mode"] == "Mine"
    assert df.loc["my_bf16", "initial_loss"] == df.loc["torch_fp32", "initial_loss"]
    assert df.loc["my_fp8", "status"] == "ok" and df.loc["my_fp8", "mode"] == "Mine-FP8"
    ratios = results.load_summary(run)["fp8_vs_bf16"]
    assert set(ratios) == {"my_fp8"}
    want = df.loc["my_fp8", "final_train_loss"] / df.loc["my_bf16", "final_train_loss"]
    assert ratios["my_fp8"]["final_loss_ratio"] == pytest.approx(want)
    assert (run / "step_time.png").is_file()
    step = plots.step_time(run).axes[0]
    colours = [mcolors.to_rgba(b.get_facecolor()) for b in step.patches]
    assert mcolors.to_rgba(plots.student_color("my_fp8")) in colours
    assert len({plots.student_color(s) for s in df.index}) == len(df)


@pytest.mark.parametrize("layout", ["separate", "fused"])
def test_te_conversion_swaps_every_layer_and_keeps_the_weights(monkeypatch, layout):
    from workbench.backends._te import convert_to_te
    from workbench.models import Student, reference_student

    monkeypatch.setattr(_te, "load", lambda: (FakeTEModules, object(), ""))
    cfg = config.from_preset("cpu-smoke", layout=layout)
    torch.manual_seed(0)
    reference = reference_student(cfg.model, Student(cfg.model).state_dict())
    model = reference_student(cfg.model, reference.state_dict() if layout == "separate" else
                              reference.to_reference_state())
    swapped = convert_to_te(model, cfg, torch.device("cpu"))
    want = {"separate": {FakeTEModules.Linear, FakeTEModules.LayerNorm},
            "fused": {FakeTEModules.Linear, FakeTEModules.LayerNormMLP}}[layout]
    assert {type(m) for m in model.modules() if type(m).__qualname__.startswith("FakeTEModules")} == want
    n_blocks = cfg.model.layers
    assert len(swapped) == (3 * n_blocks + 1 if layout == "separate" else n_blocks + 1)  # + the head
    backends.check_matched(model, reference)
    tokens = torch.randint(0, cfg.model.vocab, (2, 8))
    assert torch.equal(model(tokens), reference(tokens))


def test_the_step_policy_is_the_backends_answer():
    cuda, seed = torch.device("cuda"), config.from_preset("seed", graphs=True, compile=True)
    torch_bf16 = policy("torch_bf16", seed, cuda)
    assert torch_bf16 == backends.StepPolicy(compile=True, graph="step", grad_scaler=False, notes=())
    te = policy("te_fp8:current", seed, cuda)
    assert (te.compile, te.graph) == (False, "fwd_bwd") and "compile not applied" in te.notes[0]
    p = policy("torch_fp16", seed, cuda)
    assert p.grad_scaler and p.graph is None and any("not graph-safe" in n for n in p.notes)
    assert policy("torch_fp32", seed, torch.device("cpu")).graph is None  # no GPU, no graph
    assert policy("torchao_float8", config.from_preset("seed"), cuda).compile  # always compiled


def test_te_delayed_scaling_takes_its_history_from_the_config(monkeypatch):

    monkeypatch.setattr(_te, "load", lambda: (FakeTEModules, FakeRecipes, ""))
    cfg = config.from_preset("cpu-smoke", te_amax_history_len=1024, te_amax_compute_algo="most_recent")
    recipe = backends.make("te_fp8:delayed").run(cfg, torch.device("cpu")).recipe
    assert recipe == {"margin": 0, "fp8_format": "HYBRID", "amax_history_len": 1024,
                            "amax_compute_algo": "most_recent", "reduce_amax": True}
    with pytest.raises(config.ConfigError, match="options.te_amax_compute_algo"):
        config.from_preset("cpu-smoke", te_amax_compute_algo="min")


def test_a_delayed_scaling_student_alone_on_one_rank_does_not_all_reduce(monkeypatch):
    """A distributed run's one-GPU reference runs on rank 0 while the other ranks wait: TE's amax all-reduce
    over the default group would wait for them forever (seen on two H200s). Spread students reduce over theirs."""

    monkeypatch.setattr(_te, "load", lambda: (FakeTEModules, FakeRecipes, ""))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    cfg, cpu = config.from_preset("cpu-smoke"), torch.device("cpu")
    alone = backends.make("te_fp8:delayed").run(cfg, cpu)
    spread = backends.make("te_fp8:delayed_e4m3").run(cfg, cpu, group=object())  # what workbench.run.parallel hands
    assert alone.recipe["reduce_amax"] is False and spread.recipe["reduce_amax"] is True


def test_te_whole_step_graph_is_a_switch_that_names_what_blocks_it():
    cuda = torch.device("cuda")
    step = config.from_preset("seed", graphs=True, te_graph="step")
    assert policy("te_fp8:delayed", step, cuda).graph == "step"
    assert policy("te_bf16", config.from_preset("seed", graphs=True), cuda).graph == "fwd_bwd"
    # the whole-step graph has no output-only restriction: the hidden-state loss graphs too
    hidden = config.from_preset("seed", graphs=True, te_graph="step", loss="hidden")
    assert policy("te_fp8:current", hidden, cuda).graph == "step"
    assert policy("te_fp8:current", config.from_preset("seed", graphs=True, loss="hidden"), cuda).graph is None
    # FP8 weights: TE's FusedAdam cannot capture their update, so the step runs eager, and the row says why
    p = policy("te_fp8:delayed", config.from_preset("seed", graphs=True, te_graph="step", te_fp8_weights=True,
                                                    optimizer="te_fused_adam"), cuda)
    assert p.graph is None and any("graphs not applied: FP8 weights" in n for n in p.notes)
    fp8w_cfg = config.from_preset("seed", te_fp8_weights=True, optimizer="te_fused_adam")
    assert any("te_fp8_weights not applied" in n for n in policy("te_bf16", fp8w_cfg, cuda).notes)
    assert not any("te_fp8_weights" in n for n in policy("te_fp8:current", fp8w_cfg, cuda).notes)


@pytest.mark.parametrize("overrides, field", [
    ({"moments_dtype": "bf16"}, "train.moments_dtype"),
    ({"te_fp8_weights": True}, "options.te_fp8_weights"),
    ({"te_graph": "whole"}, "options.te_graph"),
    ({"optimizer": "sgd"}, "train.optimizer"),
])
def test_the_new_speed_switches_are_validated(overrides, field):
    with pytest.raises(config.ConfigError, match=field):
        config.from_preset("seed", **overrides)


class FakeScalingState:
    """TE's DelayedScalingRecipeState: a scale and an amax history per quantized tensor."""

    def __init__(self):
        self.scale, self.amax_history = torch.full((3,), 4.0), torch.full((16, 3), 2.0)


def test_capture_warmup_is_undone_in_tes_delayed_scaling_state():
    """The graph holds these tensors' addresses: they are reset in place to a fresh module's (scale 1, no
    history); current scaling's state (no scale, no history) and modules without FP8 state are left alone."""
    delayed, current = torch.nn.Module(), torch.nn.Module()
    delayed.fp8_meta = {"scaling_fwd": FakeScalingState(), "scaling_bwd": FakeScalingState(), "recipe": "delayed"}
    current.fp8_meta = {"scaling_fwd": object()}
    model = torch.nn.Sequential(delayed, current, torch.nn.Linear(2, 2))
    tensors = [(s.scale, s.amax_history) for s in (delayed.fp8_meta["scaling_fwd"], delayed.fp8_meta["scaling_bwd"])]
    reset_fp8_scaling(model)
    for key, (scale, history) in zip(("scaling_fwd", "scaling_bwd"), tensors):
        state = delayed.fp8_meta[key]
        assert state.scale is scale and state.amax_history is history  # same tensors: the graph keeps reading them
        assert (scale == 1).all() and not history.any()


def test_reset_optimizer_is_a_fresh_optimizer_in_place():
    from workbench.train import loop

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, capturable=False)
    for _ in range(2):
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
    moments = [opt.state[p]["exp_avg"] for p in model.parameters()]
    loop.reset_optimizer(opt)
    assert all(opt.state[p]["exp_avg"] is m and not m.any() for p, m in zip(model.parameters(), moments))
    assert all(float(opt.state[p]["step"]) == 0 for p in model.parameters())

    # TE's FusedAdam keeps its capturable step count in the param group and fp32 masters in the state:
    # the masters must equal the restored weights, not zero
    w = torch.nn.Parameter(torch.full((3,), 0.5, dtype=torch.bfloat16))
    fake = type("FusedAdamLike", (), {})()
    fake.state = {w: {"exp_avg": torch.ones(3), "master_param": torch.zeros(3)}}
    fake.param_groups = [{"params": [w], "step": torch.tensor([7])}]
    fake._scales = {w: {"exp_avg": torch.tensor([3.0])}}
    loop.reset_optimizer(fake)
    assert torch.equal(fake.state[w]["master_param"], torch.full((3,), 0.5))
    assert not fake.state[w]["exp_avg"].any() and int(fake.param_groups[0]["step"]) == 0
    assert float(fake._scales[w]["exp_avg"]) == 1.0


class FakeFusedAdam(torch.optim.AdamW):
    """transformer_engine.pytorch.optimizers.FusedAdam's signature and state calls, torch's AdamW maths."""

    def __init__(self, params, lr, weight_decay, adam_w_mode, capturable, master_weights, exp_avg_dtype,
                 exp_avg_sq_dtype):
        super().__init__(params, lr=lr, weight_decay=weight_decay)
        self.kw = dict(adam_w_mode=adam_w_mode, capturable=capturable, master_weights=master_weights,
                       exp_avg_dtype=exp_avg_dtype, exp_avg_sq_dtype=exp_avg_sq_dtype)
        self.masters = {}

    def initialize_state(self, param, store_param_remainders):
        self.state[param]["exp_avg"] = torch.zeros_like(param)

    def set_scaled_state(self, param, name, value):
        self.masters[param] = value


def test_te_fused_adam_takes_the_config_and_starts_fp8_masters_at_the_shared_init(monkeypatch):
    from workbench.train import loop

    fake_te = type("FakeTE", (), {"optimizers": type("O", (), {"FusedAdam": FakeFusedAdam})})
    model = torch.nn.Linear(4, 4).to(torch.bfloat16)
    exact = torch.randn(4, 4)
    setattr(model.weight, backends.MASTER_INIT, exact)  # what an FP8 weight carries (see TEFP8.convert)
    cfg = config.from_preset("seed", optimizer="te_fused_adam", moments_dtype="bf16")
    opt = loop.te_fused_adam(fake_te, model, cfg, capturable=True)
    assert opt.kw == dict(adam_w_mode=True, capturable=True, master_weights=True, exp_avg_dtype=torch.bfloat16,
                          exp_avg_sq_dtype=torch.bfloat16)
    assert torch.equal(opt.masters[model.weight], exact) and not hasattr(model.weight, backends.MASTER_INIT)
    # no TE (or no GPU): AdamW runs, and the row's note says why
    monkeypatch.setattr(_te, "load", lambda: (None, None, "no TE here"))
    opt, note = loop.make_optimizer(model, cfg, torch.device("cpu"), capturable=False)
    assert isinstance(opt, torch.optim.AdamW) and "te_fused_adam not applied (it needs a CUDA GPU)" in note


def test_fp8_weights_keep_the_exact_shared_init_for_their_masters(monkeypatch):
    """Under te.quantized_model_init TE's weights are FP8; each keeps the fp32 value it was quantized from."""
    import contextlib
    import copy

    from workbench.models import reference_student

    inits = []

    class FakeTEWithFP8Weights(FakeTEModules):
        QuantizedTensor = torch.nn.Parameter  # here every TE weight counts as quantized

        class Linear(FakeTEModules.Linear):
            """Loading into an FP8 weight rounds it (E4M3, scale 1): what is left to start a master from."""

            def _load_from_state_dict(self, *args, **kwargs):
                super()._load_from_state_dict(*args, **kwargs)
                with torch.no_grad():
                    self.weight.copy_(self.weight.to(torch.float8_e4m3fn).float())

        @staticmethod
        def quantized_model_init(enabled, recipe):
            inits.append((enabled, recipe))
            return contextlib.nullcontext()

    monkeypatch.setattr(_te, "load", lambda: (FakeTEWithFP8Weights, FakeRecipes, ""))
    cfg = config.from_preset("cpu-smoke", te_fp8_weights=True, optimizer="te_fused_adam")
    reference = reference_student(cfg.model)
    model = copy.deepcopy(reference)
    backends.make("te_fp8:current").quantized(model, cfg, TERun(torch.device("cpu"), torch.bfloat16, recipe="recipe"))
    assert inits == [(True, "recipe")]
    ref = reference.state_dict()
    rounded = [name for name, p in model.named_parameters() if not torch.equal(p.detach().float(), ref[name].float())]
    assert rounded  # the FP8 weights no longer hold the shared init...
    for name, p in model.named_parameters():  # ...their masters start from it all the same
        assert torch.equal(getattr(p, backends.MASTER_INIT), ref[name].float()), name


def test_a_backend_prepares_students_as_values(monkeypatch):
    """What `prepare` resolves (the model, its dtype, a TE recipe, what a conversion swapped) is in the student it
    returns, never on the backend: one backend prepares any number of students, each its own, and none changes."""
    import dataclasses

    from workbench.models import Student, reference_student

    monkeypatch.setattr(_te, "load", lambda: (FakeTEModules, FakeRecipes, ""))
    cfg = config.from_preset("cpu-smoke")
    ref = reference_student(cfg.model, Student(cfg.model).state_dict())
    for spec in ("torch_bf16", "te_fp8:current"):
        b = backends.make(spec)
        before = dict(vars(b))
        one, two = b.prepare(ref, cfg, torch.device("cpu")), b.prepare(ref, cfg, torch.device("cpu"))
        assert vars(b) == before and one.model is not two.model and one.policy == two.policy
        with pytest.raises(dataclasses.FrozenInstanceError):
            one.model = two.model
