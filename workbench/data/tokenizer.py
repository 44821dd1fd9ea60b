"""A Hugging Face model's own tokenizer for the corpus (needs the `lm` extra: transformers).

A pretrained teacher reads token ids that mean something only under its own tokenizer, so when `lm.teacher` or
`lm.student` is a local Hugging Face folder with one, the text is tokenized by it (`AutoTokenizer`, offline).
Teacher and student must then share it: the same tokens with the same ids, or the KL compares unrelated
distributions. Its identity is a hash of its files (`sha256`), which keys the text cache: the same tokenizer
moved to another folder finds its cache, an edited one does not.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from workbench.config import ConfigError

# what AutoTokenizer reads from a folder; a tokenizer's vocabulary is in one of the first three
VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
TOKENIZER_FILES = (*VOCAB_FILES, "merges.txt", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja")


def has_tokenizer(folder: str | Path) -> bool:
    """Whether a model folder holds a tokenizer (a file with its vocabulary)."""
    return any((Path(folder) / name).is_file() for name in VOCAB_FILES)


def files_sha256(folder: str | Path) -> str:
    """A hash of the tokenizer's files (names and bytes), in a fixed order: its identity, whatever its path."""
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = Path(folder) / name
        if path.is_file():
            h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


class PretrainedTokenizer:
    """The tokenizer saved in a model folder, loaded offline. `vocab_size` counts every token it can emit
    (added special tokens too); `eot_id` (its end-of-sequence token) ends every piece of text."""

    def __init__(self, folder: str | Path):
        from transformers import AutoTokenizer

        self.folder, self.sha256 = str(folder), files_sha256(folder)
        try:
            # never the folder's own code (an auto_map in tokenizer_config.json): transformers' tokenizers only
            self.hf = AutoTokenizer.from_pretrained(self.folder, local_files_only=True, trust_remote_code=False)
        except (OSError, ValueError, TypeError) as e:  # a damaged or foreign tokenizer: say which folder
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"the tokenizer in {self.folder!r} does not load (offline): {first}") from e
        self.vocab_size = len(self.hf)
        self.eot_id = self.hf.eos_token_id
        if self.eot_id is None:
            raise ConfigError(f"the tokenizer in {self.folder!r} has no end-of-sequence token (eos_token), which "
                              "separates the corpus's texts; set one in its tokenizer_config.json")

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # no BOS per piece (a piece is a window's middle, not a prompt); verbose=False: a piece is longer than
        # the tokenizer's model_max_length on purpose (windows are cut from the stream), no warning needed
        return self.hf(texts, add_special_tokens=False, verbose=False)["input_ids"]

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def decode(self, ids) -> str:
        return self.hf.decode([int(i) for i in ids])

    def info(self) -> dict:
        """What task.json and the text cache's meta.json record of it."""
        return {"tokenizer_path": self.folder, "tokenizer_sha256": self.sha256, "tokenizer_vocab": self.vocab_size}


@functools.lru_cache(maxsize=4)
def _load(folder: str, sha256: str) -> PretrainedTokenizer:
    return PretrainedTokenizer(folder)  # the hash in the key: a tokenizer changed on disk is read again


def load(folder: str | Path) -> PretrainedTokenizer:
    """The tokenizer in `folder`, loaded once per content (a run resolves its config, then builds its task)."""
    return _load(str(folder), files_sha256(folder))


def shared(folders: dict[str, str]) -> PretrainedTokenizer | None:
    """The one tokenizer of the Hugging Face folders ({field: folder}, the teacher's first) that have one, or
    None when none has. Two that differ (another vocabulary, or the same tokens under other ids) are refused,
    naming both folders: distillation compares the teacher's and the student's logits id by id."""
    found = {who: load(folder) for who, folder in folders.items() if has_tokenizer(folder)}
    if not found:
        return None
    (first_who, first), *others = found.items()
    for who, tok in others:
        if tok.sha256 != first.sha256 and tok.hf.get_vocab() != first.hf.get_vocab():
            a, b = first.hf.get_vocab(), tok.hf.get_vocab()
            diff = sorted(set(a.items()) ^ set(b.items()), key=lambda kv: kv[1])[:3]
            raise ConfigError(
                f"{first_who} ({first.folder}) and {who} ({tok.folder}) have different tokenizers ({len(a)} and "
                f"{len(b)} tokens; first differing token/id pairs {diff}): teacher and student must share one "
                "(the same tokens under the same ids); give both models the same tokenizer, or set lm.tokenizer=bpe "
                "to tokenize the text with a BPE trained here")
    return first
