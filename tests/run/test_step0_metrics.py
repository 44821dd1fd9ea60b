"""Step-0 held-out metrics: every language-model student is evaluated in its own precision before its first
training step (`heldout_ppl_step0`, `kl_teacher_student_t1_nats_step0`, `top1_agreement_step0`), beside the
values after training. A student that is its teacher's own weights starts at KL 0 and agreement 1 in fp32.
(TE's delayed scaling left as training finds it: tests/backends/test_lm_te.py with the fake TE,
tests/gpu/test_gpu.py.)"""
import math

import pytest

from workbench import config, results
from workbench.run import runner

pytest.importorskip("transformers")
from workbench.models import hf_init  # noqa: E402

STEP0 = ("heldout_ppl", "kl_teacher_student_t1_nats", "top1_agreement")


@pytest.fixture(scope="module")
def twin_run(tmp_path_factory):
    """hf-init's tiny Llama as the teacher and as every student (fp32, bf16, TE FP8, which falls back to
    PyTorch autocast on a CPU, and the no-KD student), a few steps."""
    out = tmp_path_factory.mktemp("step0")
    folder = hf_init.write("tiny-llama", out / "tiny-llama", vocab=512, dtype="fp32", corpus_mb=0.2)
    cfg = config.from_preset("gpt-cpu", kind="llama", vocab=512, corpus_mb=0.2, teacher=str(folder),
                             student=str(folder), steps=3, warmup=0, iters=1, eval_batches=2,
                             backends="torch_fp32,torch_bf16,te_fp8:delayed", no_kd_student=True)
    run_dir = runner.run(cfg, out=out, run_id="twin", progress=False)
    return results.load(run_dir).set_index("student"), run_dir


def test_every_lm_student_row_has_its_step0_metrics_beside_the_final_ones(twin_run):
    df, run_dir = twin_run
    assert list(df.index) == ["torch_fp32", "torch_bf16", "te_fp8:delayed", "torch_fp32:no_kd"]
    assert df["status"].isin(results.RAN).all(), df["reason"].to_dict()
    cols = list(df.columns)
    for metric in STEP0:
        step0 = metric + results.STEP0_SUFFIX
        assert cols.index(step0) == cols.index(metric) + 1, step0  # the file puts them side by side
        assert df[step0].map(math.isfinite).all(), df[step0].to_dict()
        # training moved every student, so its held-out numbers moved too
        assert (df[step0] != df[metric]).all(), (metric, df[[metric, step0]])
    assert (df["heldout_ppl_step0"] > 0).all()
    assert df["top1_agreement_step0"].between(0, 1).all()
    assert (df["kl_teacher_student_t1_nats_step0"] >= 0).all()
    assert (run_dir / "heldout_quality.png").exists()  # the plots still read the file


def test_step0_is_the_students_start_in_its_own_precision(twin_run):
    df, _ = twin_run
    fp32, no_kd, bf16 = df.loc["torch_fp32"], df.loc["torch_fp32:no_kd"], df.loc["torch_bf16"]
    for metric in STEP0:  # the no-KD student starts from the same weights in the same precision: same start
        step0 = metric + results.STEP0_SUFFIX
        assert no_kd[step0] == fp32[step0], metric
    # initial_loss stays the fp32 reference model's loss of the weights: equal for every student ...
    assert (df["initial_loss"] == fp32["initial_loss"]).all()
    # ... while step 0 is each student's own arithmetic: bf16 logits are not fp32's
    assert bf16["heldout_ppl_step0"] != fp32["heldout_ppl_step0"]
    assert bf16["kl_teacher_student_t1_nats_step0"] != fp32["kl_teacher_student_t1_nats_step0"]


def test_a_student_that_is_its_teacher_starts_at_zero_kl_and_full_agreement(twin_run):
    df, _ = twin_run
    fp32, bf16 = df.loc["torch_fp32"], df.loc["torch_bf16"]
    # the teacher's own weights and arithmetic: the same logits, up to fp32 summation order
    assert fp32["kl_teacher_student_t1_nats_step0"] == pytest.approx(0, abs=1e-6)
    assert fp32["top1_agreement_step0"] == 1.0
    assert fp32["heldout_ppl_step0"] == pytest.approx(fp32["teacher_heldout_ppl"], rel=1e-5)
    # bf16 rounding of the same model (1.8e-7 nats and agreement 1.0 here); a random model's near-tied logits
    # may swap a few first places, hence the margins
    assert bf16["kl_teacher_student_t1_nats_step0"] < 1e-3
    assert bf16["top1_agreement_step0"] > 0.95
    # training (KL mixed with the text's cross-entropy) then moves the student away from its teacher
    assert fp32["kl_teacher_student_t1_nats"] > fp32["kl_teacher_student_t1_nats_step0"] + 1e-3


def test_step0_columns_sit_beside_their_metric_and_stay_without_one():
    rows = [{"student": "a", "status": "ok", "heldout_ppl_step0": 9.0, "x": 1, "heldout_ppl": 3.0},
            {"student": "b", "status": "diverged", "top1_agreement_step0": 0.5}]
    cols = list(results.students_frame(rows).columns[len(results.STUDENT_COLUMNS):])
    # a step-0 column without its metric (every student diverged) is kept where it was
    assert cols == ["x", "heldout_ppl", "heldout_ppl_step0", "top1_agreement_step0"]
