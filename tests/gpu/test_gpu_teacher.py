"""GPU checks of the teacher modes and the head-fused loss (scripts/gpu_tests.sh on the H200; skipped without
CUDA): online and top-k teachers train like the precomputed one on CUDA, eager and inside the whole-step CUDA
graph; the head-fused loss equals the checkpointed one on CUDA and replays in a CUDA graph."""
import functools

import pytest
import torch

from workbench import backends, config
from workbench.config import DistillConfig
from workbench.models.lm import HeadFeatures
from workbench.train import lm_task, loop
from workbench.train.objectives import lm_objectives as lo
from workbench.train.objectives.head_loss import head_fused_loss
from workbench.train.teacher_targets import topk_store as tt
from workbench.train.teacher_targets.online import OnlineBatches

# The loss kernels' settings as a distill config, at the defaults these tests were written for (T = 1, no CE)
D = functools.partial(DistillConfig, loss="forward_kl", temperature=1.0, ce_weight=0.0)

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def _cfg(**over):
    base = dict(corpus_mb=0.2, tokenizer="bytes", vocab=256, hidden=64, intermediate=256, layers=2, heads=4,
                seq_len=64, batch=4, steps=8, eval_batches=1, warmup=2, iters=3, teacher="random", topk=256,
                no_kd_student=False, fused_optimizer=True)
    return config.from_preset("gpt-cpu", **{**base, **over}).validate()


def _train(tmp_path, spec="torch_bf16", **over):
    cfg = _cfg(**over)
    task = lm_task.LMTask(cfg, CUDA, torch.bfloat16, tmp_path / "cache")
    data = task.make_data()
    metrics, losses = loop.run_student(loop.prepare(backends.make(spec), cfg, task, CUDA), cfg, task, data, CUDA)
    return task, data, metrics, losses


@pytest.mark.parametrize("graphs", [False, True])
def test_online_and_topk_teachers_train_like_the_precomputed_one_on_cuda(tmp_path, graphs):
    runs = {mode: _train(tmp_path, teacher_mode=mode, graphs=graphs) for mode in ("precomputed", "online", "topk")}
    pre, online, topk = runs["precomputed"], runs["online"], runs["topk"]
    assert isinstance(online[1].train, OnlineBatches) and isinstance(topk[1].train, tt.TopKBatches)
    assert bool(online[2]["graphed"]) == graphs
    # a deterministic teacher forward: the online student sees the precomputed student's exact targets
    assert online[3] == pytest.approx(pre[3], rel=1e-6)
    # k = vocab: the top-k loss is the full one, by other bf16/fp32 arithmetic
    assert topk[3] == pytest.approx(pre[3], rel=1e-3)
    assert topk[2]["kl_teacher_student_t1_nats"] == pytest.approx(pre[2]["kl_teacher_student_t1_nats"], rel=2e-2)


def test_the_online_teacher_gives_the_same_targets_on_every_pass(tmp_path):
    task = lm_task.LMTask(_cfg(teacher_mode="online"), CUDA, torch.bfloat16, tmp_path / "cache")
    data = task.make_data()
    first = [t.out.clone() for _, t in data.train]
    assert all(torch.equal(a, t.out) for a, (_, t) in zip(first, data.train))


