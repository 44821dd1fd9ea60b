"""The causal LMs: shapes, causality, the FLOP count against a hand count, attention-mask semantics
(SDPA vs TE), and their conversion to TE layers (a named fake TE on CPU) and to torchao float8."""
import pytest
import torch
import torch.nn.functional as F
from fake_te import FakeTEModules

from workbench import backends, config
from workbench.backends._te import convert_to_te, rmsnorm_eps, stayed_torch
from workbench.config import ConfigError
from workbench.env import te as _te
from workbench.models import CausalLM, LMShape, SDPACore, attention_masks

SHAPE = dict(vocab=96, hidden=32, intermediate=64, layers=2, heads=4, seq_len=16)


def lm(kind: str, seed: int = 0, **changes) -> CausalLM:
    torch.manual_seed(seed)
    return CausalLM(LMShape(kind=kind, **{**SHAPE, **changes}))


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_shapes_hidden_states_and_seeded_init(kind):
    model = lm(kind)
    tokens = torch.randint(0, 96, (2, 16))
    logits, hidden = model(tokens, return_hidden=True)
    assert logits.shape == (2, 16, 96) and len(hidden) == 2 and hidden[0].shape == (2, 16, 32)
    assert torch.equal(model(tokens), logits)
    same, other = lm(kind).state_dict(), lm(kind, seed=1).state_dict()
    assert all(torch.equal(v, same[k]) for k, v in model.state_dict().items())
    assert not torch.equal(other["head.weight"], same["head.weight"])


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_a_token_sees_only_the_past(kind):
    model = lm(kind)
    tokens = torch.randint(0, 96, (1, 16))
    later = tokens.clone()
    later[0, 10:] = (later[0, 10:] + 1) % 96
    a, b = model(tokens), model(later)
    torch.testing.assert_close(a[0, :10], b[0, :10])
    assert not torch.allclose(a[0, 10:], b[0, 10:])


