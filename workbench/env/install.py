"""Transformer Engine installer: run the plan (`workbench.env.install_plan`), verify, fall back gracefully.

    python -m workbench install-te --dry-run                              # the plan: commands + environment
    python -m workbench install-te                                        # PyPI, the documented route
    python -m workbench install-te --find-links WHEELHOUSE --no-index     # offline (clusters without internet)
    python -m workbench install-te --build-from-source                    # compile the torch extension here
    python -m workbench install-te --jax                                  # + TE's JAX extension, built for your jax

From Python (the notebook): `install_plan.plan(probe_dict, ...)` -> Plan, `install_te(...)` -> Outcome.

`install_te()` runs each step with pip as a subprocess (argument list, no shell), streams its output, and
writes results/install/<timestamp>/: install.log (complete), plan.json, probe_before.json,
probe_after.json (a fresh process, so the new TE is really imported) and outcome.json: te_mode
(transformer_engine | fallback), the reason, the doctor's diagnosis, the steps' exit codes, an FP8
forward/backward smoke test (`workbench.env.smoke`). On fallback the workbench's TE students run the
PyTorch autocast path.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from workbench.config import ConfigError
from workbench.env import doctor
from workbench.env.install_plan import Plan, Step, plan
from workbench.results import write_json

REPO_ROOT = str(Path(__file__).resolve().parents[2])


# ---------------------------------------------------------------------------------------------- running
@dataclass
class Outcome:
    te_mode: str
    """'transformer_engine' (TE imports after this run) or 'fallback' (the workbench uses PyTorch autocast)."""
    ok: bool
    """The planned install ran and TE imports afterwards."""
    reason: str
    diagnosis: list[dict[str, Any]]
    te_version: str | None
    refused: bool = False
    steps: list[dict[str, Any]] = field(default_factory=list)
    duration_s: float = 0.0
    fp8_smoke: dict[str, Any] | None = None
    run_dir: str | None = None
    log: str | None = None
    log_tail: list[str] = field(default_factory=list)
    te_jax: dict[str, Any] | None = None
    """With --jax: whether transformer_engine.jax imports in a fresh process ({'ok', 'error'})."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _subprocess_env(step_env: dict[str, str], target: str | None) -> dict[str, str]:
    env = {**os.environ, **step_env}
    env.pop("NVTE_RELEASE_BUILD", None)  # set, it builds TE without the PyTorch extension (TE #2505)
    # a step's own folder first (TE-JAX's parallel compile, install_plan.PARALLEL_BUILD), then the target's
    # packages and this workbench, for verification
    paths = [p for p in (step_env.get("PYTHONPATH"), target, REPO_ROOT, os.environ.get("PYTHONPATH")) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _stream(argv: list[str], env: dict[str, str], log, echo: Callable[[str], None] | None) -> int:
    """Run argv (no shell), copy every output line to the log (and to `echo`), return the exit code."""
    log.write(f"\n$ {shlex.join(argv)}\n")
    log.flush()
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          errors="replace", bufsize=1) as proc:
        for line in proc.stdout:
            log.write(line)
            if echo:
                echo(line)
        rc = proc.wait()
    log.write(f"[exit {rc}]\n")
    log.flush()
    return rc


