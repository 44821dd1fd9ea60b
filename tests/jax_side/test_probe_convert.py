"""What runs without jax: the availability answer when jax is missing, and the numpy weight conversion."""
import os
import sys

import numpy as np
import pytest
import torch

from workbench import config
from workbench.backends import reference_state
from workbench.env import jax as probe
from workbench.jax_side import convert, runner
from workbench.models.mlp import LayerNormMLP, Student


def test_without_jax_the_row_is_skipped_with_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)  # `import jax` raises ImportError, installed or not
    avail = probe.availability()
    assert avail.jax.startswith("jax is not importable") and "pip install 'jax[cpu]' flax optax" in avail.jax
    assert avail.reason == avail.jax and avail.fp8_reason == avail.jax
    cfg = config.from_preset("cpu-smoke")
    row = runner.run(cfg, init_state={}, data=None)  # never reaches the weights or the batches
    assert row["status"] == "skipped" and row["reason"] == avail.jax
    assert row["framework"] == "jax" and row["backend"] == "jax_fp32" and row["mode"] is None


def test_te_jax_reasons_name_the_build_and_the_missing_extension():
    missing = ModuleNotFoundError("No module named 'transformer_engine'", name="transformer_engine")
    assert "is not installed" in probe._te_jax_reason(missing) and "NVTE_FRAMEWORK=jax" in probe._te_jax_reason(missing)
    so = ImportError("Could not find the shared object file for the Transformer Engine Jax extension.")
    reason = probe._te_jax_reason(so)
    assert "does not load" in reason and "shared object file" in reason and "NVTE_FRAMEWORK=jax" in reason


def test_fp8_needs_te_jax_and_a_gpu():
    ok = probe.Availability(jax="", flax="", optax="", te_jax="", gpu=True)
    assert ok.reason == "" and ok.fp8_reason == ""
    assert "no GPU" in probe.Availability(jax="", flax="", optax="", te_jax="", gpu=False).fp8_reason
    assert probe.Availability(jax="", flax="", optax="", te_jax="no TE", gpu=True).fp8_reason == "no TE"


@pytest.mark.parametrize("layout", ["separate", "fused"])
def test_conversion_round_trip_is_bit_exact(layout):
    m = config.from_preset("cpu-smoke").model
    torch.manual_seed(0)
    model = Student(m, mlp=LayerNormMLP if layout == "fused" else None)
    for p in model.parameters():  # not the init's zeros and ones: every value must survive the trip
        torch.nn.init.normal_(p)
    state = reference_state(model)
    params = convert.to_flax(state)
    assert params["fc1_0"]["kernel"].shape == (m.hidden, m.intermediate)  # torch [out, in] -> Flax [in, out]
    assert params["head"]["kernel"].shape == (m.hidden, m.hidden) and len(params) == 2 + 3 * m.layers
    back = convert.to_torch(params)
    assert back.keys() == state.keys()
    for k, v in state.items():
        assert back[k].dtype == np.float32 and np.array_equal(back[k], v.numpy()), k
    model.load_state_dict(model.from_reference_state({k: torch.from_numpy(v) for k, v in back.items()}))


def test_a_weight_the_flax_student_lacks_is_refused():
    state = reference_state(Student(config.from_preset("cpu-smoke").model))
    with pytest.raises(ValueError, match="lacks"):
        convert.to_flax({**state, "extra.weight": torch.zeros(2)})


def test_asking_for_jax_leaves_the_gpu_memory_to_share(monkeypatch):
    """JAX preallocates most of a GPU at its first use unless told not to: the probe tells it not to (before any
    jax import of ours), and a user's own choice stands."""
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    probe.availability()
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    probe.availability()
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"


def test_the_machine_probe_names_the_jax_side_without_importing_it(monkeypatch):
    """`workbench probe` lists the JAX distributions by metadata (None where absent), never importing jax."""
    from workbench.env import probe as env_probe

    monkeypatch.setitem(sys.modules, "jax", None)  # an import of jax would raise
    facts = env_probe._jax_facts()
    assert set(facts) == {"jax_version", "jaxlib_version", "jax_cuda12_plugin_version", "jax_cuda13_plugin_version",
                          "flax_version", "optax_version", "transformer_engine_jax_version"}
    try:
        import importlib.metadata as md
        assert facts["jax_version"] == md.version("jax")
    except md.PackageNotFoundError:
        assert facts["jax_version"] is None


def _random_lm(kind: str):
    from workbench.models import CausalLM, kinds

    torch.manual_seed(0)
    model = CausalLM(kinds.get(kind).lm_shape(vocab=64, hidden=16, intermediate=32, layers=2, heads=2, seq_len=8))
    for p in model.parameters():  # not the init's zeros and ones: every value must survive the trip
        torch.nn.init.normal_(p)
    return model


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_lm_conversion_round_trip_is_bit_exact(kind):
    model = _random_lm(kind)
    state = reference_state(model)
    params = convert.lm_to_flax(state)
    assert params["blocks_0_attn_qkv"]["kernel"].shape == (16, 48)  # torch [out, in] -> Flax [in, out]
    assert params["embed"]["embedding"].shape == (64, 16) and params["head"]["kernel"].shape == (16, 64)
    assert set(params["blocks_1_norm2"]) == ({"scale", "bias"} if kind == "gpt" else {"scale"})
    assert ("pos" in params) == (kind == "gpt")  # learned positions: GPT's alone
    back = convert.lm_to_torch(params, list(state))
    for k, v in state.items():
        assert back[k].dtype == np.float32 and np.array_equal(back[k], v.numpy()), k
    model.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()})


def test_lm_params_without_a_torch_name_are_refused():
    state = reference_state(_random_lm("llama"))
    params = convert.lm_to_flax(state)
    with pytest.raises(ValueError, match="no torch name"):
        convert.lm_to_torch({**params, "extra": {"kernel": np.zeros((2, 2))}}, list(state))
    with pytest.raises(KeyError, match="no place"):
        convert.lm_to_torch(params, [*state, "blocks.9.attn.qkv.weight"])


def test_the_jax_lm_row_is_refused_up_front_for_a_hugging_face_student():
    from types import SimpleNamespace

    from workbench.backends.jax_flax import JaxFlax

    cfg = config.from_preset("gpt-cpu", student="/some/hf/folder")
    ok, why = JaxFlax("bf16").availability(SimpleNamespace(cfg=cfg, device=torch.device("cpu")))
    assert not ok and "lm.student '/some/hf/folder'" in why and "no Flax counterpart" in why


def test_the_jax_lm_row_is_skipped_on_top_k_teacher_targets(monkeypatch):
    """Top-k targets (distill.teacher_mode topk, or chosen by the run) are a skipped row saying what to run
    instead, before any weight is converted (jax itself stood in for: its availability only)."""
    from types import SimpleNamespace

    from workbench.train.objectives import Targets

    monkeypatch.setattr(probe, "availability", lambda: probe.Availability("", "", "", "", gpu=False))
    topk = Targets(torch.zeros(1, 4, 8), next_tokens=torch.zeros(1, 4, dtype=torch.long),
                   indices=torch.zeros(1, 4, 8, dtype=torch.int32), rest_lse=torch.zeros(1, 4))
    row = runner.run(config.from_preset("gpt-cpu"), init_state={}, data=SimpleNamespace(bench=[(None, topk)]),
                     compute="bf16", shape=object())
    assert row["status"] == "skipped" and "teacher_mode 'precomputed' or 'online'" in row["reason"]
