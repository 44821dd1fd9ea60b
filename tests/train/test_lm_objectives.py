"""LM distillation losses and held-out metrics against hand-computed values on tiny tensors, and the
chunking: same loss and gradient as unchunked, one chunk's fp32 maths at a time."""
import functools
import math
import os
import shutil

import pytest
import torch
import torch.nn.functional as F

from workbench.config import ConfigError, DistillConfig
from workbench.train.objectives import lm_objectives
from workbench.train.objectives.lm_metrics import LMMetrics, lm_metrics
from workbench.train.objectives.lm_objectives import IGNORE_INDEX, hidden_mse, kd_per_token, lm_loss

S = torch.tensor([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]])  # student logits: 2 tokens, vocab 3
T = torch.tensor([[2.0, 0.0, 1.0], [1.0, 1.0, 1.0]])  # teacher logits
Y = torch.tensor([1, 2])  # next tokens

# The loss kernels' settings as a distill config, at the defaults these tests were written for (T = 1, no CE)
D = functools.partial(DistillConfig, loss="forward_kl", temperature=1.0, ce_weight=0.0)


def probs(row, temperature=1.0):
    e = [math.exp(v / temperature) for v in row]
    return [v / sum(e) for v in e]


def kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q))


def mean_over_tokens(f):
    return sum(f(s.tolist(), t.tolist()) for s, t in zip(S, T)) / len(S)


def test_forward_kl_is_kl_teacher_student_times_t_squared():
    for temperature in (1.0, 2.0, 0.5):
        want = mean_over_tokens(lambda s, t: kl(probs(t, temperature), probs(s, temperature))) * temperature ** 2
        got = lm_loss(S, T, Y, D(loss="forward_kl", temperature=temperature))
        assert got.item() == pytest.approx(want, rel=1e-6)


def test_reverse_kl_is_kl_student_teacher():
    want = mean_over_tokens(lambda s, t: kl(probs(s, 2.0), probs(t, 2.0))) * 4.0
    assert lm_loss(S, T, Y, D(loss="reverse_kl", temperature=2.0)).item() == pytest.approx(want, rel=1e-6)


def test_generalized_jsd_matches_gkd_definition_and_its_limits():
    def jsd(s, t, beta):
        p, q = probs(t), probs(s)
        m = [beta * a + (1 - beta) * b for a, b in zip(p, q)]
        return beta * kl(p, m) + (1 - beta) * kl(q, m)

    for beta in (0.1, 0.5, 0.9):
        want = mean_over_tokens(lambda s, t: jsd(s, t, beta))
        assert lm_loss(S, T, Y, D(loss="jsd", jsd_beta=beta)).item() == pytest.approx(want, rel=1e-6)
    # beta = 0.5 is symmetric and at most ln 2; equal distributions give 0
    half = kd_per_token(S, T, "jsd", beta=0.5)
    assert torch.allclose(half, kd_per_token(T, S, "jsd", beta=0.5), atol=1e-7)
    assert (half <= math.log(2)).all() and kd_per_token(S, S, "jsd").abs().max() < 1e-7
    # small beta: JSD/beta tends to KL(teacher||student); beta near 1: JSD/(1-beta) to KL(student||teacher)
    forward, reverse = kd_per_token(S, T, "forward_kl"), kd_per_token(S, T, "reverse_kl")
    eps = 1e-5  # the gap closes as O(beta)
    assert torch.allclose(kd_per_token(S.double(), T.double(), "jsd", beta=eps) / eps, forward.double(), rtol=1e-3)
    assert torch.allclose(kd_per_token(S.double(), T.double(), "jsd", beta=1 - eps) / eps, reverse.double(), rtol=1e-3)
    # the end points are those limits (TRL's GKDTrainer), not the formula's vanishing value
    assert torch.equal(kd_per_token(S, T, "jsd", beta=0.0), forward)
    assert torch.equal(kd_per_token(S, T, "jsd", beta=1.0), reverse)


