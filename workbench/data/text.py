"""Real text, offline: a corpus, a tokenizer trained on it, a train / held-out split and token batches.

The built-in corpus needs no download: every Python install carries `pydoc_data.topics` (~465K characters of
the language reference's prose) and the standard library's own sources (~12 MB of .py outside tests and
site-packages). It takes the topics, then the sources in sorted path order, then -- for a corpus larger than
those -- the installed packages' own Python sources (site-packages, tests left out; 161 MB on the CPU machine
with torch, results/reference/cpu/corpus_tokens.json), until `max_bytes` of UTF-8. A teacher several times the
student's size needs that much: on the 12 MB of the standard library alone it learns its training text by heart
(H200: train loss 0.99 against 2.43 nats held out after 4,000 steps, results/reference/h200/quality/long_3200/)
and its students pass it. Or
`files` names the user's own text files (paths or globs, `**` allowed), read in sorted order.

Documents are cut into pieces of about PIECE_CHARS characters at line ends; a piece goes to the held-out
split when a hash of its name ("stdlib/json/decoder.py#0") falls below `heldout_fraction`. So the split is
disjoint, does not move when other documents join the corpus, and a single long file still splits. The
tokenizer (Hugging Face `tokenizers` byte-level BPE, or raw bytes) is trained on the train split only; or it is
a model's own ('pretrained': the tokenizer saved in a Hugging Face folder, see workbench.data.tokenizer).

Everything lands in <cache_dir>/text-<key>/, the key a hash of the corpus text, the tokenizer (a pretrained
one: the hash of its files) and the split: tokenizer.json, train.npy, heldout.npy, then meta.json last (its
presence means the folder is complete; it records each file's size and sha256). A later call with the same
key reads it back instead of training again; a damaged entry is rebuilt, and two processes building one
entry take turns (workbench.data.cache).
"""
from __future__ import annotations

import codecs
import glob
import hashlib
import io
import json
import pydoc_data.topics
import sysconfig
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from workbench.config import ConfigError
from workbench.data import cache
from workbench.data.tokenizer import PretrainedTokenizer
from workbench.data.tokenizer import load as load_pretrained
from workbench.results import read_json

try:
    import tokenizers
except ImportError:  # the `lm` extra is optional: raw bytes still work
    tokenizers = None

TOKENIZERS = ("bpe", "bytes", "pretrained")
SPLITS = ("train", "heldout")
EOT = "<|endoftext|>"  # ends every piece: the model sees where one text stops and an unrelated one starts
BYTES_EOT = 0  # the bytes tokenizer's end of text: NUL, which text files do not contain
PIECE_CHARS = 16_384
FORMAT = 1  # part of the cache key: bump when the layout or the tokenization changes
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


class TextDataError(ConfigError):
    """The text or its options cannot be used; the message names the value and what is allowed."""


@dataclass(frozen=True)
class TextSpec:
    """Which text, which tokenizer, which split. Every field is part of the cache key."""

    files: tuple[str, ...] = ()  # the user's text files or globs; empty: the built-in corpus
    max_bytes: int = 4_000_000  # corpus budget in UTF-8 bytes (built-in: ~12.5 MB of stdlib, then site-packages)
    tokenizer: str = "bpe"  # "bpe" (byte-level BPE, needs `tokenizers`), "bytes" (vocab 256) or "pretrained"
    vocab_size: int = 8192  # BPE only; a multiple of 64 so FP8 GEMMs on the LM head stay aligned
    heldout_fraction: float = 0.05
    pretrained: str = ""  # "pretrained" only: the folder of the tokenizer (the key holds its files' hash, not this)

    def __post_init__(self):
        object.__setattr__(self, "files", tuple(self.files))  # a list from a config is fine too
        if self.tokenizer not in TOKENIZERS:
            raise TextDataError(f"tokenizer {self.tokenizer!r} is not one of {', '.join(TOKENIZERS)}")
        if (self.tokenizer == "pretrained") != bool(self.pretrained):
            raise TextDataError(f"tokenizer {self.tokenizer!r} with pretrained={self.pretrained!r}: a pretrained "
                                "tokenizer, and only it, names its folder")
        if self.tokenizer == "bpe" and not (self.vocab_size >= 320 and self.vocab_size % 64 == 0):
            raise TextDataError(f"vocab_size {self.vocab_size} must be a multiple of 64 and at least 320 "
                                f"(256 bytes + end of text, rounded up)")
        if not self.max_bytes > 0:
            raise TextDataError(f"max_bytes {self.max_bytes} must be > 0")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise TextDataError(f"heldout_fraction {self.heldout_fraction} must be between 0 and 1")


