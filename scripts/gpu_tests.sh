#!/bin/bash
# The GPU-marked tests (tests/gpu/: test_gpu.py and test_gpu_*.py) on a GPU machine: run after `bash .gpu/install.sh`.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
python3 -m pytest -q -m gpu tests/gpu/ 2>&1 | tee "$OUT/gpu_tests.log"
