"""The README stays a front door and every document's relative links lead somewhere.

The README is what a newcomer reads first: a size cap keeps evidence and long explanations where they
belong (results/reference/h200/README.md, docs/). A link to a moved or renamed file fails here, not in a
reader's browser. History lives in git, so the documents do not cite tracker items.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "results" / "reference" / "h200" / "README.md"]
README_MAX_BYTES = 10 * 1024

# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...
_TRACKER_REF = re.compile(r"\bissue[\s_-]*#?\d", re.I)


def relative_links(text: str) -> list[str]:
    """Targets of Markdown links and images that point into the repository (no scheme, not '#anchor')."""
    targets = (m.group(1) for m in _LINK.finditer(text))
    return [t for t in targets if not _EXTERNAL.match(t) and not t.startswith("#")]


def test_link_pattern_finds_links_and_images_but_not_urls():
    text = "[a](docs/x.md) ![b](img/y.png#frag) [c](https://e.org/z) [d](#top) [e](<../w.md>)"
    assert relative_links(text) == ["docs/x.md", "img/y.png#frag", "../w.md"]


def test_readme_is_a_front_door():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, (f"README.md is {size} bytes (at most {README_MAX_BYTES}): move evidence to "
                                      "results/reference/h200/README.md and explanations to docs/")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path):
    assert doc.is_file(), f"{doc} is missing"
    broken = [t for t in relative_links(doc.read_text(encoding="utf-8"))
              if not (doc.parent / t.split("#", 1)[0]).exists()]
    assert not broken, f"{doc.relative_to(ROOT)} links to files that do not exist: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_tracker_references(doc: Path):
    hits = [line.strip() for line in doc.read_text(encoding="utf-8").splitlines() if _TRACKER_REF.search(line)]
    assert not hits, f"{doc.relative_to(ROOT)} cites tracker items (history lives in git): {hits}"
