# Sourced by the scripts/gpu_*.sh: the environment every GPU run here shares.
# The copy sent to the GPU machine has no .git: start the command with
#   WORKBENCH_GIT_SHA=<git rev-parse --short HEAD, run here> bash scripts/gpu_....sh
# so every env.json / result row names the code that produced it.
# No LD_LIBRARY_PATH / CUDNN_PATH here: the workbench loads torch's cuDNN itself before TE
# (workbench/env/te.py), and these scripts must see what a user sees.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::UserWarning,ignore::FutureWarning,ignore::DeprecationWarning}"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
