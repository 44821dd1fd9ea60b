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
