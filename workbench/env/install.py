"""Transformer Engine installer: plan from the probe, preflight, run pip, verify, fall back gracefully.

    python -m workbench install-te --dry-run                              # the plan: commands + environment
    python -m workbench install-te                                        # PyPI, the documented route
    python -m workbench install-te --find-links WHEELHOUSE --no-index     # offline (clusters without internet)
    python -m workbench install-te --build-from-source                    # compile the torch extension here

From Python (the notebook): `plan(probe_dict, ...)` -> Plan, `install_te(...)` -> Outcome.

`plan()` reads nothing but the probe dict (and the wheelhouse folder), so any machine can be simulated
with plain data. It picks the core extra (`core_cu12` / `core_cu13`) from torch's CUDA major, pins the
meta package, core and extension to one version, and sets the build environment when the extension may
compile: NVTE_FRAMEWORK, NVTE_CUDA_ARCHS for this GPU, MAX_JOBS / NVTE_BUILD_THREADS_PER_JOB sized to
memory and cores, CUDA_HOME, CUDNN_PATH. Preflight refuses, with the reason, what cannot work.

`install_te()` runs each step with pip as a subprocess (argument list, no shell), streams its output, and
writes results/install/<timestamp>/: install.log (complete), plan.json, probe_before.json,
probe_after.json (a fresh process, so the new TE is really imported) and outcome.json: te_mode
(transformer_engine | fallback), the reason, the doctor's diagnosis, the steps' exit codes, an FP8
forward/backward smoke test. On fallback the workbench's TE students run the PyTorch autocast path.
"""
from __future__ import annotations

import email.parser
import json
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from workbench.env import doctor
from workbench.env.facts import EXTENSION, META, build_jobs, core_name, is_core
from workbench.config import ConfigError
from workbench.results import write_json

REPO_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass
class Step:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    """Added to the inherited environment (NVTE_RELEASE_BUILD is always removed: it drops the extension, #2505)."""
    why: str = ""

    def shell(self) -> str:
        """The step as one copy-pasteable shell line (display only; it runs without a shell)."""
        return " ".join([f"{k}={shlex.quote(v)}" for k, v in self.env.items()] + [shlex.join(self.argv)])


@dataclass
class Plan:
    python: str
    version: str | None
    """TE version the meta, core and extension packages are pinned to (None: PyPI's newest)."""
    core_extra: str | None
    build: str
    """'yes' (the extension compiles here), 'maybe' (PyPI sdist: a prebuilt wheel if one matches, else compile), 'no'."""
    build_reason: str
    build_env: dict[str, str]
    steps: list[Step]
    refusals: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    find_links: str | None = None
    no_index: bool = False
    target: str | None = None

    @property
    def ok(self) -> bool:
        return not self.refusals

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        d["commands"] = [s.shell() for s in self.steps]
        return d

    def render(self) -> str:
        head = f"Transformer Engine {self.version or '(newest on PyPI)'}, {self.core_extra or 'no core extra'}; " \
               f"extension build: {self.build} ({self.build_reason})"
        lines = [head, f"python: {self.python}", "preflight: " + ("ok" if self.ok else "REFUSED")]
        lines += [f"  refused: {r}" for r in self.refusals]
        lines += [f"  warning: {w}" for w in self.warnings]
        lines += [f"  note: {n}" for n in self.notes]
        for i, s in enumerate(self.steps, 1):
            lines += [f"{i}. {s.name}: {s.why}", f"   $ {s.shell()}"]
        if self.steps:
            lines.append(f"{len(self.steps) + 1}. verify: probe in a fresh process (transformer_engine.pytorch must import); "
                         "FP8 forward/backward of one te.Linear if FP8 is available")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------- wheelhouse
@dataclass(frozen=True)
class Dist:
    name: str
    version: Version
    path: Path
    tags: frozenset = frozenset()  # empty for an sdist

    @property
    def is_wheel(self) -> bool:
        return self.path.name.endswith(".whl")


def scan_wheelhouse(folder: str | Path) -> dict[str, list[Dist]]:
    """{canonical name: [Dist, ...]} of the wheels and sdists in a --find-links folder (names per PEP 427/625)."""
    found: dict[str, list[Dist]] = {}
    for path in sorted(Path(folder).iterdir()):
        try:
            if path.name.endswith(".whl"):
                name, version, _, tags = parse_wheel_filename(path.name)
            elif path.name.endswith((".tar.gz", ".zip")):
                (name, version), tags = parse_sdist_filename(path.name), frozenset()
            else:
                continue
        except (InvalidWheelFilename, InvalidSdistFilename):
            continue
        found.setdefault(str(name), []).append(Dist(str(name), version, path, tags))
    return found


