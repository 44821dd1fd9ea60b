#!/bin/bash
# Your own Hugging Face decoder on the H200: random-weight folders of three real shapes (`workbench hf-init`,
# a tokenizer trained here beside the weights), the HF GPU tests (tests/gpu/test_gpu_hf.py: equivalence of the TE
# decoder-layer conversion, one training step, FP8 head, FP8 attention; HF_TESTS=0 skips them when
# scripts/gpu_tests.sh ran them in the same call), then the bench of each shape at its own preset (8192 tokens
# a step) with the preset's HF variants: TE decoder layers (whole-step graph, eager, FP8 head, FP8 attention),
# TE per Linear, the HF model compiled in bf16 and with torchao float8. Targets H1 (4-layer cut) and H2 (the
# profiler's split of the fastest FP8 row) are judged in each targets.json.
#   llama-4l    hf-llama-4l      Llama-3.2-1B cut to 4 layers (hidden 2048, 32/8 heads, SwiGLU 8192, tied), vocab 32768
#   llama-1b    hf-llama-1b      Llama-3.2-1B (16 layers, vocab 128256)
#   qwen-0.5b   hf-qwen2.5-0.5b  Qwen2.5-0.5B (24 layers, hidden 896, 14/2 heads, SwiGLU 4864, QKV bias, tied, vocab 151936)
#   qwen3-4l, gemma3-4l, phi4-4l, smollm3-4l   hf-llama-4l   the 4-layer cuts (vocab 32768) of Qwen3-0.6B,
#               Gemma-3-1B, Phi-4-mini and SmolLM3-3B (workbench hf-init)
# After `bash .gpu/install.sh`. Knobs: SHAPES (default "llama-4l llama-1b qwen-0.5b"), HF_BUDGET_S (each bench's
# budget; variants not started by then are rows saying so; default 150. Measured at 2b27141: hf-init of
# llama-3.2-1b 51 s, then its first variant (3 TE students) 96 s: one full shape needs a call of its own),
# HF_SET (extra --set arguments; default "--set no_kd_student=false": the no-KD rows time the same student again).
# Writes $OUT/gpu_tests_hf.log, $OUT/hf/<shape>.log and $OUT/hf.tar.gz: every bench folder's small files
# (bench.csv / .md / .json, targets.json, crosscheck.json, runs/*/students.csv and profile-*.json).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
M=$(mktemp -d)/models
B=$(mktemp -d)/hf
mkdir -p "$M" "$B" "$OUT/hf"
if [ "${HF_TESTS:-1}" != 0 ]; then
  timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_gpu_hf.py 2>&1 | tee "$OUT/gpu_tests_hf.log" | tail -5
fi
# The other families' 4-layer cuts run at the 4-layer Llama preset's batch (8192 tokens a step)
declare -A PRESET=([llama-4l]=hf-llama-4l [llama-1b]=hf-llama-1b [qwen-0.5b]=hf-qwen2.5-0.5b [qwen3-4l]=hf-llama-4l
                   [gemma3-4l]=hf-llama-4l [phi4-4l]=hf-llama-4l [smollm3-4l]=hf-llama-4l)
declare -A SHAPE=([llama-4l]=llama-3.2-1b-4l [llama-1b]=llama-3.2-1b [qwen-0.5b]=qwen2.5-0.5b [qwen3-4l]=qwen3-0.6b-4l
                  [gemma3-4l]=gemma-3-1b-4l [phi4-4l]=phi-4-mini-4l [smollm3-4l]=smollm3-3b-4l)
for s in ${SHAPES:-llama-4l llama-1b qwen-0.5b}; do
  python3 -m workbench hf-init "${SHAPE[$s]}" --out "$M/$s" > "$OUT/hf/$s.log" 2>&1 || { echo "== $s: hf-init failed"; continue; }
  timeout $(( ${HF_BUDGET_S:-150} + 120 )) python3 -m workbench bench --preset "${PRESET[$s]}" --repeats 2 \
    --budget-s "${HF_BUDGET_S:-150}" --set lm.student="$M/$s" ${HF_SET:---set no_kd_student=false} \
    --out "$B" --run-id "$s" --targets results/reference/bench_targets.json >> "$OUT/hf/$s.log" 2>&1
  echo "== $s: exit $?"
  python3 - "$B/$s" <<'PY'
import json, sys
from pathlib import Path
import pandas as pd
d = Path(sys.argv[1])
try:
    df = pd.read_csv(d / "bench.csv")
    cols = [c for c in ("variant", "student", "status", "te_conversion", "step_ms_median", "tflops",
                        "peak_mem_allocated_mb", "reason") if c in df]
    print(df[cols].to_string(max_colwidth=60))
    for t in json.loads((d / "targets.json").read_text())["targets"]:
        if t["achieved"] is not None:
            print(t["id"], t["target"], round(t["achieved"], 3), t["by"], t["met"], t.get("breakdown") or "")
except Exception as e:
    print("no bench.csv / targets.json:", e)
PY
  # after every shape, so that a call cut by its limit still brings back the shapes it finished
  (cd "$B" && tar -czf "$OUT/hf.tar.gz" $(find . \( -name '*.csv' -o -name '*.md' -o -name '*.json' \) -size -4M))
done
