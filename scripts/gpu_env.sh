# Sourced by the scripts/gpu_*.sh: the environment every GPU run here shares.
# The copy sent to the GPU machine has no .git: start the command with
#   WORKBENCH_GIT_SHA=<git rev-parse --short HEAD, run here> bash scripts/gpu_....sh
# so every env.json / result row names the code that produced it.
# TE must load the cuDNN torch loads (pip nvidia-cudnn), not an older system one: seen on the lent H200 as
# "libcudnn_heuristic.so.9: undefined symbol ... libcudnn_graph.so.9" (REFERENCE §3, TE #1853).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::UserWarning,ignore::FutureWarning,ignore::DeprecationWarning}"
CUDNN_LIB=$(python3 -c "import nvidia.cudnn as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null)
[ -d "$CUDNN_LIB" ] && export LD_LIBRARY_PATH="$CUDNN_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
