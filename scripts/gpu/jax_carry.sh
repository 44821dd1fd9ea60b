#!/bin/bash
# Makes .gpujax/ here (git-ignored), what `scripts/gpu.sh te-jax` installs and builds on the H200 in one call:
# TE 2.20.2's core and meta wheels and their deps (from the GPU wheelhouse), nvidia-cudnn-frontend for Python 3.12
# (the build takes the cuDNN frontend headers from it) and the transformer_engine_jax sdist. About 49 MiB: carried
# instead of .gpu, which with it would put the call over its 64 MiB.
#   bash scripts/gpu/jax_carry.sh [WHEELHOUSE]      (default ../shared/gpu/wheelhouse)
set -euo pipefail
cd "$(dirname "$0")/../.."
HOUSE=${1:-../shared/gpu/wheelhouse}
J=.gpujax
EXCLUDE=$(git rev-parse --git-path info/exclude)  # also in a worktree, where .git is a file
mkdir -p "$(dirname "$EXCLUDE")"
grep -qx "/$J/" "$EXCLUDE" 2>/dev/null || echo "/$J/" >> "$EXCLUDE"
rm -rf "$J" && mkdir -p "$J"
cp "$HOUSE"/te/*.whl "$J"/
rm -f "$J"/transformer_engine_torch-*.whl  # the PyTorch extension is not this call's
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d "$J" "nvidia-cudnn-frontend==1.32.0"
# the sdist itself: pip builds its metadata after the download, which needs jax and a GPU and fails here; in an
# isolated build environment (pip's default) the file is saved before that failure, so the error is expected
python3 -m pip download -q --no-deps -d "$J" "transformer-engine-jax==2.20.2" >/dev/null 2>&1 || true
ls "$J"/transformer_engine_jax-2.20.2.tar.gz >/dev/null
du -sh "$J"
