"""Environment probe: what this machine has (GPU, driver, CUDA, nvcc, cuDNN, TE packages) and what TE can do.

`probe()` returns a JSON-able dict of facts (a few of them nested: TE's packages, its consistency checks, `probe_s`
the seconds each group of facts took); every run stores it as env.json and stamps result rows with it,
and `workbench.env.install_plan.plan()` decides the Transformer Engine install from it alone (so a plan for any
machine can be simulated with a plain dict). Unknown values are None, never a guess.

    python -m workbench probe            # grouped human table
    python -m workbench probe --json     # the dict, as JSON

Why these fields: most TE install failures are a mismatch between two of them —
the TE core package's CUDA major vs torch's, nvcc's major vs torch's, the extension's build vs the
installed torch / C++ ABI, the meta/core/extension versions, or a cuDNN the build or loader cannot see.
"""
from __future__ import annotations

import glob
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from typing import Any

import torch
from packaging.utils import canonicalize_name

from workbench.env import te as _te
from workbench.env.facts import EXTENSION, META, is_core, printable

# TE capability checks: probe key -> function name in transformer_engine.pytorch (its is_*_available())
CAPABILITY_CHECKS = {"fp8": "is_fp8_available", "fp8_block_scaling": "is_fp8_block_scaling_available",
                     "mxfp8": "is_mxfp8_available", "nvfp4": "is_nvfp4_available", "bf16": "is_bf16_available"}

def _run(argv: list[str], timeout: float = 10) -> str | None:
    """stdout of a short tool call (nvcc, nvidia-smi, git), or None when it is missing or fails."""
    out = _call(argv, timeout)
    return out.stdout if out is not None and out.returncode == 0 else None


