"""Every preset's bench in one place, for the `bench` run of scripts/gpu_runs.toml:

    python3 scripts/gpu/bench_summary.py BENCH_DIR OUT

writes OUT/all_presets_bench.csv (every BENCH_DIR/<preset>/bench.csv, column `preset`) and
OUT/all_presets_targets.json ({preset: its targets.json}), and prints each target that has a figure."""
import json
import sys
from pathlib import Path

import pandas as pd

bench, out = Path(sys.argv[1]), Path(sys.argv[2])
dirs = sorted(p.parent for p in bench.glob("*/bench.csv"))
if dirs:
    pd.concat([pd.read_csv(d / "bench.csv") for d in dirs]).to_csv(out / "all_presets_bench.csv", index=False)
targets = {d.name: json.loads((d / "targets.json").read_text()) for d in dirs if (d / "targets.json").exists()}
(out / "all_presets_targets.json").write_text(json.dumps(targets, indent=1))
for preset, t in ((p, t) for p, ts in targets.items() for t in ts["targets"]):
    if t["achieved"] is not None:
        print(f"{preset:6s} {t['id']:16s} {t['target']:12s} {t['achieved']:10.4g}  met={t['met']}  {t['by']}")
