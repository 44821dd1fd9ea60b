"""Language-model distillation objectives on logits, in fp32 and chunked over tokens.

At a vocabulary of 32k-128k the fp32 copies of [tokens, vocab] logits (softmax, log-softmax, their
gradients) dwarf the model's activations: 8k tokens x 128k vocab is 4 GB per fp32 copy. So every loss here
walks the tokens in chunks of `chunk_tokens` rows. The checkpointed path (every loss) wraps each chunk in
`torch.utils.checkpoint`: the forward keeps only the chunk's input views (no new memory), and the backward
recomputes one chunk's fp32 maths at a time. Its peak extra memory is a few [chunk_tokens, vocab] fp32
tensors, whatever the batch (the fused path's is below).

Losses (per token, averaged over the counted tokens, i.e. those whose next token is not `ignore_index`):
  forward_kl   KL(teacher || student) at temperature T, times T^2 (Hinton: keeps gradient scale
               independent of T; DistilBERT, DistillKit)
  reverse_kl   KL(student || teacher), same temperature and T^2 (MiniLLM)
  jsd          generalized Jensen-Shannon with beta, as GKD (Agarwal et al. 2024) and TRL's GKDTrainer define it:
               M = beta*teacher + (1-beta)*student,  JSD = beta*KL(teacher||M) + (1-beta)*KL(student||M);
               beta=0.5 is the symmetric JSD; beta=0 and beta=1 are taken as forward and reverse KL (JSD/beta
               and JSD/(1-beta) tend to them), as TRL does, since the formula itself vanishes there
and cross-entropy of the student on the text's next tokens (T = 1) mixed in:
  loss = (1 - ce_weight) * KD + ce_weight * CE
ce_weight = 1 is the student without distillation (teacher logits are then not needed). Every loss takes its
settings as the run's distill config (`cfg.distill`: loss, temperature, ce_weight, jsd_beta,
loss_chunk_tokens, loss_impl), so a new setting is one field, not a parameter threaded through each kernel.

Two implementations of forward_kl + CE (distill.loss_impl; 'auto', the default, is fused for forward_kl and
checkpointed for the other losses):
  checkpointed  the chunks above under autograd: the backward recomputes each chunk's forward, then runs
                log-softmax's backward (every kind of loss)
  fused         the gradient has a closed form, d/ds = kd_w*T*(softmax(s/T) - softmax(t/T)) + ce_w*(softmax(s)
                - onehot(y)), per counted token / counted tokens: each chunk's loss and gradient are computed
                once, in the forward, and the backward only scales the kept gradient in place. That
                gradient ([tokens, vocab] in the logits' dtype, fp32 for fp16 logits) lives from the loss's
                forward to its backward: one logits-sized tensor more than the checkpointed path holds
                then. On CUDA the chunk's maths is torch.compile'd into a few fused kernels. forward_kl only.
  fused_head    the same chunk maths with the LM head's GEMM inside it, so not even the student's logits
                exist (workbench.train.objectives.head_loss).

Against top-k teacher targets (distill.teacher_mode=topk) `topk_lm_loss` folds both distributions onto the
teacher's k tokens plus one tail bucket (the rest of the vocabulary) and takes the divergence there; with
k = vocab it is the full one.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from workbench.config import LM_LOSSES as KINDS
from workbench.config import LOSS_IMPLS as IMPLS
from workbench.config import ConfigError, DistillConfig
from workbench.train.objectives import Targets, mse

IGNORE_INDEX = -100  # torch's cross_entropy default: next tokens to leave out (padding)
DEFAULT_CHUNK_TOKENS = 4096  # 4096 x 128k vocab x 4 B = 2 GB per fp32 copy: bounded, and large enough to be fast


def kd_per_token(student: torch.Tensor, teacher: torch.Tensor, kind: str, temperature: float = 1.0,
                 beta: float = 0.5) -> torch.Tensor:
    """[n] divergence per token (nats, times T^2) from fp32 [n, vocab] logits. Unchunked: callers chunk."""
    ls = F.log_softmax(student / temperature, dim=-1)
    lt = F.log_softmax(teacher / temperature, dim=-1)
    return divergence(ls, lt, kind, beta) * temperature ** 2


def divergence(ls: torch.Tensor, lt: torch.Tensor, kind: str, beta: float = 0.5) -> torch.Tensor:
    """[n] divergence between the student's and the teacher's log-probabilities [n, support], per token."""
    if kind == "forward_kl" or (kind == "jsd" and beta == 0.0):
        return (lt.exp() * (lt - ls)).sum(-1)
    if kind == "reverse_kl" or (kind == "jsd" and beta == 1.0):
        return (ls.exp() * (ls - lt)).sum(-1)
    # the mixture in log space: no exp/log round trip through tiny probabilities
    lm = torch.logsumexp(torch.stack([lt + math.log(beta), ls + math.log(1.0 - beta)]), dim=0)
    return beta * (lt.exp() * (lt - lm)).sum(-1) + (1.0 - beta) * (ls.exp() * (ls - lm)).sum(-1)


# An empty tail (top-k with k = vocab) as a finite log-probability: exp() of it is 0, so its terms vanish and
# their gradients stay finite, where -inf would give 0 * inf = NaN in the forward or backward.
TAIL_FLOOR = -1e30


def topk_kd_per_token(student: torch.Tensor, values: torch.Tensor, indices: torch.Tensor, rest_lse: torch.Tensor,
                      kind: str, temperature: float = 1.0, beta: float = 0.5) -> torch.Tensor:
    """[n] divergence per token (times T^2) on the top-k support plus one tail bucket: the teacher's k largest
    logits `values` [n, k] at vocabulary ids `indices` [n, k] and `rest_lse` [n], the log-sum-exp of its other
    logits / T; the student's full fp32 logits [n, vocab] are folded onto the same k + 1 buckets (its tail is
    the probability of every other token). With k = vocab the tail is empty and this is kd_per_token."""
    ls = F.log_softmax(student / temperature, dim=-1)
    idx = indices.long()
    s_buckets = torch.cat([ls.gather(-1, idx), ls.scatter(-1, idx, TAIL_FLOOR).logsumexp(-1, keepdim=True)], -1)
    t = torch.cat([values.float() / temperature, rest_lse.float().clamp(min=TAIL_FLOOR).unsqueeze(-1)], -1)
    t_buckets = t - t.logsumexp(-1, keepdim=True)
    return divergence(s_buckets, t_buckets, kind, beta) * temperature ** 2


def _topk_chunk_sums(student, values, indices, rest_lse, next_tokens, d: DistillConfig):
    """(KD sum, CE sum) of one chunk against top-k teacher targets, fp32; checkpoint's unit, as _chunk_sums."""
    s = student.float()
    keep = next_tokens != IGNORE_INDEX
    zero = s.new_zeros(())
    kd = zero if d.ce_weight == 1 else (topk_kd_per_token(s, values, indices, rest_lse, d.loss, d.temperature,
                                                          d.jsd_beta) * keep).sum()
    ce = zero if d.ce_weight == 0 else F.cross_entropy(s, next_tokens, ignore_index=IGNORE_INDEX, reduction="sum")
    return torch.stack([kd, ce])


