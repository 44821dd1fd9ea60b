#!/bin/bash
# Teacher modes (distill.teacher_mode) and the head-fused loss on one H200, after `bash .gpu/install.sh`.
# Writes $OUT/teacher/: length.csv (+ length-MODE-STEPS.json), topk_quality.csv, loss_compare.csv, README.md
# (generated from those files), logs/ (each part's output) and gpu_tests_teacher.log.
#  (a) length independence: a gpt student at vocab 128256, 8192 tokens a step, teacher_mode online and topk (k=64)
#      at STEPS_SHORT and STEPS_LONG steps (default 100 and 400; the target is 2,000), one process each: peak GPU
#      memory over the whole process and peak host RSS. Precomputed logits would need 2.1 GB a step.
#  (b) top-k quality: lm-distill's student for 150 steps with full logits and top-k k in 8, 64, 256: held-out KL
#      to the full teacher, perplexity, top-1 agreement (the teacher is trained once, ~50 s, and cached).
#  (c) the logit loss at vocab 128256, 8192 tokens, hidden 2048: checkpointed, fused, fused_head (chunk 4096 and
#      1024), and Liger-Kernel's fused linear JSD at beta=0 if it is importable: loss memory, ms, loss values.
# Time (estimated, not yet measured): (a) 4 runs of 30-70 s, (b) ~50 s + 4 x ~25 s, (c) ~40 s; the GPU tests of
# the teacher modes run at the end. Time limits keep each part bounded; a part that runs out leaves its files out
# and the README says so.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
T="$OUT/teacher"
mkdir -p "$T/logs"
for steps in "${STEPS_SHORT:-100}" "${STEPS_LONG:-400}"; do
  for mode in online topk; do
    timeout 110 python3 scripts/gpu_teacher.py length "$mode" "$steps" "$T" > "$T/logs/length-$mode-$steps.log" 2>&1
    echo "== length $mode $steps: exit $?"
  done
done
timeout 200 python3 scripts/gpu_teacher.py quality "$T" > "$T/logs/quality.log" 2>&1; echo "== quality: exit $?"
timeout 90 python3 scripts/gpu_teacher.py loss "$T" > "$T/logs/loss.log" 2>&1; echo "== loss: exit $?"
python3 scripts/gpu_teacher.py readme "$T"; echo "== readme: exit $?"
rm -rf "$T/runs/cache"  # top-k stores and teacher weights: GBs, not evidence
tar -C "$T" -czf "$T/runs.tar.gz" runs && rm -rf "$T/runs"
timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_teacher.py > "$T/gpu_tests_teacher.log" 2>&1
tail -1 "$T/gpu_tests_teacher.log"
cat "$T/README.md"