def _probe_fresh(python: str, target: str | None) -> dict[str, Any]:
    """The probe in a new interpreter: this one may hold a stale (or no) TE import."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "probe.json")  # a file, not stdout: TE may print warnings there
        out = subprocess.run([python, "-m", "workbench", "probe", "--json", "--out", path], capture_output=True,
                             text=True, env=_subprocess_env({}, target), errors="replace")
        if out.returncode == 0 and os.path.exists(path):
            with open(path) as f:
                return json.load(f)
    err = (out.stderr or out.stdout).strip().splitlines()[-20:]
    return {"te_available": False, "te_import_error": "probe failed: " + " | ".join(err)}


def fp8_smoke(python: str, target: str | None = None, log=None) -> dict[str, Any]:
    """FP8 forward + backward of one te.Linear in a fresh process (`workbench.env.smoke`): proves the
    install, not just the import."""
    out = subprocess.run([python, "-m", "workbench.env.smoke"], capture_output=True, text=True,
                         env=_subprocess_env({}, target), errors="replace")
    if log:
        log.write(f"\n$ fp8 smoke test\n{out.stdout}{out.stderr}[exit {out.returncode}]\n")
    lines = out.stdout.strip().splitlines()
    if out.returncode == 0 and lines:
        return json.loads(lines[-1])
    return {"ok": False, "error": " | ".join((out.stderr or out.stdout).strip().splitlines()[-15:])}


def te_jax_import(python: str, target: str | None = None, log=None) -> dict[str, Any]:
    """Does TE's JAX extension import in a fresh process (the JAX FP8 students' precondition)? {'ok', 'error'}."""
    out = subprocess.run([python, "-c", "import transformer_engine.jax"], capture_output=True, text=True,
                         env=_subprocess_env({}, target), errors="replace")
    if log:
        log.write(f"\n$ import transformer_engine.jax\n{out.stdout}{out.stderr}[exit {out.returncode}]\n")
    err = " | ".join((out.stderr or out.stdout).strip().splitlines()[-10:])
    return {"ok": out.returncode == 0, "error": "" if out.returncode == 0 else err}


def _new_run_dir(out: str | Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        d = Path(out) / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            d.mkdir(parents=True)
            return d
        except FileExistsError:
            continue
        except OSError as e:  # a usage error (a read-only or missing root), not an install failure
            raise ConfigError(f"--out {out}: cannot create the install record folder there "
                              f"({e.strerror or e}); give a writable folder") from None
    raise RuntimeError(f"cannot create a run folder under {out}")


def _tail(path: Path, n: int = 40) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines()[-n:]


def install_te(env: dict[str, Any] | None = None, *, out: str | Path = "results/install", progress: bool = True,
               **plan_kwargs) -> Outcome:
    """Plan, preflight, run, verify; never raises for an install failure: the Outcome says what happened.

    `env`: the probe (default: probe this machine). `plan_kwargs`: see `plan()`. Writes
    `out/<timestamp>/{probe_before,plan,probe_after,outcome}.json` and `install.log`."""
    from workbench.env import probe

    t0 = time.perf_counter()
    env = env if env is not None else probe.probe()
    p = plan(env, **plan_kwargs)
    run_dir = _new_run_dir(out)
    write_json(run_dir / "probe_before.json", env)
    write_json(run_dir / "plan.json", p.to_dict())
    log_path = run_dir / "install.log"
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(p.render() + "\n")
    outcome = _without_steps(p, env, log_path)
    if outcome is None:
        results, failed = _run_steps(p, log_path, progress)
        after, smoke = _verify(p, run_dir, log_path)
        outcome = _step_failed(env, after, smoke, results, failed, log_path) if failed else \
            _after_pip(p, after, smoke, results, log_path)
        if not failed and any(st.name == "transformer-engine-jax" for st in p.steps):
            _with_te_jax(outcome, p, after, log_path)
    return _record(outcome, t0, run_dir, log_path, progress)


def _with_te_jax(o: Outcome, p: Plan, after: dict[str, Any], log_path: Path) -> None:
    """--jax: the outcome says whether transformer_engine.jax imports now; where it does not, the run failed and
    the doctor reads the import error (its JAX entries: a missing .so, the FFI registration order)."""
    with open(log_path, "a", encoding="utf-8") as log:
        o.te_jax = te_jax_import(p.python, p.target, log)
    if o.te_jax["ok"]:
        o.reason += "; TE's JAX extension built and transformer_engine.jax imports"
        return
    o.ok = False
    o.reason += f"; TE's JAX extension does not import: {o.te_jax['error'][:300]}"
    found = doctor.diagnose(o.te_jax["error"], after) or [doctor.unknown(log_path, o.te_jax["error"])]
    o.diagnosis += [d.to_dict() for d in found]


def _without_steps(p: Plan, env: dict[str, Any], log_path: Path) -> Outcome | None:
    """The outcome when nothing runs: preflight refused (the doctor reads a TE that is here but does not
    import) or there is nothing to do; TE stays as the probe found it. None: there are steps to run."""
    te_before = "transformer_engine" if env.get("te_available") else "fallback"
    if not p.ok:
        diag = [] if env.get("te_available") else [d.to_dict() for d in doctor.check_installed(env, log_path)]
        return Outcome(te_before, False, "preflight refused: " + "; ".join(p.refusals), diag,
                       env.get("te_version"), refused=True)
    if not p.steps:
        return Outcome(te_before, bool(env.get("te_available")), p.notes[0] if p.notes else "nothing to do",
                       [], env.get("te_version"))
    return None


def _run_steps(p: Plan, log_path: Path, progress: bool) -> tuple[list[dict[str, Any]], tuple[Step, int, int] | None]:
    """Run the steps in order, their output appended to the log (and streamed with `progress`), stopping at
    the first failure: (each step's name, returncode and duration_s; the failed step and where its output
    starts and ends in the log, so the doctor reads that step alone, or None)."""
    echo = (lambda line: print(line, end="", flush=True)) if progress else None
    results = []
    with open(log_path, "a", encoding="utf-8") as log:
        for step in p.steps:
            if progress:
                print(f"install-te: {step.name}: $ {step.shell()}", flush=True)
            s0 = time.perf_counter()
            start = log.tell()
            rc = _stream(step.argv, _subprocess_env(step.env, p.target), log, echo)
            results.append({"name": step.name, "returncode": rc, "duration_s": round(time.perf_counter() - s0, 2)})
            if rc != 0:
                return results, (step, start, log.tell())
    return results, None


def _verify(p: Plan, run_dir: Path, log_path: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(probe_after, FP8 smoke result or None): the probe runs in a fresh process, so the new TE is really
    imported, and is saved as probe_after.json; the smoke test runs only where FP8 is available."""
    after = _probe_fresh(p.python, p.target)
    write_json(run_dir / "probe_after.json", after)
    if not (after.get("te_available") and after.get("fp8_available")):
        return after, None
    with open(log_path, "a", encoding="utf-8") as log:
        return after, fp8_smoke(p.python, p.target, log)


