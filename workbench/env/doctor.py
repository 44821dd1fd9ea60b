"""Install doctor: why Transformer Engine does not install or import here, and the commands that fix it.

    python -m workbench doctor                    # check the installed state (probe + TE's own rules)
    python -m workbench doctor --log install.log  # match a pip/build/import log against known failures
    python -m workbench doctor --json             # the same findings as data

`KNOWN_FAILURES` is a table of known install failures (TE's issue tracker: error text -> cause -> fix), plus
what the installer met. `diagnose(text, env)` returns the matching rows, most specific first, with the
fix commands filled in from the probe (this GPU's arch, torch's CUDA major, the pip cuDNN path, the TE
version). A log nothing matches is reported as unknown, with a pointer to the full log — never guessed.
`workbench.env.install` calls `diagnose` on every failed step and records the result in outcome.json.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench.env.facts import build_jobs, is_core, printable


@dataclass(frozen=True)
class Failure:
    id: str
    patterns: tuple[str, ...]
    """Regular expressions (case-insensitive, multi-line); the first group, if any, is `{match}` in fixes.
    Every repeat is bounded (`\\w{1,40}`, never `\\w+` or `\\S*`): logs hold megabyte-long lines and
    tokens, on which an unbounded repeat before a literal backtracks for minutes."""
    cause: str
    fix: tuple[str, ...]
    """Commands (or one-line instructions) with {placeholders} from `fix_context`."""
    refs: tuple[str, ...] = ()
    priority: int = 50
    """Lower = more specific: shown first when several rows match one log (e.g. cudnn.h before ninja)."""


INSTALL = '{python} -m pip install --no-build-isolation "transformer_engine[pytorch,core_cu{cuda_major}]=={te_version}"'
UNINSTALL_ALL = ("{python} -m pip uninstall -y transformer_engine transformer_engine_torch transformer_engine_jax "
                 "transformer_engine_cu12 transformer_engine_cu13")
REBUILD = ("NVTE_FRAMEWORK=pytorch NVTE_CUDA_ARCHS={archs} MAX_JOBS={jobs} NVTE_BUILD_THREADS_PER_JOB=1 "
           "NVTE_PYTORCH_FORCE_BUILD=TRUE {python} -m pip install --no-build-isolation --no-cache-dir --no-deps "
           '--no-binary transformer_engine_torch "transformer_engine_torch=={te_version}"')
# TE's JAX extension, built from its sdist against the jax installed here (the build imports jax and its CUDA
# plugin, and takes the cuDNN frontend headers from their pip package)
REBUILD_JAX = ("{python} -m pip install nvidia-cudnn-frontend && NVTE_FRAMEWORK=jax NVTE_CUDA_ARCHS={archs} "
               "MAX_JOBS={jobs} {python} -m pip install --no-build-isolation --no-cache-dir --no-deps "
               '"transformer_engine_jax=={te_version}"')

KNOWN_FAILURES: tuple[Failure, ...] = (
    Failure("extension_abi_mismatch",
            (r"undefined symbol: (_ZN\w{0,400}?(?:3c10|5torch|2at)\w{0,400})",
             r"transformer_engine_torch\S{0,200}\.so: undefined symbol"),
            "the TE PyTorch extension was built against another torch (or C++ ABI) than the one installed: an "
            "isolated build, a prebuilt wheel for another torch, or torch upgraded after TE",
            ("{python} -m workbench install-te --build-from-source", "# or by hand:",
             "{python} -m pip uninstall -y transformer_engine_torch", REBUILD),
            ("NVIDIA/TransformerEngine#1192", "#1684", "#1283"), 10),
    Failure("cudnn_headers_missing",
            (r"(cudnn(?:_version)?\.h): No such file", r"Could not find (cudnn_LIBRARY)", r"Could not find (cuDNN)"),
            "the build cannot see cuDNN headers/libraries: CUDNN_PATH / CUDNN_HOME unset or wrong, and cuDNN not "
            "under CUDA_HOME",
            ("{python} -m pip install nvidia-cudnn-cu{cuda_major}",
             "export CUDNN_PATH={cudnn_root} CUDNN_HOME={cudnn_root}",
             "{python} -m workbench install-te --build-from-source"),
            ("NVIDIA/TransformerEngine#918", "#930", "#1309", "#954"), 10),
    Failure("mixed_te_packages",
            (r"Could not find `transformer-engine` PyPI package", r"Transformer Engine package version mismatch",
             r"Could not find TE core package", r"Found empty `transformer-engine` meta package"),
            "leftover or mixed transformer-engine packages (meta, core cuXX and torch extension must be one version, "
            "one core)",
            (UNINSTALL_ALL, INSTALL), ("NVIDIA/TransformerEngine#2410",), 10),
    Failure("torch_extension_missing",
            (r"Could not find shared object file for Transformer Engine torch lib",
             r"could not find the shared object file for the Transformer Engine PyTorch extension",
             r"Could not find package transformer_engine_torch"),
            "TE was installed without its PyTorch extension (no [pytorch] extra, or built with NVTE_RELEASE_BUILD, "
            "which drops it)",
            ("unset NVTE_RELEASE_BUILD", INSTALL), ("NVIDIA/TransformerEngine#1541", "#2505", "#1981"), 10),
    Failure("build_out_of_memory",
            (r"(Killed signal terminated program \w{1,40})", r"fatal error: (Killed)",
             r"^[ \t]{0,80}(Killed)[ \t]{0,80}$", r"exit status (137)\b"),
            "the compiler was killed: the parallel build ran out of memory",
            ("MAX_JOBS=1 NVTE_BUILD_THREADS_PER_JOB=1 NVTE_CUDA_ARCHS={archs} {python} -m workbench install-te "
             "--build-from-source --max-jobs 1", "# or by hand:",
             REBUILD.replace("MAX_JOBS={jobs}", "MAX_JOBS=1")),
            ("NVIDIA/TransformerEngine#1249", "#976"), 20),
    Failure("cuda_toolkit_mismatch",
            (r"detected CUDA version \(?([\d.]{1,20})\)? mismatches the version that was used to compile"
             r"\s{1,40}PyTorch",),
            "nvcc's CUDA major differs from the one torch was built with ({torch_cuda}); the extension must be "
            "compiled with a matching toolkit",
            ("# install the CUDA {cuda_major} toolkit (same major as torch {torch_cuda}), then:",
             "export CUDA_HOME=/usr/local/cuda-{torch_cuda} PATH=/usr/local/cuda-{torch_cuda}/bin:$PATH",
             "{python} -m workbench install-te --build-from-source",
             "# or use an NGC PyTorch container, TE preinstalled: environments/Dockerfile"),
            ("NVIDIA/TransformerEngine#553",), 10),
    Failure("core_cuda_major_mismatch",
            (r"lib(?:cublas|cublasLt|cudart|nvrtc|cufft|curand)\.so\.(\d{1,3}): cannot open shared object file",),
            "the TE core library was built for CUDA {match} but this environment (torch CUDA {torch_cuda}) has "
            "another major: the core_cu12 / core_cu13 extra must match torch",
            ("{python} -m pip uninstall -y transformer_engine_cu12 transformer_engine_cu13", INSTALL),
            ("NVIDIA/TransformerEngine#2040",), 10),
    Failure("cudnn_sublibrary_loading",
            (r"CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED",
             r"(libcudnn_\w{1,40}\.so\.\d{1,3}): cannot open shared object file",
             r"(libcudnn\w{0,40}\.so\.\d{1,3}): undefined symbol",
             r"undefined symbol: \w{1,400}, version (libcudnn\w{0,40})",
             r"Unable to load any of \{(libcudnn\w{0,40})",
             r"(cuDNN version incompatibility): PyTorch was compiled\s{1,40}against"),
            "TE loads a different cuDNN (e.g. the system's) than torch (the venv's pip cuDNN): its sub-libraries "
            "do not load, or torch then finds the other copy",
            ("export CUDNN_PATH={cudnn_root} CUDNN_HOME={cudnn_root}",
             "export LD_LIBRARY_PATH={cudnn_root}/lib:$LD_LIBRARY_PATH"),
            ("NVIDIA/TransformerEngine#1853", "#2373"), 10),
    Failure("cudnn_too_old",
            (r"Transformer Engine requires cuDNN ([\d.]{1,20}) or later",),
            "the cuDNN runtime is older than this TE needs",
            ("{python} -m pip install -U nvidia-cudnn-cu{cuda_major}", "export CUDNN_PATH={cudnn_root}"), (), 10),
    Failure("cudnn_frontend_missing",
            (r"nvidia-cudnn-frontend is required to build Transformer Engine",
             r"does not contain the expected header \S{0,300}(cudnn_frontend\.h)"),
            "TE's build (2.x) takes the cuDNN frontend headers from the pip package nvidia-cudnn-frontend, which is "
            "missing (offline installs use --no-deps)",
            ("{python} -m pip install nvidia-cudnn-frontend", "{python} -m workbench install-te --build-from-source"),
            ("transformer_engine_torch build_tools/utils.py",), 10),
    Failure("jax_extension_missing",
            (r"could not find the shared object file for the Transformer Engine Jax extension",),
            "Transformer Engine is installed without its JAX extension (transformer_engine_jax), or with one built "
            "for another jax: the JAX students cannot use TE (the PyTorch side is unaffected; without JAX students "
            "the warning can be ignored)",
            (REBUILD_JAX,), ("transformer_engine/__init__.py (TE 2.20.2)",), 20),
    Failure("jax_missing_at_build",
            (r"This package needs Jax to build", r"GPU backend is required to build TE jax extensions"),
            "jax with its CUDA plugin was not importable by the build of TE's JAX extension: pip built it in an "
            "isolated environment, or this jax is CPU-only",
            ("# install jax with its CUDA plugin first (pip install 'jax[cuda{cuda_major}]'), then:", REBUILD_JAX),
            ("transformer_engine_jax 2.20.2 sdist, setup.py",), 15),
    Failure("jax_ffi_registration_order",
            (r"Types used by FFI handlers must be registered before the handler registration",),
            "this TE JAX extension registers its XLA FFI handlers before their types, which newer jax / XLA refuse",
            ("# a TE release with the fix (NVIDIA/TransformerEngine#3382), or the jax this TE release was tested "
             "with; then rebuild:", REBUILD_JAX),
            ("NVIDIA/TransformerEngine#3382",), 10),
    Failure("torch_missing_at_build",
            (r"This package needs Torch to build", r"ModuleNotFoundError: No module named 'torch'"),
            "torch was not importable by the build: pip built the extension in an isolated environment, or torch "
            "is not installed",
            ("# install your CUDA torch first (https://pytorch.org/get-started/locally/), then:",
             "{python} -m workbench install-te   # always builds with --no-build-isolation"), (), 15),
    Failure("no_kernel_image",
            (r"no kernel image is available for execution on the device",),
            "the TE core library has no code for this GPU (compute capability {cc}): a core wheel built for other "
            "architectures (e.g. the Hopper-only wheel of the H200 wheelhouse)",
            ("{python} -m pip uninstall -y transformer_engine_cu{cuda_major}", INSTALL,
             "# or build it for this GPU: NVTE_CUDA_ARCHS={archs}"), (), 15),
    Failure("gcc_unsupported",
            (r"unsupported GNU version! gcc versions later than (\d{1,3}) are not supported",),
            "nvcc does not accept this host compiler (newer than gcc {match})",
            ("export CC=gcc-{match} CXX=g++-{match} CUDAHOSTCXX=g++-{match}",
             "{python} -m workbench install-te --build-from-source"), (), 15),
    Failure("package_not_in_index",
            (r"No matching distribution found for (transformer[-_]engine[\w-]{0,40})",
             r"Could not find a version that satisfies the requirement (transformer[-_]engine[\w-]{0,40})"),
            "pip found no {match} for this Python/platform: the offline wheelhouse lacks it (wheel or sdist), or "
            "there is no network",
            ("# on a machine with internet, add it to the wheelhouse:",
             '{python} -m pip download --no-deps -d <WHEELHOUSE> "{match}=={te_version}"',
             "# (transformer_engine_torch is an sdist on PyPI; offline it needs nvcc + cuDNN headers to build)",
             "# or drop --no-index to let pip use PyPI"), (), 20),
    Failure("unsupported_wheel",
            (r"(?<!\S)(\S{1,300}\.whl) is not a supported wheel on this platform",),
            "the wheel {match} was built for another Python / platform / glibc than this one ({python_tag})",
            ("{python} -m workbench install-te --build-from-source   # compile the extension from its sdist",),
            (), 20),
    Failure("te_not_installed",
            (r"No module named '(transformer_engine)'",),
            "Transformer Engine is not installed in this Python",
            ("{python} -m workbench install-te --dry-run   # see the plan", "{python} -m workbench install-te"),
            (), 30),
    Failure("missing_python_module",
            (r"No module named '(\w{1,100})",),
            "a Python dependency ({match}) is not installed (offline installs use --no-deps)",
            ("{python} -m pip install {match}",), (), 40),
    Failure("extension_build_failed",
            (r"ninja: build stopped: subcommand failed", r"Error compiling objects for extension",
             r"Failed (?:building wheel|to build) (transformer[-_]engine[\w-]{0,40})",
             r"error: subprocess-exited-with-error"),
            "a build step failed; the first compiler 'error:' line above it is the real cause (if processes were "
            "Killed, memory ran out)",
            ("grep -n -m5 'error:' <LOG>",
             "MAX_JOBS=1 NVTE_BUILD_THREADS_PER_JOB=1 {python} -m workbench install-te --build-from-source "
             "--max-jobs 1"),
            ("NVIDIA/TransformerEngine#1249", "#2383"), 90),
)


MAX_LINE_CHARS = 4096
"""Only this much of each log line is matched: error messages are short, while compiler command lines,
progress bars and binary junk can be megabytes long."""
@dataclass
class Diagnosis:
    id: str
    cause: str
    fix: list[str]
    refs: list[str] = field(default_factory=list)
    evidence: str = ""
    """The log line that matched (or the failed check), so the reader can verify the diagnosis."""
    known: bool = True

    def __post_init__(self) -> None:  # the texts quote logs and probe values: keep them printable
        self.cause, self.evidence = printable(self.cause), printable(self.evidence)
        self.fix = [printable(f) for f in self.fix]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Blank(dict):
    def __missing__(self, key: str) -> str:  # an unknown value stays a visible placeholder
        return f"<{key.upper()}>"


def fix_context(env: dict[str, Any] | None) -> dict[str, Any]:
    """Values the fix commands are filled with; what the probe does not know stays <PLACEHOLDER>."""

    env = env or {}
    ctx: dict[str, Any] = {"python": env.get("python_executable") or sys.executable}
    pkgs = env.get("te_packages") or {}
    version = env.get("te_version") or next(iter(pkgs.values()), None)
    for key, value in {
        "te_version": version, "cuda_major": env.get("torch_cuda_major"), "torch_cuda": env.get("torch_cuda"),
        "cudnn_root": env.get("cudnn_pip_root"), "python_tag": env.get("python_tag"),
        "cc": env.get("compute_capability"),
        "archs": (env.get("compute_capability") or "").replace(".", "") or None,
        "jobs": build_jobs(env),
    }.items():
        if value is not None:
            ctx[key] = value
    return ctx


def _fill(template: str, ctx: dict[str, Any]) -> str:
    return template.format_map(_Blank(ctx))


def diagnose(text: str, env: dict[str, Any] | None = None) -> list[Diagnosis]:
    """Every known failure whose pattern occurs in `text`, most specific first (each line is read up
    to MAX_LINE_CHARS)."""
    text = "\n".join(line[:MAX_LINE_CHARS] for line in text.splitlines())
    hits: list[tuple[int, Diagnosis]] = []
    base = fix_context(env)
    for failure in KNOWN_FAILURES:
        for pattern in failure.patterns:
            m = re.search(pattern, text, re.IGNORECASE | re.MULTILINE)
            if not m:
                continue
            ctx = dict(base)
            if m.groups():
                ctx["match"] = m.group(1)
            start = text.rfind("\n", 0, m.start()) + 1
            end = text.find("\n", m.end())
            line = text[start:end if end >= 0 else len(text)].strip()
            fix = [_fill(f, ctx) for f in failure.fix]
            hits.append((failure.priority, Diagnosis(failure.id, _fill(failure.cause, ctx), fix, list(failure.refs),
                                                     line[:400])))
            break
    return [d for _, d in sorted(hits, key=lambda h: h[0])]


def unknown(log_path: str | Path | None, excerpt: str = "") -> Diagnosis:
    where = f"read the full log: {log_path}" if log_path else "rerun with the log saved (workbench install-te keeps it)"
    return Diagnosis("unknown", "no known failure matches this error", [where], [], excerpt[-400:], known=False)


def check_installed(env: dict[str, Any], log_path: str | Path | None = None) -> list[Diagnosis]:
    """Findings about the installed state, from the probe's consistency checks and import error. An
    error no known failure matches becomes an `unknown` finding that points to `log_path`."""
    pkgs = env.get("te_packages") or {}
    if not pkgs and not env.get("te_available"):
        error = env.get("te_import_error") or "No module named 'transformer_engine'"
        return diagnose(error, env)[:1] or [unknown(log_path, error)]

    failed = {c["check"]: c["detail"] for c in env.get("te_consistency") or [] if c["ok"] is False}
    by_id = {f.id: f for f in KNOWN_FAILURES}
    ctx = fix_context(env)
    out: list[Diagnosis] = []

    def add(fid: str, evidence: str) -> None:
        f = by_id[fid]
        if all(d.id != fid for d in out):
            out.append(Diagnosis(fid, _fill(f.cause, ctx), [_fill(x, ctx) for x in f.fix], list(f.refs), evidence))

    for check in ("same_version", "meta_package", "one_core"):
        if check in failed:
            add("mixed_te_packages", f"{check}: {failed[check]}")
    if "core_matches_torch_cuda" in failed:
        ctx["match"] = ",".join(n.rsplit("cu", 1)[1] for n in pkgs if is_core(n))
        add("core_cuda_major_mismatch", f"core_matches_torch_cuda: {failed['core_matches_torch_cuda']}")
    if "torch_extension" in failed:
        add("torch_extension_missing", f"torch_extension: {failed['torch_extension']}")
    if not env.get("te_available") and env.get("te_import_error"):
        seen = {d.id for d in out}
        found = [d for d in diagnose(env["te_import_error"], env) if d.id not in seen]
        out += found or ([] if out else [unknown(log_path, env["te_import_error"])])
    return out


def latest_install_log(root: str | Path = "results/install") -> Path | None:
    logs = sorted(Path(root).glob("*/install.log"))
    return logs[-1] if logs else None


def render(diagnoses: list[Diagnosis]) -> str:
    lines = []
    for i, d in enumerate(diagnoses, 1):
        lines.append(f"{i}. [{d.id}] {d.cause}")
        if d.evidence:
            lines.append(f"   seen: {d.evidence}")
        lines.append("   fix:")
        lines += [f"     {c}" for c in d.fix]
        if d.refs:
            lines.append(f"   refs: {', '.join(d.refs)}")
    return "\n".join(lines)


def add_arguments(p) -> None:
    p.add_argument("--log", default=None, metavar="FILE", help="a pip / build / import log to diagnose")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")


def main(args) -> int:
    """Exit status 0: nothing wrong found; 1: findings (or an unknown error) printed; 2: unreadable --log."""
    from workbench.env import probe

    if args.log:
        try:  # undecodable bytes become U+FFFD: a log may hold binary junk
            text = Path(args.log).read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            print(f"workbench doctor: --log {args.log}: cannot read it ({e.strerror or e}); give a readable "
                  "pip / build / import log file", file=sys.stderr)
            return 2
    env = probe.probe()
    if args.log:
        found = diagnose(text, env) or [unknown(args.log, text)]
        header = f"doctor: {args.log}"
    else:
        found = check_installed(env, latest_install_log())
        header = f"doctor: installed state (TE packages: {env.get('te_packages') or 'none'})"
    if args.json:
        print(json.dumps([d.to_dict() for d in found], indent=2))
    elif not found:
        print(f"{header}\nTransformer Engine {env.get('te_version')} is consistent and imports; "
              f"FP8: {env.get('fp8_available')} {env.get('fp8_reason') or ''}".rstrip())
    else:
        print(f"{header}\n{render(found)}")
    return 1 if found else 0
