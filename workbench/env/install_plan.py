"""The Transformer Engine install plan: what would be installed, how and why, decided from the probe alone.

`plan()` reads nothing but the probe dict (and the wheelhouse folder), so any machine can be simulated
with plain data. It picks the core extra (`core_cu12` / `core_cu13`) from torch's CUDA major, pins the
meta package, core and extension to one version, and sets the build environment when the extension may
compile: NVTE_FRAMEWORK, NVTE_CUDA_ARCHS for this GPU, MAX_JOBS / NVTE_BUILD_THREADS_PER_JOB sized to
memory and cores, CUDA_HOME, CUDNN_PATH. Preflight refuses, with the reason, what cannot work.
`workbench.env.install` runs the plan.
"""
from __future__ import annotations

import os
import shlex
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from workbench.config import ConfigError
from workbench.env.facts import EXTENSION, META, build_jobs, core_name
from workbench.env.wheelhouse import Dist, pick, runtime_deps, scan_wheelhouse


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
    """'yes' (the extension compiles here), 'maybe' (PyPI sdist: a prebuilt wheel if one matches, else compile),
    'no'."""
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
            lines.append(
                f"{len(self.steps) + 1}. verify: probe in a fresh process (transformer_engine.pytorch must import); "
                "FP8 forward/backward of one te.Linear if FP8 is available"
            )
        return "\n".join(lines)


def build_env(env: dict[str, Any], max_jobs: int | None = None, force_build: bool = False) -> dict[str, str]:
    """Environment for compiling transformer_engine_torch here (TE's setup.py reads MAX_JOBS and
    NVTE_BUILD_THREADS_PER_JOB: https://github.com/NVIDIA/TransformerEngine#installation): MAX_JOBS from
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
         target: str | None = None, jax: bool = False) -> Plan:
    """The install for the probed machine `env` (a `workbench.probe.probe()` dict, real or simulated), decided
    in order: what an offline wheelhouse offers, whether the extension compiles here (and its build
    environment), the preflight, the already-installed short cut, then the pip steps; with `jax`, then TE's JAX
    extension compiled against the installed jax (`_jax_steps`), also beside a PyTorch side already installed."""
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
    if jax:
        p.refusals += _jax_refusals(env)
    _preflight(p, env, core, force)
    if not p.ok:
        return p
    if (installed := _already_installed(p, env, again=reinstall or build_from_source)) is not None:
        return _jax_steps(installed, env, max_jobs) if jax else installed
    p.steps = _pip_steps(p, env, core, picked, house, build_from_source)
    return _jax_steps(p, env, max_jobs) if jax else p


JAX_EXTENSION = "transformer_engine_jax"
# on PYTHONPATH for TE-JAX's build: its sitecustomize compiles the extension's sources on MAX_JOBS threads
PARALLEL_BUILD = str(Path(__file__).resolve().parent / "parallel_build")
CUDNN_FRONTEND = "nvidia-cudnn-frontend"  # the JAX build reads its C++ headers from the installed distribution


def _jax_refusals(env: dict[str, Any]) -> list[str]:
    """What TE's JAX build needs beyond the PyTorch side's: jax with its CUDA plugin installed (the build imports
    both: "This package needs Jax to build", "GPU backend is required to build TE jax extensions"), nvcc and
    cuDNN's headers (a compile, always: PyPI has only the sdist)."""
    major = env.get("torch_cuda_major") or 12
    out = []
    if not env.get("jax_version"):
        out.append(f"--jax: jax is not installed: install jax with its CUDA plugin first (pip install "
                   f"'jax[cuda{major}]'), then TE's JAX extension builds against it")
    elif not (env.get("jax_cuda12_plugin_version") or env.get("jax_cuda13_plugin_version")):
        out.append(f"--jax: jax {env['jax_version']} has no CUDA plugin (jax-cuda12-plugin / jax-cuda13-plugin), "
                   f"and TE's JAX build needs jax's GPU backend: pip install 'jax[cuda{major}]'")
    return out + [f"--jax: {r}" for r in _build_refusals(env, build_env(env))]