def _step_failed(env: dict[str, Any], after: dict[str, Any], smoke: dict[str, Any] | None,
                 results: list[dict[str, Any]], failed: tuple[Step, int, int], log_path: Path) -> Outcome:
    """A pip step failed: the doctor reads that step's output alone (its first error names the cause; not the
    verification written after it, whose TE warnings once named another failure), and the reason says when a
    TE installed before still imports."""
    step, start, end = failed
    te_mode = "transformer_engine" if after.get("te_available") else "fallback"
    version = after.get("te_version")
    with open(log_path, encoding="utf-8", errors="replace") as f:
        f.seek(start)
        step_log = f.read(end - start)
    found = doctor.diagnose(step_log, env) or [doctor.unknown(log_path, step_log)]
    reason = f"step '{step.name}' failed (exit {results[-1]['returncode']}): {found[0].cause}"
    if te_mode == "transformer_engine":
        reason += f"; the Transformer Engine already installed ({version}) still imports"
    return Outcome(te_mode, False, reason, [d.to_dict() for d in found], version, False, results, fp8_smoke=smoke)


def _after_pip(p: Plan, after: dict[str, Any], smoke: dict[str, Any] | None, results: list[dict[str, Any]],
               log_path: Path) -> Outcome:
    """pip succeeded; success is TE importing in a fresh process (else the doctor reads the import error)
    and, where FP8 is available, the FP8 smoke test passing: runtime failures (e.g. cuDNN sub-libraries)
    only show when kernels run."""
    version = after.get("te_version")
    if not after.get("te_available"):
        found = doctor.check_installed(after, log_path) or [
            doctor.unknown(log_path, after.get("te_import_error") or "")
        ]
        reason = f"pip succeeded but transformer_engine.pytorch does not import: {after.get('te_import_error')}"
        return Outcome("fallback", False, reason, [d.to_dict() for d in found], version, False, results)
    ok = smoke is None or bool(smoke.get("ok"))
    reason = f"Transformer Engine {version} installed ({'compiled here' if p.build == 'yes' else p.build_reason}) " \
             "and transformer_engine.pytorch imports"
    found = []
    if smoke is not None:
        reason += "; FP8 forward/backward " + ("works" if ok else f"FAILED: {smoke.get('error')}")
        if not ok:
            found = doctor.diagnose(str(smoke.get("error")), after) or [doctor.unknown(log_path, str(smoke))]
    elif not after.get("fp8_available"):
        reason += f"; FP8 not available here: {after.get('fp8_reason')}"
    return Outcome("transformer_engine", ok, reason, [d.to_dict() for d in found], version, False, results,
                   fp8_smoke=smoke)


