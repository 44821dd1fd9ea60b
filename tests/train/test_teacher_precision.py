"""distill.teacher_precision=fp8: the frozen teacher's forward as TE FP8 inference, with the named fake TE
(tests/fake_te.py; real TE runs on the H200, tests/gpu/test_gpu.py), and the fallback, with its reason, wherever
TE or FP8 cannot run."""
import json

import pytest
import torch
from fake_te import FakeRecipes, FakeTEModules

from workbench import backends, cli, config, results
from workbench.backends._te import TEAttention
from workbench.bench import rows as bench_rows
from workbench.env import te as _te
from workbench.models import Teacher
from workbench.run import runner
from workbench.train import lm_task, tasks
from workbench.train.teacher import teacher_precision

CPU = torch.device("cpu")
NO_FP8 = (False, "Device compute capability 8.9 or higher required for FP8 execution.")


def fake_te_with(fp8):
    """The fake TE's layers with TE's FP8 capability check answering `fp8`."""
    return type(
        "FakeTEWithFP8Check", (FakeTEModules,), {"is_fp8_available": staticmethod(lambda return_reason=False: fp8)}
    )


def smoke(**kw):
    return config.from_preset("cpu-smoke", **{"backends": "torch_fp32", "baseline": "torch_fp32", "steps": 2,
                                              "warmup": 1, "iters": 2, "eval_batches": 1, **kw})


def test_the_fp8_teacher_is_the_teacher_under_tes_autocast_with_current_scaling_and_no_grad(monkeypatch):
    monkeypatch.setattr(_te, "load", lambda: (FakeTEModules, FakeRecipes, ""))
    # the fake runs on a CPU, which the real capability checks refuse: the conversion and forward are tested here
    monkeypatch.setattr(teacher_precision, "fp8_unavailable", lambda teacher, cfg, device: "")
    seen = []
    plain_forward = FakeTEModules.Linear.forward

    def recording(self, x):
        seen.append((FakeTEModules._recipe, torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"),
                     torch.get_autocast_dtype("cpu")))
        return plain_forward(self, x)

    monkeypatch.setattr(FakeTEModules.Linear, "forward", recording)
    cfg = smoke(teacher_precision="fp8", param_dtype="bf16")
    task = tasks.MLPTask(cfg, CPU, runner.teacher_dtype(cfg, CPU))
    assert task.teacher_precision.used == "fp8" and task.teacher_precision.reason == ""
    assert task.info["teacher_precision_used"] == "fp8"
    assert {type(m) for m in task.teacher.modules()} >= {FakeTEModules.Linear, FakeTEModules.LayerNorm}
    assert not any(p.requires_grad for p in task.teacher.parameters())

    # exactly the teacher's weights (fp32, whatever the students' param_dtype), and the students' init untouched
    torch.manual_seed(cfg.train.seed)
    plain = Teacher(cfg.model)
    assert task.teacher.state_dict().keys() >= plain.state_dict().keys()
    for k, v in plain.state_dict().items():
        assert torch.equal(task.teacher.state_dict()[k], v), k
    torch.manual_seed(0)
    other = Teacher(cfg.model)
    stream = torch.get_rng_state()  # TE's layer constructors draw an init the conversion overwrites: not from here
    teacher_precision.prepare(other, cfg, CPU, runner.teacher_dtype(cfg, CPU))
    assert torch.equal(torch.get_rng_state(), stream)
    bf16_cfg = cfg.replace(teacher_precision="bf16")
    bf16 = tasks.MLPTask(bf16_cfg, CPU, runner.teacher_dtype(bf16_cfg, CPU))
    for k, v in bf16.reference.state_dict().items():
        assert torch.equal(task.reference.state_dict()[k], v), k

    data = task.make_data()
    assert seen and all(
        isinstance(recipe, FakeRecipes.Float8CurrentScaling) and not grad and amp and dt is torch.bfloat16
        for recipe, grad, amp, dt in seen
    )
    # the fake's current scaling is torch's maths: the same targets as the bf16 teacher's
    for (_, fp8_t), (_, bf16_t) in zip(data.eval, bf16.make_data().eval):
        assert torch.equal(fp8_t.out, bf16_t.out)

    seen.clear()  # the teacher's timing runs the same forward
    cells, _ = runner.time_teacher(cfg, task, data, CPU)
    assert cells["teacher_ms_median"] > 0
    assert seen and all(
        isinstance(recipe, FakeRecipes.Float8CurrentScaling) and not grad for recipe, grad, _, _ in seen
    )