def _call(argv: list[str], timeout: float = 10) -> subprocess.CompletedProcess | None:
    """The finished call, or None when the tool cannot be started or hangs. Output is decoded with
    replacement: a tool printing non-UTF-8 bytes must not stop the probe (and with it every run)."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None


def _git_sha() -> str | None:
    """The code version that made a result. WORKBENCH_GIT_SHA, set by whoever sends a copy of the tree
    elsewhere, wins over git: a copied tree can carry a stale .git, which would stamp its results with the
    wrong commit."""
    if os.environ.get("WORKBENCH_GIT_SHA"):
        return os.environ["WORKBENCH_GIT_SHA"]
    here = os.path.dirname(os.path.abspath(__file__))
    out = _run(["git", "-C", here, "rev-parse", "--short", "HEAD"], timeout=5)
    return out.strip() if out else None


def _major(version: str | None) -> int | None:
    m = re.match(r"(\d+)", version or "")
    return int(m.group(1)) if m else None


def _cuda_home() -> str | None:
    """The CUDA toolkit a TE build would use: torch's own discovery (CUDA_HOME/CUDA_PATH, nvcc on PATH,
    /usr/local/cuda); on a CPU torch build, which has none, the same rules by hand."""
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME:
        return cpp_extension.CUDA_HOME
    env = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if env:
        return env
    nvcc = shutil.which("nvcc")
    if nvcc:
        return os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    return "/usr/local/cuda" if os.path.isdir("/usr/local/cuda") else None


def _nvcc(cuda_home: str | None) -> tuple[str | None, str | None, str | None]:
    """(path, 'MAJOR.MINOR', problem) of the nvcc a build would run: CUDA_HOME's, the PATH's, or the pip
    `nvidia-cuda-nvcc` one (site-packages/nvidia/{cu13,cuda_nvcc}/bin), which TE's build also finds.
    `problem` says why an nvcc that exists gave no version (it fails, hangs or prints something else):
    such an nvcc cannot build the extension, and the install preflight says so."""
    candidates = [os.path.join(cuda_home, "bin", "nvcc")] if cuda_home else []
    candidates.append(shutil.which("nvcc") or "")
    candidates += sorted(p for entry in sys.path for p in glob.glob(os.path.join(entry, "nvidia", "*", "bin", "nvcc")))
    path = next((c for c in candidates if c and os.path.exists(c)), None)
    if path is None:
        return None, None, None
    out = _call([path, "--version"])
    if out is None:
        return path, None, "`nvcc --version` could not be run or did not finish"
    m = re.search(r"release (\d+\.\d+)", out.stdout)
    if out.returncode == 0 and m:
        return path, m.group(1), None
    said = next((line.strip() for line in (out.stdout + out.stderr).splitlines() if line.strip()), "no output")
    how = f"exited {out.returncode}" if out.returncode else "printed no 'release X.Y'"
    return path, None, f"`nvcc --version` {how}: {printable(said)[:200]}"


def _driver() -> str | None:
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if out and out.strip():
        return out.strip().splitlines()[0].strip()
    try:  # no nvidia-smi in some containers; the kernel module still reports itself
        with open("/proc/driver/nvidia/version", errors="replace") as f:
            m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", f.read())
        return m.group(1) if m else None
    except OSError:
        return None


def _cudnn_headers(cuda_home: str | None) -> dict[str, Any]:
    """Where cudnn.h is: the system (CUDA_HOME, /usr) and the pip `nvidia-cudnn-cu*` package, whose
    root is what CUDNN_PATH must name for a build that cannot find cuDNN (TE #918, #930)."""
    system = [os.path.join(cuda_home, "include", "cudnn.h")] if cuda_home else []
    system += ["/usr/include/cudnn.h", "/usr/local/include/cudnn.h", "/usr/include/x86_64-linux-gnu/cudnn.h"]
    system_header = next((p for p in system if os.path.exists(p)), None)
    # The nvidia-cudnn-cu* wheel (the one torch depends on, `nvidia.cudnn`) puts cuDNN under
    # site-packages/nvidia/cudnn. Only that folder: a CUDA 13 `nvidia/cu13` tree may hold an older
    # cuDNN, the copy env/te.py keeps TE away from (9.14 next to torch's 9.19 on the H200).
    pip_header = next((h for entry in sys.path
                       if os.path.exists(h := os.path.join(entry, "nvidia", "cudnn", "include", "cudnn.h"))), None)
    pip_pkg = _installed(lambda n: n.startswith("nvidia-cudnn-cu"))
    return {
        "cudnn_system_header": system_header,
        "cudnn_pip_header": pip_header,
        "cudnn_pip_root": os.path.dirname(os.path.dirname(pip_header)) if pip_header else None,
        "cudnn_pip_packages": pip_pkg,
        "cudnn_header_exists": bool(system_header or pip_header),
    }


def _installed(match) -> dict[str, str]:
    """{canonical name: version} of installed distributions whose name matches; the first one on
    sys.path wins, as for imports."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"] or "")  # PEP 503, as pip compares names
        if name and match(name) and name not in found:
            found[name] = dist.version
    return found


def te_packages() -> dict[str, str]:
    """Every installed transformer-engine* distribution (meta, core cu12/cu13, torch/jax extensions)."""
    return _installed(lambda n: n.startswith("transformer-engine"))


def consistency(env: dict[str, Any]) -> list[dict[str, Any]]:
    """TE's own import-time rules, checked from package metadata so they also explain a TE that does
    not import: one version everywhere, one core whose CUDA major is torch's, the torch extension
    present, and the extension importing. Each check: {check, ok, detail}; ok None = not applicable."""
    pkgs: dict[str, str] = env.get("te_packages") or {}
    if not pkgs:
        return []
    cores = {n: v for n, v in pkgs.items() if is_core(n)}
    torch_major = _major(env.get("torch_cuda"))
    out = []

    def add(check: str, ok: bool | None, detail: str) -> None:
        out.append({"check": check, "ok": ok, "detail": detail})

    versions = sorted(set(pkgs.values()))
    add(
        "same_version",
        len(versions) == 1,
        "all " + versions[0]
        if len(versions) == 1
        else "different versions: " + ", ".join(f"{n} {v}" for n, v in pkgs.items()),
    )
    add("meta_package", META in pkgs, "transformer-engine installed" if META in pkgs else
        "no transformer-engine meta package (TE checks for it at import)")
    add("one_core", len(cores) == 1, ", ".join(cores) or "no transformer-engine-cu* core package")
    if cores and torch_major is not None:
        core_majors = {int(n.rsplit("cu", 1)[1]) for n in cores}
        add("core_matches_torch_cuda", core_majors == {torch_major},
            f"core {sorted(core_majors)} vs torch CUDA {env.get('torch_cuda')}")
    else:
        add("core_matches_torch_cuda", None, "no core package or CPU-only torch")
    add("torch_extension", EXTENSION in pkgs, "transformer-engine-torch " + pkgs.get(EXTENSION, "missing"))
    add(
        "extension_imports",
        bool(env.get("te_available")),
        env.get("te_import_error") or "transformer_engine.pytorch imports",
    )
    return out


def native_bf16(device: torch.device) -> bool:
    """Whether the hardware does bf16 (a CPU's autocast does; a GPU needs compute capability 8.0).
    Not torch.cuda.is_bf16_supported(): it counts emulation and says True on a Colab T4 (CC 7.5), where
    bf16 runs emulated and slow instead of the fp16 + grad scaler path."""
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device) >= (8, 0)


def _memory_gb() -> tuple[float | None, float | None]:
    """(total, available) GiB from /proc/meminfo: sizes the parallel build (MAX_JOBS)."""
    try:
        with open("/proc/meminfo") as f:
            info = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f)}
        return round(info["MemTotal"] / 2**20, 1), round(info.get("MemAvailable", info["MemTotal"]) / 2**20, 1)
    except (OSError, KeyError, ValueError):
        return None, None


def _cudnn_version() -> tuple[int | None, str | None]:
    """(torch's cuDNN version, None) or (None, why): with two cuDNN copies mapped, torch's own check raises
    "cuDNN version incompatibility" here, and the probe must report that, not die of it."""
    try:
        return (torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None), None
    except Exception as e:  # noqa: BLE001 - any failure is the finding
        return None, f"{type(e).__name__}: {e}"


def probe(attention: bool = False) -> dict[str, Any]:
    """The environment. `attention`: also ask TE which attention backend it selects here (a child process
    running one small attention forward/backward; seconds, so only `workbench probe` asks)."""
    # Each group's wall seconds go into env.json (probe_s): a study's point pays the probe at every start, and on
    # an H100 a run's start, mostly the probe, took 15-17 s (task.json phase_s.start_s in
    # results/reference/h100/quality/real/3e25bd0/), against 0.2-0.25 s for the whole probe on a CPU
    # (results/reference/cpu/carry_1f6f578.txt).
    seconds: dict[str, float] = {}

    def timed(name: str, f, *args):
        t = time.perf_counter()
        out = f(*args)
        seconds[name] = round(time.perf_counter() - t, 3)
        return out

    # TE first: asking torch for its cuDNN version loads cuDNN's sub-libraries, after which a TE that
    # picks another cuDNN copy fails to import (seen on the H200; _te.load also pins CUDNN_PATH).
    te, _, why = timed("te_load", _te.load)
    cuda = timed("cuda_available", torch.cuda.is_available)
    cuda_home = _cuda_home()
    # The groups in this order are the keys' order in env.json; cuDNN's facts come after TE loaded.
    env: dict[str, Any] = {}
    for name, facts, args in (("python", _python_facts, ()), ("torch", _torch_facts, ()), ("gpu", _gpu_facts, (cuda,)),
                              ("toolkit", _toolkit_facts, (cuda_home,)), ("cudnn", _cudnn_facts, (cuda_home,)),
                              ("host", _host_facts, ()), ("te", _te_facts, (te, why, cuda, attention)),
                              ("jax", _jax_facts, ())):
        env.update(timed(name, facts, *args))
    env["te_consistency"] = consistency(env)
    checks = [c["ok"] for c in env["te_consistency"] if c["ok"] is not None]
    env["te_consistent"] = all(checks) if checks else None
    env["probe_s"] = seconds
    return env


def _python_facts() -> dict[str, Any]:
    """The interpreter and platform: pip installs into this Python, and an offline wheelhouse must hold
    wheels for its tag and machine."""
    return {
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "python_tag": f"cp{sys.version_info.major}{sys.version_info.minor}",
        "platform": platform.platform(),
        "machine": platform.machine(),
    }


def _torch_facts() -> dict[str, Any]:
    """The installed torch, which TE must match: its CUDA major picks the TE core package (and nvcc's
    must agree), its C++ ABI the extension's build."""
    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_cuda_major": _major(torch.version.cuda),
        "torch_cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
    }


def _gpu_facts(cuda: bool) -> dict[str, Any]:
    """The GPU and driver: the compute capability decides bf16 / FP8 and the architectures a build compiles."""
    cc = torch.cuda.get_device_capability(0) if cuda else None
    return {
        "gpu_name": torch.cuda.get_device_name(0) if cuda else None,
        "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "driver": _driver(),
    }


def _toolkit_facts(cuda_home: str | None) -> dict[str, Any]:
    """The CUDA toolkit a build of the extension would use (and why its nvcc cannot, if it cannot)."""
    nvcc_path, nvcc_version, nvcc_problem = _nvcc(cuda_home)
    return {
        "cuda_home": cuda_home,
        "nvcc_exists": nvcc_path is not None,
        "nvcc_path": nvcc_path,
        "nvcc_version": nvcc_version,
        "nvcc_problem": nvcc_problem,
    }


def _cudnn_facts(cuda_home: str | None) -> dict[str, Any]:
    """cuDNN as torch loaded it and as a build would find it: two copies in one process break TE's import or
    its fused attention, and a build without cudnn.h fails."""
    cudnn_version, cudnn_error = _cudnn_version()
    return {
        "cudnn_torch": cudnn_version,
        "cudnn_torch_error": cudnn_error,
        "cudnn_mapped_dirs": _te.mapped_cudnn_dirs(),  # more than one: two cuDNN copies in this process
        **_cudnn_headers(cuda_home),
    }


def _host_facts() -> dict[str, Any]:
    """The host: cores and memory size a parallel build; the container, Colab and the code version stamp results."""
    mem_total, mem_avail = _memory_gb()
    return {
        "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "mem_total_gb": mem_total,
        "mem_available_gb": mem_avail,
        "ngc_pytorch_container": os.environ.get("NVIDIA_PYTORCH_VERSION"),
        "colab": "google.colab" in sys.modules,
        "git_sha": _git_sha(),
    }


# the CUDA plugins say whether jax has a GPU backend without importing it (install-te --jax needs one to build)
JAX_DISTRIBUTIONS = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "flax", "optax",
                     "transformer_engine_jax")


def _jax_facts() -> dict[str, Any]:
    """The optional JAX side (the `jax:*` students; TE's JAX extension for their FP8), by installed distribution:
    importing jax here would start its GPU backend, which takes most of the GPU's memory before any student ran.
    Whether they run is each JAX row's own status and reason."""
    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {f"{canonicalize_name(n).replace('-', '_')}_version": version(n) for n in JAX_DISTRIBUTIONS}


def _te_facts(te, why: str, cuda: bool, attention: bool) -> dict[str, Any]:
    """Transformer Engine as imported here (`te`, or `why` not): its packages, which explain a TE that does
    not import, and what it can do on this GPU."""
    facts: dict[str, Any] = {
        "cudnn_path_for_te": os.environ.get("CUDNN_PATH"),  # as _te.load left it
        "te_available": te is not None,
        "te_import_error": why or None,
        "te_version": getattr(sys.modules.get("transformer_engine"), "__version__", None) if te is not None else None,
        "te_packages": te_packages(),
        **_capabilities(te, why, cuda),
    }
    if attention and te is not None and cuda:
        facts["te_attention"] = _te.attention_backend()
    return facts


def _capabilities(te, why: str, cuda: bool) -> dict[str, Any]:
    """{key}_available and {key}_reason for each TE capability check (what the backends may use here)."""
    out: dict[str, Any] = {}
    for key, fn in CAPABILITY_CHECKS.items():
        if te is None:
            ok, reason = False, f"Transformer Engine not available: {why}"
            if key == "bf16":  # bf16 without TE is still a torch question
                ok, reason = (native_bf16(torch.device("cuda")), "") if cuda else (True, "CPU autocast bf16")
        elif not cuda:
            ok, reason = False, "no CUDA GPU visible"
        else:
            ok, reason = _te.check(getattr(te, fn, None), key)
        out[f"{key}_available"] = ok
        out[f"{key}_reason"] = reason
    return out