def topk_lm_loss(student_logits: torch.Tensor, targets: Targets, d: DistillConfig) -> torch.Tensor:
    """lm_loss against the teacher's top-k targets (distill.teacher_mode=topk: `targets.out` the k values,
    `targets.indices`, `targets.rest_lse`): (1 - ce_weight) * KD over the k + 1 buckets + ce_weight * CE,
    chunked and checkpointed like lm_loss's checkpointed path, whatever d.loss_impl says. `rest_lse` must be at
    the same temperature (the store is keyed by it)."""
    check_options(d, impl="checkpointed")
    values, indices, rest_lse, next_tokens = targets.out, targets.indices, targets.rest_lse, targets.next_tokens
    vocab, k = student_logits.shape[-1], values.shape[-1]
    if values.shape != indices.shape or values.shape[:-1] != student_logits.shape[:-1] or k > vocab:
        raise ValueError(f"top-k targets {tuple(values.shape)} / {tuple(indices.shape)} do not fit student logits "
                         f"{tuple(student_logits.shape)}")
    s, y = student_logits.reshape(-1, vocab), next_tokens.reshape(-1)
    v, i, r = values.detach().reshape(-1, k), indices.reshape(-1, k), rest_lse.detach().reshape(-1)
    kd_w = 1.0 - d.ce_weight
    recompute = torch.is_grad_enabled() and s.requires_grad
    sums = s.new_zeros(2, dtype=torch.float32)
    for parts in zip(*(x.split(d.loss_chunk_tokens) for x in (s, v, i, r, y))):
        sums = sums + (checkpoint(_topk_chunk_sums, *parts, d, use_reentrant=False) if recompute
                       else _topk_chunk_sums(*parts, d))
    counted = (y != IGNORE_INDEX).sum().clamp(min=1)
    return (kd_w * sums[0] + d.ce_weight * sums[1]) / counted


