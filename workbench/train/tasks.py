"""What a run distils. A task owns the teacher, the reference student every backend converts a copy of,
the batches with the teacher's targets, the loss and the held-out evaluation; one trainer runs them all.

  MLPTask  the tutorial's: MLP blocks on random tokens, the student regresses the teacher's output.
  LMTask   a causal LM (gpt / llama, or your Hugging Face model) distilled on real text: KL on the
           logits mixed with cross-entropy; held-out perplexity, KL to the teacher, top-1 agreement.

Teacher targets are computed once per batch before any student trains (distill.teacher_mode precomputed,
topk) or by the teacher's forward as a batch is fetched (online: teacher_targets), never inside a timed step.
"""
from __future__ import annotations

import collections.abc
import copy
import dataclasses
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from workbench import backends
from workbench.data import cache
from workbench.env.probe import _memory_gb
from workbench.config import ConfigError
from workbench.models import Student, Teacher, reference_student
from workbench.train import head_loss, lm_metrics, lm_objectives, objectives, teacher_precision, teacher_targets
from workbench.train.loop import Data

LM_BENCH_BATCHES = 4  # distinct timed batches, cycled: an LM batch's teacher logits take GBs at vocab 32k
SHARD_SEED_STRIDE = 7919  # a data-parallel rank's batch seeds: seed + offset + this x rank (apart from rank 0's)
GPU_LOGITS_SHARE = 0.6  # of the GPU's free memory, for teacher logits: the rest is the students'
HOST_LOGITS_SHARE = 0.8  # of the host's available memory (pinned pages cannot be swapped out)


def resolve_lm(cfg):
    """The config with model.vocab from its Hugging Face teacher / student (their embeddings must agree), after
    checking their tokenizers up front (a shared one, no larger than the embedding). Other configs as they are."""
    folders = cfg.lm.hf_folders() if cfg.model.kind != "mlp" else {}
    if not folders:
        return cfg
    from workbench.models.hf import check_folder, config_vocab

    for who, folder in folders.items():  # a folder that is no model is named before anything reads its vocabulary
        check_folder(folder, who, cfg.model.seq_len)
    vocabs = {who: config_vocab(folder) for who, folder in folders.items()}
    if len(set(vocabs.values())) > 1:
        raise ConfigError("the Hugging Face teacher and student have different vocabularies: " + ", ".join(
            f"{who} ({folders[who]}) {v} tokens" for who, v in vocabs.items()) + "; distillation compares their "
            "logits token by token, so both need the same vocabulary")
    vocab = next(iter(vocabs.values()))
    if cfg.lm.tokenizer == "bytes" and vocab < 256:
        raise ConfigError(f"lm.tokenizer=bytes needs 256 token ids, the model's embedding has {vocab} rows")
    tok, _ = lm_tokenizer(cfg)
    if tok is not None and tok.vocab_size > vocab:
        raise ConfigError(f"the tokenizer in {tok.folder} has {tok.vocab_size} tokens, more than the model's embedding "
                          f"({vocab} rows, vocab_size in {', '.join(folders.values())}): its ids would index past it")
    return cfg if cfg.model.vocab == vocab else cfg.replace(**{"model.vocab": vocab})


def lm_tokenizer(cfg):
    """(the Hugging Face tokenizer the text is tokenized with, or None; the warning every row carries, or
    None): lm.tokenizer 'auto' takes the teacher's or student's own, refusing two that differ."""
    from workbench.data import tokenizer as hf_tokenizer

    folders = cfg.lm.hf_folders() if cfg.model.kind != "mlp" else {}
    if not folders:
        return None, None
    if cfg.lm.tokenizer != "auto":
        with_one = [f"{who} ({f})" for who, f in folders.items() if hf_tokenizer.has_tokenizer(f)]
        return None, (f"lm.tokenizer={cfg.lm.tokenizer!r}: the text is not tokenized by the tokenizer of "
                      f"{' and '.join(with_one)}, so a pretrained model reads ids it never learned" if with_one else None)
    tok = hf_tokenizer.shared(folders)
    if tok is None:
        return None, (f"{' and '.join(f'{who} ({f})' for who, f in folders.items())} has no tokenizer: the text is "
                      "tokenized by a BPE trained here, whose ids a pretrained model never learned")
    return tok, None


