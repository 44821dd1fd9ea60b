#!/bin/bash
# The one entry point for the GPU runs: scripts/gpu.sh list | [--dry-run] NAME [KNOB=VALUE ...] [ARG ...].
# The runs are declared in scripts/gpu_runs.toml; scripts/gpu.py reads it (its docstring says how a run is made).
exec python3 "$(dirname "$0")/gpu.py" "$@"