def test_cross_entropy_is_mixed_in_by_its_weight():
    ce = F.cross_entropy(S, Y)
    kd = lm_loss(S, T, Y, D(loss="forward_kl", temperature=2.0))
    assert lm_loss(S, None, Y, D(ce_weight=1.0)).item() == pytest.approx(ce.item(), rel=1e-6)  # no-KD: no teacher
    mixed = lm_loss(S, T, Y, D(loss="forward_kl", temperature=2.0, ce_weight=0.3))
    assert mixed.item() == pytest.approx(0.7 * kd.item() + 0.3 * ce.item(), rel=1e-6)
    with pytest.raises(ValueError, match="teacher logits are needed"):
        lm_loss(S, None, Y, D(ce_weight=0.5))


def test_ignored_next_tokens_do_not_count():
    s = torch.cat([S, torch.randn(1, 3)]).reshape(1, 3, 3)
    t = torch.cat([T, torch.randn(1, 3)]).reshape(1, 3, 3)
    y = torch.tensor([[1, 2, IGNORE_INDEX]])
    for kind in lm_objectives.KINDS:
        assert lm_loss(s, t, y, D(loss=kind, ce_weight=0.5)).item() == pytest.approx(
            lm_loss(S, T, Y, D(loss=kind, ce_weight=0.5)).item(), rel=1e-6)
    assert lm_loss(s, t, torch.full_like(y, IGNORE_INDEX), D()).item() == 0.0  # all padding: zero, not NaN


def test_bf16_logits_give_fp32_maths():
    s16 = torch.randn(4, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    t16 = torch.randn(4, 8, 64, dtype=torch.bfloat16)
    y = torch.randint(0, 64, (4, 8))
    loss = lm_loss(s16, t16, y, D(loss="forward_kl", temperature=2.0, ce_weight=0.5))
    assert loss.dtype == torch.float32
    ref = lm_loss(s16.detach().float(), t16.float(), y, D(loss="forward_kl", temperature=2.0, ce_weight=0.5))
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)  # exactly the fp32 maths on the bf16 values
    loss.backward()
    assert s16.grad.dtype == torch.bfloat16 and torch.isfinite(s16.grad.float()).all()


@pytest.mark.parametrize("kind", lm_objectives.KINDS)
def test_chunked_loss_and_gradient_equal_unchunked_and_chunks_are_bounded(kind, monkeypatch):
    torch.manual_seed(0)
    s = torch.randn(3, 7, 50, dtype=torch.float64, requires_grad=True)  # 21 tokens
    t = torch.randn(3, 7, 50)
    y = torch.randint(0, 50, (3, 7))
    y[0, :2] = IGNORE_INDEX
    kw = dict(loss=kind, temperature=1.5, ce_weight=0.4, jsd_beta=0.3, loss_impl="checkpointed")  # 'auto' fuses
    whole = lm_loss(s, t, y, D(loss_chunk_tokens=10_000, **kw))
    (g_whole,) = torch.autograd.grad(whole, s)

    rows = []
    real = lm_objectives._chunk_sums
    monkeypatch.setattr(lm_objectives, "_chunk_sums", lambda st, *a: rows.append(st.shape[0]) or real(st, *a))
    chunked = lm_loss(s, t, y, D(loss_chunk_tokens=4, **kw))
    assert rows == [4, 4, 4, 4, 4, 1]  # the forward saw 4 tokens at a time
    (g_chunked,) = torch.autograd.grad(chunked, s)
    assert sorted(rows[6:]) == [1, 4, 4, 4, 4, 4]  # the backward recomputed each chunk alone (checkpoint)
    assert chunked.item() == pytest.approx(whole.item(), rel=1e-6, abs=1e-7)
    assert torch.allclose(g_chunked, g_whole, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("kind", lm_objectives.KINDS)
def test_the_backward_keeps_no_fp32_copy_of_the_logits(kind):
    """What autograd saves for the backward: only views of the input logits, never a chunk's fp32 softmax
    (the backward recomputes that chunk by chunk)."""
    s = torch.randn(64, 1000, dtype=torch.bfloat16, requires_grad=True)
    t = torch.randn(64, 1000, dtype=torch.bfloat16)
    y = torch.randint(0, 1000, (64,))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x) or x, lambda x: x):
        loss = lm_loss(s, t, y, D(loss=kind, ce_weight=0.5, loss_chunk_tokens=16, loss_impl="checkpointed"))
    inputs = {s.untyped_storage().data_ptr(), t.untyped_storage().data_ptr(), y.untyped_storage().data_ptr()}
    big = [x for x in saved if x.numel() > 1]
    assert big and all(x.untyped_storage().data_ptr() in inputs for x in big)
    assert not [x for x in saved if x.dtype == torch.float32 and x.numel() > 1]
    loss.backward()
    assert s.grad.shape == s.shape