def _wheel_fits(dist: Dist, env: dict[str, Any]) -> bool:
    """Does this wheel install on the probed Python/platform (interpreter tag and machine)?"""
    py, machine = env.get("python_tag") or "", env.get("machine") or ""
    return any((t.interpreter == py or t.interpreter in ("py3", "py2.py3")) and
               (t.platform == "any" or (machine and machine in t.platform)) for t in dist.tags)


def _requires(dist: Dist) -> list[Requirement]:
    """Requires-Dist of a wheel (METADATA) or sdist (PKG-INFO), without extras-only requirements."""
    try:
        if dist.is_wheel:
            with zipfile.ZipFile(dist.path) as z:
                name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
                text = z.read(name).decode(errors="replace")
        else:
            with tarfile.open(dist.path) as t:
                member = next(m for m in t.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"))
                text = t.extractfile(member).read().decode(errors="replace")
    except (StopIteration, OSError, EOFError, zlib.error, zipfile.BadZipFile, tarfile.TarError):
        return []  # a damaged archive (e.g. a truncated download): pip reports it when it gets there
    out = []
    for line in email.parser.Parser().parsestr(text).get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is None or "extra" not in str(req.marker):
            out.append(req)
    return out


def _pick(dists: list[Dist], version: Version, env: dict[str, Any]) -> Dist | None:
    """The wheel for this Python of `version`, else its sdist."""
    same = [d for d in dists if d.version == version]
    return next((d for d in same if d.is_wheel and _wheel_fits(d, env)), next((d for d in same if not d.is_wheel), None))


def _runtime_deps(chosen: list[Dist], house: dict[str, list[Dist]]) -> tuple[list[str], list[str]]:
    """(names in the wheelhouse, names missing from it) of what the chosen TE packages require,
    followed through the wheelhouse; TE's own packages and torch are excluded (never touched)."""
    skip = {META, EXTENSION, "torch"} | {n for n in house if is_core(n)}
    todo, present, missing = list(chosen), [], []
    while todo:
        for req in _requires(todo.pop()):
            name = str(canonicalize_name(req.name))
            if name in skip or name in present or name in missing:
                continue
            if name in house:
                present.append(name)
                todo.append(max(house[name], key=lambda d: (d.version, d.is_wheel)))
            else:
                missing.append(name)
    return present, missing


# ------------------------------------------------------------------------------------------------- plan
def build_env(env: dict[str, Any], max_jobs: int | None = None, force_build: bool = False) -> dict[str, str]:
    """Environment for compiling transformer_engine_torch here (REFERENCE §3): MAX_JOBS from
    `build_jobs`; threads per job share the remaining cores among this GPU's architectures (one arch:
    one thread)."""
    cores = int(env.get("cpu_cores") or 1)
    jobs = max_jobs or build_jobs(env)
    archs = [env["compute_capability"].replace(".", "")] if env.get("compute_capability") else []
    out = {"NVTE_FRAMEWORK": "pytorch", "MAX_JOBS": str(jobs),
           "NVTE_BUILD_THREADS_PER_JOB": str(max(1, min(len(archs) or 1, cores // jobs)))}
    if archs:
        out["NVTE_CUDA_ARCHS"] = ";".join(archs)
    nvcc, home = env.get("nvcc_path"), env.get("cuda_home")
    if nvcc and not (home and nvcc.startswith(home.rstrip("/") + "/")):
        home = os.path.dirname(os.path.dirname(nvcc))  # e.g. a pip nvidia-cuda-nvcc: site-packages/nvidia/cu13
    if home:
        out["CUDA_HOME"] = out["CUDA_PATH"] = home
    cudnn = env.get("cudnn_pip_root") or (os.path.dirname(os.path.dirname(env["cudnn_system_header"]))
                                          if env.get("cudnn_system_header") else None)
    if cudnn:
        out["CUDNN_PATH"] = out["CUDNN_HOME"] = cudnn
    if force_build:
        out["NVTE_PYTORCH_FORCE_BUILD"] = "TRUE"  # skip the extension's attempt to download a prebuilt wheel
    return out


def _capability_refusals(env: dict[str, Any]) -> tuple[list[str], list[str]]:
    refusals, warnings = [], []
    if not env.get("torch_cuda"):
        refusals.append(f"torch {env.get('torch')} is a CPU build (torch.version.cuda is None): install a CUDA "
                        "build of torch first; meanwhile the workbench runs the PyTorch fallback")
    elif env.get("torch_cuda_major") not in (12, 13):
        refusals.append(f"torch CUDA {env.get('torch_cuda')}: TE publishes core_cu12 and core_cu13 only")
    if not env.get("gpu_name") or not env.get("compute_capability"):
        refusals.append("no CUDA GPU visible (torch.cuda.is_available() is False): TE needs an NVIDIA GPU; "
                        "the workbench runs the PyTorch fallback")
    else:
        cc = tuple(int(x) for x in env["compute_capability"].split("."))
        if cc < (8, 0):
            refusals.append(f"compute capability {env['compute_capability']} ({env['gpu_name']}) is below 8.0: no bf16 "
                            "and no FP8, so TE brings no benefit; the workbench uses fp16 autocast + GradScaler")
        elif cc < (8, 9):
            warnings.append(f"compute capability {env['compute_capability']}: TE bf16 only, no FP8 "
                            "(FP8 needs 8.9 with CUDA >= 12.1, or 9.0+)")
    return refusals, warnings


def _build_refusals(env: dict[str, Any], benv: dict[str, str]) -> list[str]:
    """What a compile of the extension needs and this machine lacks."""
    out = []
    torch_major = env.get("torch_cuda_major")
    if not env.get("nvcc_path"):
        out.append(f"nvcc not found (CUDA_HOME={env.get('cuda_home')}): install the CUDA {torch_major} toolkit "
                   "or use an NGC PyTorch container (environments/Dockerfile)")
    elif not env.get("nvcc_version"):  # it exists but does not say its release: it cannot be trusted to compile
        out.append(f"nvcc present but unusable: {env.get('nvcc_problem') or '`nvcc --version` gave no release'} "
                   f"({env['nvcc_path']}): repair or remove it, or point CUDA_HOME at a working CUDA "
                   f"{torch_major} toolkit")
    elif env.get("nvcc_version") and torch_major and int(env["nvcc_version"].split(".")[0]) != torch_major:
        out.append(f"nvcc {env['nvcc_version']} at {env['nvcc_path']} but torch was built with CUDA "
                   f"{env.get('torch_cuda')}: the majors must match (TE #553)")
    if "CUDNN_PATH" not in benv:
        out.append(f"cuDNN headers (cudnn.h) not found under CUDA_HOME, /usr or a pip nvidia-cudnn package: "
                   f"pip install nvidia-cudnn-cu{torch_major} (TE #918)")
    return out


def _version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise ConfigError(f"--version {text!r} is not a PEP 440 version; give one such as 2.20.2") from None


def plan(env: dict[str, Any], *, version: str | None = None, find_links: str | None = None, no_index: bool = False,
         build_from_source: bool = False, reinstall: bool = False, force: bool = False, max_jobs: int | None = None,
         target: str | None = None) -> Plan:
    """The install for the probed machine `env` (a `workbench.probe.probe()` dict, real or simulated), decided
    in order: what an offline wheelhouse offers, whether the extension compiles here (and its build
    environment), the preflight, the already-installed short cut, then the pip steps."""
    refusals, warnings = _capability_refusals(env)
    major = env.get("torch_cuda_major")
    core = core_name(major) if major else None
    pin = _version(version) if version else None
    if max_jobs is not None and max_jobs < 1:
        raise ConfigError(f"--max-jobs {max_jobs}: give at least 1 parallel compile job")
    house, picked, pin, offline_refusals = _wheelhouse_pick(env, find_links, no_index, core, pin)
    build, build_reason = _build_choice(env, picked.get(EXTENSION), build_from_source, no_index)
    p = Plan(env.get("python_executable") or sys.executable, str(pin) if pin else None,
             f"core_cu{major}" if major else None, build, build_reason,
             build_env(env, max_jobs, force_build=build == "yes") if build != "no" else {}, [],
             refusals + offline_refusals, warnings, [], find_links, no_index, target)
    _preflight(p, env, core, force)
    if not p.ok:
        return p
    if (installed := _already_installed(p, env, again=reinstall or build_from_source)) is not None:
        return installed
    p.steps = _pip_steps(p, env, core, picked, house, build_from_source)
    return p


def _wheelhouse_pick(env: dict[str, Any], find_links: str | None, no_index: bool, core: str | None,
                     pin: Version | None) -> tuple[dict[str, list[Dist]], dict[str, Dist | None], Version | None, list[str]]:
    """(wheelhouse, {TE package: its file there}, pin, refusals). Offline, pip sees only the wheelhouse, so
    the plan pins what it holds (its newest meta package unless --version says otherwise) and refuses before
    pip runs when a TE package of that version is missing: a wheel for this Python, or for the extension
    at least its sdist (which then compiles here)."""
    refusals: list[str] = []
    picked: dict[str, Dist | None] = {}
    if no_index and not find_links:
        refusals.append("--no-index needs --find-links DIR (a wheelhouse)")
    have_house = bool(find_links) and Path(find_links).is_dir()
    if find_links and not have_house:
        refusals.append(f"--find-links {find_links}: not a folder")
    try:
        house = scan_wheelhouse(find_links) if have_house else {}
    except OSError as e:
        house = {}
        refusals.append(f"--find-links {find_links}: cannot read the folder ({e.strerror or e})")
    if no_index and have_house:
        if pin is None and META in house:
            pin = max(d.version for d in house[META])
        if pin is None:
            refusals.append(f"the wheelhouse {find_links} has no transformer_engine meta package")
        else:
            picked = {name: _pick(house.get(name, []), pin, env) for name in (META, core, EXTENSION) if name}
            for name, dist in picked.items():
                if dist is None:
                    kind = "a wheel for " + str(env.get("python_tag")) + " or an sdist" if name == EXTENSION else "a wheel"
                    refusals.append(f"the wheelhouse {find_links} has no {name}=={pin} ({kind})")
    return house, picked, pin, refusals


def _build_choice(env: dict[str, Any], ext_dist: Dist | None, build_from_source: bool, no_index: bool) -> tuple[str, str]:
    """(build, reason): does transformer_engine_torch compile here? It decides whether the plan sets a build
    environment and checks nvcc and cuDNN. Offline the wheelhouse's file answers; on PyPI the extension is
    an sdist that fetches a prebuilt extension when one matches this torch, so there it is 'maybe'."""
    if build_from_source:
        return "yes", "--build-from-source"
    if ext_dist is not None:
        if ext_dist.is_wheel:
            return "no", f"prebuilt wheel {ext_dist.path.name}"
        return "yes", f"the wheelhouse has only the sdist {ext_dist.path.name} for {env.get('python_tag')}"
    if no_index:
        return "no", "nothing to build (see refusals)"
    return "maybe", ("transformer_engine_torch is an sdist on PyPI: it fetches a prebuilt "
                     "extension when one matches this torch, else compiles")


def _preflight(p: Plan, env: dict[str, Any], core: str | None, force: bool) -> None:
    """Refuse, in `p`, what cannot work, so that nothing half-installs: a compile needs nvcc of torch's CUDA
    major and cuDNN headers (where the extension only may compile, that is a warning). --force turns every
    refusal into a warning, except one: without torch's CUDA version no core package can be chosen."""
    if p.build != "no" and not p.refusals:
        missing = _build_refusals(env, p.build_env)
        if p.build == "yes":
            p.refusals += missing
        else:
            p.warnings += [f"if it compiles: {m}" for m in missing]
    if force and p.refusals:
        p.warnings += [f"(--force) {r}" for r in p.refusals]
        p.refusals = []
    if core is None and not p.refusals:  # not even --force can choose core_cu12 / core_cu13 then
        p.refusals.append(f"cannot choose core_cu12 / core_cu13: torch {env.get('torch')} has no CUDA version")
    if p.refusals:
        p.notes.append("preflight refused: nothing will run (--force runs anyway where it can)")


def _already_installed(p: Plan, env: dict[str, Any], again: bool) -> Plan | None:
    """The short cut: a TE that imports, is consistent and is the wanted version needs nothing (installing
    it again would first uninstall a working TE). None: install. `again` (--reinstall or
    --build-from-source) always installs."""
    have = env.get("te_version") or (env.get("te_packages") or {}).get(META)
    healthy = bool(env.get("te_available")) and env.get("te_consistent") is not False
    if not healthy or again or (p.version is not None and have != p.version):
        return None
    note = (f"nothing to do: Transformer Engine {have} is installed, consistent and imports "
            "(--reinstall or --build-from-source to install again)")
    return replace(p, version=p.version or have, build="no", build_reason="already installed", build_env={},
                   notes=p.notes + [note])


PIP_ENV = {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}  # no network call to PyPI for pip's own version


def _uninstall_step(p: Plan, env: dict[str, Any]) -> Step | None:
    """Remove every installed transformer-engine* package first, so meta, core and extension end up one
    consistent set (TE #2410). Not for --target, which leaves the environment's packages alone."""
    installed = env.get("te_packages") or {}
    if not installed or p.target is not None:
        return None
    why = "one consistent set: remove every transformer-engine* package first (TE #2410); pip " \
          "--force-reinstall would reinstall torch and friends too"
    if env.get("te_consistent") is False:
        bad = [c["check"] for c in env.get("te_consistency") or [] if c["ok"] is False]
        why = f"the installed TE is inconsistent ({', '.join(bad)}); " + why
    return Step("uninstall", [p.python, "-m", "pip", "uninstall", "-y", *sorted(installed)], dict(PIP_ENV), why)


def _pip_steps(p: Plan, env: dict[str, Any], core: str, picked: dict[str, Dist | None], house: dict[str, list[Dist]],
               build_from_source: bool) -> list[Step]:
    """The pip commands: the uninstall, then meta, core and extension in one pip call, either from the
    wheelhouse alone (pinned, --no-deps, after TE's runtime dependencies found there; a warning names those
    it lacks) or from PyPI (the documented `transformer_engine[pytorch,core_cuXX]`)."""
    pip = [p.python, "-m", "pip"]
    steps = [s for s in [_uninstall_step(p, env)] if s]
    where = ["--target", p.target] if p.target else []
    links = ["--find-links", p.find_links] if p.find_links else []
    source = ["--no-binary", "transformer_engine_torch", "--no-cache-dir"] if build_from_source else []
    verbose = ["-v"] if p.build != "no" else []  # compiler output in the log: the first 'error:' is the cause
    if p.no_index and p.version is not None and core:
        present, missing = _runtime_deps([d for d in picked.values() if d], house)
        if missing:
            p.warnings.append("required by TE but not in the wheelhouse, so they must already be installed (the "
                              "verification import shows a missing one): " + ", ".join(missing))
        if present:
            steps.append(Step("runtime-deps", pip + ["install", "--no-index", *links, "--no-deps", *where, *present],
                              dict(PIP_ENV), "TE's runtime dependencies found in the wheelhouse; --no-deps so pip "
                              "never tries to replace torch or fetch CUDA libraries offline (already installed ones "
                              "are left as they are)"))
        steps.append(Step("transformer-engine", pip + ["install", "--no-index", *links, "--no-deps", "--no-build-isolation",
                                                       *source, *verbose, *where,
                                                       f"transformer_engine=={p.version}",
                                                       f"{core.replace('-', '_')}=={p.version}",
                                                       f"transformer_engine_torch=={p.version}"],
                          {**PIP_ENV, **p.build_env}, "meta, core and extension pinned to one version; "
                          "--no-build-isolation so the extension builds against the installed torch"))
    elif not p.no_index:
        spec = f"transformer_engine[pytorch,{p.core_extra}]" + (f"=={p.version}" if p.version else "")
        steps.append(Step("transformer-engine", pip + ["install", "--no-build-isolation", *links, *source, *verbose,
                                                       *where, spec],
                          {**PIP_ENV, **p.build_env}, "the documented route: the [pytorch] extension and the core for "
                          "torch's CUDA major, built against the installed torch"))
    return steps


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _subprocess_env(step_env: dict[str, str], target: str | None) -> dict[str, str]:
    env = {**os.environ, **step_env}
    env.pop("NVTE_RELEASE_BUILD", None)  # set, it builds TE without the PyTorch extension (TE #2505)
    paths = [p for p in (target, REPO_ROOT, os.environ.get("PYTHONPATH")) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)  # the target's packages and this workbench, for verification
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


FP8_SMOKE = """
import json, torch
from workbench.env import te as _te
te, recipe, why = _te.load()  # the workbench's own import path (it aligns TE's cuDNN with torch's)
if te is None:
    raise SystemExit(why)
autocast = _te.autocast
torch.manual_seed(0)
layer = te.Linear(256, 256, bias=True).cuda()
x = torch.randn(64, 256, device="cuda", requires_grad=True)
with autocast(te, recipe.DelayedScaling(margin=0, fp8_format=recipe.Format.HYBRID)):
    y = layer(x)
y.float().pow(2).mean().backward()
torch.cuda.synchronize()
finite = bool(torch.isfinite(y).all() and torch.isfinite(x.grad).all() and torch.isfinite(layer.weight.grad).all())
print(json.dumps({"ok": finite, "recipe": "DelayedScaling(HYBRID)", "shape": list(y.shape),
                  "weight_grad_norm": float(layer.weight.grad.norm())}))
"""


def fp8_smoke(python: str, target: str | None = None, log=None) -> dict[str, Any]:
    """FP8 forward + backward of one te.Linear in a fresh process: proves the install, not just the import."""
    out = subprocess.run([python, "-c", FP8_SMOKE], capture_output=True, text=True, env=_subprocess_env({}, target),
                         errors="replace")
    if log:
        log.write(f"\n$ fp8 smoke test\n{out.stdout}{out.stderr}[exit {out.returncode}]\n")
    lines = out.stdout.strip().splitlines()
    if out.returncode == 0 and lines:
        return json.loads(lines[-1])
    return {"ok": False, "error": " | ".join((out.stderr or out.stdout).strip().splitlines()[-15:])}


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
    return _record(outcome, t0, run_dir, log_path, progress)


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


def _run_steps(p: Plan, log_path: Path, progress: bool) -> tuple[list[dict[str, Any]], tuple[Step, int] | None]:
    """Run the steps in order, their output appended to the log (and streamed with `progress`), stopping at
    the first failure: (each step's name, returncode and duration_s; the failed step and where its output
    starts in the log, so the doctor reads that step alone, or None)."""
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
                return results, (step, start)
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
                 results: list[dict[str, Any]], failed: tuple[Step, int], log_path: Path) -> Outcome:
    """A pip step failed: the doctor reads that step's output alone (its first error names the cause), and
    the reason says when a TE installed before still imports."""
    step, start = failed
    te_mode = "transformer_engine" if after.get("te_available") else "fallback"
    version = after.get("te_version")
    with open(log_path, encoding="utf-8", errors="replace") as f:
        f.seek(start)
        step_log = f.read()
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
        found = doctor.check_installed(after, log_path) or [doctor.unknown(log_path, after.get("te_import_error") or "")]
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


# ------------------------------------------------------------------------------------------------- CLI
def add_arguments(p) -> None:
    p.add_argument("--dry-run", action="store_true", help="print the plan (commands and environment) and stop")
    p.add_argument("--version", default=None, help="TE version to pin (default: PyPI's newest, or the wheelhouse's)")
    p.add_argument("--find-links", default=None, metavar="DIR", help="a wheelhouse folder for pip")
    p.add_argument("--no-index", action="store_true", help="offline: use only --find-links, never PyPI")
    p.add_argument("--build-from-source", action="store_true", help="compile the PyTorch extension here (from its sdist)")
    p.add_argument("--reinstall", action="store_true", help="uninstall the installed TE packages and install again")
    p.add_argument("--force", action="store_true", help="run even where preflight refuses (the refusals become warnings)")
    p.add_argument("--max-jobs", type=int, default=None, help="parallel compile jobs (default: sized to memory and cores)")
    p.add_argument("--target", default=None, help="install into this folder (pip --target) instead of the environment")
    p.add_argument("--out", default="results/install", help="parent folder of the install record")
    p.add_argument("--quiet", action="store_true", help="do not stream pip's output (it is still logged)")
    p.add_argument("--json", action="store_true", help="print the plan (with --dry-run) or the outcome as JSON")


def main(args) -> int:
    """Exit status: 0 TE usable after the run, 1 install failed (fallback or old TE kept), 2 refused."""
    from workbench.env import probe

    kwargs = dict(version=args.version, find_links=args.find_links, no_index=args.no_index,
                  build_from_source=args.build_from_source, reinstall=args.reinstall, force=args.force,
                  max_jobs=args.max_jobs, target=args.target)
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
