"""scripts/slim_gpu.sh: the .gpu route that fits a call beside the tree. Run on a copy of the script in a scratch git
repository, with a fake ../shared/gpu (named fake: its install.sh lists the wheelhouse it was given instead of
installing) and a fake staged KEEP."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("te", "notebook", "torchao", "dask")


def _fake_shared(path: Path) -> Path:
    for d in PARTS:
        (path / "wheelhouse" / d).mkdir(parents=True)
        (path / "wheelhouse" / d / f"{d}-1.0-py3-none-any.whl").write_text(d)
    (path / "wheelhouse" / "dask" / "distributed-1.0-py3-none-any.whl").write_text("distributed")
    (path / "wheelhouse" / "te" / "transformer_engine_torch-2.20.2.tar.gz").write_text("sdist")
    # the fake installer: prints which wheel folders it found beside it, as the shared one would install them
    (path / "install.sh").write_text('#!/bin/bash\nH="$(cd "$(dirname "$0")" && pwd)"\n'
                                     'echo "installed: $(cd "$H/wheelhouse" && ls */*.whl | sort | tr "\\n" " ")"\n')
    return path


def _slim(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "slim_gpu.sh", repo / "scripts")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    env = {**os.environ, "GPU_FROM": str(_fake_shared(tmp_path / "shared"))}
    subprocess.run(["bash", "scripts/slim_gpu.sh"], cwd=repo, env=env, check=True, capture_output=True)
    return repo


def test_the_slim_gpu_carries_te_alone_and_installs_the_staged_parts(tmp_path):
    repo = _slim(tmp_path)
    assert sorted(p.name for p in (repo / ".gpu" / "wheelhouse").iterdir()) == ["te"]
    assert (repo / ".gpu/wheelhouse/te/transformer_engine_torch-2.20.2.tar.gz").is_file()  # rebuilds need the sdist
    assert {"/.gpu/", "/.gpukeep/"} <= set((repo / ".git/info/exclude").read_text().split())
    # the staging call's folder holds the other parts; staged as the device call does, into a fake /root/keep
    assert sorted(p.name for p in (repo / ".gpukeep").iterdir()) == ["dask", "notebook", "torchao"]
    keep = tmp_path / "keep"
    shutil.copytree(repo / ".gpukeep", keep)
    done = subprocess.run(["bash", ".gpu/install.sh"], cwd=repo, env={**os.environ, "KEEP": str(keep)},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["installed:", "dask/dask-1.0-py3-none-any.whl",
                                   "dask/distributed-1.0-py3-none-any.whl", "notebook/notebook-1.0-py3-none-any.whl",
                                   "te/te-1.0-py3-none-any.whl",
                                   "torchao/torchao-1.0-py3-none-any.whl"]


def test_a_part_not_staged_stops_the_install_and_names_it(tmp_path):
    repo = _slim(tmp_path)
    keep = tmp_path / "keep"
    (keep / "notebook").mkdir(parents=True)
    (keep / "notebook" / "papermill-2.7-py3-none-any.whl").write_text("n")
    done = subprocess.run(["bash", ".gpu/install.sh"], cwd=repo, env={**os.environ, "KEEP": str(keep)},
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert "torchao/torchao-1.0-py3-none-any.whl" in done.stdout and "installed" not in done.stdout


def test_a_staging_copy_cut_short_stops_the_install_and_names_the_missing_wheel(tmp_path):
    # dask staged with one of its two wheels: a folder with some wheel in it is not a whole part
    repo = _slim(tmp_path)
    keep = tmp_path / "keep"
    shutil.copytree(repo / ".gpukeep", keep)
    (keep / "dask" / "distributed-1.0-py3-none-any.whl").unlink()
    done = subprocess.run(["bash", ".gpu/install.sh"], cwd=repo, env={**os.environ, "KEEP": str(keep)},
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert "not staged" in done.stdout and "dask/distributed-1.0-py3-none-any.whl" in done.stdout
    assert "dask/dask-1.0" not in done.stdout and "installed" not in done.stdout
    assert not (repo / ".gpu/wheelhouse/dask").exists()  # nothing half-filled


def test_a_gpu_folder_without_its_parts_list_stops_the_install_saying_so(tmp_path):
    # an empty list would pass every check and install without the staged parts
    repo = _slim(tmp_path)
    keep = tmp_path / "keep"
    shutil.copytree(repo / ".gpukeep", keep)
    (repo / ".gpu" / "parts.txt").write_text("")
    done = subprocess.run(["bash", ".gpu/install.sh"], cwd=repo, env={**os.environ, "KEEP": str(keep)},
                          capture_output=True, text=True)
    assert done.returncode == 1 and "parts.txt is missing or empty" in done.stdout and "installed" not in done.stdout
