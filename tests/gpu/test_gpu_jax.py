"""The JAX rows on a GPU, beside the torch rows of one run (backends jax:bf16, jax:fp8_current): the Flax student
from the torch students' starting weights, and TE-JAX's FP8 current scaling where TE's JAX extension is built (the
`te-jax` GPU run builds it from its sdist; without it these tests skip, naming what is missing). Run on the H200 by
scripts/gpu_tests.sh."""
import pytest
import torch

from workbench import config, results
from workbench.run import runner

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _jax_ready(fp8: bool) -> str:
    from workbench.env import jax as probe

    avail = probe.availability()
    return (avail.fp8_reason if fp8 else avail.reason) or ("" if avail.gpu else "JAX sees no GPU")


def _rows(tmp_path, backends: str):
    cfg = config.from_preset("seed", backends=backends.split(","), steps=30)
    run_dir = runner.run(cfg, out=tmp_path, run_id="jax", progress=False)
    return results.load(run_dir).set_index("student"), results.read_json(run_dir / "summary.json")


def test_the_bf16_flax_student_starts_and_ends_with_the_torch_one(tmp_path):
    if why := _jax_ready(fp8=False):
        pytest.skip(why)
    rows, summary = _rows(tmp_path, "torch_bf16,jax:bf16")
    assert rows.loc["jax:bf16", "status"] == "ok", rows.loc["jax:bf16", "reason"]
    assert "gpu" in str(rows.loc["jax:bf16", "device"]).lower() or "cuda" in str(rows.loc["jax:bf16", "device"]).lower()
    assert summary["initial_losses_equal"] is True
    assert rows.loc["jax:bf16", "final_train_loss"] == pytest.approx(rows.loc["torch_bf16", "final_train_loss"],
                                                                    rel=0.05)


def test_te_jax_fp8_current_scaling_trains_like_bf16(tmp_path):
    if why := _jax_ready(fp8=True):
        pytest.skip(why)
    rows, _ = _rows(tmp_path, "torch_bf16,jax:bf16,jax:fp8_current")
    fp8 = rows.loc["jax:fp8_current"]
    assert fp8["status"] == "ok", fp8["reason"]
    assert fp8["gemm_precision"] == "fp8" and fp8["framework"] == "jax"
    assert fp8["initial_loss"] == pytest.approx(rows.loc["jax:bf16", "initial_loss"], rel=1e-5)  # fp32, same weights
    assert fp8["final_train_loss"] == pytest.approx(rows.loc["jax:bf16", "final_train_loss"], rel=0.1)


def test_the_te_students_step_computes_in_fp8(tmp_path):
    """The compiled TE student holds FP8 tensors (the lowered program names an f8e4m3 type): TE's layers did not
    quietly run bf16."""
    if why := _jax_ready(fp8=True):
        pytest.skip(why)
    import jax

    from workbench.backends import reference_state
    from workbench.jax_side import convert, student
    from workbench.jax_side import runner as jax_runner
    from workbench.train import tasks

    cfg = config.from_preset("seed", steps=2)
    task = tasks.for_config(cfg, torch.device("cuda"), None, cache_dir=tmp_path)
    data = task.make_data()
    model, tx = student.for_model(cfg.model, "fp8_current"), student.adamw(cfg.train)
    _, loss = student.make_fns(model, cfg.distill.loss, tx, student.te_recipe("fp8_current"))
    params = jax.device_put(convert.to_flax(reference_state(task.reference)))
    text = loss.lower(params, *jax.device_put(jax_runner._batch(*data.train[0]))).as_text().lower()
    assert "f8e4m3" in text


def test_the_jax_lm_student_on_the_gpu_starts_with_the_torch_ones_and_fp8_tracks_bf16(tmp_path):
    """At an LM shape: the Flax causal LM from the torch students' weights (equal initial losses), its teacher
    logits through DLPack, cuDNN's fused attention in bf16, and TE-JAX FP8 (where built) within 10% of bf16's
    final loss; the held-out metrics are the torch rows' own."""
    if why := _jax_ready(fp8=False):
        pytest.skip(why)
    fp8 = not _jax_ready(fp8=True)
    backends = "torch_bf16,jax:bf16" + (",jax:fp8_current" if fp8 else "")
    cfg = config.from_preset("gpt-cpu", backends=backends.split(","), steps=40, hidden=256, intermediate=1024,
                             heads=4, seq_len=256, batch=8, vocab=4096, corpus_mb=1.0, teacher="random",
                             no_kd_student=False, teacher_mode="precomputed", baseline="torch_bf16")
    run_dir = runner.run(cfg, out=tmp_path, run_id="jaxlm", progress=False)
    rows, summary = results.load(run_dir).set_index("student"), results.read_json(run_dir / "summary.json")
    assert (rows["status"] == "ok").all(), rows["reason"].to_dict()
    assert summary["initial_losses_equal"] is True
    bf16 = rows.loc["jax:bf16"]
    assert bf16["attention_backend"] == "jax cudnn", bf16.get("attention_warning")
    assert bf16["heldout_ppl"] < bf16["heldout_ppl_step0"]
    assert bf16["final_train_loss"] == pytest.approx(rows.loc["torch_bf16", "final_train_loss"], rel=0.05)
    if fp8:
        assert rows.loc["jax:fp8_current", "final_train_loss"] == pytest.approx(bf16["final_train_loss"], rel=0.1)
