"""Imported by every Python process of TE's JAX build: `install-te --jax` puts this folder on PYTHONPATH for that
one step (install_plan._jax_steps). The extension is a pybind11 extension built by setuptools, which compiles its
~20 C++ sources one after another on one core, with no ninja as the PyTorch extension has. pybind11's own
ParallelCompile (the documented helper for exactly this, and a build requirement of TE-JAX, so it is there) runs
them on MAX_JOBS threads, the same count the PyTorch build takes. Anything that fails here leaves the build
serial, as it was: a slower build, never a broken one."""


def install() -> None:
    """Patch distutils' compile to run its sources on MAX_JOBS threads; nothing where pybind11 is missing."""
    try:
        from pybind11.setup_helpers import ParallelCompile
    except Exception:  # noqa: BLE001 - no pybind11, an old one, a broken setuptools: the serial build stays
        return
    ParallelCompile("MAX_JOBS").install()


install()
