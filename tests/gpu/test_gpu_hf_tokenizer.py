"""GPU: a Hugging Face model of a real shape (hf-init's Llama-3.2-1B cut to 4 layers, its own tokenizer) as the
student of `workbench run` on the H200, a few steps. Run with scripts/gpu_tests.sh; skipped without CUDA."""
import math

import pytest

pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[lm]')")

from workbench import config, results  # noqa: E402
from workbench.data.tokenizer import files_sha256  # noqa: E402
from workbench.models import hf_init  # noqa: E402
from workbench.run import runner

pytestmark = pytest.mark.gpu


def test_an_hf_init_llama_4l_trains_as_student_with_its_own_tokenizer(tmp_path):
    folder = hf_init.write("llama-3.2-1b-4l", tmp_path / "llama-4l", corpus_mb=2.0)
    cfg = config.from_preset("hf-llama-4l", student=str(folder), corpus_mb=2.0, steps=4, warmup=2, iters=5,
                             eval_batches=1, backends="torch_bf16,te_fp8:delayed", baseline="torch_bf16",
                             no_kd_student=False)
    run_dir = runner.run(cfg, out=tmp_path, run_id="hf-llama-4l", progress=False)
    df = results.load(run_dir).set_index("student")
    assert (df["status"] == "ok").all(), df["reason"].to_dict()
    assert (df["tokenizer"] == "pretrained").all() and (df["tokenizer_sha256"] == files_sha256(folder)).all()
    assert (df["cfg_vocab"] == 32768).all()
    assert all(math.isfinite(v) for v in df["final_train_loss"]), df["final_train_loss"].to_dict()
    task = results.read_json(run_dir / "task.json")
    assert task["tokenizer_path"] == str(folder) and task["tokenizer_vocab"] <= 32768
