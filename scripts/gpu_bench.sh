#!/bin/bash
# The benchmark on the H200: `workbench bench` at the seed preset and at the large preset, every
# default variant (eager / compile / graphs x layout x param dtype; see `python -m workbench bench --list`),
# with the matmul peak probe, the profiler cross-check and noise repeats. Budgeted to finish in < 8 min:
# a variant not started once its preset's budget is spent becomes 'skipped' rows (the files say so).
# Run from the repo root after `bash .gpu/install.sh`; writes $OUT/bench.tar.gz (unpack into
# results/reference/h200/bench/: seed/, large/, probe.json, tables.md). Knobs: PRESETS="seed large",
# SEED_VARIANTS=a,b LARGE_VARIANTS=c,d, SEED_BUDGET_S / LARGE_BUDGET_S (default 150 s each).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
python3 -c "import torch, transformer_engine.pytorch as te; print('TE', te.__version__ if hasattr(te, '__version__') else '', te.is_fp8_available(return_reason=True))" \
  || echo "gpu_bench.sh: TE does not import; TE students will be fallback rows (see python3 -m workbench doctor)"
R=$(mktemp -d)
B=$R/bench
T0=$SECONDS
show() { grep -v -e '^{' -e 'USDT:' | tail -"${1:-60}"; }

PRESETS=${PRESETS:-seed large}  # one preset per call (PRESETS=seed, then PRESETS=large) if 10 min is tight
for preset in $PRESETS; do
  case $preset in
    # seed: launch-bound, so many timed steps are cheap; 5 repeats for the noise figure (P4).
    seed) args=(--set steps=10 --set warmup=10 --set iters=50 --repeats 5 --budget-s "${SEED_BUDGET_S:-150}")
          variants=${SEED_VARIANTS:-} ;;
    # large: GEMM-bound; fp32 (~416 ms/step) runs in the eager variant only.
    large) args=(--set steps=5 --set warmup=5 --set iters=20 --repeats 3 --budget-s "${LARGE_BUDGET_S:-150}")
           variants=${LARGE_VARIANTS:-} ;;
    *) echo "gpu_bench.sh: unknown preset $preset"; continue ;;
  esac
  python3 -m workbench bench --preset "$preset" --out "$B" --run-id "$preset" "${args[@]}" \
    ${variants:+--variants "$variants"} 2>&1 | tee "$R/$preset.log" | show 80
  mv "$R/$preset.log" "$B/$preset/bench.log" 2>/dev/null
  echo "== $preset done at $((SECONDS - T0)) s"
  tar -C "$B" -czf "$OUT/bench_$preset.tar.gz" "$preset"  # kept even if a later preset is cut short
done

python3 -m workbench probe --json > "$B/probe.json" 2>/dev/null
python3 -m workbench bench --markdown "$B" | tee "$B/tables.md"
tar -C "$B" -czf "$OUT/bench.tar.gz" . && rm -f "$OUT"/bench_*.tar.gz
ls -la "$OUT"
echo "== total $((SECONDS - T0)) s"
