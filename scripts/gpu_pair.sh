#!/bin/bash
# The single-GPU evidence in one run on a two-GPU H200 host, the two GPUs side by side (< 10 min):
#   GPU 0: scripts/gpu_bench.sh (seed, large, lm-a, lm-b benches, targets P1-P6)
#   GPU 1: scripts/gpu_lm_long.sh (long perplexity run, forced attention), then the remaining GPU tests
# Each job sees one GPU only (CUDA_VISIBLE_DEVICES); the host's 32 cores are shared, so the seed bench's
# host-bound eager rows may read a little slower than on a machine of their own.
#   python3 -m pip install -q --no-index --no-deps --no-compile .gpu-run/*.whl && WORKBENCH_GIT_SHA=<sha> bash scripts/gpu_pair.sh
# Writes $OUT: gpu_bench.sh's six files, g1.tar.gz (lm_long.tar.gz + the GPU-1 test logs) and pair.log.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
G1=$(mktemp -d)/g1
mkdir -p "$G1"
T0=$SECONDS
(CUDA_VISIBLE_DEVICES=0 TOTAL_BUDGET_S=${TOTAL_BUDGET_S:-330} bash scripts/gpu_bench.sh "$OUT" > "$G1/bench_stdout.log" 2>&1) &
bench=$!
(
  export CUDA_VISIBLE_DEVICES=1
  OUT=$G1 bash scripts/gpu_lm_long.sh
  echo "== lm_long done at $((SECONDS - T0)) s"
  # the tests not run by the two scripts (theirs: whole_step, fused_adam, forced_unfused, host_placed, held_out_evaluation)
  timeout "${REST_LIMIT_S:-200}" python3 -m pytest -q -m gpu tests/gpu/test_gpu.py \
    -k "not whole_step and not fused_adam and not forced_unfused and not host_placed and not held_out_evaluation" \
    > "$G1/gpu_tests_rest.log" 2>&1
  tail -1 "$G1/gpu_tests_rest.log"
  echo "== GPU 1 done at $((SECONDS - T0)) s"
) > "$G1/g1.log" 2>&1
wait $bench
{ cat "$G1/g1.log"; echo "== bench"; tail -40 "$G1/bench_stdout.log"; echo "== all done at $((SECONDS - T0)) s"; } > "$OUT/pair.log"
tar -C "$G1" -czf "$OUT/g1.tar.gz" .
cat "$OUT/pair.log"
