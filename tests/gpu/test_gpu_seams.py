"""The seams on the H200: the summary's TE path and FP8-vs-bf16 ratios follow from what the backends declare,
and a whole-step CUDA graph (capture_step, the eager step's own update body) trains what the eager step does."""
import pytest
import torch

from workbench import config, results
from workbench.env import te as _te
from workbench.run import runner

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
SMALL = dict(steps=4, warmup=2, iters=5, eval_batches=2)


@pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")
def test_summary_compares_every_declared_fp8_student_with_its_bf16_counterpart(tmp_path):
    students = "torch_fp32,torch_bf16,te_bf16,te_fp8:delayed,torchao_float8:tensorwise"
    cfg = config.from_preset("seed", backends=students, baseline="torch_fp32", **SMALL)
    run_dir = runner.run(cfg, out=tmp_path, run_id="declared", progress=False)
    df = results.load(run_dir).set_index("student")
    summary = results.load_summary(run_dir)
    assert summary["te_path_student"] == "te_fp8:delayed" and summary["bf16_reference_student"] == "te_bf16"
    ok_fp8 = {s for s in ("te_fp8:delayed", "torchao_float8:tensorwise") if df.loc[s, "status"] == "ok"}
    assert "te_fp8:delayed" in ok_fp8, df["reason"].to_dict()
    assert set(summary["fp8_vs_bf16"]) == ok_fp8
    te = summary["fp8_vs_bf16"]["te_fp8:delayed"]["final_loss_ratio"]
    assert te == pytest.approx(df.loc["te_fp8:delayed", "final_train_loss"] / df.loc["te_bf16", "final_train_loss"])
    if "torchao_float8:tensorwise" in ok_fp8:  # torchao's counterpart is the torch bf16 student
        ao = summary["fp8_vs_bf16"]["torchao_float8:tensorwise"]["final_loss_ratio"]
        assert ao == pytest.approx(df.loc["torchao_float8:tensorwise", "final_train_loss"]
                                   / df.loc["torch_bf16", "final_train_loss"])


def test_a_graphed_step_trains_what_the_eager_step_trains(tmp_path):
    """torch_fp32 eager and graphed (bench.graphs: capture_step) from the same init on the same batches: fp32
    with deterministic kernels differs only by what the graph itself changes, which must be nothing."""
    losses = {}
    for graphs in (False, True):
        cfg = config.from_preset("seed", backends="torch_fp32", baseline="torch_fp32", graphs=graphs, **SMALL)
        run_dir = runner.run(cfg, out=tmp_path, run_id=f"graphs-{graphs}", progress=False)
        df = results.load(run_dir).set_index("student")
        assert df.loc["torch_fp32", "status"] == "ok" and bool(df.loc["torch_fp32", "graphed"]) is graphs
        losses[graphs] = results.read_csv(run_dir / "losses.csv")["loss"].tolist()
    assert losses[True] == pytest.approx(losses[False], rel=1e-3)