def test_a_language_model_teacher_runs_in_fp8_with_tes_attention_and_its_own_weights(monkeypatch, tmp_path):
    monkeypatch.setattr(_te, "load", lambda: (FakeTEModules, FakeRecipes, ""))
    monkeypatch.setattr(teacher_precision, "fp8_unavailable", lambda teacher, cfg, device: "")
    cfg = config.from_preset("gpt-cpu", vocab=256, tokenizer="bytes", corpus_mb=0.1, teacher="random", hidden=32,
                             heads=4, intermediate=64, layers=1, seq_len=16, batch=4, steps=2, eval_batches=2,
                             warmup=0, iters=1)
    fp8 = lm_task.LMTask(cfg.replace(teacher_precision="fp8"), CPU, None, tmp_path)
    bf16 = lm_task.LMTask(cfg.replace(teacher_precision="bf16"), CPU, torch.bfloat16, tmp_path)
    assert fp8.teacher_precision.used == "fp8" and isinstance(fp8.teacher.head, FakeTEModules.Linear)
    assert any(isinstance(m, TEAttention) for m in fp8.teacher.modules())  # bf16 attention: not run in FP8
    for k, v in bf16.teacher.state_dict().items():
        assert torch.equal(fp8.teacher.state_dict()[k], v), k
    for (_, a), (_, b) in zip(fp8.make_data().eval, bf16.make_data().eval):
        assert a.out.dtype == b.out.dtype == torch.bfloat16
        torch.testing.assert_close(a.out, b.out)  # the fake's attention is SDPA too; bf16 rounding aside


def test_where_fp8_cannot_run_the_teacher_falls_back_and_says_why(monkeypatch):
    cfg = smoke(teacher_precision="fp8")
    teacher = Teacher(cfg.model)
    monkeypatch.setattr(_te, "load", lambda: (fake_te_with((True, "")), FakeRecipes, ""))
    # a CPU: the torch teacher itself, in fp32
    same, p = teacher_precision.prepare(teacher, cfg, CPU, runner.teacher_dtype(cfg, CPU))
    assert same is teacher and p.dtype is None
    assert p.cells() == {"teacher_precision_used": "fp32", "teacher_precision_reason":
                         "Transformer Engine runs on CUDA GPUs only; this run's device is cpu -> the teacher ran in "
                         "fp32 instead of fp8"}
    cuda = torch.device("cuda")  # only named: none of these checks touches the device
    assert teacher_precision.fp8_unavailable(teacher, cfg, cuda) == ""
    # a GPU without FP8 (pre-Hopper): TE's own words
    monkeypatch.setattr(_te, "load", lambda: (fake_te_with(NO_FP8), FakeRecipes, ""))
    assert teacher_precision.fp8_unavailable(teacher, cfg, cuda) == NO_FP8[1]
    # the teacher's GEMM dims, not the students'
    monkeypatch.setattr(_te, "load", lambda: (fake_te_with((True, "")), FakeRecipes, ""))
    odd = Teacher(smoke(hidden=40).model)
    why = teacher_precision.fp8_unavailable(odd, cfg, cuda)
    assert why.startswith("the teacher's FP8 GEMMs need dims that are multiples of 16; not: ")
    assert "layers.0.1.in_features=40" in why and "more" in why


def test_a_teacher_tes_conversion_refuses_runs_as_asked_for_and_says_why(monkeypatch):
    """A teacher with a layer TE's conversion cannot take (a Hugging Face model's, say) is not a crash: the
    torch teacher runs, back on its device, and the reason names TE's error."""
    from workbench.backends import te_fp8

    monkeypatch.setattr(_te, "load", lambda: (FakeTEModules, FakeRecipes, ""))
    monkeypatch.setattr(teacher_precision, "fp8_unavailable", lambda teacher, cfg, device: "")

    def refuse(self, reference, cfg, device, ranks=None):
        raise RuntimeError("TE Linear does not take Conv1D's weights")

    monkeypatch.setattr(te_fp8.TEFP8, "prepare", refuse)
    cfg = smoke(teacher_precision="fp8")
    teacher = Teacher(cfg.model)
    ran, precision = teacher_precision.prepare(teacher, cfg, CPU, None)
    assert ran is teacher and precision.used == "fp32" and precision.fp8 is None
    assert "RuntimeError: TE Linear does not take Conv1D's weights" in precision.reason
    assert precision.reason.endswith("the teacher ran in fp32 instead of fp8")


