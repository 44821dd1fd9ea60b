"""Did a Dask sweep use the GPUs at the same time? For the `dask-sweep` run of scripts/gpu_runs.toml:

    python3 scripts/gpu/dask_overlap.py SWEEP_DIR OUT

writes OUT/index.csv (the sweep's index: worker = Dask worker address + its GPU), OUT/overlap.json (points on
different GPUs whose [started_at, finished_at] overlap: both_gpus_busy_at_once) and OUT/students.csv (every
complete point's students)."""
import itertools
import json
import sys
from pathlib import Path

import pandas as pd

from workbench import results
from workbench.sweep import index

d, out = sys.argv[1], sys.argv[2]
pd.set_option("display.width", 250)
idx = index.read_index(d)
idx.to_csv(f"{out}/index.csv", index=False)
print(idx.reindex(columns=["point", "status", "error_kind", "wall_s", "started_at", "finished_at", "worker",
                           "grid_hidden", "grid_seq_len", "error"]).to_string())
spans = [(r.worker.split(" GPU ")[-1], pd.Timestamp(r.started_at), pd.Timestamp(r.finished_at))
         for r in idx.itertuples() if isinstance(r.worker, str) and isinstance(r.started_at, str)
         and isinstance(r.finished_at, str)]
overlaps = [(a[0], b[0]) for a, b in itertools.combinations(spans, 2)
            if a[0] != b[0] and a[1] < b[2] and b[1] < a[2]]
verdict = {"gpus_used": sorted({s[0] for s in spans}), "points": len(idx),
           "done": int((idx["status"] == "done").sum()), "overlapping_pairs_on_different_gpus": len(overlaps),
           "both_gpus_busy_at_once": bool(overlaps)}
results.write_json(f"{out}/overlap.json", verdict)
print(json.dumps(verdict))
rows = [pd.read_csv(f"{d}/{p}/students.csv").assign(point=p) for p in idx["point"] if results.is_complete(Path(d, p))]
if rows:
    s = pd.concat(rows)
    s.to_csv(f"{out}/students.csv", index=False)
    print(s.reindex(columns=["point", "student", "status", "step_ms_median", "final_train_loss", "reason"]).to_string())
