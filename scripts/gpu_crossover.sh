#!/bin/bash
# Crossover evidence on the H200: the size_crossover sweep (hidden 512..8192 with intermediate = 4 x hidden,
# x 1024 / 8192 tokens per step, students bf16 / TE FP8 delayed / TE FP8 current / torchao tensorwise),
# then its report. Run from the repo root of the copy on the GPU machine:
#     bash .gpu/install.sh && bash scripts/gpu_crossover.sh
# Writes $OUT/sweep.tar.gz (results/sweeps/size_crossover: points, index.csv, report/) and $OUT/sweep.log.
# Budget: ~7 minutes. Each point is one papermill kernel (~6 s to start, TE import, torchao compile), so
# steps are few (10 train, 5 warm-up, 20 timed) and the students have 2 blocks. The sweep runs under
# `timeout`; whatever did not finish stays missing from the index (never half-written), the report is
# made from the complete points, and running this script again with results/sweeps/size_crossover
# present (carry it) resumes the sweep where it stopped.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
SWEEP_BUDGET_S=${SWEEP_BUDGET_S:-380}   # leaves ~40 s for the report and the tarball
NAME=size_crossover
ROOT=results/sweeps
mkdir -p "$OUT" "$ROOT"
LOG="$OUT/sweep.log"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"; } 2>&1 | tee "$LOG"

# Linked axis: intermediate moves with hidden (4x); the sizes are the outer loop, so an early stop loses
# the largest token count of the largest size last.
timeout -s TERM -k 30 "$SWEEP_BUDGET_S" python3 -m workbench sweep --name "$NAME" --out "$ROOT" --preset large \
  --set steps=${STEPS:-10} --set warmup=${WARMUP:-5} --set iters=${ITERS:-20} --set eval_batches=2 --set layers=2 --set batch=8 \
  --set backends=torch_bf16,te_fp8:delayed,te_fp8:current,torchao_float8:tensorwise --set baseline=torch_bf16 \
  --grid hidden=512,1024,2048,4096,8192 --grid intermediate=2048,4096,8192,16384,32768 --link hidden,intermediate \
  --grid seq_len=128,1024 --no-report 2>&1 | tee -a "$LOG" | grep -v -e IPKernelApp -e '^\s*$'
echo "sweep exit: ${PIPESTATUS[0]} (124: stopped by the time budget; rerun to resume)" | tee -a "$LOG"

python3 -m workbench sweep --name "$NAME" --out "$ROOT" --report-only 2>&1 | grep -v IPKernelApp | tee -a "$LOG"
python3 - "$ROOT/$NAME" <<'PY' 2>&1 | tee -a "$LOG"
import os, sys, pandas as pd
from workbench.sweep import index
d = sys.argv[1]
pd.set_option("display.width", 250); pd.set_option("display.max_colwidth", 80)
idx = index.read_index(d)
print(idx.reindex(columns=["point", "status", "error_kind", "wall_s", "grid_hidden", "grid_seq_len", "problems", "error"]).to_string())
if os.path.exists(f"{d}/report/crossover.csv"):
    print(pd.read_csv(f"{d}/report/crossover.csv").to_string())
    s = pd.read_csv(f"{d}/report/sweep.csv")
    print(s[["tokens", "cfg_hidden", "student", "status", "step_ms_median", "speedup_vs_ref", "final_loss_ratio_vs_ref",
             "peak_mem_allocated_mb"]].to_string())
PY

# Executed notebooks carry their plots inline (~0.2 MB each); leave them out only if the sweep grew large.
EXCLUDE=()
if [ "$(du -sm "$ROOT/$NAME" | cut -f1)" -gt 40 ]; then EXCLUDE=(--exclude='*/distill_benchmark.ipynb'); fi
tar -C "$ROOT" "${EXCLUDE[@]}" --exclude=.lock -czf "$OUT/sweep.tar.gz" "$NAME"
ls -la "$OUT" | tee -a "$LOG"
