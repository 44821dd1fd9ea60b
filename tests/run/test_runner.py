"""A real cpu-smoke run: matched students, fp32 losses, fallback without TE, result files, plots."""
import json
import os
import sys

import pandas as pd
import pytest
import torch

from workbench import backends, config, results
from workbench.env import te as _te
from workbench.run import runner
from workbench.train import objectives

TUTORIAL_SUMMARY_KEYS = {
    "gpu_name", "compute_capability", "te_available", "fp8_available", "fp8_reason", "mode",
    "baseline_eval_mse", "te_path_eval_mse", "baseline_mean_step_ms", "te_path_mean_step_ms",
    "baseline_peak_mem_mb", "te_path_peak_mem_mb",
}
FILES = ["config.json", "env.json", "summary.json", "students.csv", "losses.csv"] + [
    f"{p}.{e}" for p in ("loss_curves", "step_time") for e in ("png", "svg")]  # peak memory: GPU runs only


def test_every_result_file_is_written(smoke_run):
    _, run_dir = smoke_run
    for name in FILES:
        assert (run_dir / name).stat().st_size > 0, name
    assert not list(run_dir.glob(".*tmp*")), "atomic writes leave no temporary files behind"


def test_schema_round_trip(smoke_run):
    cfg, run_dir = smoke_run
    df = results.load(run_dir)
    assert list(df.columns[: len(results.STUDENT_COLUMNS)]) == results.STUDENT_COLUMNS
    assert list(df["student"]) == cfg.backends
    assert (df["schema_version"] == results.SCHEMA_VERSION).all()
    assert results.load_config(run_dir) == cfg
    # every config field is on every row, under the same name
    for name, value in cfg.flat().items():
        col = df[f"cfg_{name}"].iloc[0]
        want = ",".join(value) if isinstance(value, list) else str(value)
        assert (pd.isna(col) and want == "") or str(col) == want, name  # an empty cell reads back as NaN
    summary = results.load_summary(run_dir)
    assert TUTORIAL_SUMMARY_KEYS <= set(summary)
    env = json.loads((run_dir / "env.json").read_text())
    assert {"python", "platform", "torch", "torch_cuda", "gpu_name", "compute_capability", "cuda_home",
            "nvcc_exists", "nvcc_path", "cudnn_header_exists", "te_version", "fp8_available", "fp8_reason",
            "bf16_available"} <= set(env)
    losses = results.load_losses(run_dir)
    assert list(losses.columns) == ["step", "student", "loss"]
    assert len(losses) == cfg.train.steps * len(cfg.backends)


def test_the_tutorials_rows_have_no_step0_columns(smoke_run):
    """The held-out metrics before training are the language models' (tests/run/test_step0_metrics.py): an MLP
    run's students.csv keeps its columns."""
    _, run_dir = smoke_run
    df = results.load(run_dir)
    assert df["eval_mse"].notna().all()
    assert [c for c in df.columns if c.endswith(results.STEP0_SUFFIX)] == []


def test_load_concatenates_runs_below_a_folder(smoke_run):
    _, run_dir = smoke_run
    assert len(results.load(run_dir.parent)) == len(results.load(run_dir))


def test_students_start_matched(smoke_run):
    _, run_dir = smoke_run
    df = results.load(run_dir)
    init = df["initial_loss"].astype(float)
    assert ((init.max() - init.min()) / init.mean()) <= 1e-5
    first = df["first_step_loss"].astype(float)  # the students' own precision: close, not bitwise
    assert ((first.max() - first.min()) / first.mean()) < 1e-2
    assert results.load_summary(run_dir)["initial_losses_equal"] is True


def test_fallback_without_te_is_a_row_that_says_so(smoke_run):
    if _te.load()[0] is not None:
        pytest.skip("TE imports here; test_te_missing_forced covers the fallback")
    _, run_dir = smoke_run
    row = results.load(run_dir).set_index("student").loc["te_fp8:delayed"]
    assert row["status"] == "fallback" and row["mode"] == "Fallback-PyTorch"
    assert "transformer_engine" in row["reason"] and pd.notna(row["step_ms_median"])
    assert results.load_summary(run_dir)["mode"] == "Fallback-PyTorch"