def test_a_top_k_store_streams_a_step_ahead_to_the_gpu(tmp_path):
    task = lm_task.LMTask(_cfg(teacher_mode="topk", topk=16), CUDA, torch.bfloat16, tmp_path / "cache")
    data = task.make_data()
    # __iter__: pinned, async
    streamed = [(tokens.clone(), t.out.clone(), t.indices.clone()) for tokens, t in data.train]
    for i, (tokens, values, indices) in enumerate(streamed):
        again = data.train[i]  # __getitem__: a plain copy
        assert values.is_cuda and values.dtype == torch.bfloat16 and indices.dtype == torch.int16
        assert (
            torch.equal(tokens, again[0])
            and torch.equal(values, again[1].out)
            and torch.equal(indices, again[1].indices)
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_head_fused_loss_equals_the_checkpointed_loss_on_cuda(dtype):
    torch.manual_seed(0)
    n, hidden, vocab = 1000, 128, 4096
    h = torch.randn(n, hidden, device=CUDA, dtype=dtype, requires_grad=True)
    w = (torch.randn(vocab, hidden, device=CUDA) / 10).requires_grad_()
    t = torch.randn(n, vocab, device=CUDA, dtype=dtype)
    y = torch.randint(0, vocab, (n,), device=CUDA)
    ref = lo.lm_loss(h @ w.to(dtype).t(), t, y, D(ce_weight=0.5, loss_chunk_tokens=300, loss_impl="checkpointed"))
    ref_h, ref_w = torch.autograd.grad(ref, (h, w))
    got = head_fused_loss(HeadFeatures((h, w)), t, y, D(ce_weight=0.5, loss_chunk_tokens=300))
    got_h, got_w = torch.autograd.grad(got, (h, w))
    tol = dict(rtol=1e-4, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-4)
    torch.testing.assert_close(got, ref, **tol)
    torch.testing.assert_close(got_h.float(), ref_h.float(), **tol)
    torch.testing.assert_close(got_w, ref_w, **tol)


def test_the_compiled_chunk_takes_more_variants_than_dynamos_default_limit():
    """A GPU suite (or a sweep in one process) meets the compiled chunk in many dtypes and with or without
    each term; dynamo's default of 8 graphs per code object raised at the 9th under fullgraph=True."""
    fn = lo.compiled_chunk()
    y = torch.randint(0, 256, (64,), device=CUDA)
    counted = torch.tensor(64.0, device=CUDA)
    scalars = [torch.tensor(v, device=CUDA) for v in (1.0, 0.5, 0.5)]
    variants = [(d, terms, g) for d in (torch.bfloat16, torch.float16, torch.float32)
                for terms in ((True, True), (True, False), (False, True)) for g in (d, torch.float32)]
    variants = list(dict.fromkeys(variants))  # 15 distinct graphs: more than 8
    assert len(variants) > 8
    for dtype, (with_kd, with_ce), grad_dtype in variants:
        s = torch.randn(64, 256, device=CUDA).to(dtype)
        t = torch.randn(64, 256, device=CUDA).to(dtype)
        args = (s, t, y, lo.ChunkScalars(counted, *scalars, with_kd, with_ce, grad_dtype))
        value, grad = fn(*args)
        ref_value, ref_grad = lo._chunk_loss_and_grad(*args)
        assert grad.dtype == grad_dtype
        torch.testing.assert_close(value, ref_value, rtol=1e-3, atol=1e-5)
        torch.testing.assert_close(grad.float(), ref_grad.float(), rtol=1e-2, atol=1e-6)


def test_the_head_fused_loss_replays_in_a_cuda_graph():
    """No host sync, no branch on data: captured once, replayed on new inputs, the same as eager."""
    torch.manual_seed(0)
    n, hidden, vocab = 512, 64, 2048
    h = torch.randn(n, hidden, device=CUDA, requires_grad=True)
    w = torch.randn(vocab, hidden, device=CUDA, requires_grad=True)
    t, y = torch.randn(n, vocab, device=CUDA), torch.randint(0, vocab, (n,), device=CUDA)

    def step():
        h.grad = w.grad = None
        loss = head_fused_loss(HeadFeatures((h, w)), t, y, D(ce_weight=0.3, loss_chunk_tokens=200))
        loss.backward()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    h.grad = w.grad = None
    with torch.cuda.graph(graph):
        loss = head_fused_loss(HeadFeatures((h, w)), t, y, D(ce_weight=0.3, loss_chunk_tokens=200))
        loss.backward()
    with torch.no_grad():
        t.copy_(torch.randn_like(t))
        y.copy_(torch.randint(0, vocab, (n,), device=CUDA))
    graph.replay()
    replayed, grad_w = float(loss), w.grad.clone()
    eager = step()
    assert replayed == pytest.approx(float(eager), rel=1e-5)
    torch.testing.assert_close(grad_w, w.grad, rtol=1e-4, atol=1e-6)


def test_a_student_trains_with_the_head_fused_loss_inside_the_whole_step_graph(tmp_path):
    _, _, fused, fused_losses = _train(tmp_path, loss_impl="fused", graphs=True)
    _, _, head, head_losses = _train(tmp_path, loss_impl="fused_head", graphs=True)
    assert bool(head["graphed"])
    assert head_losses == pytest.approx(fused_losses, rel=2e-2)
