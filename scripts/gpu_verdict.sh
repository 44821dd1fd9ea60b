#!/bin/bash
# The verdict of real shapes on the H200: the `verdict` run of scripts/gpu_runs.toml (SHAPES=..., VERDICT_BUDGET_S=...).
exec bash "$(dirname "$0")/gpu.sh" verdict "$@"
