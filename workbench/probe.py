"""Environment probe: what this machine has (GPU, CUDA, nvcc, cuDNN, TE) and what TE can do on it.

`probe()` returns a JSON-able dict; every run stores it as env.json and stamps result rows with it.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from typing import Any

import torch


def _git_sha() -> str | None:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def probe() -> dict[str, Any]:
    from workbench.backends import _te

    cuda = torch.cuda.is_available()
    cc = torch.cuda.get_device_capability(0) if cuda else None
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    nvcc = shutil.which("nvcc") or os.path.join(cuda_home, "bin", "nvcc")
    nvcc_exists = os.path.exists(nvcc)
    cudnn_headers = [os.path.join(cuda_home, "include", "cudnn.h"), "/usr/include/cudnn.h", "/usr/local/include/cudnn.h"]
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "gpu_name": torch.cuda.get_device_name(0) if cuda else None,
        "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
        "cuda_home": cuda_home,
        "nvcc_exists": nvcc_exists,
        "nvcc_path": nvcc if nvcc_exists else None,
        "cudnn_header_exists": any(os.path.exists(p) for p in cudnn_headers),
        "git_sha": _git_sha(),
    }
    te, _, why = _te.load()
    env["te_available"] = te is not None
    env["te_import_error"] = why or None
    env["te_version"] = getattr(__import__("transformer_engine"), "__version__", None) if te is not None else None
    checks = {"fp8": "is_fp8_available", "fp8_block_scaling": "is_fp8_block_scaling_available",
              "mxfp8": "is_mxfp8_available", "nvfp4": "is_nvfp4_available", "bf16": "is_bf16_available"}
    for key, fn in checks.items():
        if te is None:
            ok, reason = False, f"Transformer Engine not available: {why}"
            if key == "bf16":  # bf16 without TE is still a torch question
                ok, reason = (torch.cuda.is_bf16_supported(), "") if cuda else (True, "CPU autocast bf16")
        elif not cuda:
            ok, reason = False, "no CUDA GPU visible"
        else:
            ok, reason = _te.check(getattr(te, fn, None), key)
        env[f"{key}_available"] = ok
        env[f"{key}_reason"] = reason
    return env


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print JSON only")


def main(args) -> int:
    import json

    env = probe()
    if args.json:
        print(json.dumps(env, indent=2))
    else:
        width = max(map(len, env))
        for k, v in env.items():
            print(f"{k:<{width}}  {v}")
    return 0