def test_hidden_state_mse_is_the_mean_over_layers():
    hs, ht = [torch.ones(2, 4), torch.zeros(2, 4)], [torch.zeros(2, 4), torch.zeros(2, 4)]
    assert hidden_mse(hs, ht).item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="hidden state 0"):
        hidden_mse([torch.ones(2, 4)], [torch.ones(2, 8)])


@pytest.mark.parametrize("bad, match", [
    (dict(loss="kl"), "distillation loss 'kl' is not one of forward_kl, reverse_kl, jsd"),
    (dict(temperature=0.0), "temperature 0.0 must be > 0"),
    (dict(ce_weight=1.5), "ce_weight 1.5 must be in"),
    (dict(jsd_beta=-0.1), "beta -0.1 must be in"),
    (dict(loss_chunk_tokens=0), "chunk_tokens 0 must be"),
])
def test_bad_options_are_one_line_config_errors(bad, match):
    with pytest.raises(ConfigError, match=match):
        lm_loss(S, T, Y, D(**bad))


def test_metrics_by_hand():
    s = torch.tensor([[3.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 3.0], [3.0, 0.0, 0.0]])
    t = torch.tensor([[2.0, 1.0, 0.0], [0.0, 2.0, 1.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])  # last token disagrees
    y = torch.tensor([0, 1, 0, 1])
    m = lm_metrics(s, t, y, chunk_tokens=3)
    ce = -sum(math.log(probs(r.tolist())[k]) for r, k in zip(s, y.tolist())) / 4
    teacher_ce = -sum(math.log(probs(r.tolist())[k]) for r, k in zip(t, y.tolist())) / 4
    kl_t1 = sum(kl(probs(b.tolist()), probs(a.tolist())) for a, b in zip(s, t)) / 4
    assert m["heldout_ce_nats"] == pytest.approx(ce, rel=1e-6)
    assert m["heldout_ppl"] == pytest.approx(math.exp(ce), rel=1e-6)
    assert m["teacher_heldout_ce_nats"] == pytest.approx(teacher_ce, rel=1e-6)
    assert m["teacher_heldout_ppl"] == pytest.approx(math.exp(teacher_ce), rel=1e-6)
    assert m["kl_teacher_student_t1_nats"] == pytest.approx(kl_t1, rel=1e-6)
    assert m["top1_agreement"] == 0.75 and m["heldout_tokens"] == 4


def test_metrics_accumulate_token_weighted_and_without_teacher():
    torch.manual_seed(1)
    s, t, y = torch.randn(10, 16, dtype=torch.bfloat16), torch.randn(10, 16), torch.randint(0, 16, (10,))
    y[9] = IGNORE_INDEX
    acc = LMMetrics(chunk_tokens=2)
    acc.add(s[:3], t[:3], y[:3])  # batches of unequal size: the means weigh tokens, not batches
    acc.add(s[3:], t[3:], y[3:])
    whole = lm_metrics(s, t, y)
    assert acc.result() == pytest.approx(whole, rel=1e-6) and whole["heldout_tokens"] == 9
    alone = lm_metrics(s, None, y)
    assert alone["kl_teacher_student_t1_nats"] is None and alone["teacher_heldout_ppl"] is None
    assert alone["heldout_ce_nats"] == pytest.approx(whole["heldout_ce_nats"], rel=1e-6)
    with pytest.raises(ValueError, match="for every batch or for none"):
        acc.add(s, None, y)


# ---- distill.loss_impl='fused': the gradient in closed form, computed in the forward --------------------------
@pytest.mark.parametrize("temperature, ce_weight", [(1.5, 0.4), (1.0, 0.0), (2.0, 1.0), (1.0, 0.3)])
def test_the_fused_loss_and_gradient_equal_the_checkpointed_ones(temperature, ce_weight):
    """Ignored positions, uneven chunks: the closed-form gradient is autograd's, to fp32 rounding (both
    paths do their maths in fp32, in a different order)."""
    torch.manual_seed(0)
    s = torch.randn(3, 7, 50, dtype=torch.float64, requires_grad=True)
    t = torch.randn(3, 7, 50, dtype=torch.float64) * 2
    y = torch.randint(0, 50, (3, 7))
    y[0, :3] = IGNORE_INDEX
    teacher = None if ce_weight == 1.0 else t
    kw = dict(temperature=temperature, ce_weight=ce_weight, loss_chunk_tokens=4)
    ref = lm_loss(s, teacher, y, D(loss_impl="checkpointed", **kw))
    (g_ref,) = torch.autograd.grad(ref, s)
    got = lm_loss(s, teacher, y, D(loss_impl="fused", **kw))
    (g_got,) = torch.autograd.grad(got * 3.0, s)  # the backward scales the stored gradient by grad_output
    assert got.item() == pytest.approx(ref.item(), rel=1e-6)
    # atol: the gradient's entries are up to ~0.05 here and are differences of probabilities of up to ~0.5,
    # scaled by 1/18 counted tokens: fp32 rounding of those is a few 1e-9
    assert torch.allclose(g_got, 3.0 * g_ref, rtol=1e-5, atol=1e-8)


def test_the_fused_loss_keeps_one_gradient_in_the_logits_dtype_and_no_fp32_copy():
    """What the fused loss keeps for the backward: the gradient, in the logits' dtype (bf16 here), the size
    autograd's own gradient has; no fp32 [tokens, vocab] tensor."""
    s = torch.randn(64, 1000, dtype=torch.bfloat16, requires_grad=True)
    t = torch.randn(64, 1000, dtype=torch.bfloat16)
    y = torch.randint(0, 1000, (64,))
    loss = lm_loss(s, t, y, D(ce_weight=0.5, loss_chunk_tokens=16, loss_impl="fused"))
    (kept,) = loss.grad_fn.saved_tensors
    assert kept.dtype == torch.bfloat16 and kept.shape == (64, 1000)
    loss.backward()
    assert s.grad.dtype == torch.bfloat16 and torch.equal(s.grad, kept)


def test_all_padding_gives_zero_loss_and_gradient_when_fused():
    s = torch.randn(4, 10, requires_grad=True)
    y = torch.full((4,), IGNORE_INDEX)
    loss = lm_loss(s, torch.randn(4, 10), y, D(ce_weight=0.5, loss_impl="fused"))
    loss.backward()
    assert loss.item() == 0.0 and not s.grad.any()


def test_the_fused_loss_is_forward_kl_only_and_says_so():
    with pytest.raises(ConfigError, match="distill.loss_impl='fused' computes forward_kl only, not 'jsd'"):
        lm_loss(S, T, Y, D(loss="jsd", loss_impl="fused"))
    with pytest.raises(ConfigError, match="distill.loss_impl 'triton' is not one of auto, checkpointed, fused"):
        lm_loss(S, T, Y, D(loss_impl="triton"))


@pytest.mark.parametrize(
    "kind, ran", [("forward_kl", "fused"), ("reverse_kl", "checkpointed"), ("jsd", "checkpointed")]
)
def test_auto_fuses_forward_kl_and_checkpoints_the_rest(kind, ran, monkeypatch):
    calls = []
    monkeypatch.setattr(lm_objectives._FusedForwardKL, "apply", lambda *a: calls.append("fused") or S.sum() * 0)
    monkeypatch.setattr(lm_objectives, "checkpoint", lambda f, *a, **k: calls.append("checkpointed") or f(*a))
    s = S.clone().requires_grad_(True)
    lm_loss(s, T, Y, D(loss=kind, ce_weight=0.5))  # impl defaults to 'auto'
    assert set(calls) == {ran} and lm_objectives.resolve_impl(kind, "auto") == ran


def test_auto_fuses_on_cuda_only_where_triton_can_compile_it(monkeypatch):
    cuda = torch.device("cuda")  # resolve_impl only reads its type: no GPU needed
    monkeypatch.setattr(lm_objectives, "can_fuse", lambda device: device.type != "cuda")
    assert lm_objectives.resolve_impl("forward_kl", "auto", cuda) == "checkpointed"
    assert lm_objectives.resolve_impl("forward_kl", "auto", torch.device("cpu")) == "fused"
    with pytest.raises(ConfigError, match="distill.loss_impl='fused' runs compiled .* Triton"):
        lm_objectives.resolve_impl("forward_kl", "fused", cuda)  # explicit: refused, not a compile error later
    assert lm_objectives.resolve_impl("forward_kl", "fused", torch.device("cpu")) == "fused"
    monkeypatch.undo()
    assert lm_objectives.can_fuse(torch.device("cpu"))  # eager there: nothing to compile


@pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None, reason="inductor's CPU backend needs a C++ compiler"
)
def test_the_compiled_chunk_is_one_graph_and_equals_the_eager_one():
    """What runs on CUDA: the chunk's maths through torch.compile with fullgraph=True (a graph break fails
    here). Compiled on this CPU by inductor's C++ backend (~15 s), against the eager function; then the
    same compiled function at other temperatures and weights, and a shorter chunk (0-dim tensors and a
    dynamic token count: no recompile per value, no recompile limit hit)."""
    torch.manual_seed(0)
    s = (torch.randn(21, 50) * 3).to(torch.bfloat16)
    t = (torch.randn(21, 50) * 3).to(torch.bfloat16)
    y = torch.randint(0, 50, (21,))
    y[:3] = IGNORE_INDEX
    counted = torch.tensor(18.0)
    fn = lm_objectives.compiled_chunk()
    cases = [(2.0, 0.5, 0.5, True, True), (1.0, 1.0, 0.0, True, False), (1.0, 0.0, 1.0, False, True)]
    cases += [(1.0 + i / 10, 0.5, 0.5, True, True) for i in range(10)]
    for rows in (21, 21, 13):
        for temperature, kd_w, ce_w, with_kd, with_ce in cases[:3] if rows == 21 else cases:
            scalars = lm_objectives.ChunkScalars(counted, *map(torch.tensor, (temperature, kd_w, ce_w)), with_kd,
                                                 with_ce, torch.bfloat16)
            args = (s[:rows], t[:rows], y[:rows], scalars)
            eager, compiled = lm_objectives._chunk_loss_and_grad(*args), fn(*args)
            assert compiled[0].item() == pytest.approx(eager[0].item(), rel=1e-5)
            assert compiled[1].dtype == torch.bfloat16
            assert torch.allclose(compiled[1].float(), eager[1].float(), rtol=1e-2, atol=1e-4)


