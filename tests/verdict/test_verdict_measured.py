"""The verdict's GPU part read back (workbench/verdict/measured.py): which variants a model gets, the denominator
(the fastest bf16 row, never a weaker one), each row's ratios, step-0 quality and the judgement. The bench folder
here is written by the test as files shaped like a real bench's (the GPU path itself runs on the H200)."""
import json
import warnings

import pandas as pd
import pytest

from workbench.verdict import measured, page
from workbench.verdict.predict import predict

ROWS = [  # variant, student, precision, status, step ms, spread %, peak MiB, reason
    ("hf-te-layer-step", "te_bf16", "bf16", "ok", 140.0, 0.5, 56000, ""),
    ("hf-te-layer-step", "te_fp8:delayed", "fp8", "ok", 116.0, 0.5, 56100, ""),
    ("hf-te-layer-step", "te_fp8:current", "fp8", "ok", 120.0, 0.5, 56200, ""),
    ("hf-te-layer-step", "te_bf16:no_kd", "bf16", "ok", 120.0, 0.5, 56000, ""),  # less work: never the denominator
    ("hf-compile", "torch_bf16", "bf16", "ok", 155.0, 1.0, 70000, ""),
    ("hf-compile", "torchao_float8:tensorwise", "fp8", "ok", 134.0, 1.0, 65000, ""),
    ("hf-te-layer", "te_bf16", "bf16", "skipped", None, None, None, "time budget 360 s spent (371 s)"),
]


def _bench(tmp_path, rows=ROWS):
    d = tmp_path / "bench"
    cols = ["variant", "student", "precision", "status", "step_ms_median", "median_spread_pct",
            "peak_mem_allocated_mb", "reason"]
    d.mkdir()
    pd.DataFrame(rows, columns=cols).to_csv(d / "bench.csv", index=False)
    step0 = {"te_bf16": (0.002, 0.98, 15.3), "te_fp8:delayed": (0.06, 0.87, 16.1), "te_fp8:current": (0.03, 0.9, 15.7)}
    (d / "runs" / "hf-te-layer-step").mkdir(parents=True)
    pd.DataFrame([(s, *v) for s, v in step0.items()], columns=["student", *measured.STEP0]).to_csv(
        d / "runs" / "hf-te-layer-step" / "students.csv", index=False)
    (d / "runs" / "hf-te-layer-step" / "profile-te_fp8-delayed.json").write_text(
        json.dumps({"kernel_categories_ms_per_step": {"gemm": 60.0, "attention": 15.0}}))
    return d


@pytest.fixture(scope="module")
def prediction():
    return predict("llama-3.2-1b", batch=4, seq_len=2048)


def test_the_denominator_is_the_fastest_bf16_row_and_every_ratio_names_it(tmp_path, prediction):
    m = measured.summarize(_bench(tmp_path), prediction)
    assert m["denominator"] == {"variant": "hf-te-layer-step", "what": measured.WHAT["hf-te-layer-step"],
                                "student": "te_bf16", "step_ms": 140.0}  # not the no-KD row, not compiled bf16
    best = m["best_fp8"]
    assert (best["student"], best["variant"]) == ("te_fp8:delayed", "hf-te-layer-step")
    assert best["speedup_vs_fastest_bf16"] == pytest.approx(140 / 116)
    assert best["speedup_vs_compiled_bf16"] == pytest.approx(155 / 116)
    assert best["kl_teacher_student_t1_nats_step0"] == pytest.approx(0.06) and best["top1_agreement_step0"] == 0.87
    assert best["recipe"] == "te_fp8_delayed" and best["predicted_speedup"] == pytest.approx(1.18, abs=0.03)
    assert best["mem_vs_fastest_bf16"] == pytest.approx(56100 / 56000 - 1)
    assert m["best_fp8_split_ms"] == {"gemm": 60.0, "attention": 15.0}
    assert m["not_run"] == [{"variant": "hf-te-layer", "student": "te_bf16", "status": "skipped",
                             "reason": "time budget 360 s spent (371 s)"}]
    assert m["judgement"]["recommended"] is True


def test_compiled_and_graphed_bf16_is_compiled_bf16_and_can_be_the_denominator(tmp_path, prediction):
    rows = [*ROWS, ("hf-compile-step", "torch_bf16", "bf16", "ok", 130.0, 0.5, 66000, "")]
    m = measured.summarize(_bench(tmp_path, rows), prediction)
    assert m["denominator"]["variant"] == "hf-compile-step" and m["compiled_bf16_ms"] == 130.0
    assert m["best_fp8"]["speedup_vs_fastest_bf16"] == pytest.approx(130 / 116)


