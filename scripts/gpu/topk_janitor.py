"""Frees the top-k teacher stores of study points that are done, while their studies go on (`quality-real`).

A store (<study>/cache/topk-<key>/, ~2.4 GiB per point at 800 steps of SmolLM2-135M) belongs to one point: its
recipe's seed is that point's train.seed, and no other point of the study reads it. Studies that run side by side
would otherwise fill the GPU machine's disk before they end. Usage: topk_janitor.py STUDY_DIR ... (runs until
killed, a pass every 15 s; a pass also on its own with --once). A rerun of a done point rebuilds its store.
"""
import json
import shutil
import sys
import time
from pathlib import Path

import pandas as pd


def done_seeds(study: Path) -> set[int]:
    try:
        index = pd.read_csv(study / "index.csv")
    except (OSError, ValueError):  # not written yet, or mid-rewrite (it is replaced atomically, so rarely)
        return set()
    if "grid_seed" not in index.columns:
        return set()
    return {int(s) for s in index.loc[index["status"] == "done", "grid_seed"].dropna()}


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
