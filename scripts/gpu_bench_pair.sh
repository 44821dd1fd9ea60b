#!/bin/bash
# Two benches side by side on nvidia-h200-x2, one per GPU (each sees one GPU: CUDA_VISIBLE_DEVICES), returned
# as ONE archive (two gpu_bench.sh outputs are 12 files).
#   WORKBENCH_GIT_SHA=<sha> GPU0="seed large" GPU1="lm-a lm-b" bash scripts/gpu_bench_pair.sh OUTDIR
# The knobs of scripts/gpu_bench.sh pass through (TOTAL_BUDGET_S, LM_BUDGET_S, LM_HARD_S, *_VARIANTS; TESTS=0
# is set: run scripts/gpu_tests.sh in its own call). Writes OUTDIR/bench_pair.tar.gz (gpu0/ and gpu1/, each
# gpu_bench.sh's files: bench.tar.gz, all_presets_*, README.md, bench.log) and OUTDIR/bench_pair.log.
# The two share the host's CPUs: host-bound eager rows read slower than on a machine of their own.
set -uo pipefail
OUT=${1:-${OUT:-/tmp/out}}
source "$(dirname "$0")/gpu_env.sh"
R=$(mktemp -d)
: > "$OUT/bench_pair.log"
T0=$SECONDS
for g in 0 1; do
  presets=$([ $g = 0 ] && echo "${GPU0:-seed large}" || echo "${GPU1:-lm-a lm-b}")
  mkdir -p "$R/gpu$g"
  (CUDA_VISIBLE_DEVICES=$g TESTS=0 PRESETS="$presets" bash scripts/gpu_bench.sh "$R/gpu$g" > "$R/gpu$g/stdout.log" 2>&1
   echo "== GPU $g ($presets): exit $? at $((SECONDS - T0)) s" >> "$OUT/bench_pair.log") &
done
wait
for g in 0 1; do { echo "== GPU $g"; tail -12 "$R/gpu$g/stdout.log"; } >> "$OUT/bench_pair.log"; done
tar -C "$R" -czf "$OUT/bench_pair.tar.gz" gpu0 gpu1
echo "== total $((SECONDS - T0)) s" | tee -a "$OUT/bench_pair.log"
