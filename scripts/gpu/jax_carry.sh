#!/bin/bash
# Makes .gpujax/ here (git-ignored), what `scripts/gpu.sh te-jax` builds TE's JAX extension from on the H200, carried
# beside .gpu (whose wheelhouse already holds TE 2.20.2's core and meta wheels): the transformer_engine_jax sdist
# and nvidia-cudnn-frontend for Python 3.12 cut down to its C++ headers and metadata (the build asks the installed
# distribution for its include/ folder, build_tools/utils.py cudnn_frontend_include_path; the full wheel's 11 MiB
# of Python kernels would put .gpu + .gpujax + the tree over the call's 64 MiB). About 1 MiB.
# A built extension that came back from an earlier call (tejax/*.whl under $OUT) can be put in .gpujax/built/:
# the run then installs it instead of building again.
#   bash scripts/gpu/jax_carry.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
J=.gpujax
EXCLUDE=$(git rev-parse --git-path info/exclude)  # also in a worktree, where .git is a file
mkdir -p "$(dirname "$EXCLUDE")"
grep -qx "/$J/" "$EXCLUDE" 2>/dev/null || echo "/$J/" >> "$EXCLUDE"
KEEP=$(mktemp -d)
[ -d "$J/built" ] && mv "$J/built" "$KEEP/"
rm -rf "$J" && mkdir -p "$J"
[ -d "$KEEP/built" ] && mv "$KEEP/built" "$J/"
T=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d "$T" "nvidia-cudnn-frontend==1.32.0"
python3 -m pip install -q wheel  # `wheel unpack` / `wheel pack`: pack writes a RECORD for what is left
python3 -m wheel unpack "$T"/nvidia_cudnn_frontend-*.whl -d "$T/un" >/dev/null
rm -rf "$T"/un/nvidia_cudnn_frontend-*/cudnn
python3 -m wheel pack "$T"/un/nvidia_cudnn_frontend-* -d "$J" >/dev/null
# the sdist itself: pip builds its metadata after the download, which needs jax and a GPU and fails here; in an
# isolated build environment (pip's default) the file is saved before that failure, so the error is expected
python3 -m pip download -q --no-deps -d "$J" "transformer-engine-jax==2.20.2" >/dev/null 2>&1 || true
ls "$J"/transformer_engine_jax-2.20.2.tar.gz "$J"/nvidia_cudnn_frontend-*.whl >/dev/null
du -sh "$J"
