"""Shared data for the probe / install / doctor tests: simulated machines as plain probe dicts, and a
local wheelhouse of tiny stand-in TE packages built once per session (no network, no real TE)."""
from __future__ import annotations

import io
import os
import platform
import stat
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

FAKE_VERSION = "9.9.0"

H100 = {  # a CUDA 12 machine with everything a build needs; variations below change one thing each
    "python": "3.12.3", "python_executable": sys.executable,
    "python_tag": f"cp{sys.version_info.major}{sys.version_info.minor}", "machine": platform.machine(),
    "torch": "2.5.1+cu124", "torch_cuda": "12.4", "torch_cuda_major": 12, "torch_cxx11_abi": False,
    "gpu_name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "gpu_count": 1, "driver": "550.54.15",
    "cuda_home": "/usr/local/cuda-12.4", "nvcc_exists": True, "nvcc_path": "/usr/local/cuda-12.4/bin/nvcc",
    "nvcc_version": "12.4", "cudnn_torch": 90100, "cudnn_system_header": None,
    "cudnn_pip_header": "/venv/lib/python3.12/site-packages/nvidia/cudnn/include/cudnn.h",
    "cudnn_pip_root": "/venv/lib/python3.12/site-packages/nvidia/cudnn", "cudnn_header_exists": True,
    "cpu_cores": 32, "mem_total_gb": 64.0, "mem_available_gb": 60.0,
    "te_available": False, "te_import_error": "transformer_engine.pytorch does not import: ModuleNotFoundError: "
                                              "No module named 'transformer_engine'",
    "te_version": None, "te_packages": {}, "te_consistency": [], "te_consistent": None,
}


def machine(**changes) -> dict:
    return {**H100, **changes}


def fake_nvcc(root, script: str):
    """A stand-in nvcc (a shell script) at root/bin/nvcc: no CUDA toolkit exists on the CI machine."""
    nvcc = root / "bin" / "nvcc"
    nvcc.parent.mkdir(exist_ok=True)
    nvcc.write_text("#!/bin/sh\n" + script + "\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    return nvcc


SETUP = """from setuptools import setup
setup(name={name!r}, version={version!r}, packages={packages!r}, py_modules={modules!r}, install_requires={requires!r})
"""

FAKE_TE_FILES = {  # just enough of transformer_engine for workbench.env.te.load() and the probe
    "transformer_engine/__init__.py": f'__version__ = "{FAKE_VERSION}"\n',
    "transformer_engine/common/__init__.py": "",
    "transformer_engine/common/recipe.py": "class DelayedScaling:\n    pass\n",
    "transformer_engine/pytorch/__init__.py": textwrap.dedent("""\
        def _no(return_reason=False):
            return (False, "stand-in TE built by the tests") if return_reason else False
        is_fp8_available = is_fp8_block_scaling_available = is_mxfp8_available = _no
        is_nvfp4_available = is_bf16_available = _no
        """),
}

BROKEN_SETUP = '''import sys
from setuptools import setup
if "bdist_wheel" in sys.argv:  # metadata works; the "compile" fails the way TE issue #1309 does
    print("csrc/common.h:14:10: fatal error: cudnn.h: No such file or directory")
    print("compilation terminated.")
    print("ninja: build stopped: subcommand failed.")
    sys.exit(1)
setup(name="transformer_engine_torch", version="{v}", install_requires=["tiny-dep"])
'''


def _package(root: Path, name: str, files: dict[str, str] | None = None, modules=(), requires=()) -> Path:
    src = root / name
    for rel, text in (files or {}).items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    for m in modules:
        (src / f"{m}.py").parent.mkdir(parents=True, exist_ok=True)
        (src / f"{m}.py").write_text("")
    packages = sorted({str(Path(r).parent).replace("/", ".") for r in (files or {})})
    version = "1.0" if name == "tiny_dep" else FAKE_VERSION
    (src / "setup.py").write_text(SETUP.format(name=name, version=version, packages=packages,
                                               modules=list(modules), requires=list(requires)))
    return src


def build_wheelhouses(root: Path) -> tuple[Path, Path]:
    """(good, broken): good has meta + core cu12 + extension wheels and tiny_dep; broken has the same
    but the extension only as an sdist whose build fails with a cudnn.h error."""
    src = root / "src"
    good, broken = root / "wheelhouse-good", root / "wheelhouse-broken"
    dirs = [
        _package(src, "transformer_engine", FAKE_TE_FILES),
        _package(src, "transformer_engine_cu12", {"transformer_engine_cu12_stub/__init__.py": ""}),
        _package(src, "transformer_engine_torch", {"transformer_engine_torch_stub/__init__.py": ""},
                 requires=["tiny-dep", "einops"]),
        _package(src, "tiny_dep", modules=["tiny_dep"]),
    ]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-index", "--no-deps", "--no-build-isolation",
                    "-w", str(good), *map(str, dirs)], check=True, capture_output=True,
                   env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    broken.mkdir()
    for whl in good.glob("*.whl"):
        if not whl.name.startswith("transformer_engine_torch"):
            (broken / whl.name).write_bytes(whl.read_bytes())
    top = f"transformer_engine_torch-{FAKE_VERSION}"
    with tarfile.open(broken / f"{top}.tar.gz", "w:gz") as tar:
        for name, text in {
            "setup.py": BROKEN_SETUP.format(v=FAKE_VERSION),
            "PKG-INFO": f"Metadata-Version: 2.1\nName: transformer_engine_torch\nVersion: {FAKE_VERSION}\n"
            "Requires-Dist: tiny-dep\n",
        }.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return good, broken
