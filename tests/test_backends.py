"""Backend gating with a *fake* Transformer Engine (the real one cannot exist on a CPU machine; the
real path runs on the H200 via scripts/gpu_core.sh). Only availability logic is exercised here."""
import pytest
import torch

from workbench import backends, config
from workbench.env import te as _te
from fake_te import FakeRecipes, FakeTEModules


class FakeTE:
    """Stands in for transformer_engine.pytorch: capability checks answer like TE's, with reasons."""

    def __init__(self, fp8=(True, ""), block=(True, ""), mxfp8=(False, "Device compute capability 10.0 or higher required for MXFP8 execution.")):
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


def test_cpu_graphs_and_fp16_reasons():
    b = backends.make("torch_fp16")
    assert b.can_graph(config.from_preset("seed"), torch.device("cuda")) == (
        False, "the fp16 grad scaler's inf checks and skipped steps are not graph-safe")
    assert backends.make("torch_bf16").can_graph(config.from_preset("seed"), torch.device("cpu"))[0] is False


NEW_BACKEND = '''
"""A backend that exists only in this test: bf16 autocast under another name."""
from workbench.backends import register
from workbench.backends.torch_autocast import TorchBF16


@register
class MyBF16(TorchBF16):
    name = "my_bf16"
    mode = "Mine"
'''


def test_adding_a_backend_is_adding_one_file(tmp_path):
    """Copy the package, drop one new file into backends/, and run it: no other file is edited."""
    import pathlib
    import shutil
    import subprocess
    import sys

    import pandas as pd

    import workbench

    pkg = tmp_path / "src" / "workbench"
    shutil.copytree(pathlib.Path(workbench.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "backends" / "my_bf16.py").write_text(NEW_BACKEND)
    env = {"PYTHONPATH": str(tmp_path / "src"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    p = subprocess.run([sys.executable, "-m", "workbench", "run", "--preset", "cpu-smoke", "--out", str(tmp_path / "out"),
                        "--run-id", "r", "--set", "backends=torch_fp32,my_bf16", "--set", "baseline=torch_fp32", "--set", "steps=2", "--set", "iters=2",
                        "--set", "warmup=1", "--set", "eval_batches=1"],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    df = pd.read_csv(tmp_path / "out" / "r" / "students.csv").set_index("student")
    assert df.loc["my_bf16", "status"] == "ok" and df.loc["my_bf16", "mode"] == "Mine"
    assert df.loc["my_bf16", "initial_loss"] == df.loc["torch_fp32", "initial_loss"]


@pytest.mark.parametrize("layout", ["separate", "fused"])
def test_te_conversion_swaps_every_layer_and_keeps_the_weights(monkeypatch, layout):
    from workbench.backends.te_bf16 import convert_to_te
    from workbench.models import Student, reference_student

    monkeypatch.setattr(_te, "load", lambda: (FakeTEModules, object(), ""))
    cfg = config.from_preset("cpu-smoke", layout=layout)
    torch.manual_seed(0)
    reference = reference_student(cfg.model, Student(cfg.model).state_dict())
    model = reference_student(cfg.model, reference.state_dict() if layout == "separate" else
                              reference.to_reference_state())
    swapped = convert_to_te(model, cfg, torch.device("cpu"))
    want = {"separate": {FakeTEModules.Linear, FakeTEModules.LayerNorm}, "fused": {FakeTEModules.Linear, FakeTEModules.LayerNormMLP}}[layout]
    assert {type(m) for m in model.modules() if type(m).__qualname__.startswith("FakeTEModules")} == want
    n_blocks = cfg.model.layers
    assert len(swapped) == (3 * n_blocks + 1 if layout == "separate" else n_blocks + 1)  # + the head
    backends.check_matched(model, reference)
    tokens = torch.randint(0, cfg.model.vocab, (2, 8))
    assert torch.equal(model(tokens), reference(tokens))


def test_the_step_policy_is_the_backends_answer():
    cuda, seed = torch.device("cuda"), config.from_preset("seed", graphs=True, compile=True)
    torch_bf16 = backends.make("torch_bf16").policy(seed, cuda)
    assert torch_bf16 == backends.StepPolicy(compile=True, graph="step", grad_scaler=False, notes=())
    te = backends.make("te_fp8:current").policy(seed, cuda)
    assert (te.compile, te.graph) == (False, "fwd_bwd") and "compile not applied" in te.notes[0]
    fp16 = backends.make("torch_fp16")
    fp16.dtype = torch.float16
    p = fp16.policy(seed, cuda)
    assert p.grad_scaler and p.graph is None and any("not graph-safe" in n for n in p.notes)
    assert backends.make("torch_fp32").policy(seed, torch.device("cpu")).graph is None  # no GPU, no graph


def test_te_delayed_scaling_takes_its_history_from_the_config(monkeypatch):
    from workbench.backends import te_fp8

    monkeypatch.setattr(_te, "load", lambda: (FakeTEModules, FakeRecipes, ""))
    cfg = config.from_preset("cpu-smoke", te_amax_history_len=1024, te_amax_compute_algo="most_recent")
    b = backends.make("te_fp8:delayed")
    monkeypatch.setattr(te_fp8.TEBF16, "build", lambda self, reference, cfg, device: torch.nn.Identity())
    b.build(None, cfg, torch.device("cpu"))
    assert b.fp8_recipe == {"margin": 0, "fp8_format": "HYBRID", "amax_history_len": 1024, "amax_compute_algo": "most_recent"}
    with pytest.raises(config.ConfigError, match="options.te_amax_compute_algo"):
        config.from_preset("cpu-smoke", te_amax_compute_algo="min")
