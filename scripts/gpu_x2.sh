#!/bin/bash
# Everything that needs two GPUs, in one device call on nvidia-h200-x2 (< 10 min), by priority:
#   1. `large` over 2 GPUs with DDP and FSDP2 (torch bf16, TE FP8 delayed / current; scripts/gpu_multi.sh)
#   2. the 2-GPU GPU test
#   3. transformer shape B (`lm-b`) over 2 GPUs, DDP and FSDP2 (the scaling curve's second shape)
#   4. a sweep over both GPUs through the embedded Dask cluster (scripts/gpu_sweep.sh; SWEEP=0 skips it)
#   then `workbench scaling` over every distributed run
# A step does not start once STOP_S (default 470 s) have passed. Carry the TE, notebook and dask wheels:
#   python3 -m pip install -q --no-index --no-deps --no-compile .gpu-x2/*.whl && \
#   WORKBENCH_GIT_SHA=<sha> bash scripts/gpu_x2.sh
# Writes $OUT/x2.tar.gz (multi/ run folders, sweep/, scaling/) and $OUT/x2.log.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
W=$(mktemp -d)/x2
mkdir -p "$W/sweep"
T0=$SECONDS
LOG=$OUT/x2.log
late() { [ $((SECONDS - T0)) -gt "${STOP_S:-470}" ] && echo "== $1 not started: ${STOP_S:-470} s spent" | tee -a "$LOG"; }
{ nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformer_engine.pytorch as te; print('torch', torch.__version__, 'TE fp8', te.is_fp8_available())"
} 2>&1 | tee "$LOG"

# A distributed run trains every student twice (over both ranks, then alone on rank 0 as '<student>@1gpu'):
# `large` took 151 s for DDP and FSDP2 together at fb56d8a, the 2-GPU test and `lm-b` 245 s more; 240 s per run leaves room.
TEST=0 PRESETS=large RUN_LIMIT_S=${RUN_LIMIT_S:-240} bash scripts/gpu_multi.sh "$W" 2>&1 | tee -a "$LOG"
echo "== large done at $((SECONDS - T0)) s" | tee -a "$LOG"
late test || timeout 90 python3 -m pytest -q -m gpu tests/gpu/test_gpu.py -k two_gpus 2>&1 | tee "$W/gpu_tests_x2.log" | tail -3 | tee -a "$LOG"
late lm-b || TEST=0 PRESETS=lm-b RUN_LIMIT_S=${RUN_LIMIT_S:-240} MULTI_BUDGET_S=$(( ${STOP_S:-470} - (SECONDS - T0) )) \
  bash scripts/gpu_multi.sh "$W" 2>&1 | tee -a "$LOG"
echo "== lm-b done at $((SECONDS - T0)) s" | tee -a "$LOG"
if [ "${SWEEP:-1}" = 1 ]; then
  late sweep || bash scripts/gpu_sweep.sh "$W/sweep" 2>&1 | tail -25 | tee -a "$LOG"
  echo "== sweep done at $((SECONDS - T0)) s" | tee -a "$LOG"
fi
python3 -m workbench scaling "$W/multi" --out "$W/scaling" 2>&1 | tee -a "$LOG"
echo "== all done at $((SECONDS - T0)) s" | tee -a "$LOG"
tar -C "$W" --exclude=cache -czf "$OUT/x2.tar.gz" .
ls -la "$OUT"