def next_token_losses(model, tokens: torch.Tensor, steps: int) -> list[float]:
    """AdamW on the next-token cross-entropy of one batch, `steps` times; the loss of each step."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_the_lm_learns_its_next_token(kind):
    losses = next_token_losses(lm(kind), torch.randint(0, 96, (4, 16)), steps=6)
    assert losses[-1] < 0.9 * losses[0]


def test_flops_per_token_against_a_hand_count():
    h, f, v, L, s = 32, 64, 96, 2, 16
    attention = 12 * L * h * s  # q@k^T and att@v: 2 x s x h each forward, x3 with backward, per layer
    # gpt: qkv (3h x h) + proj (h x h) + fc1 (f x h) + fc2 (h x f) per layer, + head (v x h); no embeddings
    gpt = 6 * (L * (3 * h * h + h * h + 2 * f * h) + v * h) + attention
    # llama: the same attention matrices, gate + up + down (3 x f x h) per layer
    llama = 6 * (L * (3 * h * h + h * h + 3 * f * h) + v * h) + attention
    assert lm("gpt").train_flops_per_token() == gpt == 129024  # 6 x 19456 + 12288
    assert lm("llama").train_flops_per_token() == llama
    assert lm("gpt").train_flops_per_token(seq_len=32) == gpt + attention  # the attention term scales with seq


def test_shape_errors_name_the_field():
    with pytest.raises(ConfigError, match="kind 'bert'.*allowed"):
        LMShape(kind="bert")
    with pytest.raises(ConfigError, match="hidden=30 must be a multiple of heads=4"):
        LMShape(hidden=30)


def test_padding_masks_sdpa_form_matches_a_reference_and_te_form_is_its_negation():
    torch.manual_seed(0)
    b, s, h, d = 3, 6, 2, 4
    lengths = [6, 4, 1]  # right padding: the last sequence is one real token and five pads
    valid = torch.arange(s)[None, :] < torch.tensor(lengths)[:, None]
    q, k, v = (torch.randn(b, s, h, d) for _ in range(3))
    sdpa_mask, te_mask = attention_masks(valid)
    assert torch.equal(te_mask, ~sdpa_mask)

    # explicit reference: query i of sequence n attends to real keys j <= i (a pad query to itself as well)
    want = torch.zeros(b, s, h, d)
    for n in range(b):
        for i in range(s):
            keys = [j for j in range(i + 1) if j < lengths[n] or j == i]
            w = torch.softmax(torch.einsum("hd,khd->hk", q[n, i], k[n, keys]) / d ** 0.5, dim=-1)
            want[n, i] = torch.einsum("hk,khd->hd", w, v[n, keys])
    got = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=sdpa_mask).transpose(1, 2)
    torch.testing.assert_close(got, want)
    # the fake TE reads its mask as TE does (True = masked out): the TE form gives the same attention
    te_attn = FakeTEModules.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="arbitrary")
    torch.testing.assert_close(te_attn(q, k, v, attention_mask=te_mask), want.reshape(b, s, h * d))
    for n, length in enumerate(lengths):  # real tokens never attend to pads
        assert not sdpa_mask[n, 0, :length, length:].any()


def test_sdpa_core_and_the_te_attention_agree():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 4, 16) for _ in range(3))
    te_attn = FakeTEModules.DotProductAttention(4, 16, qkv_format="bshd", attn_mask_type="causal")
    assert torch.equal(SDPACore(4, 16)(q, k, v), te_attn(q, k, v))


@pytest.fixture
def fake_te(monkeypatch):
    monkeypatch.setattr(_te, "load", lambda: (FakeTEModules, object(), ""))


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_te_conversion_of_the_lm_keeps_weights_names_and_outputs(fake_te, kind):
    reference = lm(kind)
    model = lm(kind)
    swapped = convert_to_te(model, config.from_preset("cpu-smoke"), torch.device("cpu"))
    norm = {"gpt": FakeTEModules.LayerNorm, "llama": FakeTEModules.RMSNorm}[kind]
    linears = 4 if kind == "gpt" else 5  # qkv, proj + fc1, fc2 or gate, up, down
    assert len(swapped) == 2 * (2 + linears + 1) + 2  # per block: 2 norms, the linears, the core; + final norm, head
    for name in ("blocks.0.norm1", "blocks.1.attn.qkv", "blocks.1.attn.core", "norm", "head"):
        assert name in swapped
    assert type(model.blocks[0].norm1) is norm and type(model.head) is FakeTEModules.Linear
    assert type(model.blocks[1].attn.core.attn) is FakeTEModules.DotProductAttention
    backends.check_matched(model, reference)
    assert set(model.to_reference_state()) == set(reference.state_dict())
    tokens = torch.randint(0, 96, (2, 16))
    assert torch.equal(model(tokens), reference(tokens))
    kept = stayed_torch(model, swapped)
    assert kept == (["embed (Embedding)", "pos (Embedding)"] if kind == "gpt" else ["embed (Embedding)"])


def test_hf_style_rmsnorms_are_swapped_only_when_they_compute_a_plain_rmsnorm():
    class PlainRMSNorm(torch.nn.Module):  # the Llama form: x / rms(x) * weight, eps as variance_epsilon
        def __init__(self, n):
            super().__init__()
            self.weight, self.variance_epsilon = torch.nn.Parameter(torch.rand(n) + 0.5), 1e-6

        def forward(self, x):
            return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)

    class OffsetRMSNorm(PlainRMSNorm):  # the Gemma form: scales by (1 + weight)
        def forward(self, x):
            return (1 + self.weight) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)

    assert rmsnorm_eps(PlainRMSNorm(8)) == 1e-6
    assert rmsnorm_eps(OffsetRMSNorm(8)) is None
    assert rmsnorm_eps(torch.nn.RMSNorm(8, eps=1e-5)) == 1e-5
    assert rmsnorm_eps(torch.nn.RMSNorm(8)) == torch.finfo(torch.float32).eps  # torch's default for fp32
    assert rmsnorm_eps(torch.nn.LayerNorm(8)) is None


def test_a_tied_lm_head_stays_torch_and_tied(fake_te):
    model = lm("gpt", hidden=96, vocab=96)  # square head: tie it to the embedding, as GPT-2 does
    model.head.weight = model.embed.weight
    swapped = convert_to_te(model, config.from_preset("cpu-smoke"), torch.device("cpu"))
    assert "head" not in swapped and type(model.head) is torch.nn.Linear and model.head.weight is model.embed.weight
    assert "head (Linear)" in stayed_torch(model, swapped)


@pytest.mark.parametrize("vocab, head_float8", [(96, True), (100, False)])
def test_torchao_converts_the_lm_and_the_head_only_when_its_dims_are_multiples_of_16(vocab, head_float8):
    pytest.importorskip("torchao.float8", reason="torchao is not installed (pip install torchao)")
    from torchao.float8.float8_linear import Float8Linear

    cfg = config.from_preset("cpu-smoke")
    b = backends.make("torchao_float8:tensorwise")
    reference = lm("llama", vocab=vocab)
    model = b.convert(lm("llama", vocab=vocab), cfg)
    assert all(isinstance(m, Float8Linear) for n, m in model.named_modules() if n.endswith(("qkv", "proj", "down")))
    assert isinstance(model.head, Float8Linear) is head_float8
    backends.check_matched(model, reference)
    assert model(torch.randint(0, vocab, (2, 16))).shape == (2, 16, vocab)


@pytest.mark.parametrize("selection, backend, warned", [
    ({"use_fused_attention": "1", "fused_attention_backend": "1"}, "fused (sub-backend 1)", False),
    ({"use_unfused_attention": "True"}, "unfused", True),
])
def test_a_te_student_records_its_attention_backend_and_warns_on_the_slowest(fake_te, monkeypatch, selection,
                                                                            backend, warned):
    """TE's record of its selection (faked: real TE runs on the H200) becomes the row's attention_backend;
    its unfused attention is a warning, since it silently costs TE its advantage."""
    monkeypatch.setattr(_te, "last_attention_selection", lambda: selection)
    cfg = config.from_preset("gpt-cpu", hidden=64, heads=4)
    row = backends.make("te_bf16").prepare(lm("gpt"), cfg, torch.device("cpu")).describe()
    assert row["attention_backend"] == backend and row["converted_modules"] > 0
    assert ("attention_warning" in row) == warned
