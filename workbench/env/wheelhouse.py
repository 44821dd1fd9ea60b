"""The offline wheelhouse (a --find-links folder): which TE wheels and sdists it holds, which of them fits
this Python, and the runtime dependencies they bring, read from the archives' metadata without pip."""
from __future__ import annotations

import email.parser
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

from workbench.env.facts import EXTENSION, META, is_core


@dataclass(frozen=True)
class Dist:
    name: str
    version: Version
    path: Path
    tags: frozenset = frozenset()  # empty for an sdist

    @property
    def is_wheel(self) -> bool:
        return self.path.name.endswith(".whl")


def scan_wheelhouse(folder: str | Path) -> dict[str, list[Dist]]:
    """{canonical name: [Dist, ...]} of the wheels and sdists in a --find-links folder (names per PEP 427/625)."""
    found: dict[str, list[Dist]] = {}
    for path in sorted(Path(folder).iterdir()):
        try:
            if path.name.endswith(".whl"):
                name, version, _, tags = parse_wheel_filename(path.name)
            elif path.name.endswith((".tar.gz", ".zip")):
                (name, version), tags = parse_sdist_filename(path.name), frozenset()
            else:
                continue
        except (InvalidWheelFilename, InvalidSdistFilename):
            continue
        found.setdefault(str(name), []).append(Dist(str(name), version, path, tags))
    return found


def _wheel_fits(dist: Dist, env: dict[str, Any]) -> bool:
    """Does this wheel install on the probed Python/platform (interpreter tag and machine)?"""
    py, machine = env.get("python_tag") or "", env.get("machine") or ""
    return any((t.interpreter == py or t.interpreter in ("py3", "py2.py3")) and
               (t.platform == "any" or (machine and machine in t.platform)) for t in dist.tags)


def _requires(dist: Dist) -> list[Requirement]:
    """Requires-Dist of a wheel (METADATA) or sdist (PKG-INFO), without extras-only requirements."""
    try:
        if dist.is_wheel:
            with zipfile.ZipFile(dist.path) as z:
                name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
                text = z.read(name).decode(errors="replace")
        else:
            with tarfile.open(dist.path) as t:
                member = next(m for m in t.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"))
                text = t.extractfile(member).read().decode(errors="replace")
    except (StopIteration, OSError, EOFError, zlib.error, zipfile.BadZipFile, tarfile.TarError):
        return []  # a damaged archive (e.g. a truncated download): pip reports it when it gets there
    out = []
    for line in email.parser.Parser().parsestr(text).get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is None or "extra" not in str(req.marker):
            out.append(req)
    return out


def pick(dists: list[Dist], version: Version, env: dict[str, Any]) -> Dist | None:
    """The wheel for this Python of `version`, else its sdist."""
    same = [d for d in dists if d.version == version]
    return next(
        (d for d in same if d.is_wheel and _wheel_fits(d, env)), next((d for d in same if not d.is_wheel), None)
    )


def runtime_deps(chosen: list[Dist], house: dict[str, list[Dist]]) -> tuple[list[str], list[str]]:
    """(names in the wheelhouse, names missing from it) of what the chosen TE packages require,
    followed through the wheelhouse; TE's own packages and torch are excluded (never touched)."""
    skip = {META, EXTENSION, "torch"} | {n for n in house if is_core(n)}
    todo, present, missing = list(chosen), [], []
    while todo:
        for req in _requires(todo.pop()):
            name = str(canonicalize_name(req.name))
            if name in skip or name in present or name in missing:
                continue
            if name in house:
                present.append(name)
                todo.append(max(house[name], key=lambda d: (d.version, d.is_wheel)))
            else:
                missing.append(name)
    return present, missing
