"""`workbench verdict`'s CPU part: the FP8 eligibility rules, the FLOP counts against hand counts, the project's
own numbers for the Llama-3.2-1B shape, and the command on a tiny folder writing its three files with the GPU
part marked not run and why."""
import json

import pytest

pytest.importorskip("transformers")

from workbench import cli  # noqa: E402
from workbench.config import ConfigError  # noqa: E402
from workbench.models import hf_init  # noqa: E402
from workbench.verdict import predict as vp  # noqa: E402
from workbench.verdict import shapes  # noqa: E402

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def _folder(tmp_path, name, config):
    """A Hugging Face folder holding only config.json: all a verdict reads."""
    out = tmp_path / name
    config.save_pretrained(out)
    return str(out)


def _recipe(p, name):
    return next(r for r in p["recipes"] if r["recipe"] == name)


def test_gemm_rules_tensor_16_and_block_128():
    assert shapes.gemm_eligible(8192, 2048, 512, "tensor") == (True, "")
    assert shapes.gemm_eligible(8192, 2048, 512, "block")[0]
    ok, why = shapes.gemm_eligible(8192, 576, 1536, "block")  # SmolLM2's hidden 576 = 4.5 x 128
    assert not ok and "K=576" in why and "128" in why and "N=" not in why
    assert shapes.gemm_eligible(8192, 576, 1536, "tensor")[0]  # 576 = 36 x 16
    ok, why = shapes.gemm_eligible(8192, 2048, 50257, "tensor")  # GPT-2's vocabulary
    assert not ok and "N=50257" in why and "16" in why
    assert not shapes.gemm_eligible(100, 2048, 2048, "tensor")[0]  # the tokens dimension counts too


def test_fp8_attention_needs_head_dim_128_on_hopper_and_te_layers():
    assert shapes.fp8_attention(128, "", "NVIDIA H200")[0] is True
    ok, why = shapes.fp8_attention(64, "", "NVIDIA H200")
    assert ok is False and "head_dim 64" in why
    assert shapes.fp8_attention(128, "", "NVIDIA B200")[0] is None  # not measured there: unknown, not a guess
    ok, why = shapes.fp8_attention(128, "model_type 'olmo2': post-norm", "NVIDIA H200")
    assert ok is False and "olmo2" in why