def _record(o: Outcome, t0: float, run_dir: Path, log_path: Path, progress: bool) -> Outcome:
    """Stamp the outcome with its duration, record folder and log tail, save it as outcome.json (what the
    rest of the workbench reads) and say it in one line."""
    o.duration_s = round(time.perf_counter() - t0, 2)
    o.run_dir, o.log = str(run_dir), str(log_path)
    o.log_tail = _tail(log_path) if log_path.exists() else []
    write_json(run_dir / "outcome.json", o.to_dict())
    if progress:
        print(f"install-te: {o.te_mode}: {o.reason}\n  (saved in {run_dir})")
    return o


def last_outcome(root: str | Path = "results/install") -> dict[str, Any] | None:
    """The newest readable outcome.json under `root` (what the rest of the workbench reads), or None. A
    damaged one (an install killed while writing, a hand edit) is passed over: every run reads this."""
    for path in sorted(Path(root).glob("*/outcome.json"), reverse=True):
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(found, dict):
            return found
    return None


def last_summary() -> dict | None:
    """The newest `workbench install-te` outcome in brief, for a run's env.json (`te_install`): how TE got here or
    why it fell back; None where install-te never ran."""
    o = last_outcome()
    if not o:
        return None
    return {**{k: o.get(k) for k in ("te_mode", "ok", "reason", "te_version", "run_dir")},
            "diagnosis": [d.get("id") for d in o.get("diagnosis") or []]}


# ------------------------------------------------------------------------------------------------- CLI
def add_arguments(p) -> None:
    p.add_argument("--dry-run", action="store_true", help="print the plan (commands and environment) and stop")
    p.add_argument("--version", default=None, help="TE version to pin (default: PyPI's newest, or the wheelhouse's)")
    p.add_argument("--find-links", default=None, metavar="DIR", help="a wheelhouse folder for pip")
    p.add_argument("--no-index", action="store_true", help="offline: use only --find-links, never PyPI")
    p.add_argument(
        "--build-from-source", action="store_true", help="compile the PyTorch extension here (from its sdist)"
    )
    p.add_argument("--reinstall", action="store_true", help="uninstall the installed TE packages and install again")
    p.add_argument(
        "--force", action="store_true", help="run even where preflight refuses (the refusals become warnings)"
    )
    p.add_argument(
        "--max-jobs", type=int, default=None, help="parallel compile jobs (default: sized to memory and cores)"
    )
    p.add_argument("--jax", action="store_true", help="also compile TE's JAX extension against the installed jax "
                   "(the jax:fp8_current students; needs jax with its CUDA plugin, nvcc and cuDNN headers)")
    p.add_argument("--target", default=None, help="install into this folder (pip --target) instead of the environment")
    p.add_argument("--out", default="results/install", help="parent folder of the install record")
    p.add_argument("--quiet", action="store_true", help="do not stream pip's output (it is still logged)")
    p.add_argument("--json", action="store_true", help="print the plan (with --dry-run) or the outcome as JSON")


def main(args) -> int:
    """Exit status: 0 TE usable after the run, 1 install failed (fallback or old TE kept), 2 refused."""
    from workbench.env import probe

    kwargs = dict(version=args.version, find_links=args.find_links, no_index=args.no_index,
                  build_from_source=args.build_from_source, reinstall=args.reinstall, force=args.force,
                  max_jobs=args.max_jobs, target=args.target, jax=args.jax)
    env = probe.probe()
    if args.dry_run:
        p = plan(env, **kwargs)
        print(json.dumps(p.to_dict(), indent=2) if args.json else p.render())
        return 0 if p.ok else 2
    o = install_te(env, out=args.out, progress=not (args.quiet or args.json), **kwargs)
    if args.json:
        print(json.dumps(o.to_dict(), indent=2))
    elif o.diagnosis:
        print(doctor.render([doctor.Diagnosis(**d) for d in o.diagnosis]))
    return 2 if o.refused else (0 if o.ok else 1)
