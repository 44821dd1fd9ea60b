#!/bin/bash
# Makes .gpu/ here (git-ignored) as ../shared/gpu with its TE wheelhouse alone (wheels and the extension's sdist) and
# an install.sh that first takes the wheelhouse's other parts (the notebook stack, torchao, Dask) from KEEP, where the
# .big parts were staged (scripts/real_model_parts.sh: Dask in .big/aa, the notebook stack in .big/ab, torchao in
# .big/ac). Why: the whole wheelhouse is 48.2 MiB on disk, with the tree 65.7 of a call's 64 MiB, so no [".gpu"] call
# could start (install-check, bare-install, real, te-jax); slimmed, .gpu is 36.8 MiB and the call 54.3
# (results/reference/cpu/carry_1f6f578.txt).
# It also makes .gpukeep/ (~12 MiB): those other parts alone, for one staging call where no model travels.
#   bash scripts/slim_gpu.sh                       (from ../shared/gpu, or GPU_FROM=DIR)
#   carry [".gpukeep"]: mkdir -p /root/keep && cp -r .gpukeep/* /root/keep/      (install-check, bare-install, te-jax)
#   or, for the real-model runs, carry [".big/aa"], then [".big/ab"], then [".big/ac"] with cp -r .big/*/* /root/keep/
#   carry [".gpu", ...]: bash .gpu/install.sh && ...          (or bash .gpu/fill.sh first, where a route reads
#                                                               .gpu/wheelhouse itself: bare-install, install-check)
set -euo pipefail
SRC=$(realpath "${GPU_FROM:-$(dirname "$0")/../../shared/gpu}")  # before the cd: a relative GPU_FROM is the caller's
cd "$(dirname "$0")/.."
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")"
for d in /.gpu/ /.gpukeep/; do grep -qxF "$d" "$EXCLUDE" 2>/dev/null || echo "$d" >> "$EXCLUDE"; done
rm -rf .gpu .gpukeep && mkdir -p .gpu/wheelhouse .gpukeep
cp -r "$SRC/wheelhouse/te" .gpu/wheelhouse/
for d in notebook torchao dask; do cp -r "$SRC/wheelhouse/$d" .gpukeep/; done
# every wheel of the parts left out, by name: fill.sh checks each one staged (a copy cut short lacks some)
(cd "$SRC/wheelhouse" && ls notebook/*.whl torchao/*.whl dask/*.whl) > .gpu/parts.txt
cp "$SRC/install.sh" .gpu/install-all.sh  # the shared installer, unchanged: it reads the wheelhouse beside it
cat > .gpu/fill.sh <<'SH'
#!/bin/bash
# puts the wheelhouse parts this slimmed .gpu lacks in place from KEEP (the staged .big parts): every wheel parts.txt
# names, so a staging copy cut short stops here, naming what is missing, not later inside pip
H="$(cd "$(dirname "$0")" && pwd)"
K=${KEEP:-/root/keep}
[ -s "$H/parts.txt" ] || { echo "fill: $H/parts.txt is missing or empty: make .gpu again (scripts/slim_gpu.sh)"; exit 1; }
missing=$(while read -r w; do [ -f "$H/wheelhouse/$w" ] || [ -f "$K/$w" ] || echo "$w"; done < "$H/parts.txt")
if [ -n "$missing" ]; then
  echo "fill: not staged in $K: $(echo "$missing" | tr '\n' ' ')(stage .gpukeep or the .big parts first: scripts/slim_gpu.sh)"; exit 1
fi
while read -r w; do
  [ -f "$H/wheelhouse/$w" ] || { mkdir -p "$H/wheelhouse/$(dirname "$w")" && cp "$K/$w" "$H/wheelhouse/$w"; } ||
    { echo "fill: copying $w from $K failed"; exit 1; }  # a full disk: not a wheelhouse missing one wheel
done < "$H/parts.txt"
SH
cat > .gpu/install.sh <<'SH'
#!/bin/bash
# the shared install.sh, after fill.sh has put the staged parts in the wheelhouse
H="$(cd "$(dirname "$0")" && pwd)"
bash "$H/fill.sh" && exec bash "$H/install-all.sh" "$@"
SH
du -sh .gpu .gpukeep
