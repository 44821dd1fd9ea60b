"""Import Transformer Engine once per process, safely, with torch's cuDNN (shared by the TE backends,
the probe and the installer).

Two things go wrong when TE is imported, and each becomes a reason (a fallback row), never a crash:
  * TE and torch load different cuDNN copies. TE dlopens cuDNN itself, and cuDNN dlopens its
    sub-libraries by soname, so on a machine with a system cuDNN (9.14 beside torch's pip 9.19 on the
    H200) the process ends up with a mix: "undefined symbol … libcudnn_graph.so.9", torch's "cuDNN version
    incompatibility", or TE silently disabling its fused attention (CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED).
    `pin_cudnn` loads every one of torch's cuDNN libraries by absolute path (RTLD_GLOBAL) first; later
    dlopens by soname then resolve to those.
  * A broken extension segfaults, hangs or calls sys.exit while importing. `load` imports TE first in a
    child interpreter with a timeout, and only imports it here when that worked.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

# torch's cuDNN 9 libraries, in dependency order (the shim first, then the graph library the engines need)
CUDNN_LIBS = ("libcudnn", "libcudnn_graph", "libcudnn_engines_precompiled", "libcudnn_engines_runtime_compiled",
              "libcudnn_heuristic", "libcudnn_ops", "libcudnn_cnn", "libcudnn_adv")
# A cold TE import on a busy machine takes tens of seconds (CUDA libraries, cuDNN, the torch extension)
IMPORT_TIMEOUT_S = float(os.environ.get("WORKBENCH_TE_IMPORT_TIMEOUT_S", "300"))
_OK = "WORKBENCH_TE_IMPORT:"  # the child's last line: this marker and a JSON verdict


def torch_cudnn_dir() -> str | None:
    """The folder of torch's cuDNN: the copy already mapped into this process, else the pip
    `nvidia-cudnn-*` package torch depends on (`nvidia.cudnn`). Never a guess from other folders:
    a CUDA 13 `nvidia/cu13` tree or the system may hold an older cuDNN."""
    mapped = mapped_cudnn_dirs()
    if len(mapped) == 1:
        return mapped[0]
    try:
        import nvidia.cudnn as pkg  # the pip wheel torch's CUDA builds depend on
    except ImportError:
        return None
    lib = os.path.join(list(pkg.__path__)[0], "lib")
    return lib if glob.glob(os.path.join(lib, "libcudnn.so*")) else None


def mapped_cudnn_dirs() -> list[str]:
    """Folders of every cuDNN library mapped into this process (/proc/self/maps): one when all is well."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcudnn" in line}
    except OSError:
        return []
    return sorted({os.path.dirname(p) for p in paths if os.path.basename(p).startswith("libcudnn")})


def pin_cudnn() -> list[str]:
    """Load torch's cuDNN libraries by absolute path into the global namespace; return what was loaded.
    Also points CUDNN_PATH at them, which TE's own loader reads first."""
    lib_dir = torch_cudnn_dir()
    if not lib_dir:
        return []
    os.environ.setdefault("CUDNN_PATH", lib_dir)
    loaded = []
    for base in CUDNN_LIBS:
        files = sorted(glob.glob(os.path.join(lib_dir, base + ".so*")), key=len)  # libcudnn.so.9 before .so.9.19.0
        if not files:
            continue
        try:
            ctypes.CDLL(files[0], mode=ctypes.RTLD_GLOBAL)
            loaded.append(files[0])
        except OSError:  # a partial cuDNN: TE then reports what it misses
            pass
    return loaded


def _import_here() -> tuple[Any, Any]:
    pin_cudnn()
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe

    return te, recipe


def _child_env() -> dict[str, str]:
    """This process's environment, with the folder holding `workbench` first on PYTHONPATH."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


CHILD = f"""
import json, sys
try:
    from workbench.env import te as _te
    _te._import_here()
    verdict = {{"ok": True, "error": ""}}
except Exception as e:
    verdict = {{"ok": False, "error": f"{{type(e).__name__}}: {{e}}".strip()}}
