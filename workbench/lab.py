"""JupyterLab's side of keeping the tracked notebooks clean in git (`make lab`).

.gitattributes sends notebooks/*.ipynb through nbstripout's git filter (the Makefile's `git-filter` defines it), so
git's content sees no outputs. But git's index also caches each file's size, and after Run All the file on disk is
larger: `git status` calls it modified and `git pull` refuses to overwrite it, although `git diff` shows nothing.
`make lab` runs `git_post_save` after every save: when git sees no change in a tracked notebook's content, it
re-stages the file, which only refreshes the cached size. A real edit (git sees a change) is left alone, unstaged.
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any


def _git(folder: Path, *args: str) -> int:
    return subprocess.run(["git", *args], cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode


def git_post_save(model: dict[str, Any], os_path: str, contents_manager: Any = None, **_: Any) -> None:
    """Jupyter server's post-save hook (`--ContentsManager.post_save_hook=workbench.lab.git_post_save`)."""
    if model.get("type") != "notebook":
        return
    path = Path(os_path)
    tracked = _git(path.parent, "ls-files", "--error-unmatch", "--", path.name) == 0
    # `git diff --quiet` compares the filtered file with the index: 0 when only outputs changed
    if tracked and _git(path.parent, "diff", "--quiet", "--", path.name) == 0:
        _git(path.parent, "add", "--", path.name)
