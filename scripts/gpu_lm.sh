#!/bin/bash
# Language-model students on the H200: the GPU tests, then the lm-a and lm-b presets (decoder stacks at
# shapes A and B, vocab 32768, KL on the logits) with every backend, the attention backend TE selected
# recorded per TE student. After `bash .gpu/install.sh`. Knobs: PRESETS (default "lm-a lm-b"),
# LM_BUDGET_S (seconds per preset, default 200). Writes $OUT/lm.tar.gz and $OUT/gpu_tests.log.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
R=$(mktemp -d)/lm
mkdir -p "$R"
timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
for preset in ${PRESETS:-lm-a lm-b}; do
  timeout "${LM_BUDGET_S:-200}" python3 -m workbench run --preset "$preset" --out "$R" --run-id "$preset" \
    > "$R/$preset.log" 2>&1
  echo "== $preset: exit $?"
  python3 - "$R/$preset" <<'PY'
import sys
import pandas as pd
try:
    df = pd.read_csv(sys.argv[1] + "/students.csv")
    cols = [c for c in ("student", "status", "step_ms_median", "tflops", "peak_mem_allocated_mb", "attention_backend",
                        "heldout_ppl", "initial_loss", "reason") if c in df]
    print(df[cols].to_string(max_colwidth=60))
except Exception as e:
    print("no students.csv:", e)
PY
done
tar -C "$(dirname "$R")" -czf "$OUT/lm.tar.gz" --exclude='cache' lm
