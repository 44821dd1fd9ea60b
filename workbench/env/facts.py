"""Facts probe, doctor and install share: TE's package names, how many compile jobs fit this machine,
and text safe to print. A leaf of env/: it imports nothing of ours."""
from __future__ import annotations

import re
import unicodedata
from typing import Any

META, EXTENSION = "transformer-engine", "transformer-engine-torch"
GB_PER_BUILD_JOB = 4
"""Peak memory of one parallel compile job of TE's CUDA sources; an unbounded build gets Killed (TE #1249)."""


def core_name(cuda_major: int) -> str:
    return f"transformer-engine-cu{cuda_major}"


def is_core(name: str) -> bool:
    """A TE core package (transformer-engine-cu12 / -cu13), by canonical distribution name."""
    return re.fullmatch(r"transformer-engine-cu\d+", name) is not None


def build_jobs(env: dict[str, Any]) -> int:
    """MAX_JOBS for a build here: the cores, but no more jobs than memory holds at GB_PER_BUILD_JOB each."""
    mem = env.get("mem_available_gb") or env.get("mem_total_gb")
    return max(1, min(int(env.get("cpu_cores") or 1), int(mem // GB_PER_BUILD_JOB) if mem else 1))


_ESCAPE = re.compile(r"\x1b(?:\[[0-?]{0,32}[ -/]{0,8}[@-~]|\][^\x07\x1b]{0,512}(?:\x07|\x1b\\)?|[@-_]?)")
"""ANSI/VT escape sequences (colour, cursor moves, window titles) and a lone ESC."""


def printable(text: str) -> str:
    """`text` without escape sequences and control or format characters (tabs and newlines stay):
    what a log quotes is printed to a terminal, where raw ESC bytes would recolour or rewrite it."""
    text = _ESCAPE.sub("", text)
    return "".join(c for c in text if c in "\t\n" or unicodedata.category(c) not in ("Cc", "Cf"))
