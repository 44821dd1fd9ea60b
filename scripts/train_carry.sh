#!/bin/bash
# Makes .gpux/ here (git-ignored): the wheels a training run or the GPU tests need on the GPU machine and nothing
# else — TE 2.20.2 (core, PyTorch extension, their dependencies), torchao and Dask (a study's points run on Dask
# workers) — with install.sh, which installs them and prints what imports. Why: .gpu (../shared/gpu's wheelhouse)
# also holds the notebook stack, and .gpu with torchao and Dask beside the tree (~17 MiB and growing with committed
# results) is over a call's 64 MiB; .gpux is ~42 MiB. A papermill run still carries .gpu.
#   bash scripts/train_carry.sh                  (from ../shared/gpu/wheelhouse, or WHEELHOUSE=DIR)
#   carry [".gpux"]: bash .gpux/install.sh && WORKBENCH_GIT_SHA=<sha> bash scripts/gpu.sh tests
#   PARTS=te bash scripts/train_carry.sh         TE alone (~37 MiB): for calls after the .big parts were staged in
#     /root/keep (scripts/real_model_parts.sh: torchao in .big/ac, Dask in .big/aa, tornado with the notebook stack
#     in .big/ab), where install.sh takes them from; 6 MiB less beside the growing tree (60.3 of 64 MiB at c6739fd)
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
PARTS=${PARTS:-te torchao dask}
for d in $PARTS; do
  mkdir -p "$X/$d" && cp "$WH/$d"/*.whl "$X/$d/"  # wheels only: the TE sdist (a rebuild) stays in .gpu
done
# distributed imports tornado, which the wheelhouse keeps with the notebook stack (at 7634e2f, without it,
# `import distributed` failed on the H100)
if [ -d "$X/dask" ]; then cp "$WH"/notebook/tornado-*.whl "$X/dask/"; fi
cat > "$X/install.sh" <<'SH'
#!/bin/bash
# installs the wheels beside it (offline) and prints what imports; exit 1 when TE does not. A part this folder
# lacks (PARTS=te) comes from KEEP, where the .big parts were staged (torchao, dask; tornado with the notebook stack)
H="$(cd "$(dirname "$0")" && pwd)"
K=${KEEP:-/root/keep}
W=()
for d in te torchao dask; do
  if compgen -G "$H/$d/*.whl" > /dev/null; then W+=("$H/$d"/*.whl)
  elif compgen -G "$K/$d/*.whl" > /dev/null; then
    W+=("$K/$d"/*.whl)
    if [ "$d" = dask ]; then W+=("$K"/notebook/tornado-*.whl); fi  # distributed imports tornado
  else echo "install: no $d wheels in $H/$d or $K/$d (stage the .big parts first, or make .gpux with every part)"; exit 1
  fi
done
python3 -m pip install -q --no-index --no-deps --no-compile "${W[@]}"
python3 - <<'PY'
import warnings; warnings.simplefilter("ignore")
import torch, torchao, dask, distributed, transformer_engine.pytorch as te
ok, why = te.is_fp8_available(return_reason=True)
print(f"install: torch {torch.__version__} | TE fp8 {ok} {why} | torchao {torchao.__version__} | dask {dask.__version__} | {torch.cuda.get_device_name(0)}")
PY
SH
du -sh "$X"
