"""Every install route takes the same extras (pyproject.toml's `all`; GPU routes add torchao; the Makefile splits
it by target), the notebooks name the kernel `make` registers, and the image leaves the host's venv and results
out."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import notebook

ROOT = Path(__file__).resolve().parents[2]
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


def _closure(names: set[str]) -> set[str]:
    """The extras a set installs, through te-workbench[...], without the `all` that only names the others."""
    return set().union(*(_expand(n) for n in names)) - {"all"}


def makefile_variables() -> dict[str, str]:
    """The Makefile's `NAME ?= value` defaults, with $(OTHER) references to earlier ones resolved."""
    out: dict[str, str] = {}
    for name, value in re.findall(r"^([A-Z_]+)\s*\?=[ \t]*(.*?)\s*$", (ROOT / "Makefile").read_text(), re.M):
        out[name] = re.sub(r"\$\(([A-Z_]+)\)", lambda m: out.get(m.group(1), m.group(0)), value)
    return out


# Makefile target -> the variable naming the extras it installs
MAKE_TARGET_EXTRAS = {"run": "RUN_EXTRAS", "bench": "RUN_EXTRAS", "test": "TEST_EXTRAS", "test-fast": "TEST_EXTRAS",
                      "lint": "TEST_EXTRAS", "lab": "LAB_EXTRAS", "sweep": "SWEEP_EXTRAS"}


def _installed_extras(route: str) -> set[str]:
    path, _ = ROUTES[route]
    text = (ROOT / path).read_text()
    if route == "make":  # each target its part; between them, the one set
        values = makefile_variables()
        assert '-e ".[$*]"' in text
        return set().union(*(values[v].split(",") for v in MAKE_TARGET_EXTRAS.values()))
    found = re.findall(r"-e\s+\"?\.{1,2}\[([^\]]+)\]", text)
    assert len(found) == 1, (path, found)
    return set(found[0].split(","))


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_installs_the_one_set_of_extras(route):
    assert _closure(_installed_extras(route)) == _closure(ROUTES[route][1])


def test_make_installs_by_target():
    """`make run` takes what a run needs, not the tools of the tests, the sweeps or JupyterLab."""
    values = {target: _closure(set(makefile_variables()[v].split(","))) for target, v in MAKE_TARGET_EXTRAS.items()}
    assert values["run"] == values["bench"] == {"notebook", "lm"}
    assert values["test"] == values["test-fast"] == values["lint"] == {"notebook", "lm", "dev", "sweep"}
    assert values["lab"] == {"notebook", "lm", "lab"}
    assert values["sweep"] == {"notebook", "lm", "sweep"}


def _make_dry_run(tmp_path: Path, target: str, *assignments: str) -> str:
    """The commands `make TARGET` would run for a clone without a venv (make -n runs nothing)."""
    if shutil.which("make") is None:
        pytest.skip("no make here")
    # neither an enclosing make's flags nor an exported default (JOBS=4, TORCH=...) may change what it prints
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MAKE", "MFLAGS")) and k not in makefile_variables()}
    done = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}", *assignments], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("target", MAKE_TARGET_EXTRAS)
def test_make_target_installs_its_extras_and_registers_the_kernel_in_the_venv(tmp_path, target):
    commands = _make_dry_run(tmp_path, target)
    (extras,) = re.findall(r"pip install -q -e \"\.\[([^\]]+)\]\"", commands)
    assert extras == makefile_variables()[MAKE_TARGET_EXTRAS[target]]
    # the venv's own kernelspec: a user-wide one belongs to whichever clone ran set-up last
    assert "ipykernel install --sys-prefix --name te-workbench" in commands and "--user" not in commands


def test_make_lab_runs_as_root_and_passes_lab_args(tmp_path):
    as_root = _make_dry_run(tmp_path, "lab", "LAB_UID=0", "LAB_ARGS=--no-browser --port 8899").splitlines()[-1]
    assert "jupyter lab --allow-root" in as_root and as_root.endswith("--no-browser --port 8899 notebooks/")
    assert "JUPYTER_PREFER_ENV_PATH=1" in as_root  # the venv's kernelspec before a stale user-wide one
    as_user = _make_dry_run(tmp_path, "lab", "LAB_UID=1000").splitlines()[-1]
    assert "jupyter lab" in as_user and "--allow-root" not in as_user
    own = _make_dry_run(tmp_path, "lab").splitlines()[-1]
    assert ("--allow-root" in own) == (os.getuid() == 0)


@pytest.mark.parametrize("target", ["test", "test-fast"])
def test_make_test_loads_only_the_plugins_the_suite_needs(tmp_path, target):
    """The venv sees the system's site-packages; their pytest plugins are not autoloaded, xdist is named."""
    (line,) = [c for c in _make_dry_run(tmp_path, target).splitlines() if " -m pytest" in c]
    assert line.startswith("PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 ") and "-p xdist.plugin" in line
    assert f"-n {makefile_variables()['JOBS']}" in line


def test_all_carries_what_every_command_needs():
    assert {"notebook", "lm", "sweep", "dev", "lab"} <= _expand("all")
    for name in ("sweep", "dev"):  # the sweep report's HTML needs nbconvert wherever sweeps are installed
        assert any(r.startswith("nbconvert") for r in EXTRAS[name]), name
    assert any(r.startswith("jupyterlab") for r in EXTRAS["lab"])


def test_the_notebooks_name_the_kernel_make_registers():
    import json

    make = (ROOT / "Makefile").read_text()
    (kernel,) = re.findall(r"^KERNEL\s*\?=\s*(\S+)", make, re.M)
    assert kernel == notebook.KERNEL_NAME and "ipykernel install --sys-prefix --name $(KERNEL)" in make
    assert "ipykernel install --sys-prefix --name te-workbench" in (ROOT / "environments/Dockerfile").read_text()
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


_PIP_TORCH = re.compile(r"^ {4}pip install (torch==\S+) --index-url (\S+)", re.M)
_PIP_PACKAGE = re.compile(r"^ {4}pip install -e '\.\[([^\]]+)\]'", re.M)


@pytest.mark.parametrize("doc", ["README.md", "docs/install.md"])
def test_the_documented_pip_route_is_what_make_run_installs(doc):
    """Without make: the pinned torch from the CPU wheel index first (pip alone takes the default index's multi-GB
    CUDA build), then the package with `make run`'s extras; the other targets' additions named beside them."""
    text = (ROOT / doc).read_text()
    values = makefile_variables()
    assert _PIP_TORCH.findall(text) == [(values["TORCH"], values["TORCH_CPU_INDEX"])]
    (extras,) = _PIP_PACKAGE.findall(text)
    assert set(extras.split(",")) == set(values["RUN_EXTRAS"].split(","))
    assert _PIP_TORCH.search(text).start() < _PIP_PACKAGE.search(text).start()
    run = set(values["RUN_EXTRAS"].split(","))
    for target in ("TEST_EXTRAS", "LAB_EXTRAS"):
        added = ",".join(e for e in values[target].split(",") if e not in run)
        assert f"`{added}" in text, (target, added)
