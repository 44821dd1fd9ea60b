"""GPU-only checks of what CPU tests cannot reach: CUDA-graph capture keeps students matched, TE FP8
trains, peak memory is measured. Run on the H200 with scripts/gpu_tests.sh; skipped without CUDA."""
import json

import pytest
import torch

from workbench import config, results, runner
from workbench.env import te as _te

pytestmark = pytest.mark.gpu


def _run(tmp_path, run_id, **overrides):
    cfg = config.from_preset("seed", steps=6, warmup=2, iters=5, eval_batches=2, **overrides)
    return results.load(runner.run(cfg, out=tmp_path, run_id=run_id, progress=False)).set_index("student")


def test_graphed_step_trains_like_the_eager_one(tmp_path):
    """Capture runs real warm-up updates and restores them: the graphed student must start where the
    eager one starts and follow it (same batches, same maths, bf16 rounding aside)."""
    eager = _run(tmp_path, "eager", backends="torch_bf16", fused_optimizer=True)
    graphed = _run(tmp_path, "graphed", backends="torch_bf16", fused_optimizer=True, graphs=True)
    e, g = eager.loc["torch_bf16"], graphed.loc["torch_bf16"]
    assert bool(g["graphed"]) and g["capture_ms"] > 0
    assert g["initial_loss"] == pytest.approx(e["initial_loss"], rel=1e-6)
    assert g["first_step_loss"] == pytest.approx(e["first_step_loss"], rel=1e-3)
    assert g["final_train_loss"] == pytest.approx(e["final_train_loss"], rel=2e-2)
    assert g["peak_mem_allocated_mb"] > 0


@pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")
def test_te_fp8_students_start_matched_and_track_bf16(tmp_path):
    df = _run(tmp_path, "te", backends="te_bf16,te_fp8:delayed,te_fp8:current", baseline="te_bf16")
    assert (df["status"] == "ok").all(), df["reason"].to_dict()
    init = df["initial_loss"]
    assert (init.max() - init.min()) / init.mean() <= 1e-5
    ratio = df["final_train_loss"] / df.loc["te_bf16", "final_train_loss"]
    assert ratio.between(0.8, 1.25).all(), ratio.to_dict()


@pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")
def test_te_graphed_fp8_keeps_the_shared_init(tmp_path):
    df = _run(tmp_path, "te-graphs", backends="torch_bf16,te_fp8:delayed,te_fp8:current,te_bf16", graphs=True,
              fused_optimizer=True)
    assert (df["status"] == "ok").all(), df["reason"].to_dict()
    assert df["graphed"].all()
    init = df["initial_loss"]
    assert (init.max() - init.min()) / init.mean() <= 1e-5
    # graphed students leave nothing behind: every student starts from the same allocated floor (the H200
    # bench before the gc fix showed later graphed TE students' peaks GBs higher). The first TE student
    # allocates TE's process-wide workspaces once (results/reference/h200/graphed/seed: the floor rises from
    # 182 to 312 MiB at the first TE student, to 344 at the first FP8 one, then stays), so floors are compared from it on.
    floor = df["mem_floor_mb"]
    assert floor.notna().all()
    after_te = floor.loc["te_fp8:delayed":]
    assert after_te.max() - after_te.min() < 1.0, floor.to_dict()
    assert floor.max() - floor.min() < 128, floor.to_dict()


@pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")
def test_the_workbench_te_import_maps_one_cudnn_copy():
    """After the workbench's TE loading (pin_cudnn, then TE) every cuDNN library in this process comes
    from one folder, torch's: a second copy is the mix that breaks TE's fused attention and torch's check."""
    import torch

    assert len(_te.mapped_cudnn_dirs()) == 1, _te.mapped_cudnn_dirs()
    assert torch.backends.cudnn.version() is not None  # torch's own version check does not raise


@pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")
def test_te_selects_a_fused_or_flash_attention_backend():
    """With one cuDNN copy TE's cuDNN fused attention loads (flash-attn may be absent); the probe reports it."""
    att = _te.attention_backend()
    assert att["selected"] and not att["selected"].startswith("unfused"), att
    assert not att["fell_back_to_slower"], att
    assert len(att["cudnn_dirs"]) == 1, att


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_under_torchrun_start_matched_and_report_scaling(tmp_path):
    """`seed` over two GPUs (DDP, NCCL) through runner.run's torchrun launch: one set of files from rank 0, every
    rank starting every student from the same weights, and per-rank step time and memory in the rows."""
    students = "torch_bf16,te_fp8:delayed" if _te.load()[0] is not None else "torch_bf16"
    cfg = config.from_preset("seed", steps=4, warmup=2, iters=5, eval_batches=2, nproc=2, backends=students)
    run_dir = runner.run(cfg, out=tmp_path, run_id="two", progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["two"]
    df = results.load(run_dir).set_index("student")
    assert (df["status"] == "ok").all(), df["reason"].to_dict()
    two = df[df["world_size"] == 2]
    assert list(two.index) == students.split(",") and (two["scaling_efficiency"] > 0).all()
    for cell in two["peak_mem_allocated_mb_ranks"]:
        assert len(json.loads(cell)) == 2 and min(json.loads(cell)) > 0
    assert results.load_summary(run_dir)["initial_losses_equal"] is True


def _lm_run(tmp_path, run_id, **overrides):
    """A tiny GPT run on real text (random teacher): seconds on the H200."""
    cfg = config.from_preset("gpt-cpu", corpus_mb=0.2, teacher="random", steps=6, warmup=1, iters=3, eval_batches=1,
                             no_kd_student=False, **overrides)
    run_dir = runner.run(cfg, out=tmp_path, run_id=run_id, progress=False)
    return results.load(run_dir).set_index("student"), run_dir


@pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")
def test_a_forced_unfused_attention_is_what_te_selects_and_auto_afterwards_is_tes_own_pick(tmp_path):
    """TE reads NVTE_*_ATTN when it selects and caches its selection per attention input: the forcing must
    reach the selection, and a later auto student in the same process must not inherit it."""
    forced, _ = _lm_run(tmp_path, "unfused", backends="te_bf16", baseline="te_bf16", te_attention="unfused")
    row = forced.loc["te_bf16"]
    assert row["status"] == "ok", row["reason"]
    assert (row["attention_requested"], row["attention_backend"]) == ("unfused", "unfused")
    auto, _ = _lm_run(tmp_path, "auto", backends="te_bf16", baseline="te_bf16")
    assert not str(auto.loc["te_bf16", "attention_backend"]).startswith("unfused"), auto.loc["te_bf16"].to_dict()


def test_host_placed_teacher_logits_train_like_gpu_placed_ones(tmp_path):
    """Pinned host logits copied one step ahead on a side stream: the same losses as logits kept on the GPU
    (a missing stream wait would train on half-copied logits)."""
    losses = {}
    for where in ("gpu", "host"):
        _, run_dir = _lm_run(tmp_path, where, backends="torch_fp32", baseline="torch_fp32", teacher_logits=where)
        assert results.read_json(run_dir / "task.json")["teacher_logits"] == where
        losses[where] = list(results.load_losses(run_dir)["loss"])
    assert losses["host"] == pytest.approx(losses["gpu"], rel=1e-6)


@pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")
def test_te_delayed_scaling_trains_the_same_with_held_out_evaluation_in_between(tmp_path):
    """Evaluation forwards under FP8 must not feed the amax history (kept by TE's get/reset_fp8_meta_tensors)."""
    kw = dict(backends="te_fp8:delayed", baseline="te_fp8:delayed", te_amax_compute_algo="most_recent")
    without = _run(tmp_path, "no-eval", **kw)
    with_eval = _run(tmp_path, "eval", eval_every=1, **kw)
    assert (with_eval["status"] == "ok").all(), with_eval["reason"].to_dict()
    for col in ("first_step_loss", "final_train_loss"):
        assert with_eval.loc["te_fp8:delayed", col] == pytest.approx(without.loc["te_fp8:delayed", col], rel=1e-6)
