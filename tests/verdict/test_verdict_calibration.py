"""The verdict's expected speed-up against the H200's measurements (issue 35's target: within 10% on >= 3 shapes).
The measured rows are committed result files (results/reference/h200/); the prediction is computed here on the CPU,
so a change to the step model or its constants that moves a prediction off its measurement fails this test."""
from pathlib import Path

import pytest

from workbench.verdict import calibration, check
from workbench.verdict.predict import fused_gemms
from workbench.verdict.shapes import read

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def table():
    return check.table(ROOT)


def test_every_calibrated_recipe_is_within_the_target_on_every_shape(table):
    assert set(table["bench"]) == {c[0] for c in check.CASES}  # every case found its committed rows
    calibrated = table[table["calibrated"]]
    assert len(calibrated) >= 18
    worst = calibrated.loc[calibrated["miss"].abs().idxmax()]
    assert abs(worst["miss"]) <= check.TARGET, worst.to_dict()
    assert abs(worst["miss"]) == pytest.approx(calibration.LARGEST_MISS, abs=5e-4)  # the figure the pages quote


def test_the_best_fp8_ratio_is_predicted_within_the_target_per_bench(table):
    """Issue 35's target as stated: the best FP8 / fastest bf16 ratio, each bench's own denominator."""
    b = check.best(table)
    assert len(b) == len(check.CASES) and (b["miss"].abs() <= check.TARGET).all(), b.to_dict("records")
    verdict_1b = b[b["bench"] == "verdict/llama-3.2-1b"].iloc[0]
    assert verdict_1b["best_measured"] == verdict_1b["best_expected"] == "te_fp8_delayed_head"


def test_an_uncalibrated_recipe_is_reported_with_its_miss_not_judged(table):
    """torchao float8 runs on the compiled HF model, not TE's graphed step the prediction assumes: +20% on each."""
    ao = table[table["recipe"] == "torchao_float8"]
    assert len(ao) == 3 and not ao["calibrated"].any() and (ao["miss"] > check.TARGET).all()


def test_the_shapes_not_fitted_are_within_the_quoted_range(table):
    """Llama-3.2-1B x4 and x16 and Qwen2.5-0.5B gave no constant: their misses are what calibration.TOLERANCE is
    built from; the fitted shapes stay unbiased (within 1%) with every constant, FP8's elementwise saving included."""
    held_out = table[~table["fitted"] & table["calibrated"]]
    assert set(held_out["shape"]) == {"llama-3.2-1b-4l", "llama-3.2-1b", "qwen2.5-0.5b"}
    assert (table[table["fitted"]]["miss"].abs() < 0.01).all()
    assert (held_out["miss"].abs() <= calibration.TOLERANCE).all()


def test_the_prediction_says_fp8_does_not_pay_where_it_measured_so(table):
    """SmolLM2-135M: FP8 measured 0.99x / 0.92x; the ideal model said 1.45x."""
    small = table[table["shape"] == "smollm2-135m"]
    assert (small["speedup_expected"] < 1).all() and (small["speedup_ideal"] > 1.3).all()


def test_te_fuses_qkv_and_gate_up():
    g = {x.name: x for x in fused_gemms(read("qwen3-0.6b-4l", 2048))}
    assert g["self_attn.qkv"].n == 2048 + 1024 + 1024 and g["mlp.fc1"].n == 2 * 3072
    assert set(g) == {"self_attn.qkv", "self_attn.o_proj", "mlp.fc1", "mlp.down_proj", "lm_head"}


def test_the_committed_page_names_a_miss_and_draws_the_measured_steps():
    """The Llama-3.2-1B verdict (H200): torchao measured 1.04x against a predicted 1.25x; the page says why, and the
    figure puts each measured step beside its expected one."""
    import json

    from workbench.verdict import page

    v = json.loads((ROOT / check.H200 / "verdict/llama-3.2-1b/verdict.json").read_text())
    text = page.markdown(v)
    assert "off its prediction: `torchao_float8:tensorwise`" in text and "compiled HF bf16" in text
    assert "off its prediction: `te_fp8" not in text  # the calibrated recipes are within the range
    measured = page._measured_ms(v)
    assert measured["bf16"][0] == v["measured"]["denominator"]["step_ms"]
    assert measured["te_fp8_delayed_head"][1] > 1.25


def test_the_page_states_every_constant_the_expected_time_uses():
    """The FP8 elementwise saving moves every FP8 prediction: the assumptions say so, and the range quoted."""
    from workbench.verdict.predict import predict

    text = " ".join(predict("qwen2.5-0.5b", batch=4, seq_len=2048)["assumptions"])
    assert str(calibration.FP8_ELEMENTWISE_SAVING) in text and "Qwen2.5-0.5B" in text
    assert f"+-{calibration.TOLERANCE:.0%}" in text and f"{calibration.LARGEST_MISS:.1%}" in text
