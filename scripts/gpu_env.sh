# Sourced by the scripts/gpu_*.sh: the environment every GPU run here shares.
# The copy sent to the GPU machine has no .git: start the command with
#   WORKBENCH_GIT_SHA=<git rev-parse --short HEAD, run here> bash scripts/gpu_....sh
# so every env.json / result row names the code that produced it.
# What travels to the GPU machine is capped at 64 MiB: this tree (~8 MiB: reference evidence is committed
# as palette PNGs only (results.write_figure), .gitignore keeps its SVGs out; tests/repo/test_repo_refs.py keeps it
# under 14 MiB) plus carried paths. The whole .gpu/ wheelhouse (~49 MiB) fits beside it: carry [".gpu"] and
# start with `bash .gpu/install.sh`; a call that needs fewer wheels may carry
# a smaller folder instead (e.g. .gpu-run with cp .gpu/wheelhouse/{te,torchao}/*.whl, then
# python3 -m pip install -q --no-index --no-deps --no-compile .gpu-run/*.whl).
# No LD_LIBRARY_PATH / CUDNN_PATH here: the workbench loads torch's cuDNN itself before TE
# (workbench/env/te.py), and these scripts must see what a user sees.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::UserWarning,ignore::FutureWarning,ignore::DeprecationWarning}"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
