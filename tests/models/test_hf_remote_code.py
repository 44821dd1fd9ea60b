"""A model folder's own code never runs (trust_remote_code=False everywhere, and a folder whose config or tokenizer
config has an `auto_map` refused up front in one line naming it), and weights the safe loader refuses (a pickled
pytorch_model.bin) are one clear error, not a traceback."""
import json
import pickle

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[lm]')")

from transformers import LlamaConfig  # noqa: E402

from workbench import config  # noqa: E402
from workbench.config import ConfigError  # noqa: E402
from workbench.models import hf_init  # noqa: E402
from workbench.models.hf import check_folder, linear_shapes, load_causal_lm  # noqa: E402
from workbench.run import runner  # noqa: E402

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=512,
            max_position_embeddings=64)


def folder_with_code(root, model_type: str, where: str = "config.json"):
    """A saved tiny Llama whose config (or tokenizer config) maps the Auto classes to a module in the folder; that
    module, if anything ran it, would leave a file behind."""
    folder = root / f"remote-{model_type}-{where.split('.')[0]}"
    torch.manual_seed(0)
    load_causal_lm(LlamaConfig(**TINY)).model.save_pretrained(folder)
    hf_init.train_tokenizer(512, corpus_mb=0.05).save_pretrained(folder)
    marker = root / "ran.txt"
    (folder / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('the folder ran its own code')\n")
    data = json.loads((folder / where).read_text())
    data["auto_map"] = {"AutoConfig": "modeling_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.Evil",
                        "AutoTokenizer": ["modeling_evil.EvilTokenizer", None]}
    if where == "config.json":
        data["model_type"] = model_type
    (folder / where).write_text(json.dumps(data))
    return folder, marker


@pytest.mark.parametrize("model_type", ["llama", "evil-lm"])
def test_a_folder_that_asks_to_run_its_own_code_is_refused_naming_its_auto_map(tmp_path, model_type):
    folder, marker = folder_with_code(tmp_path, model_type)
    for call in (lambda: load_causal_lm(folder), lambda: linear_shapes(str(folder)),
                 lambda: check_folder(str(folder), "lm.student", 16)):
        with pytest.raises(ConfigError, match=r"asks to run its own code \(config.json's auto_map: .*modeling_evil"):
            call()
    with pytest.raises(ConfigError, match=r"^lm.teacher: the Hugging Face folder .* asks to run its own code"):
        check_folder(str(folder), "lm.teacher", 16)
    cfg = config.from_preset("gpt-cpu", kind="llama", corpus_mb=0.05, steps=1, teacher="random", student=str(folder),
                             backends="torch_fp32", no_kd_student=False)
    with pytest.raises(ConfigError, match="trust_remote_code=False"):
        runner.run(cfg, out=tmp_path / "out", run_id="remote", progress=False)
    assert not marker.exists()
    assert not (tmp_path / "out" / "remote").exists()  # refused before any run folder


def test_a_tokenizer_config_with_an_auto_map_is_refused_too(tmp_path):
    folder, marker = folder_with_code(tmp_path, "llama", where="tokenizer_config.json")
    with pytest.raises(ConfigError, match=r"tokenizer_config.json's auto_map"):
        load_causal_lm(folder)
    assert not marker.exists()


class _Payload:
    def __reduce__(self):
        return (print, ("a pickle that runs code on load",))


def test_a_pickled_checkpoint_the_safe_loader_refuses_is_one_clear_error(tmp_path):
    folder = tmp_path / "pickled"
    LlamaConfig(**TINY).save_pretrained(folder)
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"model.embed_tokens.weight": _Payload()}))
    with pytest.raises(ConfigError, match=rf"no Hugging Face causal LM loads from {str(folder)!r} \(offline\)"):
        load_causal_lm(folder)
