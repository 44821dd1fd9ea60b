"""Run All in Lab must not dirty the tracked notebooks (issue 33, ecosystem 3): `make git-filter` (run by `make lab`)
defines the nbstripout filter that .gitattributes names, so a notebook with outputs on disk is unchanged to git's
content, and Lab's post-save hook (workbench/lab.py) refreshes git's index so that `git status` and `git pull` agree."""
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from traitlets.utils.importstring import import_item

from workbench.lab import git_post_save

ROOT = Path(__file__).resolve().parents[2]
NB = "notebooks/distill_benchmark.ipynb"
pytest.importorskip("nbstripout")


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                          capture_output=True, text=True, check=True)


def _run_all(path: Path) -> None:
    """What Lab's Run All leaves in the file: outputs, execution counts, timing, widget state, the kernel's info."""
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        cell.execution_count = i + 1
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"output {i}\n")]
        cell.metadata["execution"] = {"iopub.status.busy": "2026-12-02T12:00:00Z"}
    nb.metadata["language_info"] = {"name": "python", "version": sys.version.split()[0]}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nbformat.write(nb, path)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git checkout holding the project's Makefile, .gitattributes and a notebook, committed clean."""
    for rel in ("Makefile", ".gitattributes", NB):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "clean")
    return tmp_path


def _make_git_filter(repo: Path) -> None:
    venv = Path(sys.executable).parent.parent  # the venv running the tests (make test's .venv)
    subprocess.run(["make", "-s", "git-filter", f"VENV={venv}"], cwd=repo, check=True, capture_output=True)


def test_run_all_outputs_stay_out_of_git(repo: Path) -> None:
    _make_git_filter(repo)
    committed = (repo / NB).read_bytes()
    assert _git(repo, "status", "--porcelain").stdout == ""  # the committed notebook passes the filter unchanged
    _run_all(repo / NB)
    assert (repo / NB).read_bytes() != committed  # Lab's outputs stay on disk
    assert subprocess.run(["git", "diff", "--exit-code", "--quiet"], cwd=repo).returncode == 0
    # git's index still holds the smaller size: without the hook, status says modified and pull would refuse
    assert NB in _git(repo, "status", "--porcelain").stdout
    git_post_save({"type": "notebook"}, str(repo / NB))  # what Lab runs after its save
    assert _git(repo, "status", "--porcelain").stdout == ""
    assert _git(repo, "show", f":{NB}").stdout.encode() == committed  # what a commit would take
    assert b"output 0" in (repo / NB).read_bytes()


def test_a_real_edit_stays_unstaged_and_untracked_notebooks_stay_out(repo: Path) -> None:
    _make_git_filter(repo)
    nb = nbformat.read(repo / NB, as_version=4)
    nb.cells[-1].source += "\nprint('my change')"
    nbformat.write(nb, repo / NB)
    git_post_save({"type": "notebook"}, str(repo / NB))
    assert _git(repo, "status", "--porcelain").stdout == f" M {NB}\n"  # modified, not staged
    shutil.copy(repo / NB, repo / "notebooks" / "mine.ipynb")
    git_post_save({"type": "notebook"}, str(repo / "notebooks" / "mine.ipynb"))
    assert "?? notebooks/mine.ipynb" in _git(repo, "status", "--porcelain").stdout


def test_without_the_filter_run_all_dirties_the_notebook(repo: Path) -> None:
    """The control: the same edit without `make git-filter` is a change git sees (so the test above can fail)."""
    _run_all(repo / NB)
    assert NB in _git(repo, "status", "--porcelain").stdout


def test_lab_sets_up_the_filter() -> None:
    makefile = (ROOT / "Makefile").read_text()
    lab = next(line for line in makefile.splitlines() if line.startswith("lab:"))
    assert "git-filter" in lab
    hook = makefile.split("--ContentsManager.post_save_hook=")[1].split()[0]
    assert import_item(hook) is git_post_save  # the dotted path Jupyter will import
    assert "notebooks/*.ipynb filter=nbstripout" in (ROOT / ".gitattributes").read_text()
