"""Declared architectures: each causal-LM kind registers its `Arch`, and workbench.models.lm builds from those
fields alone. The shipped kinds build what they built before the declarations (a golden file, recorded from the
model code that compared kind names: parameter names and shapes, and the logits for a seed); a kind registered
here, in a test, builds and runs without an edit to lm.py."""
import dataclasses
import itertools
import json
import pathlib
import re

import pytest
import torch
from torch import nn

from workbench.config import ConfigError, choices
from workbench.models import CausalLM, LMShape, kinds
from workbench.models.kinds import Arch, Kind
from workbench.models.kinds.causal_lm import LLAMA
from workbench.models.lm import MLPS, NORMS

SHAPE = dict(vocab=96, hidden=32, intermediate=64, layers=2, heads=4, seq_len=16)
GOLDEN = json.loads((pathlib.Path(__file__).parent / "lm_kinds_golden.json").read_text())


def build(kind: str, seed: int = 0) -> CausalLM:
    torch.manual_seed(seed)
    return CausalLM(LMShape(kind=kind, **SHAPE))


@pytest.fixture
def register(monkeypatch):
    """Register kinds for one test only: the registry is the process's, and other tests list its names."""
    kinds.names()  # discover the shipped kinds first, so the registry's lookup does not run again over ours

    def add(kind: Kind) -> Kind:
        monkeypatch.setitem(kinds.KINDS, kind.name, kind)
        return kind

    return add


@pytest.mark.parametrize("kind", sorted(GOLDEN))
def test_a_shipped_kind_builds_the_parameters_and_logits_it_built_before(kind):
    model, want = build(kind), GOLDEN[kind]
    assert {k: list(v.shape) for k, v in model.state_dict().items()} == want["state"]
    assert list(model.state_dict()) == list(want["state"])  # the order too: checkpoints and TE conversion see it
    logits = model(torch.arange(32).reshape(2, 16) * 7 % 96).double()
    assert logits.sum().item() == pytest.approx(want["logits_sum"], rel=1e-5, abs=1e-4)
    assert logits.abs().sum().item() == pytest.approx(want["logits_abs_sum"], rel=1e-5)
    torch.testing.assert_close(logits[0, 0, :4].float(), torch.tensor(want["logits_00"]), rtol=1e-5, atol=1e-6)


def test_a_new_architecture_is_one_kind_registered_without_an_edit_to_the_model_code(register):
    """A Llama with LayerNorm (weight and bias) in place of RMSNorm: its kind declares it, lm.py builds it."""
    register(Kind("llama_ln", task="lm", arch=dataclasses.replace(LLAMA, norm="layernorm")))
    model = build("llama_ln")
    assert not any(isinstance(m, nn.RMSNorm) for m in model.modules())
    assert sum(isinstance(m, nn.LayerNorm) for m in model.modules()) == 2 * SHAPE["layers"] + 1
    llama = set(build("llama").state_dict())
    norm_biases = {k.replace(".weight", ".bias") for k in llama if "norm" in k}
    assert set(model.state_dict()) == llama | norm_biases  # the rest of the Llama: SwiGLU, no biases, no positions
    logits, hidden = model(torch.randint(0, 96, (2, 16)), return_hidden=True)
    assert logits.shape == (2, 16, 96) and len(hidden) == SHAPE["layers"] and torch.isfinite(logits).all()
    assert kinds.is_lm("llama_ln") and kinds.get("llama_ln").lm_shape(**SHAPE).arch.norm == "layernorm"


def test_every_value_an_arch_field_declares_is_built(register):
    """lm.py has a block for every value `Arch` allows (its tables are keyed by them), and every combination
    builds and runs: the model reads the fields, whatever the kind is called."""
    allowed = choices(Arch)
    assert set(NORMS) == set(allowed["norm"]) and set(MLPS) == set(allowed["mlp"])
    tokens = torch.randint(0, 96, (1, 16))
    for i, (norm, mlp, positions, bias) in enumerate(itertools.product(
            allowed["norm"], allowed["mlp"], allowed["positions"], (False, True))):
        register(Kind(f"combo{i}", task="lm", arch=Arch(norm=norm, mlp=mlp, positions=positions, bias=bias)))
        model = build(f"combo{i}")
        state = model.state_dict()
        assert ("pos.weight" in state) == (positions == "learned")
        assert ("blocks.0.attn.qkv.bias" in state) == bias and "head.bias" not in state
        assert isinstance(model.norm, NORMS[norm]) and isinstance(model.blocks[0].mlp, MLPS[mlp])
        assert model(tokens).shape == (1, 16, 96)


def test_the_rope_theta_is_read_from_the_arch(register):
    register(Kind("llama_theta", task="lm", arch=dataclasses.replace(LLAMA, rope_theta=500000.0)))
    tokens = torch.randint(0, 96, (1, 16))
    theta, llama = build("llama_theta"), build("llama")
    assert theta.state_dict().keys() == llama.state_dict().keys()
    assert not torch.allclose(theta(tokens), llama(tokens))  # same weights (seed), other rotary frequencies


def test_declarations_that_cannot_be_built_are_refused_with_the_field_and_the_allowed():
    with pytest.raises(ConfigError, match=r"Arch.norm must be one of \['layernorm', 'rmsnorm'\], got 'batchnorm'"):
        Arch(norm="batchnorm", mlp="gelu", positions="learned", bias=True)
    with pytest.raises(ConfigError, match="a causal LM declares its architecture"):
        Kind("no_arch", task="lm")
    lm_kinds = [n for n in kinds.names() if kinds.is_lm(n)]  # from the registry: a new kind file changes nothing here
    with pytest.raises(ConfigError, match=re.escape(f"model kind 'mlp' is not allowed; allowed: {lm_kinds}")):
        LMShape(kind="mlp")  # the regression kind has no causal LM to build
    with pytest.raises(ConfigError, match="rotary embedding needs an even head size"):
        LMShape(kind="llama", hidden=12, heads=4)
