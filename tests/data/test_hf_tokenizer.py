"""A Hugging Face model's own tokenizer, and real shapes offline: `workbench hf-init` writes tiny random Llama and
Qwen2 folders with a tokenizer trained here; the corpus is tokenized by that tokenizer (its ids, not a BPE
trained by the run), teacher and student must share it, and they distil through `workbench run`."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[lm]')")

from hf_fixtures import tiny_llama  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from workbench import config, results  # noqa: E402
from workbench.config import ConfigError  # noqa: E402
from workbench.data import TextSpec, load_text, text  # noqa: E402
from workbench.data.tokenizer import TOKENIZER_FILES, files_sha256  # noqa: E402
from workbench.models import hf_init  # noqa: E402
from workbench.run import runner
from workbench.train import lm_task, task_setup  # noqa: E402

CORPUS_MB = 0.2
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """hf-init's tiny Llama and tiny Qwen2 (the same tokenizer: one corpus, one vocabulary), and a tiny Llama
    whose tokenizer was trained on less text (the same vocabulary size, other merges)."""
    root = tmp_path_factory.mktemp("hf")
    return {name: hf_init.write(shape, root / name, dtype="fp32", corpus_mb=mb)
            for name, shape, mb in (("llama", "tiny-llama", 0.3), ("qwen2", "tiny-qwen2", 0.3),
                                    ("other", "tiny-llama", 0.1))}


def lm_cfg(**kw):
    return config.from_preset("gpt-cpu", **{**dict(kind="llama", corpus_mb=CORPUS_MB, steps=3, teacher_steps=5,
                                                   backends="torch_fp32", no_kd_student=False), **kw})


def test_hf_init_writes_the_published_shapes_offline():
    """Parameter counts of the real models (Llama-3.2-1B 1.236B and Qwen2.5-0.5B 0.494B, tied), built on the
    meta device from hf-init's configs; Qwen2's QKV bias; the presets carry the same width, depth and heads."""
    counts = {}
    for shape in ("llama-3.2-1b", "llama-3.2-1b-4l", "qwen2.5-0.5b"):
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_init.hf_config(shape))
        counts[shape] = sum(p.numel() for p in model.parameters())
        assert model.lm_head.weight is model.model.embed_tokens.weight  # tied
        assert (model.model.layers[0].self_attn.q_proj.bias is not None) == shape.startswith("qwen")
    assert counts == {"llama-3.2-1b": 1_235_814_400, "llama-3.2-1b-4l": 310_396_928, "qwen2.5-0.5b": 494_032_768}
    c = hf_init.hf_config("llama-3.2-1b")
    assert (c.num_key_value_heads, c.rope_parameters["rope_theta"], c.vocab_size) == (8, 500_000.0, 128256)
    for preset, shape in (("hf-llama-4l", "llama-3.2-1b-4l"), ("hf-llama-1b", "llama-3.2-1b"),
                          ("hf-qwen2.5-0.5b", "qwen2.5-0.5b")):
        m, s = config.from_preset(preset).model, hf_init.SHAPES[shape]
        assert (m.hidden, m.intermediate, m.layers, m.heads, m.vocab) == (
            s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"], s["num_attention_heads"], s["vocab_size"])
    assert hf_init.hf_config("tiny-qwen2", vocab=1024).vocab_size == 1024
    with pytest.raises(ConfigError, match="--vocab 100: at least 320"):
        hf_init.hf_config("tiny-llama", vocab=100)


def test_hf_init_folder_holds_model_tokenizer_and_its_record(folders):
    folder = folders["llama"]
    meta = json.loads((folder / "hf_init.json").read_text())
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert meta["shape"] == "tiny-llama" and meta["tokenizer_vocab"] == len(tok) <= meta["vocab_size"] == 512
    assert (
        tok.eos_token == text.EOT
        and tok.eos_token_id == json.loads((folder / "config.json").read_text())["eos_token_id"]
    )
    assert files_sha256(folders["llama"]) == files_sha256(folders["qwen2"]) != files_sha256(folders["other"])
    with pytest.raises(ConfigError, match="exists and is not an empty folder"):
        hf_init.write("tiny-llama", folder)


def test_the_text_is_tokenized_by_the_models_tokenizer(folders, tmp_path):
    """Every train-split token id is what the model's tokenizer gives for that text (each piece followed by its
    eos), and task.json names the tokenizer by its files' hash (a BPE trained by the run has other ids)."""
    cfg = task_setup.resolve_lm(lm_cfg(teacher="random", student=str(folders["llama"])))
    task = lm_task.LMTask(cfg, torch.device("cpu"), None, tmp_path, with_batches=False)
    tok = AutoTokenizer.from_pretrained(folders["llama"], local_files_only=True)
    spec = TextSpec(max_bytes=int(CORPUS_MB * 1e6))
    train = text.split_pieces(text.pieces(text.documents(spec)), spec.heldout_fraction)["train"]
    want = np.concatenate([tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for _, t in train])
    assert np.array_equal(task.text.tokens["train"], want)
    assert task.text.encode("def f(x):") == tok("def f(x):", add_special_tokens=False)["input_ids"]
    assert (task.info["tokenizer"], task.info["tokenizer_sha256"]) == ("pretrained", files_sha256(folders["llama"]))
    assert task.info["tokenizer_path"] == str(folders["llama"]) and task.info["tokenizer_warning"] is None
    assert task.info["model_vocab"] == 512


