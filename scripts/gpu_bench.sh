#!/bin/bash
# The benchmark on the H200, one call (< 9 min): the new GPU tests (whole-step TE graphs, TE FusedAdam, FP8
# weights), then `workbench bench` at seed, large, lm-a and lm-b (transformer shapes A and B) with each preset's
# default variants (see `python -m workbench bench --list`): the tutorial-equivalent students measured in the
# same run, whole-step CUDA graphs for TE students (te_graph=step), FP8 weights, TE FusedAdam (fp32 masters,
# bf16 moments), compiled torch bf16 and torchao float8; matmul peak probe, profiler cross-check, 3 repeats.
# Each preset has a budget (variants not started once it is spent become 'skipped' rows) and a hard time
# limit (a bench cut short is aggregated from what it finished); presets not started after TOTAL_BUDGET_S
# are skipped: worst case ~9 min (tests 100 s + seed 120 + large 150 + lm-a 160, lm-b then skipped).
#   WORKBENCH_GIT_SHA=$(git rev-parse --short HEAD) bash scripts/gpu_bench.sh OUTDIR
# Run from the repo root after `bash .gpu/install.sh`. Writes to OUTDIR (default $OUT) at most 6 files:
#   bench.tar.gz  every bench folder (<preset>/bench.csv, targets.json, bench.md, peak.json, runs/...), the
#                 tokenizer/teacher cache left out; unpack into results/reference/h200/bench/
#   all_presets_bench.csv    every preset's rows in one table (column `preset`)
#   all_presets_targets.json {preset: that bench's targets.json} (P1-P6: goal, best, row, met, breakdown where missed)
#   README.md     the targets of every preset in one table, then every row (`bench --write-readme`)
#   gpu_tests.log, bench.log (the last lines of each preset's log)
# Knobs: TESTS (0: no GPU tests first), PRESETS, SEED_BUDGET_S LARGE_BUDGET_S LM_BUDGET_S LM_HARD_S, TOTAL_BUDGET_S, SEED_VARIANTS LARGE_VARIANTS LM_VARIANTS.
set -uo pipefail
[ -n "${1:-}" ] && export OUT=$1
source "$(dirname "$0")/gpu_env.sh"
python3 -c "import torch, transformer_engine.pytorch as te; print('TE', te.is_fp8_available(return_reason=True))" \
  || echo "gpu_bench.sh: TE does not import; TE students will be fallback rows (see python3 -m workbench doctor)"
R=$(mktemp -d)
B=$R/bench
mkdir -p "$B"
T0=$SECONDS
show() { grep -v -e '^{' -e 'USDT:' | tail -"${1:-40}"; }

if [ "${TESTS:-1}" = 1 ]; then  # TESTS=0: the bench only (a call that runs scripts/gpu_tests.sh anyway)
  timeout 100 python3 -m pytest -q -m gpu tests/gpu/test_gpu.py -k "whole_step or fused_adam" 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -5
  echo "== GPU tests done at $((SECONDS - T0)) s"
fi

: > "$R/bench.log"
for preset in ${PRESETS:-seed large lm-a lm-b}; do
  if [ $((SECONDS - T0)) -gt "${TOTAL_BUDGET_S:-420}" ]; then
    echo "== $preset skipped: ${TOTAL_BUDGET_S:-420} s spent" | tee -a "$R/bench.log"; continue
  fi
  case $preset in
    # seed: launch-bound, so many timed steps are cheap
    seed) budget=${SEED_BUDGET_S:-70}; variants=${SEED_VARIANTS:-eager,graphs-step-fused-bf16,compile-graphs-fused-bf16,graphs-step,te-adam-graphs-step-fused-bf16,graphs-fused-bf16}
          args=(--set steps=8 --set warmup=10 --set iters=50 --set eval_batches=2); hard=120 ;;
    # large: GEMM-bound, ~20-45 ms a step; no fp32 student (415 ms a step), no torchao (20 s compiles)
    large) budget=${LARGE_BUDGET_S:-100}; variants=${LARGE_VARIANTS:-tutorial,graphs-step-fused-bf16,fp8-weights-fused-bf16,te-adam-graphs-step-fused-bf16,te-adam-bf16-moments-graphs-step-fused-bf16,graphs-fused-bf16}
           args=(--set steps=4 --set warmup=4 --set iters=15 --set eval_batches=2); hard=150 ;;
    # decoder stacks: compiles take the time; a small corpus (a random teacher: speed and memory only)
    lm-a|lm-b) budget=${LM_BUDGET_S:-100}; variants=${LM_VARIANTS:-lm-te-step,lm-compile,lm-te,lm-te-fp8-weights,lm-checkpointed-loss,lm-te-step-checkpointed-loss}
               args=(--set steps=4 --set warmup=3 --set iters=10 --set eval_batches=1 --set no_kd_student=false
                     --set corpus_mb=1); hard=${LM_HARD_S:-160} ;;
    *) echo "gpu_bench.sh: unknown preset $preset"; continue ;;
  esac
  timeout "$hard" python3 -m workbench bench --preset "$preset" --out "$B" --run-id "$preset" "${args[@]}" \
    --repeats 3 --budget-s "$budget" --variants "$variants" --targets results/reference/bench_targets.json \
    > "$R/$preset.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && [ -d "$B/$preset" ]; then  # cut short: the finished variants still make its files
    echo "== $preset: exit $rc; aggregating what finished" >> "$R/$preset.log"
    python3 -m workbench bench --aggregate "$B/$preset" --targets results/reference/bench_targets.json \
      >> "$R/$preset.log" 2>&1
  fi
  { echo "== $preset: exit $rc at $((SECONDS - T0)) s"; show 25 < "$R/$preset.log"; } | tee -a "$R/bench.log"
done

python3 -m workbench probe --json > "$B/probe.json" 2>/dev/null
python3 -m workbench bench --write-readme "$B" > /dev/null && cp "$B/README.md" "$OUT/README.md"
python3 - "$B" "$OUT" <<'PY'
import json, sys
from pathlib import Path
import pandas as pd
bench, out = Path(sys.argv[1]), Path(sys.argv[2])
dirs = sorted(p.parent for p in bench.glob("*/bench.csv"))
if dirs:
    pd.concat([pd.read_csv(d / "bench.csv") for d in dirs]).to_csv(out / "all_presets_bench.csv", index=False)
json.dump({d.name: json.loads((d / "targets.json").read_text()) for d in dirs if (d / "targets.json").exists()},
          open(out / "all_presets_targets.json", "w"), indent=1)
for d in dirs:
    for t in json.loads((d / "targets.json").read_text())["targets"]:
        if t["achieved"] is not None:
            print(f"{d.name:6s} {t['id']:16s} {t['target']:12s} {t['achieved']:10.4g}  met={t['met']}  {t['by']}")
PY
cp "$R"/*.log "$B"/ 2>/dev/null
cp "$R/bench.log" "$OUT/bench.log"
tar -C "$B" -czf "$OUT/bench.tar.gz" --exclude='cache' .
ls -la "$OUT"
echo "== total $((SECONDS - T0)) s"