def test_te_missing_forced(monkeypatch, tmp_path):
    """Even where TE is installed, a TE student without a usable TE runs the fallback and says why."""
    monkeypatch.setattr(_te, "load", lambda: (None, None, "transformer_engine.pytorch does not import: fake"))
    cfg = config.from_preset("cpu-smoke", steps=2, iters=2, warmup=0, backends="torch_bf16,te_bf16")
    df = results.load(runner.run(cfg, out=tmp_path, run_id="r", progress=False))
    te = df.set_index("student").loc["te_bf16"]
    assert te["status"] == "fallback" and "fake" in te["reason"]


def test_losses_are_fp32_and_backward_works_with_bf16_predictions():
    pred = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randn(4, 8)
    for kind in ("mse", "cosine"):
        loss = objectives.loss(kind, pred, objectives.Targets(target))
        assert loss.dtype == torch.float32
        loss.backward()  # the tutorial's "Found dtype Float but expected BFloat16" must not happen
    hidden = [torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)]
    loss = objectives.loss("hidden", (pred, hidden), objectives.Targets(target, [torch.randn(4, 8)]))
    assert loss.dtype == torch.float32
    assert loss.item() > objectives.mse(pred, target).item()  # hidden-state term adds to the output term


@pytest.mark.parametrize("loss", ["cosine", "hidden"])
def test_other_objectives_train(loss, tmp_path):
    cfg = config.from_preset("cpu-smoke", loss=loss, steps=3, iters=2, warmup=0, backends="torch_fp32,torch_bf16")
    df = results.load(runner.run(cfg, out=tmp_path, run_id="r", progress=False))
    assert (df["status"] == "ok").all() and df["final_train_loss"].notna().all()


def test_unavailable_backend_is_skipped_and_divergence_stops_one_student(tmp_path, monkeypatch):
    cfg = config.from_preset("cpu-smoke", steps=4, iters=2, warmup=0, backends="torch_fp32,torch_fp16,torch_bf16",
                             baseline="torch_fp32")
    real_make = backends.make

    def make(spec):  # force torch_bf16 to diverge: an absurd learning rate is applied only to it
        b = real_make(spec)
        if spec == "torch_bf16":
            prepare = b.prepare

            def diverging_prepare(reference, cfg_, device, ranks=None):
                student = prepare(reference, cfg_, device, ranks)
                with torch.no_grad():
                    for p in student.model.parameters():
                        p.mul_(1e30)
                return student
            b.prepare = diverging_prepare
        return b

    monkeypatch.setattr(backends, "make", make)
    df = results.load(runner.run(cfg, out=tmp_path, run_id="r", progress=False)).set_index("student")
    assert df.loc["torch_fp16", "status"] == "skipped" and "GPU" in df.loc["torch_fp16", "reason"]
    assert df.loc["torch_bf16", "status"] == "diverged" and "non-finite" in df.loc["torch_bf16", "reason"]
    assert df.loc["torch_fp32", "status"] == "ok"


@pytest.mark.parametrize("method, error, needle", [
    ("availability", OSError("libcudnn.so.9: cannot open shared object file (simulated)"), "libcudnn"),
    ("prepare", RuntimeError("CUDA out of memory (simulated)"), "out of memory"),
])
def test_a_failing_student_is_an_error_row_and_the_others_run(tmp_path, monkeypatch, method, error, needle):
    cfg = config.from_preset("cpu-smoke", steps=2, iters=2, warmup=0, backends="torch_fp32,torch_bf16")
    real_make = backends.make

    def make(spec):
        b = real_make(spec)
        if spec == "torch_fp32":
            def fail(*args):
                raise error
            setattr(b, method, fail)
        return b

    monkeypatch.setattr(backends, "make", make)
    df = results.load(runner.run(cfg, out=tmp_path, run_id="r", progress=False)).set_index("student")
    assert df.loc["torch_fp32", "status"] == "error" and needle in df.loc["torch_fp32", "reason"]
    assert df.loc["torch_bf16", "status"] == "ok"


