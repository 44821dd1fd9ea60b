#!/bin/bash
# Does the default answer say when a slower path ran? (workbench/run/slow_path.py) After `bash .gpu/install.sh`:
#   1. what `make run` runs on a GPU box: the main notebook, preset seed (eager), through papermill;
#   2. a TE language-model run with TE's unfused attention forced (options.te_attention=unfused).
# Each run's summary.json `slow_path` and step_time.png should name it. About 2-3 minutes on the H200.
# Writes $OUT/honest/{seed,unfused}/ (run folders, the executed notebook in seed/) and $OUT/honest/*.log.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
R="$OUT/honest"
mkdir -p "$R"
python3 -m workbench notebook --preset seed --out "$R" --run-id seed > "$R/seed.log" 2>&1
echo "== seed (notebook): exit $?"
python3 -m workbench run --preset gpt-cpu --out "$R" --run-id unfused --set backends=torch_bf16,te_bf16,te_fp8:delayed \
  --set baseline=torch_bf16 --set te_attention=unfused --set teacher=random --set corpus_mb=0.5 --set steps=20 > "$R/unfused.log" 2>&1
echo "== unfused (gpt-cpu, te_attention=unfused): exit $?"
for run in seed unfused; do
  python3 - "$R/$run" <<'PY'
import json, sys
import pandas as pd
run = sys.argv[1]
s = json.load(open(f"{run}/summary.json"))
print(run, "slow_path:", json.dumps(s["slow_path"], indent=1))
d = pd.read_csv(f"{run}/students.csv")
print(d[[c for c in ("student", "status", "step_ms_median", "gpu_busy_share", "attention_backend") if c in d]].to_string())
PY
done
