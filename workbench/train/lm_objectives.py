"""Language-model distillation objectives on logits, in fp32 and chunked over tokens.

At a vocabulary of 32k-128k the fp32 copies of [tokens, vocab] logits (softmax, log-softmax, their
gradients) dwarf the model's activations: 8k tokens x 128k vocab is 4 GB per fp32 copy. So every loss here
walks the tokens in chunks of `chunk_tokens` rows and wraps each chunk in `torch.utils.checkpoint`: the
forward keeps only the chunk's input views (no new memory), and the backward recomputes one chunk's fp32
maths at a time. Peak extra memory is a few [chunk_tokens, vocab] fp32 tensors, whatever the batch.

Losses (per token, averaged over the counted tokens, i.e. those whose next token is not `ignore_index`):
  forward_kl   KL(teacher || student) at temperature T, times T^2 (Hinton: keeps gradient scale
               independent of T; DistilBERT, DistillKit)
  reverse_kl   KL(student || teacher), same temperature and T^2 (MiniLLM)
  jsd          generalized Jensen-Shannon with beta, as GKD (Agarwal et al. 2024) and TRL's GKDTrainer define it:
               M = beta*teacher + (1-beta)*student,  JSD = beta*KL(teacher||M) + (1-beta)*KL(student||M);
               beta=0.5 is the symmetric JSD; beta=0 and beta=1 are taken as forward and reverse KL (JSD/beta
               and JSD/(1-beta) tend to them), as TRL does, since the formula itself vanishes there
and cross-entropy of the student on the text's next tokens (T = 1) mixed in:
  loss = (1 - ce_weight) * KD + ce_weight * CE  [+ hidden_weight * hidden-state MSE]
ce_weight = 1 is the student without distillation (teacher logits are then not needed).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from workbench.errors import ConfigError
from workbench.train.objectives import mse

KINDS = ("forward_kl", "reverse_kl", "jsd")
IGNORE_INDEX = -100  # torch's cross_entropy default: next tokens to leave out (padding)
DEFAULT_CHUNK_TOKENS = 4096  # 4096 x 128k vocab x 4 B = 2 GB per fp32 copy: bounded, and large enough to be fast


def kd_per_token(student: torch.Tensor, teacher: torch.Tensor, kind: str, temperature: float = 1.0,
                 beta: float = 0.5) -> torch.Tensor:
    """[n] divergence per token (nats, times T^2) from fp32 [n, vocab] logits. Unchunked: callers chunk."""
    ls = F.log_softmax(student / temperature, dim=-1)
    lt = F.log_softmax(teacher / temperature, dim=-1)
    if kind == "forward_kl" or (kind == "jsd" and beta == 0.0):
        per = (lt.exp() * (lt - ls)).sum(-1)
    elif kind == "reverse_kl" or (kind == "jsd" and beta == 1.0):
        per = (ls.exp() * (ls - lt)).sum(-1)
    else:  # the mixture in log space: no exp/log round trip through tiny probabilities
        lm = torch.logsumexp(torch.stack([lt + math.log(beta), ls + math.log(1.0 - beta)]), dim=0)
        per = beta * (lt.exp() * (lt - lm)).sum(-1) + (1.0 - beta) * (ls.exp() * (ls - lm)).sum(-1)
    return per * temperature ** 2


def _chunk_sums(student, teacher, next_tokens, kind, temperature, beta, kd_w, ce_w):
    """(KD sum, CE sum) over one chunk's counted tokens, in fp32. The unit that checkpoint recomputes."""
    s = student.float()
    keep = next_tokens != IGNORE_INDEX
    zero = s.new_zeros(())
    kd = zero if kd_w == 0 else (kd_per_token(s, teacher.float(), kind, temperature, beta) * keep).sum()
    ce = zero if ce_w == 0 else F.cross_entropy(s, next_tokens, ignore_index=IGNORE_INDEX, reduction="sum")
    return torch.stack([kd, ce])


def check_options(kind: str, temperature: float, ce_weight: float, beta: float, chunk_tokens: int) -> None:
    """One line naming the bad value and what is allowed."""
    if kind not in KINDS:
        raise ConfigError(f"distillation loss {kind!r} is not one of {', '.join(KINDS)}")
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
            kind: str = "forward_kl", temperature: float = 1.0, ce_weight: float = 0.0, beta: float = 0.5,
            chunk_tokens: int = DEFAULT_CHUNK_TOKENS, hidden_weight: float = 0.0,
            hidden: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None) -> torch.Tensor:
    """Scalar fp32 loss: (1 - ce_weight) * KD(kind) + ce_weight * CE [+ hidden_weight * hidden_mse(*hidden)].

    Logits are [..., vocab] in any dtype (bf16 in, fp32 maths); `next_tokens` is [...] int64, IGNORE_INDEX
    where a position does not count. `teacher_logits` may be None only when ce_weight == 1.
    """
    check_options(kind, temperature, ce_weight, beta, chunk_tokens)
    kd_w = 1.0 - ce_weight
    if kd_w > 0 and teacher_logits is None:
        raise ValueError("teacher logits are needed unless ce_weight == 1 (the student without distillation)")
    s, t, y = flatten(student_logits, teacher_logits, next_tokens)
    if t is None:
        t = s.detach()  # a placeholder the KD term never reads (kd_w == 0)
    # checkpoint only when a backward will run: under no_grad it would only add overhead
    recompute = torch.is_grad_enabled() and s.requires_grad
    sums = s.new_zeros(2, dtype=torch.float32)
    # split, not slicing: its backward concatenates the chunks' gradients once, where each slice's backward
    # would write its chunk into a zero tensor of the full logits' size
    for sc, tc, yc in zip(s.split(chunk_tokens), t.split(chunk_tokens), y.split(chunk_tokens)):
        args = (sc, tc, yc, kind, temperature, beta, kd_w, ce_weight)
        sums = sums + (checkpoint(_chunk_sums, *args, use_reentrant=False) if recompute else _chunk_sums(*args))
    counted = (y != IGNORE_INDEX).sum().clamp(min=1)  # all padding: a zero loss, not a NaN
    loss = (kd_w * sums[0] + ce_weight * sums[1]) / counted
    if hidden_weight:
        if hidden is None:
            raise ValueError("hidden_weight > 0 needs hidden=(student states, teacher states)")
        loss = loss + hidden_weight * hidden_mse(*hidden)
    return loss
