"""The LM task: a causal LM student (gpt / llama, or your Hugging Face model) distilled from a causal LM
teacher on real text (the offline corpus or your files): KL on the logits mixed with cross-entropy;
held-out perplexity, KL to the teacher, top-1 agreement. The teacher's targets come as
distill.teacher_mode says (the registry workbench.train.teacher_targets), precomputed logits where
workbench.train.teacher_targets.logits_placement puts them."""
from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path
from typing import Any

import torch

from workbench.config import ConfigError
from workbench.env.probe import _memory_gb
from workbench.train import objectives, teacher_targets
from workbench.train.loop import Data
from workbench.train.objectives import head_loss, lm_metrics, lm_objectives
from workbench.train.task_setup import (
    SHARD_SEED_STRIDE,
    bpe_vocab,
    check_teacher_output,
    lm_tokenizer,
    resolve_lm,
    teacher_seed,
)
from workbench.train.teacher import lm_teacher, teacher_precision
from workbench.train.teacher_targets import topk_store
from workbench.train.teacher_targets.logits_placement import place_teacher_logits

LM_BENCH_BATCHES = 4  # distinct timed batches, cycled: an LM batch's teacher logits take GBs at vocab 32k


class LMTask:
    """A causal LM student distilled from a causal LM teacher on the offline corpus (or your text)."""

    step0_metrics = lm_metrics.STEP0  # held-out metrics measured before training too (loop.step0_metrics)

    def __init__(self, cfg, device: torch.device, tdtype, cache_dir: str | Path, ce_only: bool = False,
                 with_batches: bool = True):
        from workbench.data import TextSpec, load_text

        cfg = resolve_lm(cfg)  # model.vocab from a Hugging Face model (runner.run has done it already)
        teacher_targets.check(cfg)  # what the teacher mode refuses (a leaf, the config cannot ask its registry)
        self.cfg, self.device, self.tdtype, self.cache_dir = cfg, device, tdtype, Path(cache_dir)
        self.needs_hidden, self.ce_only = False, ce_only
        m, lm = cfg.model, cfg.lm
        pretrained, self.tokenizer_warning = lm_tokenizer(cfg)
        kind = "pretrained" if pretrained else "bpe" if lm.tokenizer == "auto" else lm.tokenizer
        self.text = load_text(TextSpec(files=tuple(lm.corpus_files), max_bytes=int(lm.corpus_mb * 1e6), tokenizer=kind,
                                       vocab_size=bpe_vocab(m.vocab) if kind == "bpe" else 256,
                                       heldout_fraction=lm.heldout_fraction,
                                       pretrained=pretrained.folder if pretrained else ""), self.cache_dir)
        # every batch is a window of seq_len + 1 tokens
        for split, n in ((s, len(t)) for s, t in self.text.tokens.items()):
            if n < m.seq_len + 1:
                raise ConfigError(f"the text's {split} split has {n} tokens, fewer than model.seq_len + 1 = "
                                  f"{m.seq_len + 1}: raise lm.corpus_mb ({lm.corpus_mb})"
                                  + (" or lm.heldout_fraction" if split == "heldout" else "") + ", give more "
                                  "lm.corpus_files, or lower model.seq_len")
        d = cfg.distill
        mode = teacher_targets.requested(d.teacher_mode)  # 'auto' is decided in place_logits
        # one implementation for every student of the run, the no-KD one included (its CE alone could always be
        # fused), as the teacher mode allows (top-k: checkpointed over its buckets); resolve_impl refuses a fused
        # one that cannot run here
        self.loss_impl = mode.loss_impl(lm_objectives.resolve_impl(d.loss, d.loss_impl, device))
        # the losses' settings: the run's distill config with the implementation that runs, and the no-KD
        # student's (cross-entropy alone)
        self.distill = dataclasses.replace(d, loss_impl=self.loss_impl)
        self.ce_only_distill = dataclasses.replace(self.distill, ce_weight=1.0)
        self.info = {"text_folder": str(self.text.folder),
                     "tokenizer": {"pretrained": "pretrained", "bpe": "trained-here BPE"}.get(kind, kind),
                     **(pretrained.info() if pretrained else {}), "tokenizer_vocab": self.text.vocab_size,
                     "tokenizer_warning": self.tokenizer_warning, "model_vocab": m.vocab,
                     "loss_impl": self.loss_impl, "loss_impl_requested": d.loss_impl}
        torch.manual_seed(teacher_seed(cfg))
        self.teacher = self._teacher().to(device).eval().requires_grad_(False)
        # the top-k store's key: the teacher's content, before any FP8 copy; a teacher trained here is hashed too
        # (small, and a study resumed on another machine trains it again: its report tells the teachers apart)
        if with_batches and (mode.stores_targets or cfg.lm.teacher == "train"):
            self.info["teacher_weights_sha256"] = lm_teacher.fingerprint(self.teacher)
        torch.manual_seed(cfg.train.seed)  # the students' init does not depend on how the teacher came to be
        self.reference = self._student()
        self.teacher, self.teacher_precision = teacher_precision.prepare(self.teacher, cfg, device, tdtype)
        self.info.update(self.teacher_precision.info())
        if with_batches:  # False for `workbench teacher`: no training batch, so no logits to place or refuse over
            self.place_logits()  # now, with the teacher on the device, before the batches are made

    def cells(self) -> dict[str, Any]:
        """What every student row of the run carries from its task: the teacher's precision, the logit loss,
        the tokenizer, where the teacher's targets came from, why a teacher trained here was not cached."""
        return {**self.teacher_precision.cells(), "loss_impl": self.loss_impl, "tokenizer": self.info["tokenizer"],
                "tokenizer_sha256": self.info.get("tokenizer_sha256"), "tokenizer_warning": self.tokenizer_warning,
                **{k: self.info.get(k) for k in ("teacher_mode", "teacher_mode_reason", "teacher_topk",
                                                  "teacher_cache_error")}}

    # ---- models ---------------------------------------------------------------------------------
    def shape(self, teacher: bool = False):
        from workbench.models import kinds

        m, lm = self.cfg.model, self.cfg.lm
        kind = kinds.get(m.kind)  # the architecture is the kind's (the registry's), the sizes the config's
        if not teacher:
            return kind.lm_shape(vocab=m.vocab, hidden=m.hidden, intermediate=m.intermediate, layers=m.layers,
                                 heads=m.heads, seq_len=m.seq_len)
        hidden = lm.teacher_hidden or m.hidden
        # unset teacher fields follow the student's proportions (MLP ratio, head size) at the teacher's width
        intermediate = lm.teacher_intermediate or int(hidden * m.intermediate / m.hidden)
        heads = lm.teacher_heads or max(1, hidden // (m.hidden // m.heads))
        return kind.lm_shape(vocab=m.vocab, hidden=hidden, intermediate=intermediate,
                             layers=lm.teacher_layers or m.layers, heads=heads, seq_len=m.seq_len)

    def _student(self) -> torch.nn.Module:
        from workbench.models import CausalLM

        if self.cfg.lm.student:
            from workbench.models.hf import load_causal_lm, provenance

            self.info["student_source"] = provenance(self.cfg.lm.student)
            return load_causal_lm(self.cfg.lm.student, seq_len=self.cfg.model.seq_len)
        return CausalLM(self.shape())

    def _teacher(self) -> torch.nn.Module:
        from workbench.models import CausalLM

        source = self.cfg.lm.teacher
        self.info["teacher_source"] = source
        if source == "random":
            # another seed than the students': with the student's shape it would otherwise be their exact copy
            torch.manual_seed(teacher_seed(self.cfg) + 10_000)
            return CausalLM(self.shape(teacher=True))
        if source != "train":
            from workbench.models.hf import load_causal_lm

            return load_causal_lm(source, seq_len=self.cfg.model.seq_len)
        return lm_teacher.trained_teacher(self.cfg, self.shape(teacher=True), self.text, self.cache_dir, self.device,
                                          self.tdtype, self.info)

    # ---- data, loss, evaluation -----------------------------------------------------------------
    def make_data(self, shard: int = 0) -> Data:
        """The training, bench and held-out batches with their teacher targets. The training batches' come as
        distill.teacher_mode says (`self.info['teacher_mode']`, decided in `place_logits`): precomputed logits
        where `self.info['teacher_logits']` says, the online teacher, or the top-k store. The bench (timed) and
        held-out batches always stay on the device, with full logits (top-k ones for the timed batches of a
        top-k run, so its timed step runs its loss). `shard`: a data-parallel rank's own training and timed
        batches (the held-out ones are every rank's)."""
        cfg, m, seed = self.cfg, self.cfg.model, self.cfg.train.seed
        mode = teacher_targets.get(self.info.get("teacher_mode", "precomputed"))

        def windows(split: str, n: int, offset: int, base: int = seed):
            return self.text.batches(split, m.batch, m.seq_len, n, base + offset)

        def batches(split: str, n: int, offset: int, topk: bool = False, base: int = seed):
            return [self.targets(b, topk=topk) for b in windows(split, n, offset, base)]

        own = SHARD_SEED_STRIDE * shard
        return Data(train=mode.train_batches(self, windows("train", cfg.train.steps, 1 + own), shard),
                    bench=batches("train", self.bench_batches(), 2 + own, topk=mode.topk),
                    # the teacher's seed: students of every train.seed are measured on the same tokens
                    eval=batches("heldout", cfg.train.eval_batches, 3, base=teacher_seed(cfg)))

    def bench_batches(self) -> int:
        """How many distinct timed batches there are (they stay on the device, with their logits)."""
        return min(LM_BENCH_BATCHES, self.cfg.bench.warmup + self.cfg.bench.iters)

    def place_logits(self) -> None:
        """Decide, before any batch exists, where the training batches' teacher targets come from
        (distill.teacher_mode; 'auto': precomputed where its logits fit, else online) and where precomputed
        logits go (the GPU or pinned host memory), or refuse the run up front when neither can hold them;
        recorded in task.json."""
        cfg, m = self.cfg, self.cfg.model
        per_batch = m.batch * m.seq_len * m.vocab * (2 if self.tdtype is not None else 4)
        kept = self.bench_batches() + cfg.train.eval_batches
        gpu_free = torch.cuda.mem_get_info(self.device)[0] if self.device.type == "cuda" else None
        host_gb = _memory_gb()[1]
        # Every rank of this host (torchrun's LOCAL_WORLD_SIZE) pins its own training batches' logits, each
        # after every rank has placed them (the runner broadcasts the teacher first, a collective), so the
        # host's first rank judges the memory for all of them, before anything is pinned, and each other
        # rank its own share of it (if N*X fits 80% of what rank 0 saw, X fits 80% of what each sees).
        local = os.environ.get("LOCAL_RANK") in (None, "0")
        ranks = int(os.environ.get("LOCAL_WORLD_SIZE") or 1) if local else 1
        def place(train: int) -> str:  # train=0: only the timed and held-out batches' logits (online, topk)
            return place_teacher_logits(cfg.distill.teacher_logits, train * cfg.train.steps * per_batch,
                                        kept * per_batch, gpu_free, None if host_gb is None else int(host_gb * 2**30),
                                        host_ranks=ranks)

        d = cfg.distill
        mode, why, where = teacher_targets.choose(d.teacher_mode, place)
        self.info.update(teacher_mode=mode.name, teacher_mode_requested=d.teacher_mode, teacher_mode_reason=why,
                         **mode.record(cfg), teacher_logits=where,
                         teacher_logits_requested=d.teacher_logits,
                         teacher_logits_train_gib=round(cfg.train.steps * per_batch / 2**30, 3))

    def targets(self, window: torch.Tensor, host: bool = False, topk: bool = False):
        """(tokens, Targets) of a token window [batch, seq_len + 1]: the teacher's logits in its precision
        (`host`: in pinned host memory), or its top-k targets as the top-k store holds them (`topk`)."""
        tokens, next_tokens = window[:, :-1].to(self.device), window[:, 1:].to(self.device)
        with self.teacher_precision.forward():
            logits = self.teacher(tokens)
        check_teacher_output(logits, self.cfg)
        if topk:  # as the top-k store holds them (indices in its dtype)
            d = self.cfg.distill
            values, indices, rest = topk_store.topk_targets(logits, d.topk, d.temperature)
            return tokens, objectives.Targets(values, next_tokens=next_tokens, rest_lse=rest,
                                              indices=indices.to(topk_store.index_dtype(self.cfg.model.vocab)))
        if host:  # one batch at a time: all of them would not fit on the GPU
            if self.device.type == "cuda":  # pinned: the copy back to the GPU can then run asynchronously
                logits = torch.empty(logits.shape, dtype=logits.dtype, pin_memory=True).copy_(logits)
        return tokens, objectives.Targets(logits, next_tokens=next_tokens)

    def forward(self, model, tokens: torch.Tensor):
        """The student's output as the loss takes it: logits, or with loss_impl=fused_head the final hidden
        states and the head's weight (the head's GEMM runs inside the loss)."""
        return model(tokens, features=True) if self.loss_impl == "fused_head" else model(tokens)

    def loss(self, out, targets: objectives.Targets) -> torch.Tensor:
        if self.ce_only:
            return self._loss(out, None, targets.next_tokens, self.ce_only_distill)
        return self.matched_loss(out, targets)

    def matched_loss(self, out, targets: objectives.Targets) -> torch.Tensor:
        """The run's distillation loss, also for the no-KD student: its starting weights are checked
        against the others' with the same measure."""
        if targets.indices is not None:  # top-k teacher targets
            return lm_objectives.topk_lm_loss(out, targets, self.distill)
        return self._loss(out, targets.out, targets.next_tokens, self.distill)

    def _loss(self, out, teacher_logits, next_tokens, d) -> torch.Tensor:
        if d.loss_impl == "fused_head":
            return head_loss.head_fused_loss(out, teacher_logits, next_tokens, d)
        return lm_objectives.lm_loss(out, teacher_logits, next_tokens, d)

    @torch.no_grad()
    def evaluate(self, model, student, batches) -> dict[str, Any]:
        """Held-out cross-entropy and perplexity, KL(teacher‖student) at T=1 and top-1 agreement, and the
        teacher's own perplexity on the same tokens; fp32, token-weighted."""
        acc = lm_metrics.LMMetrics(self.cfg.distill.loss_chunk_tokens)
        for tokens, targets in batches:
            with student.forward_context():
                acc.add(model(tokens), targets.out, targets.next_tokens)
        return acc.result()

    def no_kd(self) -> "LMTask":
        """The same task with a cross-entropy-only loss: the student that shows what distillation adds."""
        other = copy.copy(self)
        other.ce_only = True
        return other