def test_fp8_within_the_rows_spread_is_not_recommended(tmp_path):
    rows = [("hf-te-layer-step", "te_bf16", "bf16", "ok", 33.98, 0.6, 17146, ""),
            ("hf-te-layer-step", "te_fp8:delayed", "fp8", "ok", 34.29, 0.6, 17216, "")]
    j = measured.summarize(_bench(tmp_path, rows))["judgement"]
    assert j["recommended"] is False and "0.99x" in j["why"]


def test_no_bf16_row_is_said_not_divided(tmp_path):
    rows = [("hf-te-layer-step", "te_fp8:delayed", "fp8", "ok", 30.0, 0.5, 100, "")]
    assert measured.summarize(_bench(tmp_path, rows))["status"] == "no denominator"


def test_the_page_leads_with_the_measurement(tmp_path, prediction):
    m = measured.summarize(_bench(tmp_path), prediction)
    v = {"prediction": prediction, "measured": m, "command": "python -m workbench verdict llama-3.2-1b"}
    h = page.headline(v)
    assert h.startswith("Measured: TE decoder layers, the whole step in one CUDA graph, `te_fp8:delayed`: 1.21x your "
                        "fastest bf16 path") and "1.34x compiled HF bf16" in h and "Recommended" in h
    assert "Predicted on NVIDIA H200" in h
    md = page.markdown(v)
    assert "| TE decoder layers, the whole step in one CUDA graph | `te_fp8:delayed` | 116.00 | 1.21 |" in md
    assert "not run: hf-te-layer `te_bf16` (skipped): time budget 360 s spent" in md


def test_variants_follow_the_prediction(prediction):
    # the recipe predicted fastest (the FP8 head) before torch.compile's minutes; head_dim 64: no FP8 attention
    assert measured.variants_for(prediction) == ["hf-te-layer-step", "hf-te-layer-fp8-head", "hf-compile",
                                                 "hf-compile-step", "hf-te-layer"]
    qwen3 = predict("qwen3-0.6b-4l", batch=4, seq_len=2048)
    assert "hf-te-layer-fp8-dpa" in measured.variants_for(qwen3)


def test_a_shape_outside_the_calibration_says_so():
    assert predict("llama-3.2-1b", batch=4, seq_len=2048)["calibration"]["outside"] == ""
    tiny = predict("tiny-llama", batch=2, seq_len=256)
    assert tiny["calibration"]["outside"] == "hidden 64, calibrated on 576-2048; 512 tokens a step, calibrated at 8192"
    v = {"prediction": tiny, "measured": {"status": "not run", "reason": "no CUDA GPU here"}}
    assert "Outside the calibrated range (hidden 64" in page.headline(v)


def test_an_unknown_peak_memory_is_said_not_divided(tmp_path, prediction):
    rows = [r if r[1] != "te_fp8:delayed" else (*r[:6], None, "") for r in ROWS]
    m = measured.summarize(_bench(tmp_path, rows), prediction)
    assert m["best_fp8"]["mem_vs_fastest_bf16"] is None
    v = {"prediction": prediction, "measured": m, "command": ""}
    assert "peak memory" not in page.headline(v) and "(nan%)" not in page.markdown(v)


def test_a_family_te_layers_cannot_hold_gets_no_calibrated_te_headline():
    from workbench.verdict import predict as vp
    from workbench.verdict.shapes import read

    shape = read("llama-3.2-1b-4l", 2048)
    ceil = vp.ceilings("NVIDIA H200", None)
    rows = {r["recipe"]: r for r in vp.recipe_rows(shape, 4, 2048, ceil, False, te_layers=False)}
    assert not rows["te_fp8_delayed"]["calibrated"] and not rows["te_fp8_delayed_head"]["calibrated"]
    assert {r["calibrated"] for r in vp.recipe_rows(shape, 4, 2048, ceil, False)[1:3]} == {True}


def test_a_wide_students_csv_is_read_without_a_fragmented_frame_warning(tmp_path, prediction):
    """A real students.csv has ~200 columns; read_csv leaves one block each and assign() on that warned on every
    verdict (the GPU tests' logs): results.read_csv's consolidated frame is what this guards."""
    d = _bench(tmp_path)
    f = d / "runs" / "hf-te-layer-step" / "students.csv"
    s = pd.read_csv(f)
    wide = pd.concat([s, pd.DataFrame({f"extra_{i}": [0.0] * len(s) for i in range(200)})], axis=1)
    wide.to_csv(f, index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.PerformanceWarning)
        rows = measured._rows(d)
    assert rows.loc[rows["student"] == "te_fp8:delayed", "kl_teacher_student_t1_nats_step0"].item() == 0.06