def test_the_text_cache_is_keyed_by_the_tokenizers_content(folders, tmp_path):
    moved = tmp_path / "moved"
    moved.mkdir()
    for name in TOKENIZER_FILES:
        if (folders["llama"] / name).exists():
            shutil.copy(folders["llama"] / name, moved / name)

    def folder(tok_dir):
        return load_text(TextSpec(max_bytes=100_000, tokenizer="pretrained", pretrained=str(tok_dir)), tmp_path).folder

    assert folder(moved) == folder(folders["llama"]) != folder(folders["other"])


def test_hf_teacher_and_student_distil_through_the_cli(folders, tmp_path):
    """Llama teacher, Qwen2 student (one tokenizer), through `python -m workbench run`."""
    out = subprocess.run(
        [sys.executable, "-m", "workbench", "run", "--preset", "gpt-cpu", "--out", str(tmp_path), "--run-id", "hf",
         *[a for kv in ("kind=llama", f"teacher={folders['llama']}", f"student={folders['qwen2']}", "steps=3",
                        f"corpus_mb={CORPUS_MB}", "backends=torch_fp32,torch_bf16", "no_kd_student=false")
           for a in ("--set", kv)]],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    df = results.load(tmp_path / "hf").set_index("student")
    assert (df["status"] == "ok").all(), df["reason"].to_dict()
    assert (df["tokenizer"] == "pretrained").all() and (df["tokenizer_sha256"] == files_sha256(folders["qwen2"])).all()
    assert df["tokenizer_warning"].isna().all() and (df["cfg_vocab"] == 512).all()
    assert pd.notna(df.loc["torch_fp32", "kl_teacher_student_t1_nats"])


def test_a_qwen2_teacher_distils_into_a_llama_and_into_the_workbenchs_own_student(folders, tmp_path):
    """HF teacher + HF student the other way round, and HF teacher + the workbench's gpt student, whose
    vocabulary comes from the teacher (the preset's model.vocab is another)."""
    for name, student, kind in (("llama", str(folders["llama"]), "llama"), ("gpt", "", "gpt")):
        cfg = lm_cfg(kind=kind, teacher=str(folders["qwen2"]), student=student, vocab=1024)
        run_dir = runner.run(cfg, out=tmp_path, run_id=name, progress=False)
        df = results.load(run_dir).set_index("student")
        assert df.loc["torch_fp32", "status"] == "ok", df["reason"].to_dict()
        assert df.loc["torch_fp32", "cfg_vocab"] == 512 and df.loc["torch_fp32", "tokenizer"] == "pretrained"
        assert results.read_json(run_dir / "config.json")["config"]["model"]["vocab"] == 512
        assert results.read_json(run_dir / "config.json")["requested"] == {}


def test_teacher_and_student_with_different_tokenizers_are_refused_up_front_naming_both(folders, tmp_path):
    cfg = lm_cfg(teacher=str(folders["llama"]), student=str(folders["other"]))
    with pytest.raises(ConfigError, match=rf"lm.teacher \({folders['llama']}\) and lm.student \({folders['other']}\) "
                                          "have different tokenizers"):
        runner.run(cfg, out=tmp_path, run_id="mismatch", progress=False)
    assert not (tmp_path / "mismatch").exists()  # refused before any folder or model


def test_a_folder_without_a_tokenizer_trains_bpe_here_and_every_row_says_so(tmp_path):
    hf = tiny_llama(tmp_path / "no-tok", vocab=512, layers=1)
    cfg = task_setup.resolve_lm(lm_cfg(teacher="random", student=str(hf)))
    task = lm_task.LMTask(cfg, torch.device("cpu"), None, tmp_path, with_batches=False)
    assert task.info["tokenizer"] == "trained-here BPE" and "tokenizer_sha256" not in task.info
    assert f"lm.student ({hf}) has no tokenizer" in task.cells()["tokenizer_warning"]
    assert task.text.vocab_size == 512


def test_a_tokenizer_smaller_than_the_embedding_is_fine_a_larger_one_is_refused(folders, tmp_path):
    for vocab in (576, 384):
        hf = tiny_llama(tmp_path / f"v{vocab}", vocab=vocab, layers=1)
        for name in TOKENIZER_FILES:
            if (folders["llama"] / name).exists():
                shutil.copy(folders["llama"] / name, hf / name)
        cfg = lm_cfg(teacher=str(hf), student=str(hf))
        if vocab > 512:
            assert task_setup.resolve_lm(cfg).model.vocab == 576  # a padded embedding
            continue
        with pytest.raises(ConfigError, match=rf"tokenizer in {hf} has 512 tokens, more than the model's embedding "
                                              r"\(384 rows"):
            task_setup.resolve_lm(cfg)


def test_model_vocab_comes_from_the_model_and_teacher_and_student_must_agree(tmp_path):
    a, b = tiny_llama(tmp_path / "a", vocab=320, layers=1), tiny_llama(tmp_path / "b", vocab=384, layers=1)
    assert task_setup.resolve_lm(lm_cfg(vocab=256, tokenizer="bytes", teacher=str(a))).model.vocab == 320
    with pytest.raises(ConfigError, match=rf"lm.teacher \({a}\) 320 tokens, lm.student \({b}\) 384 tokens"):
        task_setup.resolve_lm(lm_cfg(teacher=str(a), student=str(b)))


def test_an_explicit_tokenizer_over_a_models_own_is_warned(folders, tmp_path):
    cfg = task_setup.resolve_lm(lm_cfg(tokenizer="bytes", teacher=str(folders["llama"]), student=str(folders["llama"])))
    task = lm_task.LMTask(cfg, torch.device("cpu"), None, tmp_path, with_batches=False)
    assert task.info["tokenizer"] == "bytes"
    assert "lm.tokenizer='bytes': the text is not tokenized by the tokenizer of lm.teacher" in task.tokenizer_warning