def _chunk_sums(student, teacher, next_tokens, d: DistillConfig):
    """(KD sum, CE sum) over one chunk's counted tokens, in fp32. The unit that checkpoint recomputes."""
    s = student.float()
    keep = next_tokens != IGNORE_INDEX
    zero = s.new_zeros(())
    kd = zero if d.ce_weight == 1 else (kd_per_token(s, teacher.float(), d.loss, d.temperature, d.jsd_beta)
                                        * keep).sum()
    ce = zero if d.ce_weight == 0 else F.cross_entropy(s, next_tokens, ignore_index=IGNORE_INDEX, reduction="sum")
    return torch.stack([kd, ce])


class ChunkScalars(NamedTuple):
    """What the fused chunk's maths takes besides its tensors s, t, y. The token count and the weights are 0-dim
    fp32 tensors on the device, so a new value is no new compiled graph; with_kd / with_ce leave out a term
    whose weight is 0 (the no-KD student reads no teacher logits); grad_dtype is the kept gradient's."""

    counted: torch.Tensor
    temperature: torch.Tensor
    kd_w: torch.Tensor
    ce_w: torch.Tensor
    with_kd: bool
    with_ce: bool
    grad_dtype: torch.dtype


def chunk_scalars(d: DistillConfig, counted: torch.Tensor, grad_dtype: torch.dtype) -> ChunkScalars:
    """The fused chunk's scalars for the distill config `d`, on the device of `counted` (filled there, not
    copied from the host: a host-to-device copy is illegal inside a CUDA graph capture)."""
    kd_w, ce_w = 1.0 - d.ce_weight, float(d.ce_weight)
    weights = (torch.full((), v, dtype=torch.float32, device=counted.device)
               for v in (float(d.temperature), kd_w, ce_w))
    return ChunkScalars(counted, *weights, kd_w > 0, ce_w > 0, grad_dtype)


def _chunk_stats(s, t, y, c: ChunkScalars):
    """Stage 1 of a chunk, reductions only: (the chunk's kd_w * KD sum + ce_w * CE sum over `counted`, the
    per-token log-sum-exps [student at T, teacher at T, student at 1] that stage 2 needs). KL(p_t || p_s) of
    a token is sum_v p_t (t/T - s/T) - lse_t + lse_s, so no [chunk, vocab] tensor is needed here."""
    counted, temperature, kd_w, ce_w, with_kd, with_ce, _ = c
    s32 = s.float()
    keep = (y != IGNORE_INDEX).to(torch.float32)
    total, zero = s32.new_zeros(()), s32.new_zeros(s32.shape[:-1] + (1,))
    lse_st = lse_tt = lse_s = zero
    if with_kd:
        st, tt = s32 / temperature, t.float() / temperature
        lse_st, lse_tt = torch.logsumexp(st, -1, keepdim=True), torch.logsumexp(tt, -1, keepdim=True)
        kl = ((tt - lse_tt).exp() * (tt - st)).sum(-1) - lse_tt.squeeze(-1) + lse_st.squeeze(-1)
        total = total + kd_w * temperature ** 2 * (kl * keep).sum()
    if with_ce:
        lse_s = torch.logsumexp(s32, -1, keepdim=True)
        target = y.clamp(min=0).unsqueeze(-1)  # ignored positions pick token 0; `keep` zeroes them
        total = total - ce_w * ((s32.gather(-1, target) - lse_s).squeeze(-1) * keep).sum()
    return total / counted, torch.cat([lse_st, lse_tt, lse_s], dim=-1)


