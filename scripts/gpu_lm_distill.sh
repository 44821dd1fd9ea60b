#!/bin/bash
# Held-out perplexity curves of bf16 and FP8 students on the H200: the lm-distill preset with two seeds
# (the noise), and the GPU tests beside it. The tests share the GPU with the runs, so this call's step
# times are not speed evidence (lm/ and bench/ are). After `bash .gpu/install.sh`.
# Knobs: SEEDS (default "1 2"), SET (extra --set arguments), RUN_BUDGET_S (per seed, default 100).
# Writes $OUT/lm_distill.tar.gz and $OUT/gpu_tests.log.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
R=$(mktemp -d)/lm-distill
mkdir -p "$R"
(timeout 170 python3 -m pytest -q -m gpu tests/gpu/test_gpu.py > "$OUT/gpu_tests.log" 2>&1) &
tests=$!
for seed in ${SEEDS:-1 2}; do
  timeout "${RUN_BUDGET_S:-100}" python3 -m workbench run --preset lm-distill --out "$R" --run-id "seed$seed" \
    --set seed="$seed" ${SET:-} > "$R/seed$seed.log" 2>&1
  echo "== seed $seed: exit $?"
  python3 - "$R/seed$seed" <<'PY'
import sys
import pandas as pd
try:
    df = pd.read_csv(sys.argv[1] + "/students.csv")
    print(df[["student", "status", "initial_loss", "heldout_ppl", "kl_teacher_student_t1_nats", "top1_agreement",
              "teacher_heldout_ppl"]].to_string())
except Exception as e:
    print("no students.csv:", e)
PY
done
wait $tests
tail -1 "$OUT/gpu_tests.log"
tar -C "$(dirname "$R")" -czf "$OUT/lm_distill.tar.gz" --exclude='cache' lm-distill