sys.stdout.flush()
print({_OK!r} + json.dumps(verdict), flush=True)
"""


def _run_child(code: str, timeout_s: float, env: dict[str, str] | None = None):
    """(finished process, its JSON verdict or None) of `code` run in a fresh interpreter, which ends by
    printing _OK + JSON; raises subprocess.TimeoutExpired."""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, errors="replace",
                       timeout=timeout_s, env=env or _child_env())
    marker = next((line for line in reversed(p.stdout.splitlines()) if line.startswith(_OK)), None)
    return p, (None if marker is None else json.loads(marker[len(_OK):]))


def import_check(timeout_s: float = IMPORT_TIMEOUT_S) -> str:
    """'' if TE imports in a fresh interpreter exactly as `load` imports it, else why not (a crash, a
    hang, an exit or an exception, in words)."""
    what = "importing transformer_engine.pytorch"
    try:
        p, verdict = _run_child(CHILD, timeout_s)
    except subprocess.TimeoutExpired:
        return f"{what} hung (no answer after {timeout_s:.0f} s in a child process); not imported in this one"
    tail = " | ".join((p.stderr or "").strip().splitlines()[-5:])
    if verdict is not None:
        return "" if verdict["ok"] else f"transformer_engine.pytorch does not import: {verdict['error']}"
    if p.returncode < 0:
        try:
            name = signal.Signals(-p.returncode).name
        except ValueError:
            name = f"signal {-p.returncode}"
        return f"{what} killed the interpreter ({name}) in a child process; not imported in this one: {tail}"
    return f"{what} exited the interpreter (exit code {p.returncode}) in a child process: {tail}"


@functools.lru_cache(maxsize=1)
def load() -> tuple[Any, Any, str]:
    """(transformer_engine.pytorch, transformer_engine.common.recipe, '') or (None, None, reason)."""
    if importlib.util.find_spec("transformer_engine") is None:
        return None, None, ("transformer_engine.pytorch does not import: ModuleNotFoundError: "
                            "No module named 'transformer_engine'")
    if "transformer_engine.pytorch" not in sys.modules:  # already imported (a notebook): nothing to guard
        why = import_check()
        if why:
            return None, None, why
    try:
        te, recipe = _import_here()
    except Exception as e:  # the child imported it; this process differs (e.g. an earlier cuDNN mix)
        return None, None, f"transformer_engine.pytorch does not import: {type(e).__name__}: {e}".strip()
    return te, recipe, ""


ATTENTION_MODULES = ("transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention",
                     "transformer_engine.pytorch.attention")  # where TE keeps its last selection (moved in 2.x)
ATTENTION_UTILS = "transformer_engine.pytorch.attention.dot_product_attention.utils"  # FlashAttentionUtils (2.x)
# TE's switches per forced backend. TE reads them in get_attention_backend, i.e. whenever it (re)selects,
# not at import (TE 2.20, dot_product_attention/utils.py).
ATTENTION_ENV = {
    "flash": {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"},
    "fused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "0"},
    "unfused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "1"},
}
_STARTED_WITH = {k: os.environ.get(k) for k in ATTENTION_ENV["flash"]}  # 'auto' restores the user's own


def _selection_cache() -> dict | None:
    """TE's process-wide record of its attention selection (`_attention_backends`), if TE's attention is
    loaded in this process (never imported from here: importing TE is `load`'s job)."""
    for mod in ATTENTION_MODULES:
        cache = getattr(sys.modules.get(mod), "_attention_backends", None)
        if isinstance(cache, dict):
            return cache
    return None


def last_attention_selection() -> dict[str, str]:
    """TE's record of the attention backend it selected last in this process ({} before any TE attention
    ran), values as strings."""
    chosen = _selection_cache() or {}
    return {k: str(v) for k, v in chosen.items() if k != "attention_params"}


def force_attention(choice: str) -> None:
    """Make TE's next attention selections follow `choice` ('auto', 'flash', 'fused', 'unfused'): set TE's
    NVTE_* switches ('auto': back to what this process started with). TE reads them only when it selects,
    and selects again only when the attention's inputs change: so when a switch changes, its cached
    selection is marked stale too. Cheap when nothing changes (called before every TE student's forward)."""
    want = ATTENTION_ENV.get(choice, _STARTED_WITH)
    if all(os.environ.get(k) == v for k, v in want.items()):
        return
    for k, v in want.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    cache = _selection_cache()
    if cache is not None:
        cache["backend_selection_requires_update"] = True


def flash_attention_installed() -> bool | None:
    """Whether TE finds a flash-attn it can use (any version TE knows), None where this TE does not say."""
    utils = getattr(sys.modules.get(ATTENTION_UTILS), "FlashAttentionUtils", None)
    flags = [getattr(utils, f, None) for f in ("is_installed", "v3_is_installed", "v4_is_installed")]
    return None if utils is None or all(f is None for f in flags) else any(bool(f) for f in flags)


def describe_selection(chosen: dict[str, str]) -> str | None:
    """'flash (…)', 'fused (sub-backend N)', 'unfused' or None, from `last_attention_selection()`."""
    def used(key: str) -> bool:  # TE stores bools, ints or enums here, depending on the field and version
        return chosen.get(key) not in (None, "None", "False", "0", "")

    if used("use_flash_attention"):
        return f"flash ({chosen.get('flash_attention_backend')})"
    if used("use_fused_attention"):
        return f"fused (sub-backend {chosen.get('fused_attention_backend')})"
    if used("use_unfused_attention"):
        return "unfused"
    return None


ATTENTION_CHILD = f"""
import json, torch
from workbench.env import te as _te
te, _ = _te._import_here()
attn = te.DotProductAttention(num_attention_heads=4, kv_channels=64, attn_mask_type="causal",
                              qkv_format="bshd", attention_dropout=0.0).cuda()
q, k, v = (torch.randn(2, 512, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
attn(q, k, v).float().sum().backward()
torch.cuda.synchronize()
print({_OK!r} + json.dumps(_te.last_attention_selection() | {{"cudnn_dirs": _te.mapped_cudnn_dirs()}}), flush=True)
"""


def attention_backend(timeout_s: float = IMPORT_TIMEOUT_S) -> dict[str, Any]:
    """Which attention backend TE selects here for a causal bf16 self-attention (flash, cuDNN fused,
    unfused), and TE's own words on why others were disabled (its NVTE_DEBUG log lines). Runs in a
    child: TE reads its debug switches at import."""
    env = {**_child_env(), "NVTE_DEBUG": "1", "NVTE_DEBUG_LEVEL": "2"}
    try:
        p, chosen = _run_child(ATTENTION_CHILD, timeout_s, env)
    except subprocess.TimeoutExpired:
        return {"selected": None, "error": f"no answer after {timeout_s:.0f} s"}
    log = [line.strip()[:300] for line in p.stderr.splitlines()
           if "Disabling" in line or "Selected backend" in line or "Available backends" in line][:20]
    if chosen is None:
        return {"selected": None, "error": " | ".join(p.stderr.strip().splitlines()[-5:]), "log": log}
    selected = describe_selection(chosen)
    disabled = [line for line in log if "Disabling" in line]
    slower = selected == "unfused" and any("FusedAttention" in line or "FlashAttention" in line for line in disabled)
    return {"selected": selected, "fell_back_to_slower": slower, "log": log, "cudnn_dirs": chosen.get("cudnn_dirs"),
            "raw": chosen}


# TE's process-wide FP8 registry (FP8GlobalStateManager) lives here in TE >= 2.9, in .fp8 before
FP8_STATE_MODULES = ("transformer_engine.pytorch.quantization", "transformer_engine.pytorch.fp8")


def reset_fp8_state() -> bool:
    """Empty TE's process-wide FP8 registry before a student starts; True when there was one to empty.

    TE keeps every delayed-scaling module's amax buffers in one registry keyed by recipe and group that
    nothing empties (TE 2.20: FP8GlobalStateManager.quantization_state.global_amax_buffer), and each
    te.autocast exit updates every entry. So a later student would also update (and keep alive) the
    buffers of every earlier one, and in a distributed run rank 0's one-GPU reference student all-reduced
    the buffers a DDP student had registered over the default group, waiting forever for the idle
    ranks (two H200s, TE 2.20.2). Only a TE that is already imported is touched."""
    for name in FP8_STATE_MODULES:
        manager = getattr(sys.modules.get(name), "FP8GlobalStateManager", None)
        if manager is not None and hasattr(manager, "reset"):
            manager.reset()
            return True
    return False


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


def autocast(te: Any, recipe: Any, amax_reduction_group: Any = None):
    """te.autocast (TE >= 2.9) or the older te.fp8_autocast; wraps the forward only. `amax_reduction_group`:
    the data-parallel group of a distributed run, over which delayed scaling reduces its amax."""
    if hasattr(te, "autocast"):
        return te.autocast(enabled=True, recipe=recipe, amax_reduction_group=amax_reduction_group)
    return te.fp8_autocast(enabled=True, fp8_recipe=recipe, fp8_group=amax_reduction_group)
