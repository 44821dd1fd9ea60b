"""Rewrite what the notebooks and docs derive from a single source, then keep each jupytext pair in sync.

    python scripts/sync_notebooks.py           # rewrite in place
    python scripts/sync_notebooks.py --check   # exit 1 and name the files that are out of date

Derived here:
  * the main notebook's papermill parameters cell, from the config dataclasses
    (workbench.notebook.parameters_cell; the help texts are the fields' docstrings in workbench/config/), and its
    metadata that opens it collapsed (notebook.PARAMETERS_CELL_METADATA);
  * every repository address: the Colab badges (README.md, each notebook's first cell), the notebooks'
    Colab `%pip install` line and environments/colab.md, from `[project.urls] Repository` in pyproject.toml.
Run it after editing workbench/config/ or the repository address; tests/config/test_config.py and
tests/notebook/test_colab.py fail until it has run. Needs jupytext (the `dev` extra) and Python >= 3.11 (tomllib).
"""
from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

import jupytext

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's workbench, whatever is installed

from workbench import notebook  # noqa: E402

BRANCH = "main"
DOCS = [ROOT / "README.md", ROOT / "environments" / "colab.md"]
NO_VERSION_STAMP = "-jupytext.text_representation.jupytext_version"


def repository() -> str:
    """https://github.com/<owner>/<name>, from pyproject.toml."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["urls"]["Repository"].rstrip("/")


def colab_url(repo: str, notebook_name: str) -> str:
    """Where Colab opens a notebook of this repository (GitHub's copy on the default branch)."""
    return f"https://colab.research.google.com/github/{repo.removeprefix('https://github.com/')}" \
           f"/blob/{BRANCH}/notebooks/{notebook_name}"


def with_repository(text: str, repo: str) -> str:
    """`text` with every repository address (Colab links, pip's git+ URL, git clone URL) pointing at `repo`."""
    text = re.sub(r"https://colab\.research\.google\.com/github/[^/\s]+/[^/\s]+/blob/[^/\s]+/notebooks/",
                  colab_url(repo, ""), text)
    text = re.sub(r"git\+https://github\.com/[^\s\"']+", f"git+{repo}", text)
    return re.sub(r"https://github\.com/[^/\s]+/[^/\s]+\.git\b", f"{repo}.git", text)


def synced_notebook(ipynb: Path, repo: str):
    nb = jupytext.read(ipynb)
    for cell in nb.cells:
        if "parameters" in cell.metadata.get("tags", []) and ipynb.name == notebook.MAIN_NOTEBOOK.name:
            cell.source = notebook.parameters_cell()
            cell.metadata.update(notebook.PARAMETERS_CELL_METADATA)  # opens collapsed
        else:
            cell.source = with_repository(cell.source, repo)
    # jupytext stamps its own version into each .py half; a new release (1.19.6 -> 1.19.7 on a fresh CI install)
    # then rewrote that line alone and failed --check. The filter keeps the stamp out of every save, Jupyter's too.
    nb.metadata.setdefault("jupytext", {})["notebook_metadata_filter"] = NO_VERSION_STAMP
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file is out of date")
    check = parser.parse_args(argv).check
    repo = repository()
    wanted: dict[Path, str] = {doc: with_repository(doc.read_text(), repo) for doc in DOCS}
    for ipynb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = synced_notebook(ipynb, repo)
        wanted[ipynb] = jupytext.writes(nb, fmt="ipynb") + "\n"  # as Jupyter saves it
        wanted[ipynb.with_suffix(".py")] = jupytext.writes(nb, fmt="py:percent")
    stale = [path for path, text in wanted.items() if path.read_text() != text]
    if not check:
        for path in stale:
            path.write_text(wanted[path])
    for path in stale:
        print(f"{'out of date' if check else 'rewrote'}: {path.relative_to(ROOT)}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