def _chunk_grad(s, t, y, lse, c: ChunkScalars):
    """Stage 2 of a chunk, elementwise only: d(loss)/ds = (kd_w * T * (softmax(s/T) - softmax(t/T)) +
    ce_w * (softmax(s) - onehot(y))) * keep / counted, from stage 1's log-sum-exps; the one-hot is a
    comparison with the column index, so nothing but the gradient itself is written."""
    counted, temperature, kd_w, ce_w, with_kd, with_ce, grad_dtype = c
    s32 = s.float()
    keep = (y != IGNORE_INDEX).to(torch.float32).unsqueeze(-1)
    grad = s32.new_zeros(())
    if with_kd:
        grad = grad + kd_w * temperature * ((s32 / temperature - lse[:, 0:1]).exp()
                                            - (t.float() / temperature - lse[:, 1:2]).exp())
    if with_ce:
        columns = torch.arange(s32.shape[-1], device=s32.device)
        grad = grad + ce_w * ((s32 - lse[:, 2:3]).exp() - (columns == y.clamp(min=0).unsqueeze(-1)).float())
    return (grad * keep / counted).to(grad_dtype)


def _chunk_loss_and_grad(s, t, y, c: ChunkScalars, stages=(_chunk_stats, _chunk_grad)):
    """(kd_w * KD sum + ce_w * CE sum, d(loss)/ds in `c.grad_dtype`) of one chunk of forward_kl + CE, where
    loss = that sum / counted. No autograd: the gradient is written out (see the module's docstring).

    Two stages, compiled apart on CUDA (`stages`): as one graph, inductor wrote an fp32 and a bf16 [chunk,
    vocab] buffer besides the gradient (751 MiB at 1,024 tokens and vocab 128256, measured on the H200: the
    largest part of the head-fused loss's memory); split at the log-sum-exps, stage 1 is reductions over
    the inputs and stage 2 elementwise, and neither has a [chunk, vocab] intermediate to keep."""
    stats, grad = stages
    value, lse = stats(s, t, y, c)
    return value, grad(s, t, y, lse, c)


_COMPILED: dict[str, object] = {}
_RECOMPILE_LIMIT = 64


def compiled_chunk():
    """_chunk_loss_and_grad with its two stages through torch.compile, each one graph (fullgraph: a graph
    break would split the fused kernels); the token count may vary (the last chunk), the vocabulary is what
    the kernels are built for. Made once per process.

    One process meets many variants of this graph: the no-KD and the KD students, bf16, fp16 and fp32 logits
    and teachers, the head-fused path's own dtypes, a sweep's vocabularies, a test session's dozens of cases.
    dynamo keeps 8 graphs per code object by default and, with fullgraph=True, raises at the 9th (the GPU
    suite met it): the limit is raised to _RECOMPILE_LIMIT, never lowered. Each graph is a few small kernels."""
    if "chunk" not in _COMPILED:
        dynamo = torch._dynamo.config
        dynamo.recompile_limit = max(dynamo.recompile_limit, _RECOMPILE_LIMIT)
        stages = tuple(torch.compile(f, fullgraph=True) for f in (_chunk_stats, _chunk_grad))
        _COMPILED["chunk"] = functools.partial(_chunk_loss_and_grad, stages=stages)
    return _COMPILED["chunk"]


def _chunk_fn(device: torch.device):
    """The chunk's maths: compiled on CUDA (a few fused kernels instead of a dozen passes over [chunk,
    vocab] fp32 tensors), eager elsewhere (CPU runs are for correctness, and compiling costs ~15 s)."""
    return compiled_chunk() if device.type == "cuda" else _chunk_loss_and_grad


