#!/bin/bash
# Matched init with CUDA graphs: `seed` and `large` with the whole fast path (graphs, fused layout, bf16
# parameters, fused AdamW) for torch bf16, TE bf16 and every TE FP8 recipe this GPU has. Every student must
# start from the same weights (summary.json: initial_losses_equal). After `bash .gpu/install.sh`.
# Writes $OUT/graphed.tar.gz.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
R=$(mktemp -d)/graphed
mkdir -p "$R"
BACKENDS="torch_bf16,te_bf16,te_fp8:delayed,te_fp8:delayed_e4m3,te_fp8:current,te_fp8:block"
for preset in seed large; do
  python3 -m workbench run --preset "$preset" --out "$R" --run-id "$preset" --set backends="$BACKENDS" \
    --set graphs=true --set layout=fused --set param_dtype=bf16 --set fused_optimizer=true > "$R/$preset.log" 2>&1
  echo "== $preset: exit $?"
  python3 -c "import json,sys; s=json.load(open('$R/$preset/summary.json')); print('   initial_losses_equal', s['initial_losses_equal'], 'spread', s['initial_loss_rel_spread'])"
  python3 -c "import pandas as pd; d=pd.read_csv('$R/$preset/students.csv'); print(d[['student','status','graphed','initial_loss','final_train_loss','step_ms_median','peak_mem_allocated_mb']].to_string())"
done
tar -C "$(dirname "$R")" -czf "$OUT/graphed.tar.gz" graphed
