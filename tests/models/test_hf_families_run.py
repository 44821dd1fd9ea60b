"""Every Hugging Face family the TE layer conversion knows, through a whole `workbench run` on the CPU: hf-init's
tiny random Qwen3, Phi-3, Gemma 3 and SmolLM3 folders (each with its own tokenizer trained here) are the teacher
and the student of one run, whose TE student converts each decoder layer under the named fake TE (tests/fake_te.py;
the real TE runs them on the H200: tests/gpu/test_gpu_hf.py), starts from the teacher's weights (the same initial loss
as the fp32 student) and trains; a family TE cannot hold is refused with 'layer' and runs per Linear with 'auto'."""
import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[lm]')")

from fake_te import FakeRecipes, FakeTEModules  # noqa: E402
from transformers import Olmo2Config  # noqa: E402

from workbench import config, results  # noqa: E402
from workbench.backends import _te as te_backend  # noqa: E402
from workbench.backends import te_fp8  # noqa: E402
from workbench.env import te as _te  # noqa: E402
from workbench.models import hf_init  # noqa: E402
from workbench.run import runner  # noqa: E402

FAMILIES = {"qwen3": "tiny-qwen3", "phi3": "tiny-phi3", "gemma3_text": "tiny-gemma3", "smollm3": "tiny-smollm3"}


@pytest.fixture
def fake_te_here(monkeypatch):
    """The fake TE, usable on this CPU as TE is on a GPU."""
    monkeypatch.setattr(_te, "load", lambda: (FakeTEModules, FakeRecipes, ""))
    for module in (te_backend, te_fp8):
        monkeypatch.setattr(module, "te_usable", lambda ctx: (True, ""))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {family: hf_init.write(shape, root / shape, dtype="fp32", corpus_mb=0.2)
            for family, shape in FAMILIES.items()}


def run_cfg(folder, **kw):
    return config.from_preset("gpt-cpu", **{**dict(kind="llama", corpus_mb=0.2, steps=3, teacher=str(folder),
                                                   student=str(folder), backends="torch_fp32,te_bf16",
                                                   baseline="torch_fp32", no_kd_student=False, seq_len=16), **kw})


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_distils_as_teacher_and_te_layer_student(family, folders, fake_te_here, tmp_path):
    folder = folders[family]
    assert results.read_json(folder / "config.json")["model_type"] == family
    run_dir = runner.run(run_cfg(folder, te_conversion="layer"), out=tmp_path, run_id=family, progress=False)
    df = results.load(run_dir).set_index("student")
    assert (df["status"] == "ok").all(), df["reason"].to_dict()
    assert df.loc["te_bf16", "te_conversion"] == "layer"
    # both students start from the teacher's own weights: the same initial loss, to the fake's rounding
    assert df.loc["te_bf16", "initial_loss"] == pytest.approx(df.loc["torch_fp32", "initial_loss"], rel=1e-3)
    assert df.loc["te_bf16", "final_train_loss"] < df.loc["te_bf16", "initial_loss"] * 1.5  # it trained, sanely
    task = results.read_json(run_dir / "task.json")
    assert str(folder) in str(task), "task.json names the teacher folder"


def test_a_family_te_cannot_hold_is_refused_with_layer_and_falls_back_with_auto(tmp_path, fake_te_here):
    torch.manual_seed(0)
    tok = hf_init.train_tokenizer(512, corpus_mb=0.2)
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "olmo2"
    AutoModelForCausalLM.from_config(Olmo2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=512, max_position_embeddings=512, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id)).save_pretrained(folder)
    tok.save_pretrained(folder)
    run_dir = runner.run(run_cfg(folder, te_conversion="layer", steps=1), out=tmp_path, run_id="layer", progress=False)
    row = results.load(run_dir).set_index("student").loc["te_bf16"]
    assert row["status"] != "ok"
    assert "options.te_conversion='layer' cannot convert this model: model_type 'olmo2'" in row["reason"]
    run_dir = runner.run(run_cfg(folder, steps=1), out=tmp_path, run_id="auto", progress=False)
    row = results.load(run_dir).set_index("student").loc["te_bf16"]
    assert row["status"] == "ok" and row["te_conversion"] == "linear" and "olmo2" in row["te_conversion_note"]


def test_hf_init_writes_each_familys_published_shape():
    """Parameter counts of the real models (tied, built on the meta device from hf-init's configs) and the trait
    that sets each family apart, so the bench's cuts are those models' layers."""
    from transformers import AutoModelForCausalLM

    counts, models = {}, {}
    for shape in ("qwen3-0.6b", "gemma-3-1b", "phi-4-mini", "smollm3-3b", "gemma-3-1b-4l"):
        with torch.device("meta"):
            models[shape] = AutoModelForCausalLM.from_config(hf_init.hf_config(shape))
        counts[shape] = sum(p.numel() for p in models[shape].parameters())
        assert models[shape].lm_head.weight is models[shape].model.embed_tokens.weight  # tied
    assert counts == {"qwen3-0.6b": 596_049_920, "gemma-3-1b": 999_885_952, "phi-4-mini": 3_836_021_760,
                      "smollm3-3b": 3_075_098_624, "gemma-3-1b-4l": 145_118_336}
    assert models["qwen3-0.6b"].model.layers[0].self_attn.q_norm.weight.shape == (128,)
    assert models["gemma-3-1b"].config.layer_types[:6] == ["sliding_attention"] * 5 + ["full_attention"]
    assert models["gemma-3-1b-4l"].config.layer_types == ["sliding_attention"] * 3 + ["full_attention"]
    assert models["phi-4-mini"].config.rope_parameters["partial_rotary_factor"] == 0.75
    assert models["smollm3-3b"].config.no_rope_layers[:4] == [1, 1, 1, 0]
