#!/bin/bash
# A longer held-out perplexity run on the H200, and a forced-attention check. After `bash .gpu/install.sh`.
#  1. lm-distill for STEPS (default 600) steps, held-out metrics every EVAL_EVERY (default 50: 12 points per
#     curve), students torch_bf16, te_bf16, te_fp8:delayed, te_fp8:current and the no-KD row. Its 600 batches
#     of teacher logits take 75 GiB: `teacher_logits=auto` keeps them on the GPU while they fit 60% of its free
#     memory, else in pinned host memory (task.json says which).
#  2. lm-a, te_bf16 only, a few steps with te_attention=unfused and then =fused (training logits forced to the
#     host, the timed ones stay on the GPU): the rows show the requested and the selected backend, step times.
#  3. The GPU tests of these paths (forced attention, host-placed logits, FP8 state kept across evaluation),
#     beside run 1 (whose step times are not speed evidence; run 2's are, it runs alone).
# Time (H200, from results/reference/h200/lm-distill: 150 steps and 4 students took 61-69 s, steps 15-39 ms):
# run 1 ~ 600 steps x 5 students x ~27 ms + ~50 s of teacher training, imports, data ~ 2.3 min; run 2 ~ 2 x 40 s;
# the time limits (175 + 2 x 55 s, the tests beside run 1) keep it under 5 min.
# Knobs: STEPS, EVAL_EVERY, SEED (default 1), SET (extra --set arguments for run 1).
# Writes $OUT/lm_long.tar.gz (run folders, logs) and $OUT/gpu_tests_long.log.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
R=$(mktemp -d)/lm-long
mkdir -p "$R"
(timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_gpu.py -k "forced_unfused or host_placed or held_out_evaluation" \
  > "$OUT/gpu_tests_long.log" 2>&1) &
tests=$!

show() {  # the columns this script is about, from a run's students.csv and task.json
  python3 - "$1" <<'PY'
import json, sys
import pandas as pd
try:
    df = pd.read_csv(sys.argv[1] + "/students.csv")
    cols = [c for c in ("student", "status", "step_ms_median", "peak_mem_allocated_mb", "attention_requested",
                        "attention_backend", "attention_warning", "heldout_ppl", "kl_teacher_student_t1_nats",
                        "reason") if c in df]
    print(df[cols].to_string(max_colwidth=70))
    task = json.load(open(sys.argv[1] + "/task.json"))
    print({k: v for k, v in task.items() if k.startswith("teacher_logits")})
except Exception as e:
    print("no result files:", e)
PY
}

timeout 175 python3 -m workbench run --preset lm-distill --out "$R" --run-id long \
  --set steps="${STEPS:-600}" --set eval_every="${EVAL_EVERY:-50}" --set seed="${SEED:-1}" \
  --set backends=torch_bf16,te_bf16,te_fp8:delayed,te_fp8:current ${SET:-} > "$R/long.log" 2>&1
echo "== lm-distill ${STEPS:-600} steps: exit $?"
show "$R/long"
wait $tests
tail -1 "$OUT/gpu_tests_long.log"

for attention in unfused fused; do
  timeout 55 python3 -m workbench run --preset lm-a --out "$R" --run-id "attention-$attention" \
    --set backends=te_bf16 --set baseline=te_bf16 --set te_attention="$attention" --set teacher_logits=host \
    --set steps=3 --set warmup=3 --set iters=10 --set eval_batches=1 --set no_kd_student=false \
    > "$R/attention-$attention.log" 2>&1
  echo "== lm-a te_bf16, te_attention=$attention: exit $?"
  show "$R/attention-$attention"
done
tar -C "$(dirname "$R")" -czf "$OUT/lm_long.tar.gz" --exclude='cache' lm-long