def _jax_steps(p: Plan, env: dict[str, Any], max_jobs: int | None) -> Plan:
    """The plan with TE's JAX extension added: cudnn-frontend first (the build asks the installed distribution for
    its headers, so it cannot arrive in the same pip call), then transformer_engine_jax compiled here against the
    installed jax (--no-build-isolation; no prebuilt wheel exists), pinned to the TE version of the plan or of the
    TE installed, from the same index or wheelhouse."""
    version = p.version or env.get("te_version")
    pip = [p.python, "-m", "pip", "install", *(["--no-index"] if p.no_index else []),
           *(["--find-links", p.find_links] if p.find_links else []), *(["--target", p.target] if p.target else [])]
    benv = {**build_env(env, max_jobs), "NVTE_FRAMEWORK": "jax"}
    # setuptools compiles a pybind11 extension's sources one at a time: parallel_build/sitecustomize.py
    benv["PYTHONPATH"] = PARALLEL_BUILD
    spec = f"{JAX_EXTENSION}=={version}" if version else JAX_EXTENSION
    # --no-deps: the build needs the frontend's headers only; its own Python kernels' requirements
    # (nvidia-cutlass-dsl, ...) are no wheelhouse's, and offline pip refused the step over them (H200, 2a36645)
    steps = [Step("cudnn-frontend", pip + ["--no-deps", CUDNN_FRONTEND], dict(PIP_ENV),
                  "TE's JAX build takes the cuDNN frontend's C++ headers from this installed distribution"),
             Step("transformer-engine-jax", pip + ["--no-build-isolation", "--no-deps", "-v", spec],
                  {**PIP_ENV, **benv}, "TE's JAX extension, compiled against the installed jax and its CUDA plugin "
                  "(the build imports them), the same version as TE's core")]
    notes = [n for n in p.notes if not n.startswith("nothing to do")]  # the PyTorch side's short cut, if taken
    return replace(p, steps=p.steps + steps, notes=notes + ["--jax: TE's JAX extension is compiled here"],
                   build_env=p.build_env or benv)


def _wheelhouse_pick(
    env: dict[str, Any], find_links: str | None, no_index: bool, core: str | None, pin: Version | None
) -> tuple[dict[str, list[Dist]], dict[str, Dist | None], Version | None, list[str]]:
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
            picked = {name: pick(house.get(name, []), pin, env) for name in (META, core, EXTENSION) if name}
            for name, dist in picked.items():
                if dist is None:
                    kind = (
                        "a wheel for " + str(env.get("python_tag")) + " or an sdist" if name == EXTENSION else "a wheel"
                    )
                    refusals.append(f"the wheelhouse {find_links} has no {name}=={pin} ({kind})")
    return house, picked, pin, refusals


def _build_choice(
    env: dict[str, Any], ext_dist: Dist | None, build_from_source: bool, no_index: bool
) -> tuple[str, str]:
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
        present, missing = runtime_deps([d for d in picked.values() if d], house)
        if missing:
            p.warnings.append("required by TE but not in the wheelhouse, so they must already be installed (the "
                              "verification import shows a missing one): " + ", ".join(missing))
        if present:
            steps.append(Step("runtime-deps", pip + ["install", "--no-index", *links, "--no-deps", *where, *present],
                              dict(PIP_ENV), "TE's runtime dependencies found in the wheelhouse; --no-deps so pip "
                              "never tries to replace torch or fetch CUDA libraries offline (already installed ones "
                              "are left as they are)"))
        steps.append(
            Step(
                "transformer-engine",
                pip
                + [
                    "install",
                    "--no-index",
                    *links,
                    "--no-deps",
                    "--no-build-isolation",
                    *source,
                    *verbose,
                    *where,
                    f"transformer_engine=={p.version}",
                    f"{core.replace('-', '_')}=={p.version}",
                    f"transformer_engine_torch=={p.version}",
                ],
                {**PIP_ENV, **p.build_env},
                "meta, core and extension pinned to one version; "
                "--no-build-isolation so the extension builds against the installed torch",
            )
        )
    elif not p.no_index:
        spec = f"transformer_engine[pytorch,{p.core_extra}]" + (f"=={p.version}" if p.version else "")
        steps.append(Step("transformer-engine", pip + ["install", "--no-build-isolation", *links, *source, *verbose,
                                                       *where, spec],
                          {**PIP_ENV, **p.build_env}, "the documented route: the [pytorch] extension and the core for "
                          "torch's CUDA major, built against the installed torch"))
    return steps