class _FusedForwardKL(torch.autograd.Function):
    """forward_kl + CE with the gradient computed in the forward, chunk by chunk (distill.loss_impl=fused).
    The gradient is kept in the logits' dtype (bf16: the size autograd's own gradient has), in fp32 for fp16
    logits (per-token gradients / the token count underflow fp16 before the grad scaler multiplies them); the
    backward scales it in place, so it runs once (no retain_graph)."""

    @staticmethod
    def forward(ctx, s, t, y, d: DistillConfig):
        if t.requires_grad:
            raise ValueError("the fused loss gives no gradient to the teacher's logits; detach them")
        counted = (y != IGNORE_INDEX).sum().clamp(min=1).to(torch.float32)  # all padding: zero, not NaN
        fn = _chunk_fn(s.device)
        grad = torch.empty_like(s, dtype=torch.float32 if s.dtype == torch.float16 else s.dtype)
        c = chunk_scalars(d, counted, grad.dtype)
        loss = s.new_zeros((), dtype=torch.float32)
        for start in range(0, s.shape[0], d.loss_chunk_tokens):
            part = slice(start, start + d.loss_chunk_tokens)
            value, grad[part] = fn(s[part], t[part], y[part], c)
            loss = loss + value
        ctx.save_for_backward(grad)
        ctx.logits_dtype, ctx.done = s.dtype, False
        return loss

    @staticmethod
    def backward(ctx, grad_out):
        (grad,) = kept_grads_once(ctx, "the fused loss")
        grad.mul_(grad_out)  # grad_out stays fp32: a bf16 copy of it would round the scale
        return grad.to(ctx.logits_dtype), None, None, None


def kept_grads_once(ctx, what: str) -> tuple[torch.Tensor, ...]:
    """The gradients a fused loss computed in its forward and kept (ctx.saved_tensors). Its backward scales them in
    place by grad_out, so a second backward would scale them twice: refused (the forward sets ctx.done = False)."""
    if ctx.done:
        raise RuntimeError(f"{what}'s backward scales its kept gradients in place: it runs once")
    ctx.done = True
    return ctx.saved_tensors


@functools.cache
def can_fuse(device: torch.device) -> bool:
    """The fused maths is torch.compile'd on CUDA, which needs Triton for this GPU (torch's CUDA wheels for
    Windows, for one, come without it); elsewhere it runs eager. Cached: lm_loss asks in every step."""
    if device.type != "cuda":
        return True
    try:
        from torch.utils._triton import has_triton  # checks the GPU's compute capability too
    except ImportError:  # a torch that moved it: whether Triton imports is the next best answer
        import importlib.util

        return importlib.util.find_spec("triton") is not None
    return has_triton()


def resolve_impl(kind: str, impl: str, device: torch.device | None = None) -> str:
    """The implementation that runs: 'auto' is fused where it exists (forward_kl; the no-KD student's CE is
    forward_kl with no KD term) and can run compiled, else checkpointed; an explicit 'fused' that cannot run
    compiled on `device` is refused. On an H200 the fused loss took 16 ms off a 42 ms TE FP8 step at shape A,
    at the same loss and a lower peak (results/reference/h200/bench/lm-a)."""
    compiles = device is None or can_fuse(device)
    if impl in ("fused", "fused_head") and not compiles:
        raise ConfigError(f"distill.loss_impl={impl!r} runs compiled (torch.compile with Triton) on CUDA, and Triton "
                          "is not usable here; set distill.loss_impl=checkpointed or auto")
    if impl == "auto":
        return "fused" if kind == "forward_kl" and compiles else "checkpointed"
    return impl


def check_options(d: DistillConfig, impl: str | None = None) -> None:
    """One line naming the bad value of the distill config `d` and what is allowed; `impl` is the loss
    implementation that will run (d.loss_impl where None)."""
    kind, temperature, ce_weight, beta, chunk_tokens = d.loss, d.temperature, d.ce_weight, d.jsd_beta, \
        d.loss_chunk_tokens
    impl = d.loss_impl if impl is None else impl
    if kind not in KINDS:
        raise ConfigError(f"distillation loss {kind!r} is not one of {', '.join(KINDS)}")
    if impl not in IMPLS:
        raise ConfigError(f"distill.loss_impl {impl!r} is not one of {', '.join(IMPLS)}")
    if impl in ("fused", "fused_head") and kind != "forward_kl":
        raise ConfigError(f"distill.loss_impl={impl!r} computes forward_kl only, not {kind!r}; set "
                          "distill.loss_impl=checkpointed")
    if not temperature > 0:
        raise ConfigError(f"temperature {temperature} must be > 0")
    if not 0.0 <= ce_weight <= 1.0:
        raise ConfigError(f"ce_weight {ce_weight} must be in [0, 1] (1 = no distillation, cross-entropy only)")
    if not 0.0 <= beta <= 1.0:
        raise ConfigError(f"beta {beta} must be in [0, 1] (0.5 = symmetric JSD)")
    if not (isinstance(chunk_tokens, int) and chunk_tokens >= 1):
        raise ConfigError(f"chunk_tokens {chunk_tokens!r} must be a positive integer")


