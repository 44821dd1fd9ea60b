"""The top-k teacher store (distill.teacher_mode=topk, topk.py): the teacher's k largest logits, their ids and
the log-sum-exp of the rest per token, computed once into files in the cache folder; TopKBatches streams them to
the GPU a step ahead. steps x tokens x k on disk, a few pinned buffers in memory.

The store (a folder topk-<key>/ per recipe) is a cache entry (data.cache.Entry), built under the entry's lock by
one process while the others wait: values.bin (the logits' own dtype: bf16 from a bf16 teacher is lossless; fp32
on a CPU), indices.bin (int16 below 32768 tokens, else int32), rest_lse.bin (fp32), windows.bin (int32 token
windows), each written under a temporary name and renamed into place, then meta.json with every file's size and
sha256 and the store's format and recipe. A store whose files differ from meta.json's record (Entry.damage) or
whose meta.json is of another recipe or format is rebuilt, and task.json says why. A killed build leaves
temporary files and no meta.json: a miss, whose leftovers the next build clears under the lock.
"""
from __future__ import annotations

import collections.abc
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from workbench.config import ConfigError
from workbench.data.cache import FILES, META, Entry
from workbench.train import objectives

FORMAT = 2  # of the store's files and meta.json (2: a data.cache.Entry); a store of another format is rebuilt
_NUMPY = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.uint16}  # bf16 as its bits
_TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# a stored array's buffer dtype (same width; bf16 bits read into int16, then viewed as bf16)
_TORCH_OF_NUMPY = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
                   np.dtype(np.uint16): torch.int16, np.dtype(np.int16): torch.int16, np.dtype(np.int32): torch.int32}


class DamagedStore(Exception):
    """A top-k store folder that cannot be used as it is (the message says why)."""


