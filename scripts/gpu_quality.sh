#!/bin/bash
# The distillation-quality study on one H200: every arm (torch bf16, TE bf16, TE FP8 delayed / current,
# torchao float8, the no-KD student, the second bf16 arm of the noise floor) x 3 seeds, one teacher trained
# once, each student on its fastest path (compiled, whole step in one CUDA graph). At 3200 steps the study took
# 15 min 16 s on the H200 in two calls (7:36 + 7:40, the point cut by the first call's budget run again), so
# plan two calls back to back. After `bash .gpu/install.sh`. Resumable: a second call on a warm machine
# (within its 30 s idle release) finishes what a timed-out first one left (the study folder stays in $STUDY_ROOT).
# Knobs: SET (extra --set arguments, e.g. "--set lm.student=DIR"), BUDGET_S (default 570: a run within 10 minutes).
# Writes $OUT/quality/ README.md and headline.json, and $OUT/quality.tar.gz: the study's small files
# (CSV / JSON / PNG / README, the executed report notebook), no checkpoints, no point folders' runs.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
ROOT=${STUDY_ROOT:-/tmp/workbench-quality}
mkdir -p "$ROOT" "$OUT/quality"
timeout "${BUDGET_S:-570}" python3 -m workbench study --preset distill-quality --out "$ROOT" ${SET:-} \
  > "$ROOT/study.log" 2>&1
echo "== study: exit $?"
S="$ROOT/distill-quality"
tail -3 "$ROOT/study.log"
cp "$S/README.md" "$S/headline.json" "$OUT/quality/" 2>/dev/null
cp "$ROOT/study.log" "$S/" 2>/dev/null
(cd "$S" && tar -czf "$OUT/quality.tar.gz" $(ls *.csv *.json *.png *.md *.ipynb *.log 2>/dev/null))
cat "$OUT/quality/headline.json" 2>/dev/null | head -c 2000; echo
