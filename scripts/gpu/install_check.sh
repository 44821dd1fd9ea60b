#!/bin/bash
# Install evidence on the GPU machine: workbench install-te / doctor for real, offline, from the TE 2.20.2
# wheelhouse. Run from the repository root of the copy on that machine, WITHOUT .gpu/install.sh first
# (this script is the installer under test); the device call needs carry: [".gpu"]:
#     bash scripts/gpu.sh install-check
# Runs, in order (about 5 minutes, most of it the extension compile):
#   0. probe --json before
#   1. install-te --find-links .gpu/wheelhouse/te --no-index --reinstall   -> TE 2.20.2, FP8 fwd/bwd smoke test
#   2. ... --build-from-source                                             -> compiles transformer_engine_torch
#   3. a wheelhouse with only the meta + core wheels (no extension, no sdist):
#      a. without --force: preflight refuses, the installed TE is kept
#      b. with --force: pip fails -> te_mode fallback + diagnosis; doctor on the installed state;
#         a tiny workbench run whose TE student becomes a `fallback` row
#   4. install-te from the full wheelhouse again (leaves a working TE for later commands)
#   5. probe --json after
# Writes $OUT/install_summary.json (one line per run) and $OUT/install.tar.gz (per-run plan, outcome,
# diagnosis, duration and log tail; both probes). Full logs stay on the machine (they can be MBs).
set -uo pipefail
source "$(dirname "$0")/../gpu_env.sh"
WH=$PWD/.gpu/wheelhouse/te
R=$(mktemp -d)
S=$R/install            # what comes back (tarred)
mkdir -p "$S"
T0=$SECONDS
wb() { python3 -m workbench "$@"; }

# summarize NAME RUN_OUT_DIR STDOUT_FILE EXIT_CODE COMMAND...: newest outcome/plan under RUN_OUT_DIR -> $S/NAME.json
summarize() {
  python3 - "$S" "$@" <<'PY'
import json, sys
from pathlib import Path
s, name, run_out, stdout, rc, *cmd = sys.argv[1:]
runs = sorted(Path(run_out).glob("*/outcome.json"))
rec = {"run": name, "command": " ".join(cmd), "exit_code": int(rc)}
if runs:
    d = runs[-1].parent
    o, p = json.loads(runs[-1].read_text()), json.loads((d / "plan.json").read_text())
    rec["plan"] = {k: p[k] for k in ("version", "core_extra", "build", "build_reason", "build_env", "commands",
                                     "refusals", "warnings", "notes")}
    rec["outcome"] = o
    if (d / "probe_after.json").exists():
        a = json.loads((d / "probe_after.json").read_text())
        rec["after"] = {k: a.get(k) for k in ("te_available", "te_version", "te_packages", "te_consistent",
                                              "te_import_error", "fp8_available", "fp8_reason")}
else:  # install-te itself failed: keep what it printed
    rec["outcome"] = None
    rec["stdout_tail"] = Path(stdout).read_text(errors="replace").splitlines()[-30:]
    print("\n".join(rec["stdout_tail"][-10:]))
(Path(s) / f"{name}.json").write_text(json.dumps(rec, indent=2))
o = rec["outcome"] or {}
print(f"== {name}: exit {rc}, te_mode={o.get('te_mode')}, ok={o.get('ok')}, {o.get('duration_s')} s: {o.get('reason')}")
for dg in o.get("diagnosis") or []:
    print(f"   diagnosis [{dg['id']}] {dg['cause']}\n     fix: {' ; '.join(dg['fix'])}")
if o.get("fp8_smoke"):
    print(f"   fp8 smoke: {o['fp8_smoke']}")
PY
}

# run NAME ARGS...: one install-te run into its own results folder, then its summary
run() {
  local name=$1; shift
  local t=$SECONDS
  timeout 330 python3 -m workbench install-te --quiet --out "$R/runs/$name" "$@" > "$R/$name.stdout" 2>&1
  local rc=$?
  summarize "$name" "$R/runs/$name" "$R/$name.stdout" "$rc" install-te "$@"
  echo "   ($((SECONDS - t)) s wall)"
  return $rc
}

