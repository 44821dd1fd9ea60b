"""Real text offline: the corpus, the split, the tokenizer and its cache, the user's files, the batches."""
import itertools

import numpy as np
import pytest
import torch

from workbench.data import text
from workbench.data.text import TextDataError, TextSpec, documents, load_text, pieces, split_pieces

SMALL = TextSpec(max_bytes=200_000, vocab_size=512, heldout_fraction=0.1)  # trains in well under a second


def test_builtin_corpus_is_non_empty_bounded_and_deterministic():
    docs = documents(SMALL)
    assert docs == documents(SMALL)
    size = sum(len(t.encode()) for _, t in docs)
    assert 199_000 <= size <= 200_000
    assert docs[0][0].startswith("pydoc_data.topics/")
    wider = [name for name, _ in documents(TextSpec(max_bytes=700_000))]  # past the ~465K of pydoc prose
    assert any(n.startswith("stdlib/") for n in wider) and not any("/test/" in n for n in wider)


def test_a_corpus_larger_than_the_stdlib_goes_on_into_the_installed_packages(tmp_path, monkeypatch):
    """Past the standard library the built-in corpus takes site-packages' sources (tests left out), in path
    order after every stdlib file; asking for more than there is warns with what there is."""
    std, site = tmp_path / "lib", tmp_path / "lib" / "site-packages"
    for path, body in {std / "json" / "a.py": "x = 1\n" * 50, site / "pkg" / "m.py": "y = 2\n" * 50,
                       site / "pkg" / "tests" / "t.py": "z = 3\n", std / "test" / "t.py": "w = 4\n"}.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    monkeypatch.setattr(text.sysconfig, "get_paths", lambda: {"stdlib": str(std), "purelib": str(site)})
    monkeypatch.setattr(text.pydoc_data.topics, "topics", {"k": "prose " * 10})
    with pytest.warns(UserWarning, match=r"the built-in corpus has 0\.0 MB here, less than the 1\.0 MB asked"):
        docs = documents(TextSpec(max_bytes=1_000_000))
    assert [n for n, _ in docs] == ["pydoc_data.topics/k", "stdlib/json/a.py", "site/pkg/m.py"]
    assert text._by_source(docs) == {"pydoc_data.topics": 60, "stdlib": 300, "site": 300}
    # a budget the stdlib fills reads no package source
    assert [n for n, _ in documents(TextSpec(max_bytes=200))][-1] == "stdlib/json/a.py"


def test_split_is_disjoint_stable_and_never_empty():
    named = pieces(documents(SMALL))
    parts = split_pieces(named, 0.1)
    train, held = {n for n, _ in parts["train"]}, {n for n, _ in parts["heldout"]}
    assert not train & held and train | held == {n for n, _ in named} and train and held
    # a piece keeps its side when the corpus grows: the split hashes names, not positions
    more = split_pieces(pieces(documents(TextSpec(max_bytes=400_000))), 0.1)
    assert held <= {n for n, _ in more["heldout"]} and train <= {n for n, _ in more["train"]}
    # a tiny text still gets one piece on each side
    tiny = split_pieces([("a#0", "x"), ("a#1", "y")], 0.01)
    assert len(tiny["train"]) == len(tiny["heldout"]) == 1
    with pytest.raises(TextDataError, match="too small to split"):
        split_pieces([("a#0", "x")], 0.1)


def test_tokenizer_and_tokens_are_cached_and_reused(tmp_path, monkeypatch):
    first = load_text(SMALL, tmp_path)
    assert not first.from_cache and first.tokenizer_kind == "bpe" and first.vocab_size == 512
    assert sorted(p.name for p in first.folder.iterdir()) == ["heldout.npy", "meta.json", "tokenizer.json", "train.npy"]
    stamp = (first.folder / "tokenizer.json").stat().st_mtime_ns

    def no_training(*a, **k):
        raise AssertionError("trained again although the cache holds this tokenizer")

    monkeypatch.setattr(text, "train_bpe", no_training)
    again = load_text(SMALL, tmp_path)
    assert again.from_cache and again.folder == first.folder
    assert (first.folder / "tokenizer.json").stat().st_mtime_ns == stamp
    for split in text.SPLITS:
        assert np.array_equal(again.tokens[split], first.tokens[split])
    assert again.encode("def f(x):\n    return x") == first.encode("def f(x):\n    return x")
    assert again.meta()["tokens"] == {s: len(first.tokens[s]) for s in text.SPLITS}
    # another vocabulary is another key, another folder
    monkeypatch.undo()
    assert load_text(TextSpec(max_bytes=200_000, vocab_size=576, heldout_fraction=0.1), tmp_path).folder != first.folder


def test_training_is_deterministic_across_fresh_caches(tmp_path):
    a, b = load_text(SMALL, tmp_path / "a"), load_text(SMALL, tmp_path / "b")
    assert a.folder.name == b.folder.name
    for split in text.SPLITS:
        assert np.array_equal(a.tokens[split], b.tokens[split])


