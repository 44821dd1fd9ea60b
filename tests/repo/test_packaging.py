"""A built wheel (not an editable install) runs the notebooks: they ship as package data.

The wheel is built from a copy of this checkout and installed with --no-deps into a fresh venv that sees
this environment's packages (torch, papermill, ipykernel) but not this checkout: PYTHONPATH is unset and
the command runs from an empty folder, so only the installed wheel can provide `workbench` and its
notebooks.
"""
import json
import os
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _build_wheel(tmp: Path) -> Path:
    src = tmp / "src"
    common = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__")

    def ignore(folder: str, names: list[str]) -> set[str]:
        # the repository's results/ (evidence, not package data), never the package's own workbench/results/
        return set(common(folder, names)) | ({"results"} & set(names) if Path(folder) == ROOT else set())

    shutil.copytree(ROOT, src, symlinks=True, ignore=ignore)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp / "dist"), str(src)], check=True)
    (wheel,) = (tmp / "dist").glob("te_workbench-*.whl")
    return wheel


def _venv_with(wheel: Path, path: Path) -> Path:
    """A venv with the wheel installed (--no-deps), the system site-packages and, when this interpreter is
    itself a venv, its packages too: a .pth line, written after the install so pip does not take this
    environment's own (editable) te-workbench for the wheel; .pth files inside those folders are not run."""
    venv.create(path, system_site_packages=True, with_pip=False)
    python = path / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
                   check=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    if sys.prefix != sys.base_prefix:
        Path(purelib, "parent_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


@pytest.mark.slow
def test_the_installed_wheel_runs_the_notebook_from_an_empty_folder(tmp_path):
    wheel = _build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    for nb in ("distill_benchmark.ipynb", "sweep_report.ipynb"):  # real files, not the repository's link
        assert zipfile.ZipFile(wheel).read(f"workbench/notebooks/{nb}") == (ROOT / "notebooks" / nb).read_bytes()
    assert not [n for n in names if n.startswith("workbench/notebooks/") and n.endswith(".py")]

    python = _venv_with(wheel, tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    empty = tmp_path / "empty"
    empty.mkdir()
    where = subprocess.run([str(python), "-c", "import workbench; print(workbench.__file__)"], cwd=empty, env=env,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(tmp_path / "venv")), f"workbench imported from {where}, not the wheel"

    done = subprocess.run([str(tmp_path / "venv" / "bin" / "workbench"), "notebook", "--preset", "cpu-smoke",
                           "--set", "steps=2", "--set", "iters=1", "--set", "warmup=0", "--set", "eval_batches=1",
                           "--set", "backends=torch_fp32,torch_bf16", "--run-id", "wheel"],
                          cwd=empty, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = empty / "results" / "wheel"  # the default output folder, in the working folder
    assert (run_dir / "students.csv").is_file() and (run_dir / "distill_benchmark.ipynb").is_file()
    assert "[torch_fp32] training 2 steps" in done.stdout  # the kernel's lines came through
    kernel_python = json.loads((run_dir / "env.json").read_text())["python_executable"]
    assert kernel_python.startswith(str(tmp_path / "venv")), f"the kernel ran {kernel_python}"
