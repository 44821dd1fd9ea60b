#!/bin/bash
# A sweep over the GPUs of one host through the embedded Dask cluster (dask-cuda's LocalCUDACluster: one
# worker per GPU, each pinned by CUDA_VISIBLE_DEVICES). Run on nvidia-h200-x2, from the repo root of the copy:
#     bash .gpu/install.sh && WORKBENCH_GIT_SHA=<sha> bash scripts/gpu_sweep.sh OUTDIR
# (needs the notebook and dask wheels: papermill, dask, distributed, dask-cuda). Four small `seed` points
# (hidden 512/1024 x seq_len 128/256; torch bf16 and TE FP8 delayed), two per GPU, about a minute.
# Writes OUTDIR/sweep.log, OUTDIR/index.csv (worker = Dask worker address + its GPU; started_at/finished_at)
# and OUTDIR/overlap.json: whether points on different GPUs ran at the same time (both GPUs busy at once).
# What to check: overlap.json "both_gpus_busy_at_once" true, index.csv's worker column naming GPU 0 and GPU 1,
# every point done with te_fp8:delayed ok in its students.csv (OUTDIR/students.csv, all points).
set -uo pipefail
OUT=${1:-${OUT:-/tmp/out}}
source "$(dirname "$0")/gpu_env.sh"
ROOT=$(mktemp -d)/sweeps
NAME=dask_gpus
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>&1 | tee "$OUT/sweep.log"
python3 -c "import dask_cuda; print('dask-cuda', dask_cuda.__version__)" 2>&1 | tee -a "$OUT/sweep.log"

timeout -s TERM -k 30 150 python3 -m workbench sweep --name "$NAME" --out "$ROOT" --preset seed \
  --set steps=30 --set warmup=5 --set iters=20 --set eval_batches=2 \
  --set backends=torch_bf16,te_fp8:delayed --set baseline=torch_bf16 \
  --grid hidden=512,1024 --grid seq_len=128,256 --no-report 2>&1 | tee -a "$OUT/sweep.log" | grep -v -e IPKernelApp -e '^\s*$'
echo "sweep exit: ${PIPESTATUS[0]}" | tee -a "$OUT/sweep.log"

python3 - "$ROOT/$NAME" "$OUT" <<'PY' 2>&1 | tee -a "$OUT/sweep.log"
import itertools, json, sys
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
PY
ls -la "$OUT"