def test_the_users_own_files(tmp_path):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    lines = [f"line {i}: the quick brown fox jumps over the lazy dog {i * 7}\n" for i in range(3000)]
    (docs / "a.txt").write_text("".join(lines[:1500]))
    (docs / "sub" / "b.txt").write_text("".join(lines[1500:]))
    (docs / "skip.bin").write_bytes(b"\x00\x01")
    spec = TextSpec(files=(str(docs / "**" / "*.txt"), str(docs / "a.txt")), vocab_size=320, heldout_fraction=0.2)
    assert [name for name, _ in documents(spec)] == [str(docs / "a.txt"), str(docs / "sub" / "b.txt")]  # once each
    data = load_text(spec, tmp_path / "cache")
    assert data.meta()["documents"] == 2 and all(len(data.tokens[s]) for s in text.SPLITS)
    # pieces end in EOT and the held-out ones need not be neighbours (their names carry tmp_path, so the split
    # changes from run to run): each EOT-separated part of a window is a stretch of the user's text
    window, eot = data.batches("heldout", 1, 32, 1, seed=0)[0][0].tolist(), data.tokenizer.token_to_id(text.EOT)
    parts = [list(ids) for is_eot, ids in itertools.groupby(window, key=lambda i: i == eot) if not is_eot]
    whole = "".join(lines)
    assert parts and all(data.decode(part) in whole for part in parts)
    with pytest.raises(TextDataError, match=r"text files '.*nothing\*.txt': no file matches"):
        load_text(TextSpec(files=[str(tmp_path / "nothing*.txt")]), tmp_path / "cache")


def test_bytes_tokenizer_asked_for_or_as_fallback(tmp_path, monkeypatch):
    asked = load_text(TextSpec(max_bytes=200_000, tokenizer="bytes"), tmp_path)
    assert asked.tokenizer_kind == "bytes" and asked.vocab_size == 256 and asked.tokenizer is None
    assert asked.encode("é") == [0xC3, 0xA9] and asked.decode([0xC3, 0xA9]) == "é"
    assert not (asked.folder / "tokenizer.json").exists()
    monkeypatch.setattr(text, "tokenizers", None)  # `tokenizers` missing: fall back, and say so
    with pytest.warns(UserWarning, match="tokenizers` is not installed"):
        fallback = load_text(SMALL, tmp_path / "fallback")
    assert fallback.tokenizer_kind == "bytes" and fallback.vocab_size == 256
    assert fallback.batches("train", 2, 64, 3, seed=1)[2].max() < 256


def test_batches_are_deterministic_in_vocab_and_shifted(tmp_path):
    data = load_text(SMALL, tmp_path)
    one = data.batches("train", batch=4, seq_len=32, n=3, seed=7)
    assert len(one) == 3 and all(b.shape == (4, 33) and b.dtype == torch.int64 for b in one)
    assert all(torch.equal(a, b) for a, b in zip(one, data.batches("train", 4, 32, 3, seed=7)))
    assert not torch.equal(one[0], data.batches("train", 4, 32, 3, seed=8)[0])
    assert all(0 <= int(b.min()) and int(b.max()) < data.vocab_size for b in one)
    # each row is a contiguous window of the split, so [:, 1:] are the next tokens of [:, :-1]
    train = torch.from_numpy(data.tokens["train"].astype(np.int64))
    row = one[0][0]
    starts = [i for i in range(len(train) - 32) if torch.equal(train[i:i + 33], row)]
    assert starts
    with pytest.raises(TextDataError, match="fewer than seq_len"):
        data.batches("heldout", 1, len(data.tokens["heldout"]), 1, seed=0)


@pytest.mark.parametrize("bad, match", [
    (dict(vocab_size=500), "vocab_size 500 must be a multiple of 64"),
    (dict(tokenizer="sentencepiece"), "tokenizer 'sentencepiece' is not one of bpe, bytes"),
    (dict(heldout_fraction=1.0), "heldout_fraction 1.0 must be between 0 and 1"),
    (dict(max_bytes=0), "max_bytes 0 must be > 0"),
])
def test_bad_options_are_one_line_errors(bad, match):
    with pytest.raises(TextDataError, match=match):
        TextSpec(**bad)


def test_a_text_on_one_line_is_split_into_pieces_and_a_too_small_one_is_refused_with_its_size(tmp_path):
    """A file with no line breaks (417 KB on one line) is cut into pieces like any other; what is refused
    says how much text there was and how much a split needs."""
    one_line = tmp_path / "one.txt"
    one_line.write_text(" ".join(f"word{i}" for i in range(60_000)))  # ~417 KB, no newline
    spec = TextSpec(files=(str(one_line),), tokenizer="bytes", heldout_fraction=0.1)
    named = pieces(documents(spec))
    assert len(named) > 10 and max(len(t) for _, t in named) <= 2 * text.PIECE_CHARS  # as with short lines
    assert "".join(t for _, t in named) == one_line.read_text()  # cut, nothing lost or added
    data = load_text(spec, tmp_path / "cache")
    assert len(data.tokens["train"]) > len(data.tokens["heldout"]) > 0
    small = tmp_path / "small.txt"
    small.write_text("x" * 1000)
    with pytest.raises(TextDataError, match=rf"{small}.*1000 characters.*more than {text.PIECE_CHARS}"):
        load_text(TextSpec(files=(str(small),), tokenizer="bytes"), tmp_path / "cache")