# ---- corpus --------------------------------------------------------------------------------------
def builtin_documents():
    """(name, text) in a fixed order: the pydoc topics by key, the standard library's sources by path, then the
    installed packages' sources by path (read only as far as the corpus budget goes: documents() stops)."""
    for key in sorted(pydoc_data.topics.topics):
        yield f"pydoc_data.topics/{key}", pydoc_data.topics.topics[key]
    paths = sysconfig.get_paths()
    yield from _sources(Path(paths["stdlib"]), "stdlib")  # skips a site-packages below it: that comes next
    yield from _sources(Path(paths["purelib"]), "site")


def _sources(root: Path, prefix: str):
    for rel in sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py")):
        if not _SKIP_DIRS.intersection(rel.split("/")):
            yield f"{prefix}/{rel}", (root / rel).read_text(encoding="utf-8", errors="replace")


def user_documents(patterns: tuple[str, ...], max_bytes: int | None = None):
    """(path as matched, text) for every file the patterns match, sorted per pattern, each file once; with
    `max_bytes`, only that much of all of them together is read (a 1 GB file of which 1 MB is used costs
    1 MB). A file with a NUL byte in what is read is not text, and refused."""
    seen, left = set(), max_bytes
    for pattern in patterns:
        paths = sorted(p for p in glob.glob(str(Path(pattern).expanduser()), recursive=True) if Path(p).is_file())
        if not paths:
            raise TextDataError(f"text files {pattern!r}: no file matches (give a file, or a glob such as "
                                f"'docs/**/*.md')")
        for path in paths:
            if path in seen:
                continue
            seen.add(path)
            try:
                with open(path, "rb") as f:
                    data = f.read() if left is None else f.read(left)
            except OSError as e:
                raise TextDataError(f"text file {path}: {e.strerror or e}") from None
            if b"\0" in data:
                raise TextDataError(f"text file {path}: not text (a NUL byte at offset {data.index(0)}); "
                                    "lm.corpus_files takes text files (UTF-8)")
            # where the budget cut the file, a character cut in two is dropped (not final), as `documents` does
            ended = left is None or len(data) < left
            text = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(data, final=ended)
            yield path, text
            if left is not None:
                left -= len(text.encode("utf-8"))
                if left <= 0:
                    return


def documents(spec: TextSpec) -> list[tuple[str, str]]:
    """The corpus: documents in order until `spec.max_bytes` of UTF-8, the last one cut to fit."""
    out, left = [], spec.max_bytes
    for name, text in (user_documents(spec.files, spec.max_bytes) if spec.files else builtin_documents()):
        data = text.encode("utf-8")
        if len(data) >= left:
            text = data[:left].decode("utf-8", errors="ignore")  # a character cut in two is dropped
        out.append((name, text))
        left -= len(data)
        if left <= 0:
            break
    if not any(text.strip() for _, text in out):
        raise TextDataError(f"text {', '.join(spec.files) or 'corpus'}: no text in it")
    if left > 0 and not spec.files:  # a run that asked for more text than this Python has says so
        warnings.warn(f"the built-in corpus has {(spec.max_bytes - left) / 1e6:.1f} MB here, less than the "
                      f"{spec.max_bytes / 1e6:.1f} MB asked for (lm.corpus_mb); lm.corpus_files adds your own text",
                      stacklevel=2)
    return out


