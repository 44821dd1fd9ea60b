"""A student initialised from its teacher (workbench hf-prune, issue 36): the kept decoder layers, the embeddings,
the final norm and the head are the teacher's bit for bit, the tokenizer is the teacher's, per-layer config lists
follow the kept layers, `--init random` gives the same shape with other weights, and a run records where its
student came from (task.json student_source)."""
import filecmp
import json

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[lm]')")

from safetensors.torch import load_file  # noqa: E402

from workbench import cli, config, results  # noqa: E402
from workbench.config import ConfigError  # noqa: E402
from workbench.models import hf_init, hf_prune  # noqa: E402
from workbench.run import runner  # noqa: E402


@pytest.fixture(scope="module")
def teachers(tmp_path_factory):
    root = tmp_path_factory.mktemp("teachers")
    return {s: hf_init.write(s, root / s, dtype="fp32", corpus_mb=0.2) for s in ("tiny-smollm3", "tiny-gemma3")}


def _weights(folder):
    return load_file(str(next(folder.glob("*.safetensors"))))


def test_the_kept_layers_embeddings_and_head_are_the_teachers_bit_for_bit(teachers, tmp_path):
    teacher = teachers["tiny-smollm3"]  # 4 layers, one without RoPE
    out = hf_prune.write(teacher, "every:2", tmp_path / "s")
    t, s = _weights(teacher), _weights(out)
    assert {k for k in s if ".layers." in k} == {k.replace("layers.2.", "layers.1.") for k in t
                                                  if ".layers.0." in k or ".layers.2." in k}
    for key, value in s.items():
        src = key.replace("layers.1.", "layers.2.")  # student layer 1 is teacher layer 2
        assert torch.equal(value, t[src]), key  # bit for bit, embeddings and final norm included
    assert "model.embed_tokens.weight" in s
    tcfg, scfg = (results.read_json(f / "config.json") for f in (teacher, out))
    assert scfg["num_hidden_layers"] == 2
    assert scfg["no_rope_layers"] == [tcfg["no_rope_layers"][0], tcfg["no_rope_layers"][2]]
    assert filecmp.cmp(teacher / "tokenizer.json", out / "tokenizer.json", shallow=False)
    info = results.read_json(out / "hf_prune.json")
    assert info["layers"] == [0, 2] and info["init"] == "teacher" and info["teacher_layers"] == 4
    assert info["teacher_source"]["hf_init.json"]["shape"] == "tiny-smollm3"


def test_per_layer_types_follow_the_kept_layers(teachers, tmp_path):
    teacher = teachers["tiny-gemma3"]  # sliding, sliding, full
    out = hf_prune.write(teacher, "last:2", tmp_path / "g")
    assert results.read_json(out / "config.json")["layer_types"] == ["sliding_attention", "full_attention"]
    t, s = _weights(teacher), _weights(out)
    assert torch.equal(s["model.layers.0.self_attn.q_proj.weight"], t["model.layers.1.self_attn.q_proj.weight"])


def test_random_init_has_the_shape_not_the_weights(teachers, tmp_path):
    teacher = teachers["tiny-smollm3"]
    a = hf_prune.write(teacher, "first:2", tmp_path / "a", init="random", seed=1)
    b = hf_prune.write(teacher, "first:2", tmp_path / "b", init="random", seed=1)
    pruned = hf_prune.write(teacher, "first:2", tmp_path / "p")
    wa, wb, wp = _weights(a), _weights(b), _weights(pruned)
    assert {k: v.shape for k, v in wa.items()} == {k: v.shape for k, v in wp.items()}
    key = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(wa[key], wb[key]) and not torch.equal(wa[key], wp[key])  # seeded, and not the teacher's
    assert results.read_json(a / "hf_prune.json")["init"] == "random"


@pytest.mark.parametrize("spec, match", [("every:0", "not one of"), ("first:9", "not one of"), ("2,1", "sorted"),
                                         ("0,7", r"0\.\.3"), ("layers", "every:N, first:K, last:K")])
def test_a_bad_layer_spec_is_one_clear_error(teachers, tmp_path, spec, match):
    with pytest.raises(ConfigError, match=match):
        hf_prune.write(teachers["tiny-smollm3"], spec, tmp_path / "x")
    assert not (tmp_path / "x").exists()  # nothing half written


def test_the_command_prints_the_folder(teachers, tmp_path, capsys):
    assert cli.main(["hf-prune", str(teachers["tiny-smollm3"]), "--layers", "0,3", "--out", str(tmp_path / "c")]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["layers"] == [0, 3]


@pytest.mark.slow
def test_a_run_distils_into_the_pruned_student_and_records_it(teachers, tmp_path):
    teacher = teachers["tiny-smollm3"]
    student = hf_prune.write(teacher, "every:2", tmp_path / "s")
    cfg = config.from_preset("gpt-cpu", kind="llama", corpus_mb=0.2, steps=3, teacher=str(teacher),
                             student=str(student), backends="torch_fp32", baseline="torch_fp32", no_kd_student=False,
                             seq_len=16)
    run_dir = runner.run(cfg, out=tmp_path / "runs", run_id="pruned", progress=False)
    df = results.load(run_dir)
    assert (df["status"] == "ok").all(), df["reason"].tolist()
    source = results.read_json(run_dir / "task.json")["student_source"]
    assert source["folder"] == str(student) and source["hf_prune"]["layers"] == [0, 2]
