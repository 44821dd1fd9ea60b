"""Frees the top-k teacher stores of study points that are done, while their studies go on (`quality-real`).

A store (topk-<key>/ in a cache folder, ~2.4 GiB per seed at 800 steps of SmolLM2-135M) holds the teacher's
targets of one seed's batches: its recipe names the seed (the points' train.seed), the steps, batch and seq_len.
The studies that plan it are those with a point of that seed and shape in their grid (sweep.json; several points
a seed where the study splits its arms, `point_groups`), and it is freed once every such point of every such study
is done. Studies that run side by side would otherwise fill the GPU machine's disk before they end.

    topk_janitor.py [--once] [--ended] STUDY_DIR ...                each study's own <study>/cache
    topk_janitor.py [--once] [--ended] --cache DIR STUDY_DIR ...    one cache the studies share (`study --cache`)

It runs until killed, a pass every 15 s (one pass with --once). --ended (with --once, after the studies stopped for
good: answered, refused or with a failed point) also frees the stores they planned whose points are not all done;
a rerun of such a point rebuilds its store. A store no study plans is never touched, nor one while a study that
exists has no readable plan yet (it may plan it).
"""
import json
import shutil
import sys
import time
from pathlib import Path

import filelock

from workbench.data.cache import entry_lock
from workbench.sweep.index import DamagedIndex, read_index

SHAPE = ("steps", "batch", "seq_len")  # recipe fields a study's points set beside the seed: a store is theirs


class Unreadable(Exception):
    """A study folder without a readable plan yet (being written, or mid-rewrite)."""


def _key(overrides: dict) -> str:
    return json.dumps(overrides, sort_keys=True, default=str)


def plan(study: Path) -> tuple[list[dict], list[dict]] | None:
    """(planned points, the done ones among them), each the point's overrides (the study's set and its grid entry,
    as the index keeps them); None for a study that does not exist (it plans nothing). Only the index rows of
    points this grid plans count: a folder kept from an earlier plan of the study (other groups, other settings)
    has rows of its own that must not free a store a planned point still reads."""
    if not study.exists():
        return None
    try:
        index = read_index(study)  # the sweep's own reader: no file yet is an empty index, a cut one DamagedIndex
        spec = json.loads((study / "sweep.json").read_text())
        planned = [{**spec.get("set", {}), **p} for p in spec["grid"]["point"]]
    except (DamagedIndex, OSError, ValueError, KeyError, TypeError) as e:  # sweep.json not written yet
        raise Unreadable(str(study)) from e
    if "overrides" not in index.columns:
        raise Unreadable(str(study))
    keys = {_key(p) for p in planned}
    done = []
    for overrides in index.loc[index["status"] == "done", "overrides"].dropna():
        try:
            row = json.loads(overrides)
        except ValueError:
            continue
        if _key(row) in keys:
            done.append(row)
    return planned, done


def _reads(point: dict, recipe: dict) -> bool:
    """Whether a point of that plan trains on the store of `recipe` (a shape field the point does not set is the
    preset's: counted as a match, so the store is kept)."""
    if int(point.get("seed", -1)) != int(recipe.get("seed", -2)):
        return False
    return all(k not in point or k not in recipe or int(point[k]) == int(recipe[k]) for k in SHAPE)


def freeable(recipe: dict, plans: list, ended: bool = False) -> bool:
    """Whether some study plans the store and every study that does has done all its points of it."""
    readers = 0
    for p in plans:
        if p is None:
            continue
        planned, done = p
        n = sum(_reads(q, recipe) for q in planned)
        if n:
            readers += 1
            if not ended and sum(_reads(q, recipe) for q in done) < n:
                return False
    return readers > 0


def sweep(studies: list[Path], cache: Path | None = None, ended: bool = False) -> list[str]:
    """One pass: the stores freed, as 'where: topk-<key> (seed N)'."""
    groups = [(cache, studies, cache.name)] if cache else [(s / "cache", [s], s.name) for s in studies]
    freed = []
    for folder, users, label in groups:
        for trash in folder.glob(".trash-topk-*"):  # left by a janitor killed mid-delete
            shutil.rmtree(trash, ignore_errors=True)
        try:
            plans = [plan(s) for s in users]
        except Unreadable:
            continue
        for meta in folder.glob("topk-*/meta.json"):
            try:
                recipe = json.loads(meta.read_text())["recipe"]
            except (OSError, ValueError, KeyError):
                continue
            try:
                free = freeable(recipe, plans, ended)
            except (ValueError, TypeError):  # a recipe or plan value that is no number: keep the store
                continue
            if free and _free(meta.parent):
                freed.append(f"{label}: {meta.parent.name} (seed {recipe.get('seed')})")
    return freed


def _free(store: Path) -> bool:
    """Remove the store under its cache-entry lock (data.cache.entry_lock), taken without waiting: a point checking,
    building or opening it right now (a rerun) holds it, and the store then stays for a later pass. Renamed first: a
    janitor killed mid-delete leaves a .trash- folder, never a store missing files."""
    lock = entry_lock(store)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return False
    try:
        trash = store.with_name(f".trash-{store.name}")
        store.rename(trash)
    finally:
        lock.release()
    shutil.rmtree(trash, ignore_errors=True)
    return True


def main(argv: list[str]) -> None:
    once, ended = "--once" in argv, "--ended" in argv
    rest = [a for a in argv if a not in ("--once", "--ended")]
    cache = None
    if "--cache" in rest:
        i = rest.index("--cache")
        cache, rest = Path(rest[i + 1]), rest[:i] + rest[i + 2:]
    studies = [Path(a) for a in rest]
    while True:
        for line in sweep(studies, cache, ended):
            print(f"topk_janitor: freed {line}", flush=True)
        if once:
            break
        time.sleep(15)


if __name__ == "__main__":
    main(sys.argv[1:])