def topk_targets(logits: torch.Tensor, k: int, temperature: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(values [..., k] in the logits' dtype, indices [..., k] int64, rest_lse [...] fp32): the k largest logits,
    their vocabulary ids, and log-sum-exp over the other logits / T (-inf where k = vocab: an empty tail)."""
    values, indices = logits.topk(k, dim=-1)
    rest = (logits.float() / temperature).scatter(-1, indices, float("-inf")).logsumexp(-1)
    return values, indices, rest


def index_dtype(vocab: int) -> torch.dtype:
    return torch.int16 if vocab <= 2**15 else torch.int32


@dataclass(frozen=True)
class Layout:
    """The store's array shapes and dtypes, from its recipe."""

    steps: int
    batch: int
    seq_len: int
    k: int
    vocab: int
    value_dtype: torch.dtype

    def arrays(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        lead = (self.steps, self.batch, self.seq_len)
        return {"values": ((*lead, self.k), np.dtype(_NUMPY[self.value_dtype])),
                "indices": ((*lead, self.k),
                            np.dtype(np.int16 if index_dtype(self.vocab) == torch.int16 else np.int32)),
                "rest_lse": (lead, np.dtype(np.float32)),
                "windows": ((self.steps, self.batch, self.seq_len + 1), np.dtype(np.int32))}

    def nbytes(self) -> int:
        return sum(int(np.prod(shape)) * dt.itemsize for shape, dt in self.arrays().values())


class TopKStore:
    """An opened, verified store. Steps are read from its files with positioned reads (os.preadv) into the
    caller's buffers, never memory-mapped: mapped pages count in the process's resident memory and stay there,
    so a memmapped store's RSS grew with train.steps; read pages stay in the kernel's page cache only."""

    def __init__(self, folder: Path, recipe: dict, meta: dict | None = None):
        """The store at `folder`, checked: its files against meta.json's sizes and hashes (Entry.damage; skipped
        when the caller passes the `meta` of an entry it found whole or has just written), meta.json's format and
        recipe against this one's, and the files' sizes on disk against the recipe's layout. DamagedStore says what
        is wrong."""
        self.folder = Path(folder)
        if meta is None:
            why = Entry(self.folder, kind=lambda m: _another_kind(m, recipe)).damage()
            if why is not None:
                raise DamagedStore(f"{self.folder}: {why or f'{META} is missing'}")
            meta = json.loads((self.folder / META).read_text())
        if meta.get("format") != FORMAT or meta.get("recipe") != recipe:
            raise DamagedStore(f"{self.folder / META} was written for another recipe or format")
        self.layout = layout_of(recipe)
        self.files: dict[str, tuple[Path, tuple[int, ...], np.dtype]] = {}
        for name, (shape, dtype) in self.layout.arrays().items():
            path, size = self.folder / f"{name}.bin", int(np.prod(shape)) * dtype.itemsize
            recorded = meta[FILES].get(path.name, {}).get("bytes")
            on_disk = path.stat().st_size if path.exists() else None
            if recorded != size or on_disk != size:
                raise DamagedStore(f"{path}: {on_disk} bytes on disk, {META} records {recorded}, the recipe's "
                                   f"layout is {size}")
            self.files[name] = (path, shape[1:], dtype)

    def __len__(self) -> int:
        return self.layout.steps

    def empty(self, pin_memory: bool = False) -> dict[str, torch.Tensor]:
        """One step's CPU buffers (bf16 values as bf16), to be filled by `read`."""
        out = {name: torch.empty(shape, dtype=_TORCH_OF_NUMPY[dtype], pin_memory=pin_memory)
               for name, (_, shape, dtype) in self.files.items()}
        if self.layout.value_dtype == torch.bfloat16:
            out["values"] = out["values"].view(torch.bfloat16)
        return out

    def read(self, i: int, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Step i's arrays read from the files into `out` (from `empty`)."""
        for name, (path, shape, dtype) in self.files.items():
            buf = out[name].view(_TORCH_OF_NUMPY[dtype]).numpy()
            nbytes = buf.nbytes
            fd = os.open(path, os.O_RDONLY)
            try:
                got = os.preadv(fd, [memoryview(buf).cast("B")], i * nbytes)
            finally:
                os.close(fd)
            if got != nbytes:
                raise DamagedStore(f"{path}: step {i} is cut short ({got} of {nbytes} bytes)")
        return out

    def host(self, i: int) -> dict[str, torch.Tensor]:
        """Step i's arrays as fresh CPU tensors."""
        return self.read(i, self.empty())


def layout_of(recipe: dict) -> Layout:
    return Layout(steps=recipe["steps"], batch=recipe["batch"], seq_len=recipe["seq_len"], k=recipe["k"],
                  vocab=recipe["vocab"], value_dtype=_TORCH[recipe["value_dtype"]])


def store_key(recipe: dict) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def store_folder(cache_dir: Path, recipe: dict) -> Path:
    return Path(cache_dir) / f"topk-{store_key(recipe)}"


def build_store(folder: Path, recipe: dict, windows: collections.abc.Iterable[torch.Tensor],
                teacher_logits: Callable[[torch.Tensor], torch.Tensor],
                on_step: Callable[[int], None] | None = None) -> None:
    """Write the store of `recipe` at `folder`: for each token window [batch, seq_len + 1] the teacher's logits
    of its inputs, cut to the top k. Its caller holds the store's lock (ensure_store). The four files are written
    side by side under temporary names (Entry.writing) and renamed into place, then meta.json: a kill leaves no
    store that looks whole. `on_step(i)` after each step (progress; tests kill a build there)."""
    entry = Entry(folder)
    layout = layout_of(recipe)
    specs = {f"{name}.bin": spec for name, spec in layout.arrays().items()}
    # an old store's files go first (meta.json first of all): a store is GBs, and two may not fit the disk
    for name in (META, *specs):
        (entry.folder / name).unlink(missing_ok=True)
    n = 0
    # appended step by step with plain writes (no memmap: its dirty pages would count in this process's
    # resident memory and grow with the number of steps)
    with entry.writing(*specs) as files:
        for i, window in enumerate(windows):
            logits = teacher_logits(window)
            values, indices, rest = topk_targets(logits, layout.k, recipe["temperature"])
            if values.dtype != layout.value_dtype:
                raise ValueError(f"the teacher's logits are {values.dtype}, the store's recipe says "
                                 f"{layout.value_dtype}")
            if values.dtype == torch.bfloat16:
                values = values.view(torch.uint16)
            step = {"values.bin": values, "indices.bin": indices, "rest_lse.bin": rest, "windows.bin": window}
            for name, (shape, dt) in specs.items():
                a = np.ascontiguousarray(step[name].cpu().numpy(), dtype=dt)  # indices < vocab fit the dtype
                if a.shape != shape[1:]:
                    raise ValueError(f"the top-k store's {name} of step {i} is {a.shape}, expected {shape[1:]}")
                files[name].write(a.tobytes())
            n = i + 1
            if on_step:
                on_step(i)
        if n != layout.steps:  # inside the block: no file is put in place
            raise ValueError(f"the top-k store expected {layout.steps} steps, got {n}")
    entry.commit({"format": FORMAT, "recipe": recipe})


def ensure_store(folder: Path, recipe: dict, build: Callable[[], None],
                 say: Callable[[str], None] = print) -> tuple[TopKStore, str]:
    """(the store at `folder`, why it was rebuilt or ''): opened and verified; built by `build()` where there is
    none (a killed build's leftovers cleared first); rebuilt where it is damaged or of another recipe or format;
    refused (ConfigError) when a fresh build fails verification. The check and the build hold the store's entry
    lock (Entry.building, as a text entry's), so processes that need one store at once (two studies of one
    teacher side by side, `study --cache`) build it once: the others wait, with a line, and then open it. Without
    it both built it (bf8c11d, H100: 68 s each, one copy thrown away)."""
    folder = Path(folder)
    entry = Entry(folder, say, kind=lambda meta: _another_kind(meta, recipe))
    with entry.building() as meta:
        if meta is not None:
            return TopKStore(folder, recipe, meta), ""
        why = entry.damaged  # its files differ from meta.json's record, or it is of another format or recipe
        _remove_old_builds(folder)
        build()
        try:  # its files were hashed as they were written (Entry.writing): sizes now, not a second pass over GBs
            store = TopKStore(folder, recipe, _written_meta(folder))
        except DamagedStore as e:
            raise ConfigError(f"the top-k teacher store {folder} fails its check right after being built ({e}); "
                              "check the cache folder's disk, or set distill.teacher_mode=online") from e
    return store, why and f"the top-k store was damaged and was rebuilt: {why}"


def _written_meta(folder: Path) -> dict:
    """The meta.json a build has just committed; DamagedStore where there is none to read."""
    try:
        return json.loads((folder / META).read_text())
    except (OSError, ValueError) as e:
        raise DamagedStore(f"{folder / META} is missing or unreadable ({type(e).__name__})") from e


def _another_kind(meta: dict, recipe: dict) -> str | None:
    """Why a store's meta.json is not this recipe's store of this format (None: it is); Entry asks it first."""
    if meta.get("format") != FORMAT:
        return f"{META} is of format {meta.get('format')}, this workbench writes format {FORMAT}"
    if meta.get("recipe") != recipe:
        return f"{META} was written for another recipe"
    return None


def _remove_old_builds(folder: Path) -> None:
    """Temporary folders (`<store>.tmp-*`) and their lock files left by builds killed under format 1, which built
    in a folder of its own and renamed it (GBs each, which nothing else clears). Format 2 never makes them; called
    under the store's lock."""
    for old in folder.parent.glob(f"{folder.name}.tmp-*"):
        shutil.rmtree(old, ignore_errors=True)
    for lock in folder.parent.glob(f".{folder.name}.tmp-*.lock"):
        lock.unlink(missing_ok=True)


class TopKBatches(collections.abc.Sequence):
    """Training batches from a top-k store: (tokens, Targets(values, next_tokens, indices, rest_lse)) on the
    device. Iterating (the training loop) reads step i+1 from the files into one of two pinned buffers and
    on to the GPU on a side stream, non-blocking, while step i runs; indexing copies at once. What stays in
    memory is those two buffers, whatever the number of steps."""

    def __init__(self, store: TopKStore, device: torch.device):
        self.store, self.device = store, device
        self._pinned: list[dict[str, torch.Tensor]] = []

    def __len__(self) -> int:
        return len(self.store)

    def _batch(self, arrays: dict[str, torch.Tensor], non_blocking: bool = False):
        d = {k: v.to(self.device, non_blocking=non_blocking) for k, v in arrays.items()}
        window = d["windows"].long()
        return window[:, :-1], objectives.Targets(d["values"], next_tokens=window[:, 1:], indices=d["indices"],
                                                  rest_lse=d["rest_lse"])

    def __getitem__(self, i: int):
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._batch(self.store.host(i))

    def shared_tensors(self) -> list[torch.Tensor]:
        return []  # a student only ever gets fresh device copies: nothing it could write back into

    def __iter__(self):
        if self.device.type != "cuda" or not len(self):
            yield from (self[i] for i in range(len(self)))
            return
        if not self._pinned:
            self._pinned = [self.store.empty(pin_memory=True) for _ in range(2)]
        main, side = torch.cuda.current_stream(self.device), torch.cuda.Stream(self.device)
        copied: list[torch.cuda.Event | None] = [None, None]

        def fetch(i: int):
            buf = self._pinned[i % 2]
            if copied[i % 2] is not None:
                copied[i % 2].synchronize()  # the copy out of this buffer (two steps ago) is done before it is refilled
            self.store.read(i, buf)
            with torch.cuda.stream(side):
                batch = self._batch(buf, non_blocking=True)
                copied[i % 2] = torch.cuda.Event()
                copied[i % 2].record(side)
            return batch

        ahead = fetch(0)
        for i in range(len(self)):
            batch = ahead
            main.wait_stream(side)  # its copy is done before the step reads it
            for t in (batch[0], *batch[1].tensors()):
                t.record_stream(main)  # allocated on the side stream, used (and freed) on this one
            if i + 1 < len(self):
                ahead = fetch(i + 1)  # overlaps the step the caller runs on `batch`
            yield batch
