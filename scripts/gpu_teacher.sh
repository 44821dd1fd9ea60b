#!/bin/bash
# Teacher modes (distill.teacher_mode) and the head-fused loss on one H200, after `bash .gpu/install.sh`.
#   bash scripts/gpu_teacher.sh [PART ...]     PART: lengths quality loss readme tests (default: all of them)
# Writes $OUT/teacher/: length.csv (+ length-MODE-STEPS.json), topk_quality.csv, loss_compare.csv, README.md
# (generated from those files), runs.tar.gz (the run folders' small files), logs/ and gpu_tests_teacher.log.
#  lengths: a gpt student at vocab 128256, 8192 tokens a step, teacher_mode online and topk (k=64) at each of
#           STEPS (default "200 2000"; 2,000 is the target; STEPS_ONLINE / STEPS_TOPK for one mode): peak GPU
#           memory over the whole process and peak
#           host RSS. The two modes' chains run side by side, and the top-k quality runs beside them: memory is
#           per process, so sharing the GPU does not change it (step times there are not a speed figure).
#           Precomputed logits would need 2.1 GB a step.
#  quality: lm-distill's student for 150 steps with full logits and top-k k in 8, 64, 256: held-out KL to the
#           full teacher, perplexity, top-1 agreement (the teacher is trained once and cached).
#  loss:    the logit loss at vocab 128256, 8192 tokens, hidden 2048, alone on the GPU (it is timed):
#           checkpointed, fused, fused_head (chunks of 4096, 2048, 1024, 512), Liger-Kernel's fused linear JSD at beta=0
#           if it is importable: loss memory, ms, loss values.
# Each part has a time limit; a part that runs out leaves its files out and the README says so.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
T="$OUT/teacher"
mkdir -p "$T/logs"
PARTS=${*:-lengths quality loss readme tests}
chain() {  # one mode's length runs, shortest first
  local var="STEPS_${1^^}"  # STEPS_ONLINE / STEPS_TOPK override STEPS for one mode
  for steps in ${!var:-${STEPS:-200 2000}}; do
    timeout "${LENGTH_LIMIT_S:-280}" python3 scripts/gpu_teacher.py length "$1" "$steps" "$T" > "$T/logs/length-$1-$steps.log" 2>&1
    echo "== length $1 $steps: exit $?"
  done
}
pids=()
if [[ " $PARTS " == *" lengths "* ]]; then chain online & pids+=($!); chain topk & pids+=($!); fi
if [[ " $PARTS " == *" quality "* ]]; then
  (timeout 280 python3 scripts/gpu_teacher.py quality "$T" > "$T/logs/quality.log" 2>&1; echo "== quality: exit $?") &
  pids+=($!)
fi
for p in "${pids[@]}"; do wait "$p"; done
if [[ " $PARTS " == *" loss "* ]]; then
  timeout 120 python3 scripts/gpu_teacher.py loss "$T" > "$T/logs/loss.log" 2>&1; echo "== loss: exit $?"
fi
if [[ " $PARTS " == *" readme "* ]]; then
  python3 scripts/gpu_teacher.py readme "$T"; echo "== readme: exit $?"
  rm -rf "$T/runs/cache"  # top-k stores and teacher weights: GBs, not evidence
  [ -d "$T/runs" ] && tar -C "$T" -czf "$T/runs.tar.gz" runs && rm -rf "$T/runs"
  cat "$T/README.md"
fi
if [[ " $PARTS " == *" tests "* ]]; then
  timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_gpu_teacher.py > "$T/gpu_tests_teacher.log" 2>&1
  tail -1 "$T/gpu_tests_teacher.log"
fi