echo "== 0. probe before"
wb probe --json > "$S/probe_before.json" 2> "$R/probe_before.err"
python3 -c "import json; e=json.load(open('$S/probe_before.json')); print({k: e.get(k) for k in ('gpu_name','compute_capability','driver','torch','torch_cuda','nvcc_version','cudnn_torch','cudnn_pip_root','te_packages','torch_cxx11_abi','cpu_cores','mem_available_gb')})"

run 1-wheelhouse --find-links "$WH" --no-index --reinstall

if [ -z "${SKIP_BUILD:-}" ]; then
run 2-build-from-source --find-links "$WH" --no-index --build-from-source
rc=$?
else rc=0; echo "== 2. build-from-source skipped (SKIP_BUILD set)"; fi
if [ $rc -eq 2 ]; then  # preflight refused the build here: record why, then exercise the build anyway
  run 2b-build-from-source-forced --find-links "$WH" --no-index --build-from-source --force
fi

echo "== 3. forced failure: a wheelhouse without the PyTorch extension (no wheel, no sdist)"
BROKEN=$R/wheelhouse-no-extension
mkdir -p "$BROKEN"
for f in "$WH"/*.whl; do
  case "$(basename "$f")" in transformer_engine_torch-*) ;; *) ln -s "$f" "$BROKEN/";; esac
done
run 3a-no-extension-refused --find-links "$BROKEN" --no-index --reinstall
run 3b-no-extension-forced --find-links "$BROKEN" --no-index --reinstall --force
wb doctor --json > "$S/3c-doctor.json" 2> "$R/doctor.err"
echo "== 3c. doctor (installed state) exit $?: $(python3 -c "import json; print([d['id'] for d in json.load(open('$S/3c-doctor.json'))])" 2>&1 | tail -1)"
timeout 120 python3 -m workbench run --preset cpu-smoke --set backends=torch_bf16,te_fp8:delayed \
  --out "$R/fallback-run" --run-id fallback > "$R/fallback-run.log" 2>&1
echo "== 3d. workbench run without TE exit $?"
python3 - "$R/fallback-run/fallback/students.csv" "$S/3d-fallback-run.json" <<'PY'
import json, sys
import pandas as pd
try:
    df = pd.read_csv(sys.argv[1])
    rows = df[[c for c in ("student", "backend", "mode", "status", "reason", "step_ms_median") if c in df]].to_dict("records")
except Exception as e:  # the summary must not stop the script
    rows = [{"error": f"{type(e).__name__}: {e}"}]
json.dump(rows, open(sys.argv[2], "w"), indent=2, default=str)
for r in rows:
    print("  ", r)
PY

run 4-restore --find-links "$WH" --no-index
python3 -c "import transformer_engine.pytorch as te; print('== TE after restore:', te.is_fp8_available(return_reason=True))" 2>&1 | tail -1

echo "== 5. probe after"
wb probe --json > "$S/probe_after.json" 2> "$R/probe_after.err"

python3 - "$S" "$OUT/install_summary.json" <<'PY'
import json, sys
from pathlib import Path
rows = []
for f in sorted(Path(sys.argv[1]).glob("[0-9]*.json")):
    try:
        r = json.loads(f.read_text())
    except ValueError:
        continue
    if isinstance(r, dict) and "run" in r:
        o = r.get("outcome") or {}
        rows.append({"run": r["run"], "exit_code": r["exit_code"], "te_mode": o.get("te_mode"), "ok": o.get("ok"),
                     "duration_s": o.get("duration_s"), "reason": o.get("reason"),
                     "diagnosis": [d["id"] for d in o.get("diagnosis") or []], "fp8_smoke": o.get("fp8_smoke")})
json.dump(rows, open(sys.argv[2], "w"), indent=2)
PY
tar -C "$R" -czf "$OUT/install.tar.gz" install
echo "== done in $((SECONDS - T0)) s; $OUT/install.tar.gz ($(du -h "$OUT/install.tar.gz" | cut -f1)), $OUT/install_summary.json"