def test_plots_show_every_student(smoke_run):
    import matplotlib.pyplot as plt

    from workbench.results import plots

    cfg, run_dir = smoke_run
    fig = plots.loss_curves(run_dir)
    assert len(fig.axes[0].get_lines()) == len(cfg.backends)
    fig2 = plots.step_time(run_dir)
    assert len(fig2.axes[0].patches) == len(cfg.backends)
    plt.close("all")


def test_the_last_install_outcome_is_read_into_the_run(tmp_path, monkeypatch):
    """install-te records its outcome as data; a later run carries it (env.json, summary.json)."""
    monkeypatch.chdir(tmp_path)
    results.write_json(tmp_path / "results/install/20260101-000000/outcome.json", {
        "te_mode": "fallback", "ok": False, "reason": "pip found no transformer_engine_torch", "te_version": None,
        "run_dir": "results/install/20260101-000000", "diagnosis": [{"id": "package_not_in_index"}]})
    cfg = config.from_preset("cpu-smoke", steps=2, iters=1, warmup=0, backends="torch_bf16")
    run_dir = runner.run(cfg, out=tmp_path / "runs", run_id="r", progress=False)
    te_install = results.load_summary(run_dir)["te_install"]
    assert te_install["te_mode"] == "fallback" and te_install["diagnosis"] == ["package_not_in_index"]
    assert json.loads((run_dir / "env.json").read_text())["te_install"] == te_install


def test_a_fallback_that_fails_reports_the_precision_it_ran(tmp_path, monkeypatch):
    """A TE FP8 student that falls back runs bf16: its row must say so even when the fallback errors."""
    from workbench.backends import _autocast

    monkeypatch.setattr(_te, "load", lambda: (None, None, "transformer_engine.pytorch does not import: fake"))

    def fail(self, *args):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(_autocast.Fallback, "prepare", fail)
    cfg = config.from_preset("cpu-smoke", steps=2, iters=2, warmup=0, backends="torch_fp32,te_fp8:delayed",
                             baseline="torch_fp32")
    row = (
        results.load(runner.run(cfg, out=tmp_path, run_id="r", progress=False))
        .set_index("student")
        .loc["te_fp8:delayed"]
    )
    assert row["status"] == "error" and "out of memory" in row["reason"]
    assert row["gemm_precision"] == "bf16"


class FakeFP8Registry:
    """A fake of TE's process-wide FP8GlobalStateManager: counts the resets, records what it held then."""

    resets: list = []
    buffers: list = []

    @classmethod
    def reset(cls):
        cls.resets.append(list(cls.buffers))
        cls.buffers = []


def test_every_student_starts_with_tes_fp8_registry_emptied(tmp_path, monkeypatch):
    """TE never empties its registry of delayed-scaling amax buffers: without a reset per student, a later
    student's steps also update an earlier one's buffers (and a distributed run's one-GPU reference
    all-reduced a DDP student's, hanging on two H200s)."""
    import types

    fake = types.ModuleType("fake_te_quantization")
    fake.FP8GlobalStateManager = FakeFP8Registry
    monkeypatch.setitem(sys.modules, _te.FP8_STATE_MODULES[0], fake)
    monkeypatch.setattr(FakeFP8Registry, "resets", [])
    monkeypatch.setattr(FakeFP8Registry, "buffers", ["a buffer registered before the run"])
    cfg = config.from_preset("cpu-smoke", steps=2, warmup=1, iters=2, eval_batches=1, backends="torch_fp32,torch_bf16")
    runner.run(cfg, out=tmp_path, run_id="r", progress=False)
    assert len(FakeFP8Registry.resets) == 2  # once before each student
    assert FakeFP8Registry.resets[0] == ["a buffer registered before the run"] and FakeFP8Registry.buffers == []
    assert _te.reset_fp8_state() is True
    monkeypatch.delitem(sys.modules, _te.FP8_STATE_MODULES[0])
    assert _te.reset_fp8_state() is False  # TE not imported: nothing to reset