def test_a_run_with_an_fp8_teacher_and_no_te_says_so_in_its_files(tmp_path, monkeypatch):
    monkeypatch.setattr(_te, "load", lambda: (None, None, "transformer_engine.pytorch does not import: fake"))
    run_dir = runner.run(smoke(teacher_precision="fp8"), out=tmp_path, run_id="fp8-teacher", progress=False)
    want = {"teacher_precision_used": "fp32",
            "teacher_precision_reason": "transformer_engine.pytorch does not import: fake -> the teacher ran in fp32 "
                                        "instead of fp8"}
    row = results.load(run_dir).iloc[0]
    assert row["status"] == "ok" and row["cfg_teacher_precision"] == "fp8"
    assert {k: row[k] for k in want} == want
    assert results.read_json(run_dir / "task.json") | want == results.read_json(run_dir / "task.json")
    summary = results.load_summary(run_dir)
    assert {k: summary[k] for k in want} == want and summary["teacher_dtype"] == "torch.float32"


def test_teacher_precision_names_its_field_and_the_allowed_values(capsys):
    with pytest.raises(config.ConfigError, match=r"distill.teacher_precision must be one of "
                                                 r"\['auto', 'fp32', 'bf16', 'fp16', 'fp8'\], got 'fp4'"):
        config.from_preset("seed", teacher_precision="fp4")
    assert cli.main(["run", "--preset", "cpu-smoke", "--set", "teacher_precision=int8"]) == 2
    assert "distill.teacher_precision" in capsys.readouterr().err


def test_the_bench_compares_a_teacher_with_the_peak_of_the_precision_it_ran_in():
    peak = {"measured": {"bf16": {"status": "ok", "tflops": 800.0}, "fp8": {"status": "ok", "tflops": 1600.0}}}
    row = {"cfg_kind": "mlp", "train_gflop_per_step": 3000.0, "teacher_ms_median": 2.0, "gpu_name": "NVIDIA H200",
           "cfg_teacher_precision": "fp8"}
    fp8 = bench_rows._teacher_cells({**row, "teacher_precision_used": "fp8"}, 8.0, peak)
    assert fp8["teacher_precision"] == "fp8" and fp8["teacher_tflops"] == pytest.approx(500.0)
    assert fp8["teacher_pct_of_measured_peak"] == pytest.approx(31.25) and fp8["teacher_share_pct"] == pytest.approx(
        20.0
    )
    fell_back = bench_rows._teacher_cells({**row, "teacher_precision_used": "bf16"}, 8.0, peak)
    assert fell_back["teacher_precision"] == "bf16" and fell_back["teacher_pct_of_measured_peak"] == pytest.approx(62.5)


def test_an_fp8_teachers_cached_weights_are_those_of_the_precision_it_trains_in(tmp_path, capsys):
    """Only weights are cached, keyed by the autocast they trained in: an fp8 run trains (and finds) the
    teacher of its fallback autocast (fp32 on a CPU, bf16 on a GPU), another precision trains its own."""
    def checkpoint(precision):
        argv = ["teacher", "--preset", "gpt-cpu", "--out", str(tmp_path), "--set", "corpus_mb=0.2",
                "--set", "teacher_steps=3", "--set", f"teacher_precision={precision}"]
        assert cli.main(argv) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    fp32, fp8, bf16 = checkpoint("fp32"), checkpoint("fp8"), checkpoint("bf16")
    assert fp8["teacher_cached"] is True and fp8["teacher_checkpoint"] == fp32["teacher_checkpoint"]
    assert fp8["teacher_precision_used"] == "fp32" and fp8["teacher_precision_reason"].endswith(
        "ran in fp32 instead of fp8"
    )
    assert bf16["teacher_cached"] is False and bf16["teacher_checkpoint"] != fp32["teacher_checkpoint"]


def test_the_fp8_teacher_never_takes_the_students_fp8_attention(monkeypatch):
    """options.te_fp8_dpa is a student switch: the teacher's TE copy is prepared without it (on the H200, head_dim
    64 has no FP8 attention backend, and the refusal would come at the teacher's first forward, past its fallback)."""
    monkeypatch.setattr(_te, "load", lambda: (FakeTEModules, FakeRecipes, ""))
    monkeypatch.setattr(teacher_precision, "fp8_unavailable", lambda teacher, cfg, device: "")
    te_fp8 = type(backends.make("te_fp8:current"))
    seen, prepare = [], te_fp8.prepare

    def recording(self, reference, cfg, device, ranks=None):
        seen.append((cfg.options.te_fp8_dpa, cfg.options.te_fp8_weights, cfg.model.param_dtype))
        return prepare(self, reference, cfg, device, ranks)

    monkeypatch.setattr(te_fp8, "prepare", recording)
    cfg = smoke(teacher_precision="fp8", te_fp8_dpa=True)
    task = tasks.MLPTask(cfg, CPU, runner.teacher_dtype(cfg, CPU))
    assert task.teacher_precision.used == "fp8" and seen == [(False, False, "fp32")]
