"""GPU: the default answer cannot mislead. On the H200 the `seed` preset's eager TE FP8 step is host-bound
(0.69 ms of kernels in a ~8 ms step, results/reference/h200/bench/seed): its row, summary.json and plot must
say so and name the step graph; a forced unfused attention must be named too. Run by scripts/gpu_tests.sh."""
import pytest

from workbench import config, results
from workbench.env import te as _te
from workbench.results import plots
from workbench.run import runner, slow_path

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here"),
]


def test_seed_eager_te_fp8_is_marked_host_bound_with_the_step_graph(tmp_path):
    cfg = config.from_preset("seed", steps=6, warmup=3, iters=10, eval_batches=2,
                             backends="torch_bf16,te_fp8:delayed")
    run = runner.run(cfg, out=tmp_path, run_id="seed", progress=False)
    row = results.load(run).set_index("student").loc["te_fp8:delayed"]
    assert row["status"] == "ok", row["reason"]
    assert 0 < row["gpu_busy_share"] < 0.8, row["gpu_busy_share"]
    assert row["slow_path"].startswith("host-bound: GPU busy") and "graphs=true te_graph=step" in row["slow_path"]
    # the step-graphed figure is quoted from a committed bench of this GPU only (results/reference/h200/bench/seed
    # on an H200; none on an H100, where quoting the H200's figure would mislead)
    bench_ms = slow_path.bench_step_graph_ms(row.to_dict() | {"student": "te_fp8:delayed"}, slow_path.REFERENCE)
    assert ("bench measured" in row["slow_path"]) == (bench_ms is not None), (row["gpu_name"], row["slow_path"])
    if "H200" in row["gpu_name"]:
        assert bench_ms is not None  # the committed H200 bench has this student step-graphed
    summary = results.load_summary(run)
    assert summary["slow_path"]["te_fp8:delayed"] == row["slow_path"] and summary["timings_note"] is None
    fig = plots.step_time(run)
    assert any(t.get_text() == plots.SLOW_MARK for t in fig.axes[0].texts) and len(fig.texts) == 1


def test_the_step_graph_clears_the_host_bound_mark(tmp_path):
    cfg = config.from_preset("seed", steps=6, warmup=3, iters=10, eval_batches=2, backends="te_fp8:delayed",
                             baseline="te_fp8:delayed", graphs=True, te_graph="step", layout="fused",
                             param_dtype="bf16", fused_optimizer=True)
    row = results.load(runner.run(cfg, out=tmp_path, run_id="graphed", progress=False)).iloc[0]
    assert row["status"] == "ok" and row["graphed"], row["reason"]
    assert row["gpu_busy_share"] >= 0.8, row["gpu_busy_share"]
    assert not isinstance(row["slow_path"], str) or "host-bound" not in row["slow_path"]


def test_a_forced_unfused_attention_is_named(tmp_path):
    cfg = config.from_preset("gpt-cpu", corpus_mb=0.2, teacher="random", steps=4, warmup=1, iters=3, eval_batches=1,
                             no_kd_student=False, backends="te_bf16", baseline="te_bf16", te_attention="unfused")
    row = results.load(runner.run(cfg, out=tmp_path, run_id="unfused", progress=False)).iloc[0]
    assert row["attention_backend"] == "unfused", row.to_dict()
    assert "unfused attention ran" in row["slow_path"] and "forced: te_attention=unfused" in row["slow_path"]
