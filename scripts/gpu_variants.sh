#!/bin/bash
# Quick look at the step-time variants on the GPU (graphs / compile / layout / param dtype) for the
# seed and large presets; writes $OUT/variants.tar.gz with one run folder per variant and a table.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
R=$(mktemp -d)
run() { # name preset backends overrides...
  local name=$1 preset=$2 backends=$3; shift 3
  local sets=(); for s in "$@"; do sets+=(--set "$s"); done
  timeout 300 python3 -m workbench run --preset "$preset" --set backends="$backends" --set baseline=$(echo $backends | cut -d, -f1) \
    --set steps=10 "${sets[@]}" --out "$R" --run-id "$name" > "$R/$name.log" 2>&1 || echo "$name failed" >> "$R/failures.txt"
}
SEEDB="torch_bf16,te_bf16,te_fp8:delayed,te_fp8:current,torchao_float8:tensorwise"
run seed_eager seed "$SEEDB" iters=50 warmup=10
run seed_graphs seed "$SEEDB" iters=50 warmup=10 graphs=true fused_optimizer=true
run seed_compile_graphs_fused seed "torch_bf16,te_fp8:delayed" iters=50 warmup=10 graphs=true compile=true fused_optimizer=true layout=fused param_dtype=bf16
LARGEB="torch_bf16,te_bf16,te_fp8:delayed,te_fp8:current,te_fp8:block,torchao_float8:tensorwise,torchao_float8:rowwise"
run large_fused_bf16 large "$LARGEB" layout=fused param_dtype=bf16 fused_optimizer=true compile=true
python3 - "$R" <<'PY'
import sys, pandas as pd
from workbench import results
df = results.load(sys.argv[1])
cols = ["run_id","student","status","step_ms_median","tflops","compile_ms","capture_ms","final_train_loss","initial_loss","teacher_ms_median","notes","reason"]
pd.set_option("display.width", 250); pd.set_option("display.max_colwidth", 60)
print(df[cols].to_string())
PY
cat "$R"/failures.txt 2>/dev/null; tail -5 "$R"/*.log | grep -i -B2 error | head -40
tar -C "$R" -czf "$OUT/variants.tar.gz" .