def test_fp16_logits_keep_an_fp32_gradient_so_the_grad_scaler_can_scale_it():
    """fp16 autocast: per-token gradients / the token count are below fp16's range, and a grad scaler's
    65536 in fp16 is inf. The kept gradient is fp32, scaled by the fp32 grad_output, then cast."""
    torch.manual_seed(0)
    s = (torch.randn(2048, 512) * 3).to(torch.float16).requires_grad_()
    t = (torch.randn(2048, 512) * 3).to(torch.float16)
    y = torch.randint(0, 512, (2048,))
    loss = lm_loss(s, t, y, D(temperature=2.0, ce_weight=0.5, loss_impl="fused"))
    (loss * 65536.0).backward()
    ref = s.detach().float().requires_grad_()
    (lm_loss(ref, t.float(), y, D(temperature=2.0, ce_weight=0.5, loss_impl="checkpointed")) * 65536.0).backward()
    assert torch.isfinite(s.grad).all()
    assert (s.grad != 0).float().mean() > 0.99
    assert torch.allclose(s.grad.float(), ref.grad, rtol=1e-2, atol=1e-3)


def test_the_fused_backward_runs_once_and_the_teacher_gets_no_gradient():
    s = torch.randn(4, 10, requires_grad=True)
    loss = lm_loss(s, torch.randn(4, 10), torch.randint(0, 10, (4,)), D(loss_impl="fused"))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="runs once"):
        loss.backward()
    with pytest.raises(ValueError, match="detach them"):
        lm_objectives._FusedForwardKL.apply(s, torch.randn(4, 10, requires_grad=True), torch.zeros(4, dtype=torch.long),
                                            D(loss_chunk_tokens=4))
