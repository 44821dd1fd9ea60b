"""The repository address is written once (pyproject's [project.urls]); the Colab badges, the notebooks'
Colab cell and environments/colab.md agree with it, and the Colab install leaves Colab's kernel alone."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
REPO = PYPROJECT["project"]["urls"]["Repository"]
SLUG = REPO.removeprefix("https://github.com/")
COLAB_PINNED = {"ipykernel", "ipython", "ipywidgets"}


def colab_url(name: str) -> str:
    return f"https://colab.research.google.com/github/{SLUG}/blob/main/notebooks/{name}"


def cells(ipynb: Path) -> list[dict]:
    return json.loads(ipynb.read_text())["cells"]


def test_the_repository_is_a_github_address():
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", REPO)


def test_every_address_in_the_docs_and_notebooks_is_the_repository():
    texts = {p: p.read_text() for p in [ROOT / "README.md", ROOT / "environments" / "colab.md", *NOTEBOOKS,
                                        *(nb.with_suffix(".py") for nb in NOTEBOOKS)]}
    for path, text in texts.items():
        assert "<org>" not in text and "<repo>" not in text, f"{path.name} still has a placeholder"
        for slug in re.findall(r"colab\.research\.google\.com/github/([^/\s]+/[^/\s]+)/", text):
            assert slug == SLUG, f"{path.name}: Colab link to {slug}, pyproject says {SLUG}"
        if path.name != "README.md":  # the README also links other projects (TE issues)
            for slug in re.findall(r"github\.com/([\w.-]+/[\w-]+)", text):
                assert slug == SLUG, f"{path.name}: {slug}, pyproject says {SLUG}"
    assert f"({colab_url('distill_benchmark.ipynb')})" in texts[ROOT / "README.md"]
    assert colab_url("distill_benchmark.ipynb") in texts[ROOT / "environments" / "colab.md"]
    assert f"git+{REPO}" in texts[ROOT / "environments" / "colab.md"]


@pytest.mark.parametrize("ipynb", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_each_notebook_opens_with_its_badge_and_a_colab_cell(ipynb):
    first, setup = cells(ipynb)[0], next(c for c in cells(ipynb) if c["cell_type"] == "code")
    assert first["cell_type"] == "markdown" and f"({colab_url(ipynb.name)})" in "".join(first["source"])
    src = "".join(setup["source"])
    assert 'if "google.colab" in sys.modules:' in src
    assert re.search(rf'^\s+%pip install -q "te-workbench @ git\+{re.escape(REPO)}"$', src, re.M)
    assert "subprocess" not in src  # Colab's kernel does not show a child process's output
    if ipynb.stem == "distill_benchmark":
        assert 'cli.main(["install-te"])' in src  # the installer runs in the kernel: its verdict shows


def test_colab_install_does_not_upgrade_what_colab_pins():
    """Installing the workbench (no extras) must not pull ipykernel / ipython / ipywidgets: Colab pins its own
    versions, and upgrading them breaks its kernel. `make` installs them through the `notebook` extra."""
    core = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in PYPROJECT["project"]["dependencies"]}
    assert not core & COLAB_PINNED
    assert {"ipykernel", "ipywidgets"} <= {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0]
                                           for d in PYPROJECT["project"]["optional-dependencies"]["notebook"]}
    assert re.search(r"^RUN_EXTRAS +\?= notebook\b", (ROOT / "Makefile").read_text(), re.M)  # make run's extras
    assert re.search(
        r"te-workbench\[[^\]]*\bnotebook\b", " ".join(PYPROJECT["project"]["optional-dependencies"]["all"])
    )


def test_derived_files_are_up_to_date():
    """scripts/sync_notebooks.py derives the parameters cell and every address; nothing is left to rewrite."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "sync_notebooks.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_jupytext_release_rewrites_a_notebook_half(monkeypatch):
    """jupytext stamped its version into each .py half, so a new release (1.19.7 on a fresh CI install) made
    every half out of date. The notebooks' metadata filter keeps the stamp out: another version writes the same."""
    import jupytext
    import jupytext.header

    monkeypatch.setattr(jupytext.header, "__version__", "99.0.0")
    for ipynb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        half = ipynb.with_suffix(".py").read_text()
        assert jupytext.writes(jupytext.read(ipynb), fmt="py:percent") == half, ipynb.name
