"""What an LM run decides from its config before any model exists: the vocabulary (a Hugging Face teacher's
or student's), the tokenizer the text is read with, the seeds (the teacher's, a data-parallel rank's
batches), and the guard on the teacher's outputs that every task's targets pass."""
from __future__ import annotations

import torch

from workbench.config import ConfigError
from workbench.models import kinds

SHARD_SEED_STRIDE = 7919  # a data-parallel rank's batch seeds: seed + offset + this x rank (apart from rank 0's)


def resolve_lm(cfg):
    """The config with model.vocab from its Hugging Face teacher / student (their embeddings must agree), after
    checking their tokenizers up front (a shared one, no larger than the embedding). Other configs as they are."""
    folders = cfg.lm.hf_folders() if kinds.is_lm(cfg.model.kind) else {}
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

    folders = cfg.lm.hf_folders() if kinds.is_lm(cfg.model.kind) else {}
    if not folders:
        return None, None
    if cfg.lm.tokenizer != "auto":
        with_one = [f"{who} ({f})" for who, f in folders.items() if hf_tokenizer.has_tokenizer(f)]
        return None, (f"lm.tokenizer={cfg.lm.tokenizer!r}: the text is not tokenized by the tokenizer of "
                      f"{' and '.join(with_one)}, so a pretrained model reads ids it never learned"
                      if with_one else None)
    tok = hf_tokenizer.shared(folders)
    if tok is None:
        return None, (f"{' and '.join(f'{who} ({f})' for who, f in folders.items())} has no tokenizer: the text is "
                      "tokenized by a BPE trained here, whose ids a pretrained model never learned")
    return tok, None


def teacher_seed(cfg) -> int:
    """The seed of the LM teacher and of the held-out batches: lm.teacher_seed, or train.seed when it is -1."""
    return cfg.lm.teacher_seed if cfg.lm.teacher_seed >= 0 else cfg.train.seed


def check_teacher_output(out: torch.Tensor, cfg) -> None:
    """Refuse the run when the teacher's outputs (every student's targets) are not finite: no student can
    learn from them, and each would otherwise be blamed for what the teacher did. One fp32 sum per batch:
    it is finite exactly when every value is (a logit is far below the float32 range)."""
    if not torch.isfinite(out.sum(dtype=torch.float32)):
        lm = cfg.lm
        source = ("" if not kinds.is_lm(cfg.model.kind) else
                  f", lm.teacher={lm.teacher!r}"
                  + (f", lm.teacher_lr={lm.teacher_lr}" if lm.teacher == "train" else ""))
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

