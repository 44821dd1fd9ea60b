#!/bin/bash
# TE's FSDP2 recipe for FP8 weights on two GPUs (device kind nvidia-h200-x2, TE >= 2.16; ~2 minutes):
# the GPU test that runs `seed` over 2 GPUs with FSDP2 and FusedAdam, te_fp8:delayed with FP8 weights (TE's
# recipe) and without (plain fully_shard). Its two run folders are kept under OUTDIR/pytest (pytest's
# --basetemp), the test's log in OUTDIR/gpu_fsdp2_fp8.log. After `bash .gpu/install.sh`:
#     WORKBENCH_GIT_SHA=<sha> bash scripts/gpu_fsdp2_fp8.sh OUTDIR
# What this checks that could not be run on a CPU (TE 2.20's source says so, no GPU has run it yet):
#   te.Linear / te.LayerNormMLP built with device="meta" under te.quantized_model_init defer their init;
#   reset_parameters() on a sharded DTensor with a meta local tensor materialises it on the GPU;
#   copy_ of the fp32 shard into an FP8 local tensor quantizes it (current scaling: amax all-reduced);
#   FusedAdam's set_scaled_state(dtensor_param, "master_param", fp32 shard) on DTensor parameters;
#   DTensor.full_tensor() of FP8 shards dequantizes (initial_loss); distribute_tensor(src_data_rank=None).
set -uo pipefail
OUT=${1:-${OUT:-/tmp/out}}
source "$(dirname "$0")/gpu_env.sh"
python3 -c "import transformer_engine as t, torch; print('TE', t.__version__, 'torch', torch.__version__, 'GPUs', torch.cuda.device_count())" \
  2>&1 | tee "$OUT/gpu_fsdp2_fp8.log"
# the test skips itself below two GPUs or without TE: a skip here is a failed check, not a pass
python3 -c "import sys, torch; sys.exit(torch.cuda.device_count() < 2)" || { echo "needs 2 GPUs" | tee -a "$OUT/gpu_fsdp2_fp8.log"; exit 2; }
timeout 170 python3 -m pytest -q -rs -m gpu tests/gpu/test_gpu.py -k fsdp2_fp8_weights --basetemp "$OUT/pytest" 2>&1 \
  | tee -a "$OUT/gpu_fsdp2_fp8.log" | tail -15
rc=${PIPESTATUS[0]}
grep -q "1 passed" "$OUT/gpu_fsdp2_fp8.log" || [ "$rc" != 0 ] || rc=1
find "$OUT/pytest" -name cache -type d -prune -exec rm -rf {} +  # teacher caches: not evidence
exit "$rc"
