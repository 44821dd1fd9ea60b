"""The verdict's GPU part on a real GPU with the real Transformer Engine (CPU tests read back a bench folder written
as files): `workbench verdict` of a small hf-init shape writes its folder, benches it with the model as its own
teacher and names the fastest bf16 row as the denominator. Run on the H200 by scripts/gpu_tests.sh; the verdict's
files go to $OUT/verdict_gpu/ when OUT is set."""
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[lm]')")

from workbench import cli  # noqa: E402
from workbench.env import te as _te  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")]


def test_verdict_measures_against_the_fastest_bf16_row(tmp_path):
    out = tmp_path / "verdict"
    # tiny-llama (hidden 64, 2 layers): every dimension a multiple of 16, so the FP8 rows run; a short budget keeps
    # the graphed TE variant and cuts the rest into rows that say so
    assert cli.main(["verdict", "tiny-llama", "--preset", "hf-llama-4l", "--set", "model.batch=2",
                     "--set", "model.seq_len=256", "--budget-s", "20", "--out", str(out)]) == 0
    v = json.loads((out / "verdict.json").read_text())
    if os.environ.get("OUT"):
        shutil.copytree(out, Path(os.environ["OUT"]) / "verdict_gpu", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("model", "runs", "*.safetensors"))
    m = v["measured"]
    assert m["status"] == "ok", m
    assert (out / "model" / "config.json").exists()  # the hf-init shape was written first
    ran = {(r["variant"], r["student"]): r for r in m["rows"]}
    assert ("hf-te-layer-step", "te_fp8:delayed") in ran and ("hf-te-layer-step", "te_bf16") in ran
    bf16 = [r["step_ms"] for r in m["rows"] if r["precision"] == "bf16"]
    assert m["denominator"]["step_ms"] == min(bf16)
    fp8 = ran[("hf-te-layer-step", "te_fp8:delayed")]
    assert fp8["kl_teacher_student_t1_nats_step0"] is not None and fp8["kl_teacher_student_t1_nats_step0"] >= 0
    assert fp8["predicted_speedup"] is not None
    assert all(r["reason"] for r in m["not_run"])
    assert (out / "verdict.md").read_text().count("Measured:") >= 1
