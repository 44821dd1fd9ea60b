# Sourced by the scripts/gpu_*.sh: the environment every GPU run here shares.
# The copy sent to the GPU machine has no .git: start the command with
#   WORKBENCH_GIT_SHA=<git rev-parse --short HEAD, run here> bash scripts/gpu_....sh
# so every env.json / result row names the code that produced it.
# What travels to the GPU machine is capped at 64 MiB: this tree (~19 MiB, mostly results/reference/) plus
# carried paths. The whole .gpu/ wheelhouse (~49 MiB) no longer fits beside it; carry only the wheels a call
# needs, e.g. mkdir .gpu-run && cp .gpu/wheelhouse/{te,torchao}/*.whl .gpu-run/ (no TE sdist: ~40 MiB),
# then start the command with: python3 -m pip install -q --no-index --no-deps --no-compile .gpu-run/*.whl
# No LD_LIBRARY_PATH / CUDNN_PATH here: the workbench loads torch's cuDNN itself before TE
# (workbench/env/te.py), and these scripts must see what a user sees.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::UserWarning,ignore::FutureWarning,ignore::DeprecationWarning}"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
