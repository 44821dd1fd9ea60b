#!/bin/bash
# Your own Hugging Face decoder on the H200: random-weight folders of three real shapes, the HF GPU tests
# (tests/test_gpu_hf.py: equivalence of the TE decoder-layer conversion, one training step, FP8 head, FP8
# attention), then the bench's HF variants at 8192 tokens a step (lm-a's seq 2048 x batch 4).
#   llama-4l    Llama-3.2-1B cut to 4 layers (hidden 2048, 32/8 heads, SwiGLU 8192, RoPE 5e5 llama3, tied), vocab 32768
#   llama-1b    Llama-3.2-1B (16 layers, vocab 128256)
#   qwen-0.5b   Qwen2.5-0.5B (24 layers, hidden 896, 14/2 heads, SwiGLU 4864, QKV bias, tied, vocab 151936)
# After `bash .gpu/install.sh`. Writes $OUT/gpu_tests_hf.log, $OUT/hf_gpu_checks.json, $OUT/hf/<shape>/ (bench
# folders: bench.csv, bench.md, targets.json, runs/), $OUT/hf/<shape>.log. About 8 minutes; HF_BUDGET_S caps
# each bench (default 150 s for the 4-layer cut, 90 s for each full shape).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
M=$(mktemp -d)/models
mkdir -p "$M" "$OUT/hf"
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_hf.py 2>&1 | tee "$OUT/gpu_tests_hf.log" | tail -5

# The folders: `workbench hf-init` where this checkout has it (it writes a tokenizer beside the weights),
# else plain transformers configs with random weights (the corpus is then read by the bytes tokenizer).
if python3 -m workbench hf-init --help >/dev/null 2>&1; then
  python3 -m workbench hf-init llama-3.2-1b-4l --out "$M/llama-4l" \
    && python3 -m workbench hf-init llama-3.2-1b --out "$M/llama-1b" \
    && python3 -m workbench hf-init qwen2.5-0.5b --out "$M/qwen-0.5b" && TOK="" \
    || echo "hf-init failed: plain configs instead"
fi
if [ ! -f "$M/qwen-0.5b/config.json" ]; then
  TOK="--set lm.tokenizer=bytes"
  python3 - "$M" <<'PY'
import sys, torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config
out = sys.argv[1]
llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
llama = dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
             rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=True, rope_parameters=llama3)
shapes = {"llama-4l": LlamaConfig(**llama, num_hidden_layers=4, vocab_size=32768),
          "llama-1b": LlamaConfig(**llama, num_hidden_layers=16, vocab_size=128256),
          "qwen-0.5b": Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                                   num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=32768,
                                   tie_word_embeddings=True, vocab_size=151936,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})}
for name, c in shapes.items():
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(c, dtype=torch.float32).save_pretrained(f"{out}/{name}")
    print("wrote", name)
PY
fi

bench() {  # shape vocab budget variants
  timeout $(( $3 + 60 )) python3 -m workbench bench --preset lm-a --repeats 2 --budget-s "$3" \
    --set lm.student="$M/$1" --set model.kind=llama --set model.vocab="$2" $TOK \
    --variants "$4" --out "$OUT/hf" --run-id "$1" > "$OUT/hf/$1.log" 2>&1
  echo "== $1: exit $?"
  python3 - "$OUT/hf/$1/bench.csv" <<'PY'
import sys
import pandas as pd
try:
    df = pd.read_csv(sys.argv[1])
    cols = [c for c in ("variant", "student", "status", "te_conversion", "step_ms_median", "tflops",
                        "peak_mem_allocated_mb", "reason") if c in df]
    print(df[cols].to_string(max_colwidth=70))
except Exception as e:
    print("no bench.csv:", e)
PY
}
bench llama-4l 32768 "${HF_BUDGET_S:-150}" \
  hf-te-layer-step,hf-compile,hf-te-layer,hf-te-layer-fp8-head,hf-te-linear,hf-te-layer-fp8-dpa
bench llama-1b 128256 "${HF_BUDGET_S_FULL:-90}" hf-te-layer-step,hf-compile,hf-te-layer-fp8-head
bench qwen-0.5b 151936 "${HF_BUDGET_S_FULL:-90}" hf-te-layer-step,hf-compile,hf-te-layer-fp8-head