def pieces(docs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Each document cut at line ends into pieces of about PIECE_CHARS, named '<document>#<i>'; a line longer
    than that is cut too (see _lines)."""
    out = []
    for name, text in docs:
        cur, size, i = [], 0, 0
        for line in _lines(text):
            cur.append(line)
            size += len(line)
            if size >= PIECE_CHARS:
                out.append((f"{name}#{i}", "".join(cur)))
                cur, size, i = [], 0, i + 1
        if cur:
            out.append((f"{name}#{i}", "".join(cur)))
    return out


def _lines(text: str):
    """The text's lines, each line longer than PIECE_CHARS cut into parts of at most PIECE_CHARS, after the
    last space of a part where there is one in its second half: a text without line breaks (one long line of
    prose, minified code) would otherwise be one piece, and too small to split."""
    for line in text.splitlines(keepends=True):
        while len(line) > PIECE_CHARS:
            cut = line.rfind(" ", PIECE_CHARS // 2, PIECE_CHARS) + 1 or PIECE_CHARS
            yield line[:cut]
            line = line[cut:]
        yield line


def _unit_hash(name: str) -> float:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") / 2 ** 64


def split_pieces(named: list[tuple[str, str]], heldout_fraction: float) -> dict[str, list[tuple[str, str]]]:
    """{'train': [...], 'heldout': [...]} by a hash of each piece's name; each side gets at least one piece
    (the one whose hash is nearest the other side), so a small corpus still has both."""
    if len(named) < 2:
        docs = sorted({name.rsplit("#", 1)[0] for name, _ in named})
        raise TextDataError(
            f"text {', '.join(docs) or '(none)'} too small to split into train and held-out: "
            f"{sum(len(t) for _, t in named)} characters make {len(named)} piece(s) of up to {PIECE_CHARS}, and "
            f"each split needs one; give more than {PIECE_CHARS} characters of text")
    ranked = sorted(named, key=lambda p: _unit_hash(p[0]))
    n_held = sum(_unit_hash(name) < heldout_fraction for name, _ in named)
    n_held = min(max(n_held, 1), len(named) - 1)
    held = {name for name, _ in ranked[:n_held]}
    return {"train": [p for p in named if p[0] not in held], "heldout": [p for p in named if p[0] in held]}


# ---- tokenizers ----------------------------------------------------------------------------------
def train_bpe(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer (GPT-2's scheme: no unknown token, any text encodes) trained on `texts`."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def _encode(texts: list[str], tok) -> np.ndarray:
    """Token ids of the texts, each followed by the end-of-text token, as one int32 array."""
    if tok is None:
        ids = [np.frombuffer(t.encode("utf-8") + bytes([BYTES_EOT]), dtype=np.uint8) for t in texts]
    elif isinstance(tok, PretrainedTokenizer):
        ids = [np.array(e + [tok.eot_id], dtype=np.int32) for e in tok.encode_batch(texts)]
    else:
        eot = tok.token_to_id(EOT)
        ids = [np.array(e.ids + [eot], dtype=np.int32) for e in tok.encode_batch(texts)]
    return np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, np.int32)


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


# ---- the data ------------------------------------------------------------------------------------
@dataclass
class TextData:
    """Token arrays of both splits and the tokenizer that made them."""

    spec: TextSpec
    tokenizer_kind: str  # what ran: "bytes" also when "bpe" was asked for but `tokenizers` is missing
    vocab_size: int  # the model's vocabulary: every id is below it
    tokens: dict[str, np.ndarray]  # split -> int32 token ids
    folder: Path  # the cache folder
    from_cache: bool  # read back, not trained now
    tokenizer: object = field(default=None, repr=False)  # tokenizers.Tokenizer, PretrainedTokenizer, None: bytes

    def meta(self) -> dict:
        """What the cache folder records: the spec, documents, pieces and tokens per split."""
        return read_json(self.folder / "meta.json")

    def encode(self, text: str) -> list[int]:
        if isinstance(self.tokenizer, PretrainedTokenizer):
            return self.tokenizer.encode(text)
        return list(text.encode("utf-8")) if self.tokenizer is None else self.tokenizer.encode(text).ids

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        return bytes(ids).decode("utf-8", errors="replace") if self.tokenizer is None else self.tokenizer.decode(ids)

    def batches(self, split: str, batch: int, seq_len: int, n: int, seed: int) -> list[torch.Tensor]:
        """`n` int64 tensors [batch, seq_len + 1] of windows at random places in `split`, the same for the
        same seed (every student trains on the same batches). Inputs are [:, :-1], next tokens [:, 1:]."""
        if split not in SPLITS:
            raise TextDataError(f"split {split!r} is not one of {', '.join(SPLITS)}")
        tokens = self.tokens[split]
        if len(tokens) < seq_len + 1:
            raise TextDataError(f"the {split} split has {len(tokens)} tokens, fewer than seq_len + 1 = "
                                f"{seq_len + 1}: give more text (max_bytes) or a shorter seq_len")
        starts = np.random.default_rng(seed).integers(0, len(tokens) - seq_len, size=(n, batch))
        windows = tokens[starts[..., None] + np.arange(seq_len + 1)]
        return list(torch.from_numpy(windows.astype(np.int64)))


def _key(spec: TextSpec, kind: str, named: list[tuple[str, str]], pretrained: PretrainedTokenizer | None) -> str:
    what = {"format": FORMAT, "piece_chars": PIECE_CHARS, "tokenizer": kind,
            "vocab_size": spec.vocab_size if kind == "bpe" else 256, "heldout_fraction": spec.heldout_fraction}
    if pretrained is not None:  # its content, not its path: the same files elsewhere are the same tokens
        what.update(vocab_size=pretrained.vocab_size, tokenizer_sha256=pretrained.sha256)
    h = hashlib.sha256(json.dumps(what).encode())
    for name, text in named:  # the text itself, not its file names: another Python's stdlib is another corpus
        h.update(name.encode() + b"\0" + text.encode("utf-8") + b"\0")
    return h.hexdigest()[:16]


def load_text(spec: TextSpec = TextSpec(), cache_dir: str | Path = "results/cache") -> TextData:
    """The text of `spec`, tokenized and split: read from the cache, or built and cached."""
    kind = spec.tokenizer
    if kind == "bpe" and tokenizers is None:
        warnings.warn("Hugging Face `tokenizers` is not installed (pip install 'te-workbench[lm]'): "
                      "using the bytes tokenizer (vocab 256)", stacklevel=2)
        kind = "bytes"
    pretrained = load_pretrained(spec.pretrained) if kind == "pretrained" else None
    named = pieces(documents(spec))
    folder = Path(cache_dir) / f"text-{_key(spec, kind, named, pretrained)}"
    vocab = {"bpe": spec.vocab_size, "bytes": 256}.get(kind) or pretrained.vocab_size
    entry = cache.Entry(folder)
    if entry.read() is not None:
        return _read(spec, kind, vocab, folder, pretrained)
    with entry.building() as meta:  # another process may have built it while this one waited
        if meta is not None:
            return _read(spec, kind, vocab, folder, pretrained)
        parts = split_pieces(named, spec.heldout_fraction)
        texts = {s: [text for _, text in parts[s]] for s in SPLITS}
        tok = train_bpe(texts["train"], vocab) if kind == "bpe" else pretrained  # held-out text stays unseen
        tokens = {s: _encode(texts[s], tok) for s in SPLITS}
        if kind == "bpe":
            entry.write_file("tokenizer.json", lambda f: f.write(tok.to_str().encode()))
        for s in SPLITS:
            entry.write_file(f"{s}.npy", lambda f, s=s: f.write(_npy(tokens[s])))
        entry.commit({  # last: its presence says the folder is complete
            "spec": asdict(spec), "tokenizer_kind": kind, "vocab_size": vocab,
            "trained_vocab_size": tok.get_vocab_size() if kind == "bpe" else vocab,
            **(pretrained.info() if pretrained else {}),
            "documents": len({name.rsplit("#", 1)[0] for name, _ in named}), "bytes_by_source": _by_source(named),
            "pieces": {s: len(parts[s]) for s in SPLITS}, "tokens": {s: int(len(tokens[s])) for s in SPLITS},
            "heldout_pieces": [name for name, _ in parts["heldout"]]})
    return TextData(spec, kind, vocab, tokens, folder, False, tok)


def _by_source(named: list[tuple[str, str]]) -> dict[str, int]:
    """UTF-8 bytes per source (the part of a name before its first '/': stdlib, site, a user path's root)."""
    out: dict[str, int] = {}
    for name, text in named:
        src = name.split("/", 1)[0] or "/"
        out[src] = out.get(src, 0) + len(text.encode("utf-8"))
    return out


def _read(spec: TextSpec, kind: str, vocab: int, folder: Path, pretrained=None) -> TextData:
    """The cached text of a verified entry (its files match the sizes and hashes meta.json recorded)."""
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json")) if kind == "bpe" else pretrained
    tokens = {s: np.load(folder / f"{s}.npy") for s in SPLITS}
    return TextData(spec, kind, vocab, tokens, folder, True, tok)