def teacher_seed(cfg) -> int:
    """The seed of the LM teacher and of the held-out batches: lm.teacher_seed, or train.seed when it is -1."""
    return cfg.lm.teacher_seed if cfg.lm.teacher_seed >= 0 else cfg.train.seed


def for_config(cfg, device: torch.device, tdtype, cache_dir: str | Path) -> "MLPTask | LMTask":
    return MLPTask(cfg, device, tdtype) if cfg.model.kind == "mlp" else LMTask(cfg, device, tdtype, cache_dir)


class MLPTask:
    """The tutorial's set-up (REFERENCE §1): random tokens, the teacher's output as the regression target."""

    def __init__(self, cfg, device: torch.device, tdtype):
        self.cfg, self.device, self.tdtype = cfg, device, tdtype
        self.kind = cfg.distill.loss
        self.needs_hidden = objectives.needs_hidden(self.kind)
        torch.manual_seed(cfg.train.seed)
        self.teacher = Teacher(cfg.model).to(device).eval().requires_grad_(False)
        # The one torch model every student is a converted copy of (matched init by construction)
        self.reference = reference_student(cfg.model, Student(cfg.model).state_dict())
        self.teacher, self.teacher_precision = teacher_precision.prepare(self.teacher, cfg, device, tdtype)
        self.info: dict[str, Any] = self.teacher_precision.info()

    def cells(self) -> dict[str, Any]:
        """What every student row of the run carries from its task."""
        return self.teacher_precision.cells()

    def forward(self, model, tokens: torch.Tensor):
        """The student's output as the loss takes it (with every block's state for loss='hidden')."""
        return model(tokens, return_hidden=True) if self.needs_hidden else model(tokens)

    def loss(self, out, targets: objectives.Targets) -> torch.Tensor:
        return objectives.loss(self.kind, out, targets)

    matched_loss = loss  # the measure of a student's starting weights (see loop.initial_loss)

    def make_data(self, shard: int = 0) -> Data:
        """Random-token batches from a seeded generator and the teacher's targets, computed once. `shard`:
        a data-parallel rank's own training and timed batches (the held-out ones are every rank's)."""
        cfg, m = self.cfg, self.cfg.model
        gen = torch.Generator().manual_seed(cfg.train.seed + 1)

        def tokens(n: int):
            return [torch.randint(0, m.vocab, (m.batch, m.seq_len), generator=gen) for _ in range(n)]

        train, bench, held_out = tokens(cfg.train.steps), tokens(cfg.bench.warmup + cfg.bench.iters), tokens(cfg.train.eval_batches)
        if shard:
            gen = torch.Generator().manual_seed(cfg.train.seed + 1 + SHARD_SEED_STRIDE * shard)
            train, bench = tokens(cfg.train.steps), tokens(cfg.bench.warmup + cfg.bench.iters)
        return Data(*([self._targets(t.to(self.device)) for t in part] for part in (train, bench, held_out)))

    def _targets(self, tokens: torch.Tensor):
        with self.teacher_precision.forward():
            y = self.teacher(tokens, return_hidden=self.needs_hidden)
        out, hidden = y if self.needs_hidden else (y, None)
        check_teacher_output(out, self.cfg)
        return tokens, objectives.Targets(out.float(), [h.float() for h in hidden] if hidden else None)

    @torch.no_grad()
    def evaluate(self, model, backend, batches) -> dict[str, Any]:
        """Mean output MSE against the teacher on held-out batches (the tutorial's eval), in fp32."""
        vals = []
        for tokens, targets in batches:
            with backend.forward_context():
                vals.append(float(objectives.mse(model(tokens), targets.out)))
        return {"eval_mse": sum(vals) / len(vals)}

    def no_kd(self) -> None:
        return None  # regression on the teacher's output has no teacher-free counterpart


