#!/bin/bash
# One config over N GPUs of one host: `large` with DDP and with FSDP2 for torch bf16 and TE FP8 delayed /
# current, launched by `workbench run --set nproc=N` (torchrun). Each run also trains and times every student
# alone on rank 0 (rows '<student>@1gpu'): the 1-GPU and N-GPU points come from the same code, and
# students.csv carries world_size, scaling_efficiency, the slowest and median rank's step time and every
# rank's peak memory. On the 2 x H200 host (device kind nvidia-h200-x2), after `bash .gpu/install.sh`:
#     WORKBENCH_GIT_SHA=<sha> bash scripts/gpu_multi.sh OUTDIR          # NPROC=4 (or 8) for a scaling curve
# Knobs: PRESETS (default large; lm-a / lm-b are the transformer shapes), STRATEGIES, RUN_LIMIT_S,
# MULTI_BUDGET_S (no run starts after it), TEST=0 skips the test. Then the 2-GPU GPU test. Writes OUTDIR/multi/<preset>-<strategy>-<N>gpu/ (run folders and their logs) and
# OUTDIR/gpu_multi_tests.log. Budget: ~4 minutes on two GPUs (10 train steps, 5 warm-up, 20 timed).
set -uo pipefail
OUT=${1:-${OUT:-/tmp/out}}
source "$(dirname "$0")/gpu_env.sh"
N=${NPROC:-2}
# torchrun sets OMP_NUM_THREADS=1 in every rank when unset: the CPU-side model init of `large` then crawls
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
R="$OUT/multi"
mkdir -p "$R"
T0=$SECONDS
for preset in ${PRESETS:-large}; do
for strategy in ${STRATEGIES:-ddp fsdp2}; do
  id="$preset-$strategy-${N}gpu"
  if [ $((SECONDS - T0)) -gt "${MULTI_BUDGET_S:-100000}" ]; then echo "== $id skipped: budget spent"; continue; fi
  extra=()
  case $preset in lm-*) extra=(--set no_kd_student=false --set corpus_mb=1 --set eval_batches=1) ;; esac
  timeout "${RUN_LIMIT_S:-150}" python3 -m workbench run --preset "$preset" --out "$R" --run-id "$id" --set nproc="$N" \
    --set strategy="$strategy" --set backends=torch_bf16,te_fp8:delayed,te_fp8:current \
    --set steps=10 --set warmup=5 --set iters=20 --set eval_batches=2 "${extra[@]}" > "$R/$id.log" 2>&1
  echo "== $id: exit $?"
  python3 - "$R/$id" <<'PY'
import json, sys
import pandas as pd
try:
    df = pd.read_csv(sys.argv[1] + "/students.csv")
    cols = [c for c in ("student", "status", "world_size", "step_ms_median", "step_ms_median_rank_median",
                        "scaling_efficiency", "tokens_per_s", "peak_mem_allocated_mb_ranks", "initial_loss", "notes",
                        "reason") if c in df]
    print(df[cols].to_string(max_colwidth=50))
    print("initial_losses_equal:", json.load(open(sys.argv[1] + "/summary.json"))["initial_losses_equal"])
except Exception as e:
    print("no students.csv:", e)
PY
done
done
if [ "${TEST:-1}" = 1 ]; then
  timeout 90 python3 -m pytest -q -m gpu tests/gpu/test_gpu.py -k two_gpus 2>&1 | tee "$OUT/gpu_multi_tests.log" | tail -3
  exit "${PIPESTATUS[0]}"
fi