def test_a_run_leaves_tes_attention_switches_as_the_process_started(tmp_path, monkeypatch):
    """A TE student forcing unfused attention sets NVTE_*_ATTN for its forwards; after the run they are the
    process's own again, so a notebook's or an in-process sweep's next run does not inherit the forcing."""
    for k in _te.ATTENTION_ENV["flash"]:  # setenv first: monkeypatch then restores each key, even if this test fails
        monkeypatch.setenv(k, "0")
        monkeypatch.delenv(k)
    monkeypatch.setattr(_te, "_STARTED_WITH", {k: None for k in _te.ATTENTION_ENV["flash"]})
    _te.force_attention("unfused")  # what the last TE student of a run left behind
    cfg = config.from_preset("cpu-smoke", backends="torch_bf16", baseline="torch_bf16", steps=2, iters=2, warmup=1)
    runner.run(cfg, out=tmp_path, run_id="r", progress=False)
    assert [k for k in _te.ATTENTION_ENV["flash"] if k in os.environ] == []


def test_training_prints_a_progress_line_every_few_steps(capsys):
    """gpt-cpu trains 80 steps per student and its teacher 200: a line every lm_teacher.progress_every steps."""
    from workbench.train.teacher import lm_teacher

    seen = []
    step = runner._with_progress(lambda i, loss: seen.append(i), True, "te_fp8:delayed", 80)
    for i in range(1, 81):
        step(i, 1.0 / i)
    lines = capsys.readouterr().out.splitlines()
    assert lm_teacher.progress_every(80) == 20 and seen == list(range(1, 81))
    assert lines == [f"[te_fp8:delayed] step {i}/80, loss {1.0 / i:.4g}" for i in (20, 40, 60)]
    assert runner._with_progress(None, True, "s", 8) is None  # short runs: the start and end lines suffice
    assert runner._with_progress(None, False, "s", 80) is None


def test_a_students_closing_line_gives_four_significant_digits():
    """Not `step 652.1969189999481 ms`: the numbers a person reads, rounded; a missing one says so."""
    lm = {"student": "te_fp8:delayed", "status": "ok", "final_train_loss": 2.718281828,
          "step_ms_median": 652.1969189999481, "heldout_ppl": 123.456789, "kl_teacher_student_t1_nats": 0.0123456789}
    assert runner.done_line(lm) == \
        "[te_fp8:delayed] ok: final loss 2.718, step 652.2 ms, held-out ppl 123.5, KL to teacher 0.01235"
    mlp = {"student": "torch_bf16", "status": "skipped", "final_train_loss": None, "step_ms_median": float("nan"),
           "eval_mse": 1.0e-5 / 3}
    assert runner.done_line(mlp) == "[torch_bf16] skipped: final loss n/a, step n/a ms, eval mse 3.333e-06"


@pytest.mark.parametrize("students, needle", [
    ("torch_bf16,tensorrt", "unknown backend 'tensorrt'"),
    ("torch_bf16,te_fp8:fancy", "unknown recipe 'fancy' for backend 'te_fp8'"),
    ("torch_bf16,torch_fp32:delayed", "takes no recipe"),
])
def test_the_run_checks_every_student_names_a_backend_before_any_work(tmp_path, students, needle):
    """The registry knows the backends (the config does not): the run asks it first, writing nothing."""
    cfg = config.from_preset("cpu-smoke", backends=students, baseline="torch_bf16")
    with pytest.raises(config.ConfigError, match=needle):
        runner.run(cfg, out=tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    with pytest.raises(config.ConfigError, match=r"allowed: \[.*'te_fp8'.*'torch_bf16'"):
        backends.check_specs(["nope"])
