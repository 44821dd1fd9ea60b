# Sourced before every run of scripts/gpu_runs.toml (scripts/gpu.sh NAME): the environment every GPU run shares.
# The copy sent to the GPU machine has no .git: start the command with
#   WORKBENCH_GIT_SHA=<git rev-parse --short HEAD, run here> bash scripts/gpu.sh NAME
# so every env.json / result row names the code that produced it.
# What travels to the GPU machine is capped at 64 MiB, counted as blocks on disk (a call of 62.8 MiB in bytes,
# 66.3 on disk, was refused): this tree (16.2 MiB on disk at ba9bc5f, 12.9 in bytes; reference evidence is committed
# as palette PNGs only (results.write_figure), .gitignore keeps its SVGs out; tests/repo/test_repo_refs.py keeps the
# bytes under 14 MiB) plus carried paths. `scripts/gpu.sh carry .gpu ...` adds them up that way before a call.
# The shared wheelhouse whole is 48.2 MiB on disk, so tree + all of it (65.6 at 7d957c4) no longer fits: carry the
# .gpu that scripts/slim_gpu.sh makes (TE's wheelhouse alone; its install.sh takes the notebook stack, torchao and
# Dask from /root/keep, staged by an earlier call of .gpukeep or the .big parts), or .gpux (scripts/train_carry.sh).
# No LD_LIBRARY_PATH / CUDNN_PATH here: the workbench loads torch's cuDNN itself before TE
# (workbench/env/te.py), and these runs must see what a user sees.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::UserWarning,ignore::FutureWarning,ignore::DeprecationWarning}"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# The hf and verdict runs take real shapes by short name: the `workbench hf-init` shape and its bench preset.
# The other families' 4-layer cuts run at the 4-layer Llama preset's batch (8192 tokens a step).
declare -A HF_SHAPE=([llama-4l]=llama-3.2-1b-4l [llama-1b]=llama-3.2-1b [qwen-0.5b]=qwen2.5-0.5b
                     [qwen3-4l]=qwen3-0.6b-4l [gemma3-4l]=gemma-3-1b-4l [phi4-4l]=phi-4-mini-4l [smollm3-4l]=smollm3-3b-4l)
declare -A HF_PRESET=([llama-4l]=hf-llama-4l [llama-1b]=hf-llama-1b [qwen-0.5b]=hf-qwen2.5-0.5b
                      [qwen3-4l]=hf-llama-4l [gemma3-4l]=hf-llama-4l [phi4-4l]=hf-llama-4l [smollm3-4l]=hf-llama-4l)
