"""Import Transformer Engine once, lazily, and remember why it failed (shared by the TE backends)."""
from __future__ import annotations

import functools
import glob
import os
from typing import Any, Callable


def torch_cudnn_dir() -> str | None:
    """The folder of torch's cuDNN: the copy already mapped into this process, else the pip
    `nvidia-cudnn-*` package torch depends on (`nvidia.cudnn`). Never a guess from other folders:
    a CUDA 13 `nvidia/cu13` tree or the system may hold an older cuDNN (9.14 next to torch's 9.19
    on the H200), and loading that one breaks torch's own cuDNN version check."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if os.path.basename(path).startswith(("libcudnn.so", "libcudnn_graph.so")):
                    return os.path.dirname(path)
    except OSError:
        pass
    try:
        import nvidia.cudnn as pkg  # the pip wheel torch's CUDA builds depend on
    except ImportError:
        return None
    lib = os.path.join(list(pkg.__path__)[0], "lib")
    return lib if glob.glob(os.path.join(lib, "libcudnn.so*")) else None


@functools.lru_cache(maxsize=1)
def load() -> tuple[Any, Any, str]:
    """(transformer_engine.pytorch, transformer_engine.common.recipe, '') or (None, None, reason).

    TE dlopens cuDNN itself; if it finds the system's while torch has the venv's, cuDNN's sub-libraries
    mix versions ("undefined symbol ... libcudnn_graph.so.9", TE issue #1853, seen on the H200 once
    torch had initialised cuDNN). Pointing CUDNN_PATH at torch's cuDNN first makes both use one copy.
    """
    if not (os.environ.get("CUDNN_PATH") or os.environ.get("CUDNN_HOME")):
        found = torch_cudnn_dir()
        if found:  # TE globs CUDNN_PATH recursively for libcudnn.so*: this folder holds exactly one
            os.environ["CUDNN_PATH"] = found
    try:
        import transformer_engine.pytorch as te
        from transformer_engine.common import recipe
    except Exception as e:  # ImportError, or an OSError/undefined symbol from a broken extension
        return None, None, f"transformer_engine.pytorch does not import: {type(e).__name__}: {e}".strip()
    return te, recipe, ""


def check(fn: Callable | None, what: str) -> tuple[bool, str]:
    """Run one of TE's `is_*_available` checks and return (ok, TE's own reason)."""
    if fn is None:
        return False, f"this Transformer Engine has no {what} check (too old for {what})"
    try:
        res = fn(return_reason=True)
    except TypeError:  # older TE: no return_reason
        res = fn()
    except Exception as e:  # e.g. no CUDA device visible
        return False, f"{what} check failed: {type(e).__name__}: {e}"
    if isinstance(res, tuple):
        ok, why = bool(res[0]), str(res[1] or "")
    else:
        ok, why = bool(res), ""
    return ok, ("" if ok else (why or f"{what} not available on this GPU"))


def autocast(te: Any, recipe: Any):
    """te.autocast (TE >= 2.9) or the older te.fp8_autocast; wraps the forward only."""
    if hasattr(te, "autocast"):
        return te.autocast(enabled=True, recipe=recipe)
    return te.fp8_autocast(enabled=True, fp8_recipe=recipe)
