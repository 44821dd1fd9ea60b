"""The GPU runs of this repository: one declared table (scripts/gpu_runs.toml), one entry point (scripts/gpu.sh).

    scripts/gpu.sh list                                 every run: device kind, budget, folders it fills, knobs
    scripts/gpu.sh [--dry-run] NAME [KNOB=VALUE ...] [ARG ...]
    scripts/gpu.sh show FILE [COL,COL,...]              a result CSV's columns (those present) or a JSON's keys
    scripts/gpu.sh carry [PATH ...]                     what a device call would carry (the tree and the PATHs
                                                        named in its carry) against its 64 MiB; exit 1 if over

A run is bash: `set -uo pipefail`, scripts/gpu_env.sh sourced, every knob set (KNOB=VALUE here, else the
environment, else the table's default), then the table's `run` text with the ARGs as "$@". --dry-run prints that
script, ready to paste, instead of running it. Run it on the GPU machine from the repository root, after
`bash .gpu/install.sh` (install-check and bare-install are the installers under test and go first); start the
device call with WORKBENCH_GIT_SHA=<git rev-parse --short HEAD, run here> so every result row names its code.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "scripts" / "gpu_runs.toml"
KINDS = ("nvidia-h200", "nvidia-h200-x2", "nvidia-h200-x4", "nvidia-h200-x8")
FIELDS = {"about", "kind", "budget_s", "fills", "knobs", "run"}
KNOB = re.compile(r"[A-Z][A-Z0-9_]*")
CARRY_CAP = 64 * 2**20  # one device call copies the tree and its carried paths, at most this much


def load(path: Path | None = None) -> dict[str, dict]:
    """The table, each run checked for the fields it must declare (an unknown field is a typo)."""
    path = path or TABLE
    runs = tomllib.loads(path.read_text())
    for name, run in runs.items():
        missing, extra = FIELDS - {"knobs"} - set(run), set(run) - FIELDS
        if missing or extra:
            raise SystemExit(f"{path.name} [{name}]: missing {sorted(missing)}, unknown {sorted(extra)}")
        if run["kind"] not in KINDS:
            raise SystemExit(f"{path.name} [{name}]: kind {run['kind']!r} is none of {KINDS}")
        bad = [k for k in run.get("knobs", {}) if not KNOB.fullmatch(k)]
        if bad:
            raise SystemExit(f"{path.name} [{name}]: knob names are environment variables in capitals: {bad}")
    return runs


def script(run: dict, knobs: dict[str, str]) -> str:
    """The bash a run executes, knobs first (so a dry run shows every value it would use)."""
    lines = [f"export {k}={shlex.quote(v)}" for k, v in knobs.items()]
    return "\n".join([*lines, "set -uo pipefail", "source scripts/gpu_env.sh", run["run"].strip(), ""])


def resolve(name: str, run: dict, args: list[str]) -> tuple[dict[str, str], list[str]]:
    """Knob values (command line over environment over default) and the remaining arguments for "$@"."""
    declared = {k: str(v) for k, v in run.get("knobs", {}).items()}
    knobs = {k: os.environ.get(k, v) for k, v in declared.items()}
    rest = []
    for a in args:
        k, eq, v = a.partition("=")
        if eq and KNOB.fullmatch(k):
            if k not in declared:
                raise SystemExit(f"{name} has no knob {k}; its knobs: {', '.join(declared) or 'none'}")
            knobs[k] = v
        else:
            rest.append(a)
    return knobs, rest


def listing(runs: dict[str, dict]) -> str:
    out = []
    for name, r in runs.items():
        out.append(f"{name:17s} {r['kind']:15s} {r['budget_s']:>4d} s  {r['about']}")
        out.append(f"{'':17s} fills {', '.join(r['fills'])}")
        if r.get("knobs"):
            out.append(f"{'':17s} knobs " + " ".join(f"{k}={shlex.quote(str(v))}" for k, v in r["knobs"].items()))
    return "\n".join(out)


def show(path: str, cols: str = "") -> None:
    """Print what a run wants to see of a result file; never fails the run (a missing file is said)."""
    want = [c for c in cols.split(",") if c]
    try:
        if path.endswith(".json"):
            d = json.loads(Path(path).read_text())
            print(json.dumps({k: d.get(k) for k in want} if want else d, indent=1, default=str))
            return
        import pandas as pd

        df = pd.read_csv(path)
        print(df[[c for c in want if c in df] or list(df)].to_string(max_colwidth=70))
    except Exception as e:  # noqa: BLE001 - a summary line must not stop the run
        print(f"no {path}: {type(e).__name__}: {e}")


def _size(path: Path, on_disk: bool) -> int:
    """A file's bytes, or (`on_disk`) the blocks it takes: the device tool's 64 MiB counts the latter. Measured:
    a carry of 62.8 MiB in bytes (66.3 MiB on disk, the tree's ~1,600 small files each rounded up to a block) was
    refused, one of 59.6 MiB (63.1 on disk) went through."""
    st = path.stat()
    return st.st_blocks * 512 if on_disk else st.st_size


def tree_bytes(untracked: bool = True, on_disk: bool = False) -> int:
    """Bytes of the tree as a device call copies it: tracked files, and (`untracked`) those git does not ignore."""
    cmd = ["git", "ls-files", "-z", *(["--cached", "--others", "--exclude-standard"] if untracked else [])]
    names = subprocess.run(cmd, cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    return sum(_size(p, on_disk) for n in names if n and (p := ROOT / n.decode()).is_file())


def carry(paths: list[str]) -> int:
    """Print the tree's and each carried path's MiB against the cap (a missing path is said: the call removes
    it there); 1 when the call would be refused for size. The wheelhouse beside a growing tree is what nears it."""
    sizes = {"the tree (tracked + untracked, not ignored)": tree_bytes(on_disk=True)}
    for name in paths:
        path = ROOT / name
        files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
        sizes[name if path.exists() else f"{name} (missing here)"] = sum(_size(f, True) for f in files)
    total = sum(sizes.values())
    for name, size in sizes.items():
        print(f"{size / 2**20:6.1f} MiB  {name} (on disk)")
    over = total > CARRY_CAP
    print(f"{total / 2**20:6.1f} MiB of {CARRY_CAP / 2**20:.0f} MiB" + (": over, carry less" if over else ""))
    return int(over)


def main(argv: list[str]) -> int:
    dry = "--dry-run" in argv
    argv = [a for a in argv if a != "--dry-run"]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    if argv[0] == "show":
        show(*argv[1:3])
        return 0
    if argv[0] == "carry":
        return carry(argv[1:])
    runs = load()
    if argv[0] == "list":
        print(listing(runs))
        return 0
    name, *args = argv
    if name not in runs:
        raise SystemExit(f"no run {name!r}; scripts/gpu.sh list names them: {', '.join(runs)}")
    knobs, rest = resolve(name, runs[name], args)
    text = script(runs[name], knobs)
    if dry:
        print(f"# {name}: {runs[name]['about']} ({runs[name]['kind']}, {runs[name]['budget_s']} s)")
        print((f"set -- {shlex.join(rest)}\n" if rest else "") + text, end="")
        return 0
    t0 = time.monotonic()
    rc = subprocess.run(["bash", "-c", text, f"gpu.sh {name}", *rest], cwd=ROOT).returncode
    print(f"== {name}: exit {rc} in {time.monotonic() - t0:.0f} s (budget {runs[name]['budget_s']} s)", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
