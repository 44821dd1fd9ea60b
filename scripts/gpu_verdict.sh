#!/bin/bash
# The verdict of real shapes on the H200 (issue 35): `workbench verdict <hf-init shape> --preset <its bench preset>`
# writes the shape's random-weight folder, predicts, benches it with itself as teacher (the variants the prediction
# calls for, the fastest bf16 row as the denominator) and writes the page. After `bash .gpu/install.sh`.
#   llama-4l   llama-3.2-1b-4l  hf-llama-4l      Llama-3.2-1B cut to 4 layers, vocab 32768
#   qwen-0.5b  qwen2.5-0.5b     hf-qwen2.5-0.5b  Qwen2.5-0.5B (24 layers, vocab 151936)
#   llama-1b   llama-3.2-1b     hf-llama-1b      Llama-3.2-1B (16 layers, vocab 128256): target under 8 min wall
#   qwen3-4l   qwen3-0.6b-4l    hf-llama-4l      Qwen3-0.6B cut to 4 layers (head_dim 128: the FP8 attention row)
# Knobs: SHAPES (default "llama-4l qwen-0.5b"), VERDICT_BUDGET_S (each bench's --budget-s, default 240).
# Writes $OUT/verdict/<shape>/: verdict.json / .md / .png, verdict.log (its output, with the wall time), bench/'s
# small files (bench.csv / .md / .json, peak.json, runs/*/students.csv and profile-*.json); the model folder stays.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
declare -A SHAPE=([llama-4l]=llama-3.2-1b-4l [qwen-0.5b]=qwen2.5-0.5b [llama-1b]=llama-3.2-1b [qwen3-4l]=qwen3-0.6b-4l)
declare -A PRESET=([llama-4l]=hf-llama-4l [qwen-0.5b]=hf-qwen2.5-0.5b [llama-1b]=hf-llama-1b [qwen3-4l]=hf-llama-4l)
W=$(mktemp -d)
for s in ${SHAPES:-llama-4l qwen-0.5b}; do
  mkdir -p "$OUT/verdict/$s"
  start=$(date +%s)
  timeout $(( ${VERDICT_BUDGET_S:-240} + 240 )) python3 -m workbench verdict "${SHAPE[$s]}" --preset "${PRESET[$s]}" \
    --budget-s "${VERDICT_BUDGET_S:-240}" --out "$W/$s" > "$OUT/verdict/$s/verdict.log" 2>&1
  echo "== $s: exit $? in $(( $(date +%s) - start )) s (model creation included)" | tee -a "$OUT/verdict/$s/verdict.log"
  grep -m1 "^Measured\|^Predicted" "$OUT/verdict/$s/verdict.log"
  # after every shape, so that a call cut by its limit still brings back the shapes it finished
  (cd "$W/$s" && cp verdict.json verdict.md verdict.png "$OUT/verdict/$s/" 2>/dev/null
   find bench \( -name '*.csv' -o -name '*.md' -o -name '*.json' \) -size -4M | tar -czf "$OUT/verdict/$s/bench.tar.gz" -T -)
done
