"""Every script the project's front files name exists (a marker text once named a script that did not)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRONT_FILES = ["pyproject.toml", "README.md", "Makefile"]


def named_scripts(text: str) -> set[str]:
    """`scripts/<name>.sh` mentions; globs such as scripts/gpu_*.sh name no single file."""
    return set(re.findall(r"scripts/[\w.-]{1,100}\.sh", text))


@pytest.mark.parametrize("front", FRONT_FILES)
def test_every_script_named_exists(front):
    named = named_scripts((ROOT / front).read_text())
    assert [s for s in sorted(named) if not (ROOT / s).is_file()] == []


def test_the_gpu_marker_names_the_gpu_test_script():
    assert "scripts/gpu_tests.sh" in named_scripts((ROOT / "pyproject.toml").read_text())


def test_the_tracked_tree_leaves_room_for_the_gpu_wheelhouse():
    """A device call carries the tree and .gpu/ (~49 MiB of wheels) under one 64 MiB cap: the committed
    files (mostly reference plots, palette PNGs) must stay under 12 MiB."""
    import subprocess

    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    total = sum((ROOT / f.decode()).stat().st_size for f in files if f and (ROOT / f.decode()).is_file())
    assert total < 12 * 2**20, f"{total / 2**20:.1f} MiB tracked"
