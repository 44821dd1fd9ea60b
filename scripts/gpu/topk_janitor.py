"""Frees the top-k teacher stores of study points that are done, while their studies go on (`quality-real`).

A store (<study>/cache/topk-<key>/, ~2.4 GiB per seed at 800 steps of SmolLM2-135M) belongs to one seed: its
recipe's seed is the points' train.seed, and it is freed once every point of that seed in the study's grid
(sweep.json; several where the study splits a seed's arms, `point_groups`) is done. Studies that run side by side
would otherwise fill the GPU machine's disk before they end. Usage: topk_janitor.py STUDY_DIR ... (runs until
killed, a pass every 15 s; a pass also on its own with --once). A rerun of a done point rebuilds its store.
"""
import json
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd


def _key(overrides: dict) -> str:
    return json.dumps(overrides, sort_keys=True, default=str)


def done_seeds(study: Path) -> set[int]:
    """The seeds whose every point in the grid is done (none while sweep.json or index.csv is unreadable). Only
    the index rows of points this grid plans count: a folder kept from an earlier plan of the study (other groups,
    other settings) has rows of its own seeds that must not free a store a planned point still reads."""
    try:
        index = pd.read_csv(study / "index.csv")
        spec = json.loads((study / "sweep.json").read_text())
        planned = [{**spec.get("set", {}), **p} for p in spec["grid"]["point"]]
    except (OSError, ValueError, KeyError, TypeError):  # not written yet, or mid-rewrite (both replaced atomically)
        return set()
    if not {"status", "overrides"} <= set(index.columns):
        return set()
    keys = {_key(p) for p in planned}
    done = Counter()
    for overrides in index.loc[index["status"] == "done", "overrides"].dropna():
        try:
            row = json.loads(overrides)
        except ValueError:
            continue
        if _key(row) in keys:
            done[int(row["seed"])] += 1
    wanted = Counter(int(p["seed"]) for p in planned)
    return {seed for seed, n in wanted.items() if done[seed] >= n}


def sweep(studies: list[Path]) -> list[str]:
    freed = []
    for study in studies:
        seeds = done_seeds(study)
        for meta in (study / "cache").glob("topk-*/meta.json"):
            try:
                seed = json.loads(meta.read_text())["recipe"]["seed"]
            except (OSError, ValueError, KeyError):
                continue
            if seed in seeds:
                shutil.rmtree(meta.parent, ignore_errors=True)
                freed.append(f"{study.name}: {meta.parent.name} (seed {seed})")
    return freed


if __name__ == "__main__":
    once = "--once" in sys.argv
    dirs = [Path(a) for a in sys.argv[1:] if a != "--once"]
    while True:
        for line in sweep(dirs):
            print(f"topk_janitor: freed {line}", flush=True)
        if once:
            break
        time.sleep(15)
