"""Cache entries (the text, tokenizer and teacher caches, the top-k teacher store): one folder per entry,
verified on read, built by one process at a time.

    entry = Entry(cache_dir / "teacher-1a2b3c")
    meta = entry.read()                     # the meta.json of a complete, undamaged entry, or None
    if meta is None:
        with entry.building() as meta:      # waits for another process building it; None: build it now
            if meta is None:
                entry.write_file("teacher.pt", lambda f: torch.save(state, f))
                entry.commit({...})         # meta.json last, with every file's size and sha256

An entry's files are written under unique temporary names in its folder and renamed into place (removed
on failure): one at a time through a callback (`write_file`), or several side by side through open handles
(`writing`: the top-k store appends a piece of each of its files per step). meta.json, written last,
records each file's size and sha256, so a file cut short, changed or deleted later makes the entry a miss
that is rebuilt, with one line naming the folder. The lock is a file beside the folder (`.<name>.lock`,
filelock): a second process waits for the first one and then reuses its result instead of building the
same entry again.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

import filelock

from workbench.results import OutputError, write_with

META = "meta.json"
FILES = "files"  # meta.json's record: {file name: {"bytes": size, "sha256": hex digest}}


class CacheError(OutputError):
    """A cache folder that cannot be written; the message names it."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def entry_lock(folder: Path) -> filelock.FileLock:
    """The lock of a cache entry built in place of `folder` (a file beside it, `.<name>.lock`): held over the check
    and the build, so processes that need one entry at once build it once."""
    folder = Path(folder)
    return filelock.FileLock(str(folder.with_name(f".{folder.name}.lock")))


def hold(lock: filelock.FileLock, folder: Path, say: Callable[[str], None]) -> None:
    """Acquire an entry's lock, saying once that another process is building `folder` when this one must wait."""
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        say(f"[cache] waiting for another process building {folder}")
        lock.acquire()


class Entry:
    """One cache folder: its files, then meta.json."""

    def __init__(self, folder: str | Path, say: Callable[[str], None] = print,
                 kind: Callable[[dict], str | None] | None = None):
        """`kind(meta)`: why a readable meta.json belongs to another kind of entry (another format or recipe),
        or None; asked before the files' record, whose layout another format may not share."""
        self.folder, self.say, self.kind = Path(folder), say, kind
        self.written: dict[str, dict[str, Any]] = {}
        self.damaged = ""  # why building() found the entry damaged ('' when it was whole or missing)

    # ---- reading ---------------------------------------------------------------------------------
    def damage(self) -> str | None:
        """Why the entry cannot be used ('' when it is missing: a plain miss), or None when it is whole."""
        meta_path = self.folder / META
        if not meta_path.exists():
            return ""
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError) as e:
            return f"{META} is unreadable ({type(e).__name__})"
        other = self.kind(meta) if self.kind and isinstance(meta, dict) else None
        if other:
            return other
        record = meta.get(FILES) if isinstance(meta, dict) else None
        if not isinstance(record, dict):
            return f"{META} records no file sizes and hashes (written by an older workbench)"
        for name, want in record.items():
            path = self.folder / name
            if not path.exists():
                return f"{name} is missing"
            size = path.stat().st_size
            if size != want.get("bytes"):
                return f"{name} has {size} bytes, {META} recorded {want.get('bytes')}"
            if sha256(path) != want.get("sha256"):
                return f"{name} changed after it was written (its sha256 differs from {META}'s)"
        return None

    def read(self) -> dict | None:
        """meta.json of the complete, undamaged entry; None when it is missing or damaged (not reported
        here: `building` reports damage, under the lock, and rebuilds)."""
        if self.damage() is None:
            return json.loads((self.folder / META).read_text())
        return None

    # ---- building --------------------------------------------------------------------------------
    def lock(self) -> filelock.FileLock:
        return entry_lock(self.folder)

    @contextlib.contextmanager
    def building(self) -> Iterator[dict | None]:
        """Hold the entry's lock (waiting, with a line, while another process holds it) and yield the
        entry's meta when it is whole by then, else None: the caller builds it now. A damaged entry is
        reported in one line (why is kept in `damaged`, for the caller's own records) and its meta.json
        removed first, so no reader takes the rebuilt files for the old ones. The folder is checked writable
        before anything is built."""
        check_writable(self.folder.parent)
        lock = self.lock()
        hold(lock, self.folder, self.say)
        try:
            why = self.damage()
            self.damaged = why or ""
            if why is None:
                yield json.loads((self.folder / META).read_text())
                return
            if why:
                self.say(f"[cache] {self.folder} is damaged: {why}; rebuilding it")
                (self.folder / META).unlink(missing_ok=True)
            check_writable(self.folder)
            _remove_stale(self.folder)
            self.written = {}
            yield None
        finally:
            lock.release()

    def write_file(self, name: str, write: Callable, mode: str = "wb") -> Path:
        """One file of the entry, written under a unique temporary name and renamed into place; its size
        and sha256 are recorded for commit()."""
        path = write_with(self.folder / name, write, mode=mode)
        self._record(name)
        return path

    @contextlib.contextmanager
    def writing(self, *names: str) -> Iterator[dict[str, BinaryIO]]:
        """Several files of the entry written side by side, {name: a binary file open for writing}, for a writer
        that makes a piece of each per step (one pass over its data). Each is under a unique temporary name, as
        write_file's; when the block ends without error they are flushed to disk, renamed into place and recorded
        for commit(), otherwise removed (a rename that fails midway can leave some in place: no meta.json names
        them, so the entry is still a miss)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        files: dict[str, BinaryIO] = {}
        try:
            for name in names:  # `_remove_stale`'s pattern: a killed writer's files are cleared by the next build
                files[name] = open(self.folder / f".{name}.{uuid.uuid4().hex[:8]}.tmp", "xb")
            yield files
            for f in files.values():
                f.flush()
                os.fsync(f.fileno())  # on disk before meta.json says they are whole
                f.close()
            for name, f in files.items():
                os.replace(f.name, self.folder / name)
                self._record(name)
        finally:
            for f in files.values():
                with contextlib.suppress(OSError):  # a full disk fails close()'s flush too: remove them anyway
                    f.close()
                Path(f.name).unlink(missing_ok=True)  # gone already where it was renamed into place

    def _record(self, name: str) -> None:
        path = self.folder / name
        self.written[name] = {"bytes": path.stat().st_size, "sha256": sha256(path)}

    def commit(self, meta: dict[str, Any]) -> dict[str, Any]:
        """meta.json, last: strict JSON (a NaN in it is a bug, refused here) with the files' record."""
        meta = {**meta, FILES: dict(self.written)}
        text = json.dumps(meta, indent=2, allow_nan=False)
        write_with(self.folder / META, lambda f: f.write(text))
        return meta


def check_writable(folder: str | Path) -> Path:
    """`folder`, created if missing and checked writable by making (and removing) a file in it; CacheError
    naming it otherwise."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()  # holds for root users and read-only mounts alike
    except OSError as e:
        raise CacheError(f"cache folder {folder} is not writable: {e.strerror or e} (the tokenizer and the "
                         "teacher are cached there, below --out; make it writable or choose another --out)") from None
    return folder


def _remove_stale(folder: Path) -> None:
    """Temporary files a killed writer left in `folder` (names `.<file>.<random>.tmp`); called under the
    entry's lock, so no live writer owns them."""
    for p in Path(folder).glob(".*.tmp"):
        with contextlib.suppress(OSError):
            os.unlink(p)