def flatten(student_logits, teacher_logits, next_tokens):
    """[tokens, vocab] views of the logits and [tokens] next tokens, after checking the shapes agree."""
    vocab = student_logits.shape[-1]
    if teacher_logits is not None and teacher_logits.shape != student_logits.shape:
        raise ValueError(f"teacher logits {tuple(teacher_logits.shape)} and student logits "
                         f"{tuple(student_logits.shape)} differ in shape (the vocabularies must match)")
    if next_tokens.shape != student_logits.shape[:-1]:
        raise ValueError(f"next tokens {tuple(next_tokens.shape)} do not match logits {tuple(student_logits.shape)}")
    t = None if teacher_logits is None else teacher_logits.detach().reshape(-1, vocab)
    return student_logits.reshape(-1, vocab), t, next_tokens.reshape(-1)


def hidden_mse(student_hidden: list[torch.Tensor], teacher_hidden: list[torch.Tensor]) -> torch.Tensor:
    """Mean over layers of the fp32 MSE between hidden states of equal shape (TinyBERT, MiniLM). A student
    narrower than its teacher needs a projection first; that belongs to the model, not here."""
    if len(student_hidden) != len(teacher_hidden) or not student_hidden:
        raise ValueError(f"hidden-state MSE needs as many student states ({len(student_hidden)}) as teacher "
                         f"states ({len(teacher_hidden)}), at least one")
    for i, (s, t) in enumerate(zip(student_hidden, teacher_hidden)):
        if s.shape != t.shape:
            raise ValueError(f"hidden state {i}: student {tuple(s.shape)} and teacher {tuple(t.shape)} differ")
    return torch.stack([mse(s, t.detach()) for s, t in zip(student_hidden, teacher_hidden)]).mean()


def lm_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor | None, next_tokens: torch.Tensor,
            d: DistillConfig) -> torch.Tensor:
    """Scalar fp32 loss: (1 - d.ce_weight) * KD(d.loss) + d.ce_weight * CE, run as d.loss_impl says.

    Logits are [..., vocab] in any dtype (bf16 in, fp32 maths); `next_tokens` is [...] int64, IGNORE_INDEX
    where a position does not count. `teacher_logits` may be None only when d.ce_weight == 1.
    """
    check_options(d)
    impl = resolve_impl(d.loss, d.loss_impl, student_logits.device)
    kd_w = 1.0 - d.ce_weight
    if kd_w > 0 and teacher_logits is None:
        raise ValueError("teacher logits are needed unless ce_weight == 1 (the student without distillation)")
    s, t, y = flatten(student_logits, teacher_logits, next_tokens)
    if t is None:
        t = s.detach()  # a placeholder the KD term never reads (kd_w == 0)
    # checkpoint only when a backward will run: under no_grad it would only add overhead
    recompute = torch.is_grad_enabled() and s.requires_grad
    if impl == "fused" and recompute:  # without a backward to come, the plain chunks below are the same maths
        return _FusedForwardKL.apply(s, t, y, d)
    sums = s.new_zeros(2, dtype=torch.float32)
    # split, not slicing: its backward concatenates the chunks' gradients once, where each slice's backward
    # would write its chunk into a zero tensor of the full logits' size
    for sc, tc, yc in zip(*(x.split(d.loss_chunk_tokens) for x in (s, t, y))):
        sums = sums + (checkpoint(_chunk_sums, sc, tc, yc, d, use_reentrant=False) if recompute
                       else _chunk_sums(sc, tc, yc, d))
    counted = (y != IGNORE_INDEX).sum().clamp(min=1)  # all padding: a zero loss, not a NaN
    return (kd_w * sums[0] + d.ce_weight * sums[1]) / counted
