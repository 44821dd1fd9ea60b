#!/bin/bash
# Makes .gpux/ here (git-ignored): the wheels a training run or the GPU tests need on the GPU machine and nothing
# else — TE 2.20.2 (core, PyTorch extension, their dependencies), torchao and Dask (a study's points run on Dask
# workers) — with install.sh, which installs them and prints what imports. Why: .gpu (../shared/gpu's wheelhouse)
# also holds the notebook stack, and .gpu with torchao and Dask beside the tree (~17 MiB and growing with committed
# results) is over a call's 64 MiB; .gpux is ~42 MiB. A papermill run still carries .gpu.
#   bash scripts/train_carry.sh                  (from ../shared/gpu/wheelhouse, or WHEELHOUSE=DIR)
#   carry [".gpux"]: bash .gpux/install.sh && WORKBENCH_GIT_SHA=<sha> bash scripts/gpu.sh tests
# (a study's points are notebooks: [quality-real] installs the notebook stack from /root/keep/notebook, which
# scripts/real_model_parts.sh's .big/ab carries)
set -euo pipefail
cd "$(dirname "$0")/.."
X=.gpux
WH=${WHEELHOUSE:-../shared/gpu/wheelhouse}
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")"
grep -qx "/$X/" "$EXCLUDE" 2>/dev/null || echo "/$X/" >> "$EXCLUDE"
rm -rf "$X" && mkdir -p "$X"
for d in te torchao dask; do
  mkdir -p "$X/$d" && cp "$WH/$d"/*.whl "$X/$d/"  # wheels only: the TE sdist (a rebuild) stays in .gpu
done
# distributed imports tornado, which the wheelhouse keeps with the notebook stack (at 7634e2f, without it,
# `import distributed` failed on the H100)
cp "$WH"/notebook/tornado-*.whl "$X/dask/"
cat > "$X/install.sh" <<'SH'
#!/bin/bash
# installs the wheels beside it (offline) and prints what imports; exit 1 when TE does not
H="$(cd "$(dirname "$0")" && pwd)"
python3 -m pip install -q --no-index --no-deps --no-compile "$H"/te/*.whl "$H"/torchao/*.whl "$H"/dask/*.whl
python3 - <<'PY'
import warnings; warnings.simplefilter("ignore")
import torch, torchao, dask, distributed, transformer_engine.pytorch as te
ok, why = te.is_fp8_available(return_reason=True)
print(f"install: torch {torch.__version__} | TE fp8 {ok} {why} | torchao {torchao.__version__} | dask {dask.__version__} | {torch.cuda.get_device_name(0)}")
PY
SH
du -sh "$X"
