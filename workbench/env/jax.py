"""Can the JAX students run here (jax, flax, optax), and can they run TE-JAX's FP8? Each missing piece is a reason a
user can act on. A leaf of env/: it imports nothing of ours (the `jax` backend asks it, workbench.jax_side trains).

Nothing is cached: a test (or a user who just installed jax) asks again and gets the answer for now.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

JAX_INSTALL = ("pip install 'jax[cpu]' flax optax (GPU: pip install 'jax[cuda12]' flax optax), "
               "or pip install -e '.[jax]'")
TE_JAX_INSTALL = ("build Transformer Engine's JAX side against this jax: NVTE_FRAMEWORK=jax pip install "
                  "--no-build-isolation transformer-engine-jax (a GPU host with CUDA and cuDNN)")


@dataclass(frozen=True)
class Availability:
    """'' where a piece is usable, else why not; `versions` of what imported."""

    jax: str
    flax: str
    optax: str
    te_jax: str
    gpu: bool
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def reason(self) -> str:
        """Why the JAX student cannot run at all ('' when it can): jax, flax and optax are all it needs."""
        return self.jax or self.flax or self.optax

    @property
    def fp8_reason(self) -> str:
        """Why the TE-JAX FP8 student cannot run ('' when it can): TE-JAX must import and JAX must see a GPU."""
        return self.reason or self.te_jax or ("" if self.gpu else "JAX sees no GPU (FP8 needs a CUDA GPU "
                                                                  "and jax's CUDA plugin)")


def _missing(name: str, err: BaseException) -> str:
    return f"{name} is not importable ({type(err).__name__}: {err}): {JAX_INSTALL}"


def _te_jax_reason(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    if isinstance(err, ModuleNotFoundError) and err.name in ("transformer_engine", "transformer_engine.jax"):
        return f"Transformer Engine's JAX side is not installed ({text}): {TE_JAX_INSTALL}"
    # TE's torch wheel without its JAX extension, or one built against another jax: the package imports, its
    # compiled part does not ("could not find the shared object file for the Transformer Engine Jax extension")
    return f"Transformer Engine's JAX side does not load ({text[:500]}): {TE_JAX_INSTALL}"


def availability() -> Availability:
    """What of jax, flax, optax and TE-JAX imports here, and whether JAX sees a GPU."""
    # JAX's docs: at its first use of a GPU it preallocates 75% of its memory. In a run whose torch students share
    # the GPU that would starve them, so unless the user chose otherwise it allocates as it goes, as torch does.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    reasons, versions, gpu = {}, {}, False
    try:
        import jax
        versions["jax"] = jax.__version__
        gpu = any(d.platform == "gpu" for d in jax.devices())
    except Exception as err:  # not installed, or a jaxlib that does not load: the same answer for a user
        reasons["jax"] = _missing("jax", err)
    try:
        import flax
        versions["flax"] = flax.__version__
    except Exception as err:
        reasons["flax"] = _missing("flax", err)
    try:
        import optax
        versions["optax"] = optax.__version__
    except Exception as err:
        reasons["optax"] = _missing("optax", err)
    try:
        import transformer_engine.jax  # importing it loads the compiled extension: that is the check
        versions["transformer_engine"] = getattr(transformer_engine, "__version__", "")
    except Exception as err:  # OSError / RuntimeError / ImportError: TE raises all three for a missing .so
        reasons["te_jax"] = _te_jax_reason(err)
    return Availability(jax=reasons.get("jax", ""), flax=reasons.get("flax", ""), optax=reasons.get("optax", ""),
                        te_jax=reasons.get("te_jax", ""), gpu=gpu, versions=versions)
