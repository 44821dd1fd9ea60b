"""workbench.run.slow_path: the classification of a slower path, driven by synthetic timings and rows."""
import pandas as pd
import pytest

from workbench.measure import profiler
from workbench.run import runner, slow_path

TE_FP8 = {"student": "te_fp8:delayed", "backend": "te_fp8", "mode": "TE-FP8", "status": "ok", "gemm_precision": "fp8",
          "graphed": False, "graph_scope": None, "cfg_preset": "seed", "cfg_layout": "separate",
          "cfg_param_dtype": "fp32", "gpu_name": "NVIDIA H200"}


def _busy(row, busy_ms, step_ms):
    """A row whose profiled steps saw the GPU busy `busy_ms` of a `step_ms` step (as time_steps writes it)."""
    return {**row, "step_ms_median": step_ms, "gpu_busy_ms_per_step": busy_ms, "gpu_busy_share": busy_ms / step_ms}


def test_an_eager_te_step_with_an_idle_gpu_is_host_bound_and_names_the_step_graph():
    # the H200's seed preset, eager TE FP8: 0.69 ms of kernels in a 7.86 ms step
    reasons = slow_path.classify(_busy(TE_FP8, 0.69, 7.86), bench_ms=0.87)
    assert reasons == ["host-bound: GPU busy 9% of the step; set graphs=true te_graph=step (bench measured 0.87 ms)"]


@pytest.mark.parametrize("busy_ms, step_ms, host_bound", [(0.79, 1.0, True), (0.8, 1.0, False), (23.6, 24.1, False)])
def test_the_threshold_is_the_bench_one(busy_ms, step_ms, host_bound):
    assert profiler.HOST_BOUND_BELOW == 0.8
    got = bool(slow_path.classify(_busy(TE_FP8, busy_ms, step_ms)))
    assert got is host_bound


def test_the_fix_follows_what_already_ran():
    torch_row = {
        **TE_FP8,
        "student": "torch_bf16",
        "backend": "torch_bf16",
        "mode": "PyTorch-BF16",
        "gemm_precision": "bf16",
    }
    assert "; set graphs=true" in slow_path.classify(_busy(torch_row, 0.6, 5.0))[0]
    assert "te_graph" not in slow_path.classify(_busy(torch_row, 0.6, 5.0))[0]
    fwd_bwd = {**TE_FP8, "graphed": True, "graph_scope": "fwd_bwd"}
    assert "; set te_graph=step" in slow_path.classify(_busy(fwd_bwd, 0.2, 1.0))[0]
    step = {**TE_FP8, "graphed": True, "graph_scope": "step"}
    text = slow_path.classify(_busy(step, 0.2, 1.0), bench_ms=0.9)[0]
    assert "already one CUDA graph" in text and "bench measured" not in text


def test_no_busy_share_is_no_claim():
    """A CPU row (share unknown) and a busy GPU say nothing."""
    assert slow_path.classify({**TE_FP8, "gpu_busy_share": None}) == []
    assert slow_path.classify(_busy(TE_FP8, 0.95, 1.0)) == []
    assert slow_path.cell([]) is None


def test_every_other_slower_path_is_named():
    row = {**_busy(TE_FP8, 0.95, 1.0), "attention_backend": "unfused", "attention_requested": "auto",
           "kept_torch_modules": "tok (Embedding); lm_head (Linear); blocks.0.act (GELU)"}
    reasons = slow_path.classify(row, task_info={"teacher_logits": "host"},
                                 env={"cudnn_mapped_dirs": ["/usr/lib/cudnn", "/venv/nvidia/cudnn/lib"]})
    assert [r.split(" ")[0] for r in reasons] == ["TE's", "FP8", "teacher", "cuDNN"]
    assert "lm_head (Linear)" in reasons[1] and "Embedding" not in reasons[1]
    forced = slow_path.classify({**row, "attention_requested": "unfused", "kept_torch_modules": None})
    assert "forced: te_attention=unfused" in forced[0]
    fallback = {**TE_FP8, "status": "fallback", "reason": "TE does not import -> ran PyTorch autocast instead"}
    assert slow_path.classify(fallback, env={"cudnn_mapped_dirs": ["a", "b"]}) == [
        "fallback: PyTorch autocast ran instead of te_fp8 (TE does not import)"]  # no TE ran: no cuDNN claim


def test_the_bench_figure_comes_from_the_committed_bench_of_the_same_gpu(tmp_path):
    bench = tmp_path / "h200" / "bench" / "seed"
    bench.mkdir(parents=True)
    rows = [("eager", "te_fp8:delayed", False, None, "separate", "fp32", 9.77),
            ("graphs-step-fused-bf16", "te_fp8:delayed", True, "step", "fused", "bf16", 0.45),
            ("graphs-step", "te_fp8:delayed", True, "step", "separate", "fp32", 0.87)]
    pd.DataFrame([{"variant": v, "student": s, "status": "ok", "graphed": g, "graph_scope": sc, "layout": lay,
                   "param_dtype": pdt, "step_ms_median": ms, "gpu_name": "NVIDIA H200"}
                  for v, s, g, sc, lay, pdt, ms in rows]).to_csv(bench / "bench.csv", index=False)
    assert slow_path.bench_step_graph_ms(TE_FP8, tmp_path) == 0.87  # same layout and dtype first
    assert slow_path.bench_step_graph_ms({**TE_FP8, "cfg_layout": "fused", "cfg_param_dtype": "bf16"}, tmp_path) == 0.45
    assert slow_path.bench_step_graph_ms({**TE_FP8, "gpu_name": "NVIDIA A100"}, tmp_path) is None
    assert slow_path.bench_step_graph_ms({**TE_FP8, "gpu_name": None}, tmp_path) is None


def test_the_committed_h200_bench_has_the_seed_figure():
    assert slow_path.bench_step_graph_ms(TE_FP8, slow_path.REFERENCE) == pytest.approx(0.87, abs=0.01)


def test_mark_rows_leaves_students_that_did_not_start_unmarked():
    rows = [{**_busy(TE_FP8, 0.5, 5.0)}, {**TE_FP8, "student": "te_fp8:current", "status": "skipped"}]
    slow_path.mark_rows(rows, {}, {}, bench_root=None)
    assert rows[0]["slow_path"].startswith("host-bound") and rows[1]["slow_path"] is None


def test_a_cpu_run_summary_says_its_timings_are_a_smoke_test_and_gives_a_fallback_no_speedup(tmp_path):
    from workbench import config, results

    cfg = config.from_preset("cpu-smoke", steps=2, iters=2, warmup=0)
    run = runner.run(cfg, out=tmp_path, run_id="r", progress=False)
    s = results.load_summary(run)
    assert s["timings_note"] == slow_path.CPU_NOTE and "smoke test" in s["timings_note"]
    assert s["speedup_vs_baseline"]["torch_bf16"] == 1.0
    assert s["speedup_vs_baseline"]["te_fp8:delayed"] is None  # a fallback here: no TE
    assert s["slow_path"]["te_fp8:delayed"].startswith("fallback")
    assert s["gpu_busy_share"] == {k: None for k in s["gpu_busy_share"]}
    assert not (run / "peak_memory.png").exists() and (run / "step_time.png").exists()
