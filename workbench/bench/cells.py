"""Reading the bench's CSV cells and files: numbers that may be empty, flags written as text, the best row."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from workbench import results


def num(x) -> float | None:
    """A cell as a float; None for empty, NaN or not a number."""
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def integer(x) -> int | None:
    f = num(x)
    return None if f is None else int(f)


def pct(a, b) -> float | None:
    a, b = num(a), num(b)
    return a / b * 100.0 if a is not None and b else None


def div(a, b) -> float | None:
    a, b = num(a), num(b)
    return a / b if a is not None and b else None


def truthy(x) -> bool:
    """A flag cell: CSV round trips write booleans as 'True', 1 or 1.0."""
    return str(x).strip().lower() in ("true", "1", "1.0")


def text(x) -> str:
    """A CSV cell as text: '' for empty (None, NaN)."""
    return x if isinstance(x, str) else ""


def best(df: pd.DataFrame, col: str = "step_ms_median", largest: bool = False) -> dict | None:
    """The row with the smallest (largest) `col`, as a dict; None when no row has it."""
    d = df.dropna(subset=[col])
    if d.empty:
        return None
    return (d.nlargest(1, col) if largest else d.nsmallest(1, col)).iloc[0].to_dict()


def read(path: Path) -> Any:
    """A JSON file's content, None when the file is not there (a bench cut short, an older layout)."""
    return results.read_json(path) if Path(path).exists() else None


def precision_of(spec: str) -> str | None:
    """GEMM precision of a student that has no row of its own (not run, or files from before the column)."""
    from workbench import backends

    try:
        return backends.make(spec).gemm_precision
    except Exception:  # a spec this version no longer knows
        return None
