#!/bin/bash
# A bare H200 as a new user meets it: no scripts/gpu_env.sh, no LD_LIBRARY_PATH or CUDNN_PATH set by hand.
# Installs the workbench and its notebook stack from the offline wheelhouse, then `workbench install-te`
# from the TE wheelhouse, then `probe`, `doctor` and a `run` whose TE rows must be `ok`. The machine has
# torch's pip cuDNN beside an older system cuDNN: the workbench must load one copy by itself.
# Device call: carry [".gpu"], command `WORKBENCH_GIT_SHA=<sha> bash scripts/gpu.sh bare-install`.
# Writes $OUT/bare.tar.gz (every record) and prints a one-line verdict per step.
set -uo pipefail
unset LD_LIBRARY_PATH CUDNN_PATH CUDNN_HOME
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
R=$(mktemp -d)/bare
mkdir -p "$R" "$OUT"
step() { local name=$1; shift; local t=$SECONDS; "$@" > "$R/$name.log" 2>&1; local rc=$?
         echo "== $name: exit $rc ($((SECONDS - t)) s)"; tail -n 4 "$R/$name.log" | cut -c1-300; return $rc; }

# the wheelhouse holds the stack without the debugger ipykernel names (the image has the rest)
step 1-notebook-stack python3 -m pip install --no-index --no-deps .gpu/wheelhouse/notebook/*.whl
step 2-workbench python3 -m pip install --no-index --no-deps --no-build-isolation -e .
step 3-install-te python3 -m workbench install-te --find-links .gpu/wheelhouse/te --no-index --quiet --out "$R/install"
step 4-probe python3 -m workbench probe --json --out "$R/probe.json"
python3 - "$R/probe.json" <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))
print("   probe:", {k: e.get(k) for k in ("te_available", "te_version", "cudnn_torch", "cudnn_torch_error",
                                         "cudnn_mapped_dirs", "fp8_available", "te_import_error")})
print("   attention:", {k: (e.get("te_attention") or {}).get(k) for k in ("selected", "fell_back_to_slower", "log")})
PY
step 5-doctor python3 -m workbench doctor
step 6-run python3 -m workbench run --preset seed --set backends=torch_bf16,te_bf16,te_fp8:delayed,te_fp8:current \
  --out "$R" --run-id run-after-install
python3 - "$R/run-after-install/students.csv" <<'PY'
import sys
import pandas as pd
df = pd.read_csv(sys.argv[1])
print(df[["student", "status", "initial_loss", "final_train_loss", "step_ms_median", "reason"]].to_string())
PY
cp "$R/run-after-install/students.csv" "$OUT/bare_students.csv" 2>/dev/null
tar -C "$(dirname "$R")" -czf "$OUT/bare.tar.gz" --exclude='*.ipynb' bare
