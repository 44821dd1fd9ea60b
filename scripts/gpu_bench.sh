#!/bin/bash
# Issue-4 benchmark on the H200: `workbench bench` at the seed preset and at the large preset, every
# default variant (eager / compile / graphs x layout x param dtype; see `python -m workbench bench --list`),
# with the matmul peak probe, the profiler cross-check and noise repeats. Budgeted to finish in < 8 min:
# a variant not started once its preset's budget is spent becomes 'skipped' rows (the files say so).
# Run from the repo root after `bash .gpu/install.sh`; writes $OUT/bench.tar.gz (unpack into
# results/reference/h200/bench/). Override the lists with SEED_VARIANTS=a,b LARGE_VARIANTS=c,d.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::UserWarning,ignore::FutureWarning,ignore::DeprecationWarning}"
# TE must load the cuDNN torch loads (pip nvidia-cudnn), not an older system one: seen on the lent H200 as
# "libcudnn_heuristic.so.9: undefined symbol ... libcudnn_graph.so.9" (REFERENCE §3, TE #1853).
CUDNN_LIB=$(python3 -c "import nvidia.cudnn as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null)
[ -d "$CUDNN_LIB" ] && export LD_LIBRARY_PATH="$CUDNN_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
python3 -c "import torch, transformer_engine.pytorch as te; print('TE', te.__version__ if hasattr(te, '__version__') else '', te.is_fp8_available(return_reason=True))" \
  || echo "gpu_bench.sh: TE does not import; TE students will be fallback rows (see python3 -m workbench doctor)"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
R=$(mktemp -d)
B=$R/bench
T0=$SECONDS
show() { grep -v -e '^{' -e 'USDT:' | tail -"${1:-60}"; }

# seed: launch-bound, so many timed steps are cheap; 5 repeats for the noise figure (P4).
python3 -m workbench bench --preset seed --out "$B" --run-id seed \
  --set steps=10 --set warmup=10 --set iters=50 --repeats 5 --budget-s "${SEED_BUDGET_S:-170}" \
  ${SEED_VARIANTS:+--variants "$SEED_VARIANTS"} 2>&1 | tee "$R/seed.log" | show 80
echo "== seed done at $((SECONDS - T0)) s"
tar -C "$B" -czf "$OUT/bench_seed.tar.gz" seed  # kept even if the large part is cut short

# large: GEMM-bound; fp32 (~416 ms/step) runs in the eager variant only.
python3 -m workbench bench --preset large --out "$B" --run-id large \
  --set steps=10 --set warmup=5 --set iters=20 --repeats 3 --budget-s "${LARGE_BUDGET_S:-170}" \
  ${LARGE_VARIANTS:+--variants "$LARGE_VARIANTS"} 2>&1 | tee "$R/large.log" | show 80
echo "== large done at $((SECONDS - T0)) s"

python3 -m workbench probe --json > "$B/probe.json" 2>/dev/null
python3 -m workbench bench --markdown "$B" | tee "$B/tables.md"
for p in seed large; do mv "$R/$p.log" "$B/$p/bench.log" 2>/dev/null; done
tar -C "$B" -czf "$OUT/bench.tar.gz" . && rm -f "$OUT/bench_seed.tar.gz"
ls -la "$OUT"
echo "== total $((SECONDS - T0)) s"