class LMTask:
    """A causal LM student distilled from a causal LM teacher on the offline corpus (or your text)."""

    def __init__(self, cfg, device: torch.device, tdtype, cache_dir: str | Path, ce_only: bool = False,
                 with_batches: bool = True):
        from workbench.data import TextSpec, load_text

        cfg = resolve_lm(cfg)  # model.vocab from a Hugging Face model (runner.run has done it already)
        self.cfg, self.device, self.tdtype, self.cache_dir = cfg, device, tdtype, Path(cache_dir)
        self.needs_hidden, self.ce_only = False, ce_only
        m, lm = cfg.model, cfg.lm
        pretrained, self.tokenizer_warning = lm_tokenizer(cfg)
        kind = "pretrained" if pretrained else "bpe" if lm.tokenizer == "auto" else lm.tokenizer
        self.text = load_text(TextSpec(files=tuple(lm.corpus_files), max_bytes=int(lm.corpus_mb * 1e6), tokenizer=kind,
                                       vocab_size=bpe_vocab(m.vocab) if kind == "bpe" else 256,
                                       heldout_fraction=lm.heldout_fraction,
                                       pretrained=pretrained.folder if pretrained else ""), self.cache_dir)
        for split, n in ((s, len(t)) for s, t in self.text.tokens.items()):  # every batch is a window of seq_len + 1 tokens
            if n < m.seq_len + 1:
                raise ConfigError(f"the text's {split} split has {n} tokens, fewer than model.seq_len + 1 = "
                                  f"{m.seq_len + 1}: raise lm.corpus_mb ({lm.corpus_mb})"
                                  + (" or lm.heldout_fraction" if split == "heldout" else "") + ", give more "
                                  "lm.corpus_files, or lower model.seq_len")
        d = cfg.distill
        # one implementation for every student of the run, the no-KD one included (its CE alone could always be fused)
        self.loss_impl = lm_objectives.resolve_impl(d.loss, d.loss_impl, device)  # refuses a fused one that cannot run
        if d.teacher_mode == "topk":  # its KD loss runs over the top-k buckets, checkpointed (config refuses fused)
            self.loss_impl = "checkpointed"
        self.info = {"text_folder": str(self.text.folder),
                     "tokenizer": {"pretrained": "pretrained", "bpe": "trained-here BPE"}.get(kind, kind),
                     **(pretrained.info() if pretrained else {}), "tokenizer_vocab": self.text.vocab_size,
                     "tokenizer_warning": self.tokenizer_warning, "model_vocab": m.vocab,
                     "loss_impl": self.loss_impl, "loss_impl_requested": d.loss_impl}
        torch.manual_seed(teacher_seed(cfg))
        self.teacher = self._teacher().to(device).eval().requires_grad_(False)
        torch.manual_seed(cfg.train.seed)  # the students' init does not depend on how the teacher came to be
        self.reference = self._student()
        self.teacher, self.teacher_precision = teacher_precision.prepare(self.teacher, cfg, device, tdtype)
        self.info.update(self.teacher_precision.info())
        if with_batches:  # False for `workbench teacher`: no training batch, so no logits to place or refuse over
            self.place_logits()  # now, with the teacher on the device: task.json is written before the batches

    def cells(self) -> dict[str, Any]:
        """What every student row of the run carries from its task: the teacher's precision, the logit loss,
        the tokenizer, where the teacher's targets came from."""
        return {**self.teacher_precision.cells(), "loss_impl": self.loss_impl, "tokenizer": self.info["tokenizer"],
                "tokenizer_sha256": self.info.get("tokenizer_sha256"), "tokenizer_warning": self.tokenizer_warning,
                **{k: self.info.get(k) for k in ("teacher_mode", "teacher_mode_reason", "teacher_topk")}}

    # ---- models ---------------------------------------------------------------------------------
    def shape(self, teacher: bool = False):
        from workbench.models import LMShape

        m, lm = self.cfg.model, self.cfg.lm
        if not teacher:
            return LMShape(kind=m.kind, vocab=m.vocab, hidden=m.hidden, intermediate=m.intermediate, layers=m.layers,
                           heads=m.heads, seq_len=m.seq_len)
        hidden = lm.teacher_hidden or m.hidden
        # unset teacher fields follow the student's proportions (MLP ratio, head size) at the teacher's width
        intermediate = lm.teacher_intermediate or int(hidden * m.intermediate / m.hidden)
        heads = lm.teacher_heads or max(1, hidden // (m.hidden // m.heads))
        return LMShape(kind=m.kind, vocab=m.vocab, hidden=hidden, intermediate=intermediate,
                       layers=lm.teacher_layers or m.layers, heads=heads, seq_len=m.seq_len)

    def _student(self) -> torch.nn.Module:
        from workbench.models import CausalLM

        if self.cfg.lm.student:
            from workbench.models.hf import load_causal_lm

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
        return self._trained_teacher()

    def _trained_teacher(self) -> torch.nn.Module:
        """A teacher trained on the corpus's train split, cached under <cache>/teacher-<key>/ (its weights,
        and meta.json last) and reused by every later run with the same text, shape and recipe. The recipe
        names the autocast it trains in: teacher_precision=fp8 trains in bf16 (fp32 on a CPU) and so finds
        the bf16 (fp32) teacher's weights, which it then runs in FP8; only weights are cached, never outputs."""
        from workbench.models import CausalLM

        cfg, shape = self.cfg, self.shape(teacher=True)
        recipe = {"shape": dataclasses.asdict(shape), "text": self.text.folder.name, "steps": cfg.lm.teacher_steps,
                  "lr": cfg.lm.teacher_lr, "seed": teacher_seed(cfg), "batch": cfg.model.batch,
                  "train_precision": teacher_precision.NAMES[self.tdtype]}
        key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
        entry = cache.Entry(self.cache_dir / f"teacher-{key}")
        model = CausalLM(shape)
        self.info["teacher_checkpoint"] = str(entry.folder)
        if entry.read() is None:
            with entry.building() as meta:  # checks the cache writable before training; waits for another builder
                if meta is None:
                    return self._train_teacher(model, entry, recipe)
        model.load_state_dict(torch.load(entry.folder / "teacher.pt", map_location="cpu", weights_only=True))
        self.info["teacher_cached"] = True
        return model

    def _train_teacher(self, model: torch.nn.Module, entry, recipe: dict) -> torch.nn.Module:
        """Train the teacher, refuse it when its loss is not finite, and cache it; a teacher that cannot be
        cached (a full disk) is still used, and task.json says why it was not kept."""
        cfg, t0 = self.cfg, time.monotonic()
        losses = train_lm(model, self.text.batches("train", cfg.model.batch, cfg.model.seq_len, cfg.lm.teacher_steps,
                                                   teacher_seed(cfg) + 7), cfg.lm.teacher_lr, self.device, self.tdtype)
        bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
        if bad is not None:
            raise ConfigError(f"the teacher trained here diverged: its training loss is {losses[bad]} at step {bad + 1} "
                              f"of lm.teacher_steps={cfg.lm.teacher_steps} (lm.teacher_lr={cfg.lm.teacher_lr}); lower "
                              "lm.teacher_lr. It was not cached")
        train_s = time.monotonic() - t0
        self.info.update(teacher_cached=False, teacher_train_s=round(train_s, 2), teacher_final_loss=losses[-1])
        try:
            entry.write_file("teacher.pt", lambda f: torch.save(model.state_dict(), f))
            entry.commit({**recipe, "final_loss": losses[-1], "train_s": train_s})
        except OSError as e:  # the temporary file is gone (results.write_with); the teacher is still good
            self.info["teacher_cache_error"] = f"not cached: {type(e).__name__}: {e}"
            print(f"[teacher] trained, but {entry.folder} could not be written ({e}); using it without caching",
                  flush=True)
        return model

    # ---- data, loss, evaluation -----------------------------------------------------------------
    def make_data(self, shard: int = 0) -> Data:
        """The training, bench and held-out batches with their teacher targets. The training batches' come as
        distill.teacher_mode says (`self.info['teacher_mode']`, decided in `place_logits`): precomputed logits
        where `self.info['teacher_logits']` says, the online teacher, or the top-k store. The bench (timed) and
        held-out batches always stay on the device, with full logits (top-k ones for the timed batches of a
        top-k run, so its timed step runs its loss). `shard`: a data-parallel rank's own training and timed
        batches (the held-out ones are every rank's)."""
        cfg, m, seed = self.cfg, self.cfg.model, self.cfg.train.seed
        mode = self.info.get("teacher_mode", "precomputed")
        on_host = self.info.get("teacher_logits") == "host"

        def windows(split: str, n: int, offset: int, base: int = seed):
            return self.text.batches(split, m.batch, m.seq_len, n, base + offset)

        def batches(split: str, n: int, offset: int, host: bool = False, topk: bool = False, base: int = seed):
            return [self._targets(b, host, topk) for b in windows(split, n, offset, base)]

        own = SHARD_SEED_STRIDE * shard
        if mode == "online":
            train = teacher_targets.OnlineBatches(windows("train", cfg.train.steps, 1 + own), self._targets)
        elif mode == "topk":
            train = teacher_targets.TopKBatches(self._topk_store(windows("train", cfg.train.steps, 1 + own), shard),
                                                self.device)
        else:
            train = batches("train", cfg.train.steps, 1 + own, host=on_host)
            train = HostBatches(train, self.device) if on_host else train
        return Data(train=train, bench=batches("train", self.bench_batches(), 2 + own, topk=mode == "topk"),
                    # the teacher's seed: students of every train.seed are measured on the same tokens
                    eval=batches("heldout", cfg.train.eval_batches, 3, base=teacher_seed(cfg)))

    def topk_recipe(self, shard: int = 0) -> dict[str, Any]:
        """What a top-k store's content depends on; its folder name is a hash of it."""
        cfg, m = self.cfg, self.cfg.model
        teacher = {k: self.info.get(k) for k in ("teacher_source", "teacher_checkpoint")}
        if cfg.lm.teacher == "random":
            teacher["shape"] = dataclasses.asdict(self.shape(teacher=True))
        return {"teacher": teacher, "teacher_precision": self.teacher_precision.used, "text": self.text.folder.name,
                "seed": cfg.train.seed, "shard": shard, "steps": cfg.train.steps, "batch": m.batch,
                "seq_len": m.seq_len, "k": cfg.distill.topk, "vocab": m.vocab, "temperature": cfg.distill.temperature,
                "value_dtype": str(self.tdtype or torch.float32).removeprefix("torch.")}

    def _topk_store(self, windows: list[torch.Tensor], shard: int) -> teacher_targets.TopKStore:
        """The training batches' top-k store: found in the cache folder, or built there now (and rebuilt where
        it is damaged); task.json says where and why."""
        recipe = self.topk_recipe(shard)
        folder = teacher_targets.store_folder(self.cache_dir, recipe)

        def logits(window: torch.Tensor) -> torch.Tensor:
            with self.teacher_precision.forward():
                return self.teacher(window[:, :-1].to(self.device))

        store, why = teacher_targets.ensure_store(folder, recipe, lambda: teacher_targets.build_store(
            folder, recipe, windows, logits))
        self.info.update(teacher_topk_store=str(folder), teacher_topk_store_gib=round(store.layout.nbytes() / 2**30, 4),
                         teacher_topk_rebuilt=why or None)
        return store

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
        mode, why, where = teacher_targets.choose_mode(d.teacher_mode, place)
        self.info.update(teacher_mode=mode, teacher_mode_requested=d.teacher_mode, teacher_mode_reason=why,
                         teacher_topk=d.topk if mode == "topk" else None, teacher_logits=where,
                         teacher_logits_requested=d.teacher_logits,
                         teacher_logits_train_gib=round(cfg.train.steps * per_batch / 2**30, 3))

    def _targets(self, window: torch.Tensor, host: bool = False, topk: bool = False):
        tokens, next_tokens = window[:, :-1].to(self.device), window[:, 1:].to(self.device)
        with self.teacher_precision.forward():
            logits = self.teacher(tokens)
        check_teacher_output(logits, self.cfg)
        if topk:  # as the top-k store holds them (indices in its dtype)
            d = self.cfg.distill
            values, indices, rest = teacher_targets.topk_targets(logits, d.topk, d.temperature)
            return tokens, objectives.Targets(values, next_tokens=next_tokens, rest_lse=rest,
                                              indices=indices.to(teacher_targets.index_dtype(self.cfg.model.vocab)))
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
            return self._loss(out, None, targets.next_tokens, ce_weight=1.0)
        return self.matched_loss(out, targets)

    def matched_loss(self, out, targets: objectives.Targets) -> torch.Tensor:
        """The run's distillation loss, also for the no-KD student: its starting weights are checked
        against the others' with the same measure."""
        d = self.cfg.distill
        if targets.indices is not None:  # top-k teacher targets
            return lm_objectives.topk_lm_loss(out, targets.out, targets.indices, targets.rest_lse, targets.next_tokens,
                                              kind=d.loss, temperature=d.temperature, ce_weight=d.ce_weight,
                                              beta=d.jsd_beta, chunk_tokens=d.loss_chunk_tokens)
        return self._loss(out, targets.out, targets.next_tokens, ce_weight=d.ce_weight)

    def _loss(self, out, teacher_logits, next_tokens, ce_weight: float) -> torch.Tensor:
        d = self.cfg.distill
        if self.loss_impl == "fused_head":
            return head_loss.head_fused_loss(out, teacher_logits, next_tokens, temperature=d.temperature,
                                             ce_weight=ce_weight, chunk_tokens=d.loss_chunk_tokens)
        return lm_objectives.lm_loss(out, teacher_logits, next_tokens, kind=d.loss, temperature=d.temperature,
                                     ce_weight=ce_weight, beta=d.jsd_beta, chunk_tokens=d.loss_chunk_tokens,
                                     impl=self.loss_impl)

    @torch.no_grad()
    def evaluate(self, model, backend, batches) -> dict[str, Any]:
        """Held-out cross-entropy and perplexity, KL(teacher‖student) at T=1 and top-1 agreement, and the
        teacher's own perplexity on the same tokens; fp32, token-weighted."""
        acc = lm_metrics.LMMetrics(self.cfg.distill.loss_chunk_tokens)
        for tokens, targets in batches:
            with backend.forward_context():
                acc.add(model(tokens), targets.out, targets.next_tokens)
        return acc.result()

    def no_kd(self) -> "LMTask":
        """The same task with a cross-entropy-only loss: the student that shows what distillation adds."""
        other = copy.copy(self)
        other.ce_only = True
        return other


def check_teacher_output(out: torch.Tensor, cfg) -> None:
    """Refuse the run when the teacher's outputs (every student's targets) are not finite: no student can
    learn from them, and each would otherwise be blamed for what the teacher did. One fp32 sum per batch:
    it is finite exactly when every value is (a logit is far below the float32 range)."""
    if not torch.isfinite(out.sum(dtype=torch.float32)):
        lm = cfg.lm
        source = ("" if cfg.model.kind == "mlp" else
                  f", lm.teacher={lm.teacher!r}" + (f", lm.teacher_lr={lm.teacher_lr}" if lm.teacher == "train" else ""))
        raise ConfigError(f"the teacher's outputs are not finite (NaN or inf), so no student can train on them "
                          f"(distill.teacher_precision={cfg.distill.teacher_precision!r}{source}): try "
                          "teacher_precision=fp32 or bf16 (fp16 overflows), or another teacher")


def bpe_vocab(vocab: int) -> int:
    """The size a BPE trained here gets for an embedding of `vocab` rows: the largest multiple of 64 that fits
    (a Hugging Face model's vocabulary need not be one; a padded embedding is fine)."""
    if vocab < 320:
        raise ConfigError(f"model.vocab={vocab} (the Hugging Face model's vocab_size) is too small for a BPE trained "
                          "here (at least 320: 256 bytes, end of text, merges); set lm.tokenizer=bytes")
    return vocab - vocab % 64


def place_teacher_logits(choice: str, train_bytes: int, kept_bytes: int, gpu_free: int | None,
                         host_available: int | None, host_ranks: int = 1) -> str:
    """Where the training batches' teacher logits live: 'gpu' or 'host' (pinned memory, copied to the GPU
    per step). `kept_bytes` (the bench and held-out batches' logits) are always on the GPU. `choice` is
    distill.teacher_logits; `gpu_free` is None on a CPU run (there 'gpu' is the run's device, no limit is
    checked), `host_available` None where unknown; `host_ranks` ranks on this host each pin their own
    `train_bytes` in that memory. Raises ConfigError, with the GiB needed and available,
    when the placement cannot hold them."""
    gib = 2**30
    if gpu_free is not None:
        budget = GPU_LOGITS_SHARE * gpu_free
        if kept_bytes > budget:
            raise ConfigError(f"the teacher's logits of the timed and held-out batches need {kept_bytes / gib:.1f} GiB on "
                              f"the GPU, {gpu_free / gib:.1f} GiB are free; lower train.eval_batches, model.batch or "
                              "model.seq_len")
        fits_gpu = train_bytes + kept_bytes <= budget
        if choice == "gpu" and not fits_gpu:
            raise ConfigError(f"distill.teacher_logits='gpu': the teacher's logits need {(train_bytes + kept_bytes) / gib:.1f} "
                              f"GiB on the GPU, {gpu_free / gib:.1f} GiB are free ({GPU_LOGITS_SHARE:.0%} of it is their "
                              "budget); set distill.teacher_logits=host or auto, or lower train.steps, model.batch or "
                              "model.seq_len")
        if choice == "auto":
            choice = "gpu" if fits_gpu else "host"
    elif choice == "auto":
        choice = "gpu"
    if choice == "host" and host_available is not None and host_ranks * train_bytes > HOST_LOGITS_SHARE * host_available:
        gpu = "" if gpu_free is None else f"the GPU has {gpu_free / gib:.1f} GiB free, "
        each = f" on each of this host's {host_ranks} ranks" if host_ranks > 1 else ""
        raise ConfigError(f"the teacher's logits of the training batches ({train_bytes / gib:.1f} GiB{each}) fit neither place: "
                          f"{gpu}the host {host_available / gib:.1f} GiB available ({HOST_LOGITS_SHARE:.0%} of it is "
                          "their budget); lower train.steps, model.batch or model.seq_len")
    return choice


class HostBatches(collections.abc.Sequence):
    """Training batches whose teacher logits live in pinned host memory: each is copied to the device when it
    is used. Iterating (the training loop) copies batch i+1 on a side stream while step i runs, non-blocking,
    so the steps wait for no copy; indexing (a sample batch for capture or the initial loss) copies at once.
    On a CPU run the copies are the tensors themselves."""

    def __init__(self, batches: list, device: torch.device):
        self.batches, self.device = batches, device

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int):
        tokens, t = self.batches[i]
        return tokens, dataclasses.replace(t, out=t.out.to(self.device))

    def shared_tensors(self) -> list[torch.Tensor]:
        """What every student is handed itself (tokens, next tokens): the logits only as fresh device copies."""
        return [x for tokens, t in self.batches for x in (tokens, *(v for v in t.tensors() if v is not t.out))]

    def __iter__(self):
        if self.device.type != "cuda" or not self.batches:
            yield from (self[i] for i in range(len(self)))
            return
        main, side = torch.cuda.current_stream(self.device), torch.cuda.Stream(self.device)

        def fetch(i: int):
            tokens, t = self.batches[i]
            with torch.cuda.stream(side):
                return tokens, dataclasses.replace(t, out=t.out.to(self.device, non_blocking=True))

        ahead = fetch(0)
        for i in range(len(self)):
            batch = ahead
            main.wait_stream(side)  # its copy is done before the step reads it
            batch[1].out.record_stream(main)  # allocated on the side stream, used (and freed) on this one
            if i + 1 < len(self):
                ahead = fetch(i + 1)  # overlaps the step the caller runs on `batch`
            yield batch


def progress_every(steps: int) -> int:
    """Steps between progress lines of a training loop: about four lines, never more often than every 10 steps."""
    return max(10, math.ceil(steps / 4))


def train_lm(model: torch.nn.Module, windows: list[torch.Tensor], lr: float, device: torch.device, dtype,
             say=print) -> list[float]:
    """Next-token training (cross-entropy) of a teacher on token windows [batch, seq+1]; returns the losses.
    `say` gets a progress line every `progress_every` steps (a teacher trains for minutes at some presets)."""
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    losses = []
    for w in windows:
        w = w.to(device)
        with backends.autocast(device, dtype):
            logits = model(w[:, :-1])
        # checkpointed, whatever distill.loss_impl: a cached teacher's recipe (its key) does not name the loss
        loss = lm_objectives.lm_loss(logits, None, w[:, 1:], ce_weight=1.0, impl="checkpointed")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        every = progress_every(len(windows))
        if say and len(losses) % every == 0 and len(losses) < len(windows):
            say(f"[teacher] training step {len(losses)}/{len(windows)}, loss {losses[-1]:.4g}")
    return losses
