"""distill.teacher_mode=topk: the teacher's k largest logits, their ids and the log-sum-exp of the rest per
token, computed once into a store in the cache folder (topk_store.py: its files, a data.cache entry checked on
use and built under its lock) and streamed to the GPU a step ahead. steps x tokens x k on disk, a few pinned
buffers in memory. The KD loss runs over the k tokens plus one tail bucket (lm_objectives.topk_lm_loss),
checkpointed; the store is read, never recomputed, so every student sees the same targets."""
from __future__ import annotations

from typing import Any

import torch

from workbench.config import ConfigError
from workbench.train.teacher_targets import TeacherMode, register, topk_store


class TopK(TeacherMode):
    name = "topk"
    topk = True
    stores_targets = True
    loss_impls = ("checkpointed",)  # its loss folds the student's logits onto the k + 1 buckets under autograd

    def check(self, cfg: Any) -> None:
        d, vocab = cfg.distill, cfg.model.vocab
        if d.topk > vocab:
            raise ConfigError(f"distill.topk={d.topk} must be at most model.vocab={vocab}")
        if d.loss_impl not in ("auto", *self.loss_impls):
            raise ConfigError(f"distill.teacher_mode='topk' runs the checkpointed loss over the top-k; "
                              f"distill.loss_impl={d.loss_impl!r} needs full teacher logits: set "
                              "distill.loss_impl=auto or checkpointed, or distill.teacher_mode=online")

    def train_batches(self, task, windows, shard):
        return topk_store.TopKBatches(_store(task, windows, shard), task.device)


def recipe(task, shard: int = 0) -> dict[str, Any]:
    """What a top-k store's content depends on; its folder name is a hash of it."""
    cfg, m = task.cfg, task.cfg.model
    # what the teacher is (its architecture and weights' hash), never where it came from: a path or a seed
    # alone let a store be reused for another teacher
    teacher = {"weights_sha256": task.info["teacher_weights_sha256"]}
    return {"teacher": teacher, "teacher_precision": task.teacher_precision.used, "text": task.text.folder.name,
            "tokenizer": task.info.get("tokenizer_sha256") or task.info["tokenizer"],
            "seed": cfg.train.seed, "shard": shard, "steps": cfg.train.steps, "batch": m.batch,
            "seq_len": m.seq_len, "k": cfg.distill.topk, "vocab": m.vocab, "temperature": cfg.distill.temperature,
            "value_dtype": str(task.tdtype or torch.float32).removeprefix("torch.")}


def _store(task, windows: list[torch.Tensor], shard: int) -> topk_store.TopKStore:
    """The training batches' top-k store: found in the cache folder, or built there now (and rebuilt where
    it is damaged); task.json says where and why."""
    spec = recipe(task, shard)
    folder = topk_store.store_folder(task.cache_dir, spec)

    def logits(window: torch.Tensor) -> torch.Tensor:
        with task.teacher_precision.forward():
            return task.teacher(window[:, :-1].to(task.device))

    store, why = topk_store.ensure_store(folder, spec, lambda: topk_store.build_store(folder, spec, windows, logits))
    nbytes = store.layout.nbytes()
    task.info.update(teacher_topk_store=str(folder), teacher_topk_key=topk_store.store_key(spec),
                     teacher_topk_store_bytes=nbytes,
                     teacher_topk_store_gib=round(nbytes / 2**30, 4), teacher_topk_rebuilt=why or None)
    return store


register(TopK())
