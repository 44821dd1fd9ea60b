"""Every install route takes the same extras (pyproject.toml's `all`; GPU routes add torchao), the notebooks
name the kernel `make` registers, and the image leaves the host's venv and results out."""
import re
import sys
from pathlib import Path

import pytest

from workbench import notebook

ROOT = Path(__file__).resolve().parent.parent
tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else pytest.importorskip("tomli")
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
# route -> (file, the extras it must install)
ROUTES = {
    "make": ("Makefile", {"all"}),
    "requirements-cpu": ("environments/requirements-cpu.txt", {"all"}),
    "requirements-gpu": ("environments/requirements-gpu.txt", {"all", "torchao"}),
    "docker": ("environments/Dockerfile", {"all", "torchao"}),
    "conda": ("environments/environment.yml", {"all"}),
}


def _expand(name: str) -> set[str]:
    """An extra and every extra it names through te-workbench[...]."""
    out = {name}
    for req in EXTRAS[name]:
        m = re.fullmatch(r"te-workbench\[([^\]]+)\]", req)
        for inner in (m.group(1).split(",") if m else []):
            out |= _expand(inner.strip())
    return out


def _installed_extras(route: str) -> set[str]:
    path, _ = ROUTES[route]
    text = (ROOT / path).read_text()
    if route == "make":
        (value,) = re.findall(r"^EXTRAS\s*\?=\s*(\S+)", text, re.M)
        assert '-e ".[$(EXTRAS)]"' in text
        return set(value.split(","))
    found = re.findall(r"-e\s+\"?\.{1,2}\[([^\]]+)\]", text)
    assert len(found) == 1, (path, found)
    return set(found[0].split(","))


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_installs_the_one_set_of_extras(route):
    assert _installed_extras(route) == ROUTES[route][1]


def test_all_carries_what_every_command_needs():
    assert {"notebook", "lm", "sweep", "dev", "lab"} <= _expand("all")
    for name in ("sweep", "dev"):  # the sweep report's HTML needs nbconvert wherever sweeps are installed
        assert any(r.startswith("nbconvert") for r in EXTRAS[name]), name
    assert any(r.startswith("jupyterlab") for r in EXTRAS["lab"])


def test_the_notebooks_name_the_kernel_make_registers():
    import json

    make = (ROOT / "Makefile").read_text()
    (kernel,) = re.findall(r"^KERNEL\s*\?=\s*(\S+)", make, re.M)
    assert kernel == notebook.KERNEL_NAME and "ipykernel install --user --name $(KERNEL)" in make
    for ipynb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        spec = json.loads(ipynb.read_text())["metadata"]["kernelspec"]
        assert spec["name"] == kernel, ipynb.name
        assert f"name: {kernel}" in ipynb.with_suffix(".py").read_text(), ipynb.name


def test_docker_builds_leave_the_host_venv_results_and_git_out():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".venv", ".git", ".gpu", "results/*", "!results/reference"} <= ignored


def test_the_cpu_route_takes_torch_from_the_cpu_wheel_index():
    make = (ROOT / "Makefile").read_text()
    assert "TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu" in make
    assert "--index-url $(TORCH_CPU_INDEX)" in make and "nvidia-smi" in make
    assert "download.pytorch.org/whl/cpu" in (ROOT / "environments/requirements-cpu.txt").read_text()


@pytest.mark.parametrize("half", sorted((ROOT / "notebooks").glob("*.py")), ids=lambda p: p.name)
def test_every_notebook_py_half_compiles(half):
    import py_compile

    py_compile.compile(str(half), doraise=True, cfile=str(Path(__import__("tempfile").mkdtemp()) / "x.pyc"))
