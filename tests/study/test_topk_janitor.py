"""scripts/gpu/topk_janitor.py frees the top-k store of a seed whose points are all done, only: studies side by
side on one GPU machine would fill its disk, and a store of a point still running (or failed, to be rerun) must
stay."""
import importlib.util
import json
from pathlib import Path

import pandas as pd

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "topk_janitor.py"


def _janitor():
    spec = importlib.util.spec_from_file_location("topk_janitor", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_only_a_done_points_store_is_freed(tmp_path):
    study = tmp_path / "real-pruned"
    for seed in (1, 1001, 2):
        store = study / "cache" / f"topk-{seed:012d}"
        store.mkdir(parents=True)
        (store / "values.bin").write_bytes(b"x" * 16)
        (store / "meta.json").write_text(json.dumps({"format": 1, "recipe": {"seed": seed}}))
    (study / "cache" / "topk-building.tmp").mkdir()  # a build in progress: no meta.json yet
    # seed 2's arms in two points (point_groups): one done is not enough; the index's overrides are the study's
    # set and the point's grid entry, as the sweep writes them
    fixed = {"steps": 800, "lm.teacher": "/m"}
    grid = [{"seed": 1, "backends": ["a"]}, {"seed": 1001, "backends": ["a"]}, {"seed": 2, "backends": ["a"]},
            {"seed": 2, "backends": ["b"]}]
    (study / "sweep.json").write_text(json.dumps({"name": "real-pruned", "set": fixed, "grid": {"point": grid}}))
    rows = [("a", "done", grid[0]), ("b", "running", grid[1]), ("c", "done", grid[2]), ("d", "failed", grid[3]),
            # a point of an earlier plan of the study (another grouping), done: it must not count for seed 2
            ("old", "done", {"seed": 2, "backends": ["a", "b"]})]
    pd.DataFrame({"point": [r[0] for r in rows], "status": [r[1] for r in rows],
                  "grid_seed": [r[2]["seed"] for r in rows],
                  "overrides": [json.dumps({**fixed, **r[2]}, sort_keys=True) for r in rows]}).to_csv(
        study / "index.csv", index=False)
    freed = _janitor().sweep([study, tmp_path / "not-started-yet"])
    assert freed == [f"real-pruned: topk-{1:012d} (seed 1)"]
    left = sorted(p.name for p in (study / "cache").iterdir() if not p.name.endswith(".lock"))  # (empty lock files
    assert left == ["topk-000000000002", "topk-000000001001", "topk-building.tmp"]  # stay, as every cache entry's)
    index = pd.read_csv(study / "index.csv")
    index.loc[index["point"] == "d", "status"] = "done"
    index.to_csv(study / "index.csv", index=False)
    assert _janitor().sweep([study]) == [f"real-pruned: topk-{2:012d} (seed 2)"]


def _study(root: Path, name: str, seeds: dict[int, str], steps: int = 800) -> Path:
    """A study folder with one point per seed in its plan, each with the index status given."""
    study = root / name
    study.mkdir(parents=True)
    fixed = {"steps": steps, "batch": 16, "seq_len": 512}
    grid = [{"seed": s, "backends": ["a"]} for s in seeds]
    (study / "sweep.json").write_text(json.dumps({"name": name, "set": fixed, "grid": {"point": grid}}))
    pd.DataFrame({"point": [f"p{s}" for s in seeds], "status": list(seeds.values()),
                  "overrides": [json.dumps({**fixed, **g}, sort_keys=True) for g in grid]}).to_csv(
        study / "index.csv", index=False)
    return study


def _store(cache: Path, seed: int, steps: int = 800) -> Path:
    store = cache / f"topk-{seed:06d}{steps:06d}"
    store.mkdir(parents=True)
    (store / "meta.json").write_text(json.dumps({"format": 1, "recipe": {"seed": seed, "steps": steps, "batch": 16,
                                                                          "seq_len": 512}}))
    return store


def test_a_shared_store_is_freed_once_every_study_that_reads_it_is_done_with_it(tmp_path):
    """`study --cache`: the pruned and the random study read one store per seed; it stays until both have done that
    seed's points. A store of another shape (the fine-tuning study's 320 steps) no study here plans: never touched;
    while a study exists without a readable plan, nothing goes."""
    j, cache = _janitor(), tmp_path / "cache"
    pruned = _study(tmp_path, "real-pruned", {1: "done", 2: "done"})
    random_ = _study(tmp_path, "real-random", {1: "done", 2: "running"})
    s1, s2, other = _store(cache, 1), _store(cache, 2), _store(cache, 1, steps=320)
    starting = tmp_path / "real-finetune"
    starting.mkdir()  # `workbench study` made its folder, its sweep.json is not there yet
    assert j.sweep([pruned, random_, starting], cache) == []
    assert j.sweep([pruned, random_, tmp_path / "not-started"], cache) == [f"cache: {s1.name} (seed 1)"]
    assert not s1.exists() and s2.exists() and other.exists()
    # the studies stopped for good, seed 2's random point unfinished (--ended): its store goes, the unplanned one stays
    assert j.sweep([pruned, random_], cache, ended=True) == [f"cache: {s2.name} (seed 2)"]
    assert other.exists()


def test_a_store_a_point_is_checking_or_building_is_left_for_a_later_pass(tmp_path):
    # a rerun's ensure_store holds the store's entry lock while it hashes, builds or opens it
    from workbench.data.cache import entry_lock

    j, cache = _janitor(), tmp_path / "cache"
    study = _study(tmp_path, "real-pruned", {1: "done"})
    store = _store(cache, 1)
    lock = entry_lock(store)
    lock.acquire()
    try:
        assert j.sweep([study], cache) == [] and store.exists()
    finally:
        lock.release()
    assert j.sweep([study], cache) == [f"cache: {store.name} (seed 1)"] and not store.exists()
