#!/bin/bash
# Matched-student evidence on the GPU machine: the seed and large presets with TE (bf16 and FP8 recipes) and
# the torch fp32/bf16 paths. Run from the repo root after `bash .gpu/install.sh`; writes $OUT/core.tar.gz.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
R=$(mktemp -d)
BACKENDS="torch_fp32,torch_bf16,te_bf16,te_fp8:delayed,te_fp8:delayed_e4m3,te_fp8:current,te_fp8:block,te_fp8:mxfp8"
for preset in seed large; do
  python3 -m workbench run --preset "$preset" --set backends="$BACKENDS" --out "$R" --run-id "$preset" \
    2>&1 | tee "$R/$preset.log" | grep -v '^{' | tail -40
done
python3 -m workbench probe --json > "$R/probe.json"
tar -C "$R" -czf "$OUT/core.tar.gz" .
