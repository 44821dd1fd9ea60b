#!/bin/bash
# The GPU-marked tests (tests/gpu/) on a GPU machine, after `bash .gpu/install.sh`: the `tests` run of scripts/gpu_runs.toml.
exec bash "$(dirname "$0")/gpu.sh" tests "$@"
