"""The JAX student as a backend of an ordinary run (`--set backends=...,jax:fp32`): its row beside the torch rows
in students.csv, skipped with the reason where it cannot run, and never the run's bf16 denominator."""
import sys

import pandas as pd
import pytest

from workbench import config, results
from workbench.run import runner


def _run(tmp_path, preset: str, backends: str, **sets):
    cfg = config.from_preset(preset, backends=backends.split(","), **sets)
    run_dir = runner.run(cfg, out=tmp_path, run_id="r", progress=False)
    return results.load(run_dir).set_index("student"), results.read_json(run_dir / "summary.json")


def test_without_jax_the_jax_row_is_skipped_and_the_torch_rows_run(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)  # `import jax` raises ImportError, installed or not
    rows, _ = _run(tmp_path, "cpu-smoke", "torch_fp32,torch_bf16,jax:fp32")
    assert rows.loc["torch_fp32", "status"] == "ok" and rows.loc["torch_fp32", "framework"] == "torch"
    assert rows.loc["jax:fp32", "status"] == "skipped" and rows.loc["jax:fp32", "framework"] == "jax"
    assert "pip install 'jax[cpu]' flax optax" in rows.loc["jax:fp32", "reason"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_the_jax_lm_row_trains_as_the_torch_fp32_row_does(tmp_path, kind):
    """At an LM shape the JAX student is the causal LM: the same starting weights (the run's initial losses are
    equal), the same batches and teacher logits, so in fp32 it ends where torch fp32 ends; held-out metrics by
    the torch rows' own code, before training too."""
    pytest.importorskip("jax")
    pytest.importorskip("flax")
    pytest.importorskip("optax")
    rows, summary = _run(tmp_path, "gpt-cpu", "torch_fp32,jax:fp32", kind=kind, steps=6, corpus_mb=0.2,
                         teacher="random", eval_batches=2, warmup=1, iters=2, no_kd_student=False)
    assert (rows["status"] == "ok").all(), rows["reason"].to_dict()
    assert summary["initial_losses_equal"] is True
    jx, pt = rows.loc["jax:fp32"], rows.loc["torch_fp32"]
    for cell in ("final_train_loss", "heldout_ppl", "heldout_ppl_step0", "kl_teacher_student_t1_nats",
                 "top1_agreement_step0"):
        assert jx[cell] == pytest.approx(pt[cell], rel=1e-4), cell
    assert jx["heldout_ppl"] < jx["heldout_ppl_step0"]  # it learned
    assert jx["attention_backend"] == "jax xla" and jx["tflops"] > 0


def test_jax_rows_start_where_the_torch_rows_start_and_stand_beside_them(tmp_path):
    pytest.importorskip("jax")
    pytest.importorskip("flax")
    pytest.importorskip("optax")
    rows, summary = _run(tmp_path, "cpu-smoke", "torch_fp32,torch_bf16,jax:fp32,jax:bf16")
    assert (rows["status"] == "ok").all(), rows["reason"].to_dict()
    assert rows["framework"].to_dict() == {"torch_fp32": "torch", "torch_bf16": "torch", "jax:fp32": "jax",
                                           "jax:bf16": "jax"}
    assert summary["initial_losses_equal"] is True  # the same weights, the same first held-out batch
    # the same training from the same start: the fp32 rows end where the torch fp32 row ends
    assert rows.loc["jax:fp32", "final_train_loss"] == pytest.approx(rows.loc["torch_fp32", "final_train_loss"],
                                                                     rel=1e-4)
    assert rows.loc["jax:fp32", "eval_mse"] == pytest.approx(rows.loc["torch_fp32", "eval_mse"], rel=1e-3)
    assert pd.notna(rows.loc["jax:bf16", "compile_ms"]) and rows.loc["jax:bf16", "gemm_precision"] == "bf16"
    assert summary["fastest_bf16_student"] == "torch_bf16"  # a PyTorch denominator, whatever JAX measured