def test_a_refused_family_and_a_supported_one(tmp_path):
    from transformers import AutoConfig

    olmo = AutoConfig.for_model("olmo2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=4, vocab_size=512, eos_token_id=0, pad_token_id=0)
    p = vp.predict(_folder(tmp_path, "olmo2", olmo), batch=2, seq_len=32)
    te = p["eligibility"]["te_layers"]
    assert te["supported"] is False and "OLMo2" in te["reason"]
    assert p["eligibility"]["attention"]["fp8"]["eligible"] is False
    assert not _recipe(p, "te_fp8_delayed_head_attention")["eligible"]
    q = vp.predict("qwen3-0.6b-4l", batch=4, seq_len=2048)  # a supported family at head_dim 128
    assert q["eligibility"]["te_layers"]["supported"] is True
    assert q["eligibility"]["attention"]["fp8"]["eligible"] is True
    assert _recipe(q, "te_fp8_delayed_head_attention")["eligible"]


def test_a_misaligned_head_refuses_te_fp8_head_but_torchao_keeps_it_bf16(tmp_path):
    p = vp.predict(_folder(tmp_path, "v520", hf_init.hf_config("tiny-llama", vocab=520)), batch=2, seq_len=32)
    head = next(g for g in p["eligibility"]["gemms"] if g["name"] == "lm_head")
    assert head["n"] == 520 and not head["tensor"]["eligible"]
    assert _recipe(p, "te_fp8_delayed")["eligible"]
    assert not _recipe(p, "te_fp8_delayed_head")["eligible"]
    torchao = _recipe(p, "torchao_float8")
    assert torchao["eligible"] and "lm_head" not in torchao["fp8_gemms"]
    assert not _recipe(p, "te_fp8_block")["eligible"]  # hidden 64 is no multiple of 128


def test_flops_of_a_tiny_llama_against_a_hand_count():
    # tiny-llama: hidden 64, ffn 128, 2 layers, 4 heads of 16, 2 KV heads, vocab 512; batch 2 x seq 32 = 64 tokens
    # per layer, K x N: q 64x64 + k 64x32 + v 64x32 + o 64x64 + gate 64x128 + up 64x128 + down 128x64 = 36864
    layer_gemms = 6 * 64 * 36864 * 2  # 6 x M x (sum of K x N) x layers = 28,311,552
    head = 6 * 64 * 64 * 512  # the tied head still runs its GEMM: 12,582,912
    attention = 12 * 64 * (33 / 2) * (4 * 16) * 2  # 12 x tokens x mean keys (seq+1)/2 x attn width x layers
    f = vp.predict("tiny-llama", batch=2, seq_len=32)["flops"]
    assert f["layer_gemms_tflop"] * 1e12 == pytest.approx(layer_gemms)
    assert f["lm_head_tflop"] * 1e12 == pytest.approx(head)
    assert f["attention_tflop"] * 1e12 == pytest.approx(attention)
    assert f["total_tflop"] * 1e12 == pytest.approx(layer_gemms + head + attention)
    # the project's count: the same GEMMs, attention over the full seq x seq square (12 x layers x width x seq)
    assert f["project_count_tflop"] * 1e12 == pytest.approx(layer_gemms + head + 12 * 2 * 64 * 32 * 64)


def test_a_sliding_window_counts_only_its_keys():
    assert vp.mean_keys(4, None) == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert vp.mean_keys(4, 2) == pytest.approx((1 + 2 + 2 + 2) / 4)


def test_llama_3_2_1b_at_8192_tokens_matches_the_projects_numbers():
    # issue 37 (the H200 at a629f82): 64.0 TFLOP a step, layer GEMMs 47.8, LM head 12.9, attention 3.3
    p = vp.predict("llama-3.2-1b", batch=4, seq_len=2048)
    f = p["flops"]
    for key, want in (("total", 64.0), ("layer_gemms", 47.8), ("lm_head", 12.9), ("attention", 3.3)):
        assert f[f"{key}_tflop"] == pytest.approx(want, rel=0.02), key
    assert p["eligibility"]["attention"]["fp8"]["eligible"] is False  # head_dim 64
    layers, head = _recipe(p, "te_fp8_delayed"), _recipe(p, "te_fp8_delayed_head")
    current = _recipe(p, "te_fp8_current")
    assert 1 < current["speedup_expected"] < layers["speedup_expected"] < head["speedup_expected"]
    assert layers["speedup_expected"] < layers["speedup_ideal"]  # the real step pays for casts, floors, attention
    assert layers["speedup_low"] < layers["speedup_expected"] < layers["speedup_high"]
    parts = layers["parts_ms"]
    assert parts["fp8_casts"] > 0 and _recipe(p, "bf16")["parts_ms"]["fp8_casts"] == 0
    assert layers["expected_ms"] == pytest.approx(sum(parts.values()))
    assert "datasheet" in p["ceilings"]["peak_source"]


def test_measured_peaks_replace_the_datasheet():
    peak = {"gpu_name": "NVIDIA H200", "measured": {"bf16": {"status": "ok", "tflops": 790.0},
                                                    "fp8": {"status": "ok", "tflops": 1400.0}}}
    c = vp.ceilings("NVIDIA H200", peak)
    assert (c["bf16_tflops"], c["fp8_tflops"]) == (790.0, 1400.0) and c["peak_source"].startswith("measured")
    unknown = vp.ceilings("Some GPU", None)
    assert unknown["bf16_tflops"] is None and "unknown" in unknown["peak_source"]


def test_a_sequence_longer_than_the_model_positions_is_refused():
    with pytest.raises(ConfigError, match="max_position_embeddings=512"):
        vp.predict("tiny-llama", batch=1, seq_len=1024)


def test_the_command_on_a_tiny_folder_writes_three_files_gpu_part_not_run(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    folder = _folder(tmp_path, "tiny", hf_init.hf_config("tiny-llama"))
    out = tmp_path / "verdict"
    assert cli.main(["verdict", folder, "--preset", "cpu-smoke", "--out", str(out)]) == 0
    v = json.loads((out / "verdict.json").read_text())
    assert v["measured"] == {"status": "not run", "reason": "no CUDA GPU here"}
    assert v["prediction"]["run"]["tokens_per_step"] == 4 * 32  # cpu-smoke: batch 4 x seq 32
    assert v["prediction"]["assumptions"] and "--preset cpu-smoke" in v["command"]
    md = (out / "verdict.md").read_text()
    assert "not run: no CUDA GPU here" in md and "## FP8 eligibility" in md and "self_attn.q_proj" in md
    assert (out / "verdict.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert v["prediction"]["ceilings"]["gpu"] == "NVIDIA H200" and "--gpu" not in v["command"]  # no GPU: the default


def test_the_prediction_is_for_the_gpu_the_measured_rows_run_on(tmp_path, monkeypatch):
    """At 05acfd3 an H100's verdict page predicted for the default H200 beside rows measured on the H100."""
    import torch

    from workbench.verdict import cli as verdict_cli
    from workbench.verdict import measured

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a named fake: this machine "has" an H100
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(measured, "measure", lambda *a, **k: {"status": "not run", "reason": "faked"})
    folder = _folder(tmp_path, "tiny", hf_init.hf_config("tiny-llama"))
    v = verdict_cli.run(folder, "cpu-smoke", out=tmp_path / "v")
    assert v["prediction"]["ceilings"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert v["prediction"]["ceilings"]["datasheet_entry"] and "H100" in v["prediction"]["ceilings"]["datasheet_entry"]
    assert verdict_cli.run(folder, "cpu-smoke", out=tmp_path / "w", gpu="NVIDIA H200")["prediction"]["ceilings"][
        "gpu"] == "NVIDIA H200"  # --gpu still names another


def test_the_command_refuses_what_is_neither_folder_nor_shape(tmp_path, capsys):
    assert cli.main(["verdict", str(tmp_path / "nothing"), "--out", str(tmp_path / "v")]) == 2
    assert "neither a folder with a config.json nor an hf-init shape" in capsys.readouterr().err


@pytest.mark.slow
def test_the_verdict_notebook_runs_under_papermill_and_shows_the_page(tmp_path):
    """notebooks/verdict.ipynb, executed as a user would (papermill, CPU): the headline, the figure, the page."""
    import nbformat
    import papermill

    from workbench import notebook

    out = tmp_path / "v"
    executed = tmp_path / "verdict.ipynb"
    papermill.execute_notebook(str(ROOT / "notebooks" / "verdict.ipynb"), str(executed), kernel_name="python3",
                               parameters={"model": "tiny-llama", "preset": "cpu-smoke", "out": str(out),
                                           "studies": [str(_finetune_study(tmp_path))]},
                               cwd=str(ROOT), progress_bar=False, extra_arguments=notebook.QUIET_KERNEL)
    v = json.loads((out / "verdict.json").read_text())
    assert v["measured"] == {"status": "not run", "reason": "no CUDA GPU here"}
    text = json.dumps(nbformat.read(executed, as_version=4).cells)
    assert v["headline"][:60] in text and "image/png" in text and "## FP8 eligibility" in text
    assert v["quality"][0]["study"] == "real-finetune" and "### `real-finetune`" in text  # the study reached the page


# ---- the quality part: studies that ran (verdict/quality.py) ------------------------------------------------
FINETUNE = ROOT / "results/reference/h100/quality/real/bf8c11d/real-finetune.tar.gz"  # a real study, 3 seeds


def _finetune_study(tmp_path):
    import tarfile

    folder = tmp_path / "real-finetune"
    with tarfile.open(FINETUNE) as tar:
        tar.extractall(folder, filter="data")
    return folder


def test_a_verdict_given_a_study_says_what_fp8_does_over_training_against_its_noise(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    study = _finetune_study(tmp_path)
    out = tmp_path / "verdict"
    assert cli.main(["verdict", "tiny-llama", "--preset", "cpu-smoke", "--out", str(out), "--study", str(study)]) == 0
    v = json.loads((out / "verdict.json").read_text())
    (q,) = v["quality"]
    assert q["study"] == "real-finetune" and q["teacher"] == "smollm2-135m" and q["other_model"] is True
    kl = next(a for a in q["arms"] if a["arm"] == "te_fp8_delayed" and a["metric"] == "kl_teacher_student_t1_nats")
    # the study's own gaps.csv: +57.9% [+55.2%, +60.6%] against a 1.0% bf16 noise floor, 3 seeds
    assert kl["n_seeds"] == 3 and kl["within_noise"] is False and round(kl["gap_pct_mean"], 1) == 57.9
    assert round(kl["noise_floor_pct"], 1) == 1.0 and round(kl["diff_mean"], 4) == 0.0247
    te_bf16 = next(a for a in q["arms"] if a["arm"] == "te_bf16" and a["metric"] == "kl_teacher_student_t1_nats")
    assert te_bf16["within_noise"] is True
    # no GPU: the predicted recipe is the one looked up; the headline carries the answer and the warning
    assert "Quality over training, te_fp8_delayed against torch_bf16" in v["headline"]
    assert "KL to the original model +57.9% [+55.2%, +60.6%]; +0.0247 nats" in v["headline"]
    assert "outside the noise" in v["headline"]
    assert "read that study before adopting it" in v["headline"] and "not this verdict's model" in v["headline"]
    md = (out / "verdict.md").read_text()
    assert "### `real-finetune`: smollm2-135m fine-tuned" in md
    assert "| te_fp8_delayed | held-out KL to the original model | 3 | +57.9% [+55.2%, +60.6%] |" in md
    assert "Untested" not in md and f"--study {study}" in v["command"]


def test_a_verdict_without_studies_says_quality_is_untested(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "verdict"
    assert cli.main(["verdict", "tiny-llama", "--preset", "cpu-smoke", "--out", str(out)]) == 0
    v = json.loads((out / "verdict.json").read_text())
    assert v["quality"] == [] and "Quality over training" not in v["headline"]
    assert "Untested by this verdict (no `--study`" in (out / "verdict.md").read_text()


def test_a_study_folder_that_is_none_is_refused_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "verdict"
    assert cli.main(["verdict", "tiny-llama", "--preset", "cpu-smoke", "--out", str(out),
                     "--study", str(tmp_path)]) == 2
    assert f"--study {tmp_path}: not a study folder (no study.json)" in capsys.readouterr().err
    assert not out.exists()  # refused up front: nothing predicted, measured or written


def _arms(kl_within, n=3):
    return [{"arm": "te_fp8_delayed", "metric": "kl_teacher_student_t1_nats", "n_seeds": n, "gap_pct_mean": 4.0,
             "gap_pct_ci_low": -1.0, "gap_pct_ci_high": 9.0, "noise_floor_pct": None if kl_within is None else 3.7,
             "within_noise": kl_within, "diff_mean": 0.01, "diff_ci_low": -0.002, "diff_ci_high": 0.02}]


@pytest.mark.parametrize("within, words, warned", [(True, "within the noise", False),
                                                   (False, "outside the noise", True),
                                                   (None, "noise unknown (no noise floor yet)", False)])
def test_the_quality_sentence_judges_by_each_studys_own_noise_floor(within, words, warned):
    from workbench.verdict import page

    studies = [{"study": "s", "student": "pruned", "teacher": "m", "other_model": False, "refused": False,
                "finetuned": False, "trained_here": False, "arms": _arms(within)}]
    verdict = {"quality": studies, "measured": {"status": "ok", "best_fp8": {"recipe": "te_fp8_delayed_head"}}}
    said = page.quality_sentence(verdict)
    # the measured FP8 row had an FP8 head: the studies' arm for it is its layers' recipe
    assert said.startswith("Quality over training, te_fp8_delayed (the studies' arm for te_fp8_delayed_head: its "
                           "FP8 head not studied) against torch_bf16: `s` (pruned students of m, 3 seeds)")
    assert words in said and ("read that study" in said) == warned


def test_a_refused_study_and_an_arm_it_did_not_run_are_said_not_judged():
    from workbench.verdict import quality

    studies = [{"study": "r", "refused": True, "arms": _arms(False)},
               {"study": "t", "student": "x", "teacher": "m", "refused": False, "finetuned": False,
                "trained_here": False, "arms": _arms(False)}]
    said = quality.sentence(studies, "torchao_float8")
    assert "`r` refused" in said and "`t` has no torchao_float8 arm" in said
    assert quality.outside(studies, "torchao_float8") == [] and quality.outside(studies, "te_fp8_delayed") == ["t"]


def test_a_study_whose_report_is_older_than_its_points_is_reported_again(tmp_path, monkeypatch):
    # the pruned study's archive (H100, 3e25bd0): its report was written by an earlier call, before seed 1's bf16
    # point finished (index.csv newer than headline.json); read as it is, every gap would say "not run"
    import tarfile

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    study = tmp_path / "real-pruned"
    with tarfile.open(ROOT / "results/reference/h100/quality/real/3e25bd0/real-pruned.tar.gz") as tar:
        tar.extractall(study, filter="data")
    assert (study / "index.csv").stat().st_mtime > (study / "headline.json").stat().st_mtime
    assert cli.main(["verdict", "tiny-llama", "--preset", "cpu-smoke", "--out", str(tmp_path / "v"),
                     "--study", str(study)]) == 0
    (q,) = json.loads((tmp_path / "v" / "verdict.json").read_text())["quality"]
    kl = next(a for a in q["arms"] if a["arm"] == "te_bf16" and a["metric"] == "kl_teacher_student_t1_nats")
    assert kl["n_seeds"] == 1 and kl["gap_pct_mean"] is not None and kl["within_noise"] is None  # one seed: no floor
    assert (tmp_path / "v" / "verdict_quality.png").read_bytes()[:4] == b"\x89PNG"


def test_an_fp8_attention_recipe_is_looked_up_as_its_layers_arm_saying_what_was_not_studied():
    from workbench.verdict import quality

    assert quality.arm_of("te_fp8_current_head_attention") == ("te_fp8_current", "its FP8 head and attention")
    assert quality.arm_of("torchao_float8") == ("torchao_float8", "")


def test_a_report_of_a_study_whose_point_folders_are_gone_is_read_as_it_is(tmp_path, monkeypatch):
    # the committed reference layout keeps the report, not the points: reporting it again would wipe its gaps, however
    # the checkout ordered the files' times
    import os
    import shutil

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    study = tmp_path / "quality"
    shutil.copytree(ROOT / "results/reference/h200/quality", study,
                    ignore=shutil.ignore_patterns("64mb", "real", "carry", "long_3200", "*.png", "*.ipynb"))
    os.utime(study / "index.csv", (2e9, 2e9))  # newer than the report
    before = (study / "headline.json").read_text()
    assert cli.main(["verdict", "tiny-llama", "--preset", "cpu-smoke", "--out", str(tmp_path / "v"),
                     "--study", str(study)]) == 0
    assert (study / "headline.json").read_text() == before
    (q,) = json.loads((tmp_path / "v" / "verdict.json").read_text())["quality"]
    assert q["trained_here"] and q["other_model"] is None and "students of a teacher trained in the study" in (
        tmp_path / "v" / "verdict.md").read_text()


def test_a_study_that_cannot_be_read_is_refused_naming_it_before_the_gpu_part(tmp_path, monkeypatch, capsys):
    from workbench.verdict import measured

    monkeypatch.setattr(measured, "measure", lambda *a, **k: pytest.fail("the GPU part ran before the studies"))
    study = _finetune_study(tmp_path)
    (study / "gaps.csv").write_bytes(b"")  # damaged
    assert cli.main(["verdict", "tiny-llama", "--preset", "cpu-smoke", "--out", str(tmp_path / "v"),
                     "--study", str(study)]) == 2
    assert f"--study {study}: its report cannot be read" in capsys.readouterr().err


def test_papermills_text_of_a_list_of_studies_is_read_as_the_list(tmp_path):
    from workbench.verdict import quality

    study = _finetune_study(tmp_path)
    assert quality.check(f'["{study}"]') == [study] and quality.check(str(study)) == [study]
