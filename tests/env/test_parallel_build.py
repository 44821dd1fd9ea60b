"""TE-JAX's build compiles its sources in parallel: install-te --jax puts workbench/env/parallel_build on the
build step's PYTHONPATH, whose sitecustomize installs pybind11's ParallelCompile. Tested with a real distutils
compile whose "compiler" is a barrier: each source waits until every other source's compile has started, which
only a parallel compile gets past (the same compile without the folder is the control, and fails)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workbench.env import install, install_plan

pytest.importorskip("pybind11")

BARRIER = textwrap.dedent("""
    import os, sys, time
    src, obj = next(a for a in sys.argv if a.endswith(".c")), sys.argv[sys.argv.index("-o") + 1]
    open(src + ".started", "w").close()
    others = [s for s in os.environ["BARRIER_SOURCES"].split(",") if s != src]
    end = time.monotonic() + float(os.environ["BARRIER_WAIT_S"])
    while not all(os.path.exists(s + ".started") for s in others):
        if time.monotonic() > end:
            sys.exit("compiled alone: the other sources never started")
        time.sleep(0.05)
    open(obj, "w").close()
""")
COMPILE = textwrap.dedent("""
    import sys
    import setuptools  # noqa: F401  (setuptools' distutils, the one a build uses)
    from distutils.ccompiler import new_compiler
    c = new_compiler()
    c.set_executable("compiler_so", [sys.executable, sys.argv[1]])
    print(c.compile(sys.argv[2].split(","), output_dir=sys.argv[3]))
""")


def _compile(tmp_path: Path, pythonpath: str | None, wait_s: float) -> subprocess.CompletedProcess:
    (tmp_path / "barrier.py").write_text(BARRIER)
    sources = []
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.c").write_text("int x;\n")
        sources.append(str(tmp_path / f"{name}.c"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(MAX_JOBS="3", BARRIER_SOURCES=",".join(sources), BARRIER_WAIT_S=str(wait_s))
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-c", COMPILE, str(tmp_path / "barrier.py"), ",".join(sources),
                           str(tmp_path / "obj")], capture_output=True, text=True, env=env, timeout=120)


def test_sources_compile_in_parallel_with_the_folder(tmp_path):
    out = _compile(tmp_path, install_plan.PARALLEL_BUILD, wait_s=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(list((tmp_path / "obj").rglob("*.o"))) == 3


def test_control_serial_compile_fails_the_barrier(tmp_path):
    out = _compile(tmp_path, None, wait_s=2)
    assert out.returncode != 0 and "compiled alone" in out.stderr


def test_jax_build_step_puts_the_folder_first_on_pythonpath(monkeypatch):
    assert (Path(install_plan.PARALLEL_BUILD) / "sitecustomize.py").is_file()
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = install._subprocess_env({"PYTHONPATH": install_plan.PARALLEL_BUILD}, None)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == install_plan.PARALLEL_BUILD
    assert env["PYTHONPATH"].split(os.pathsep)[-1] == "/elsewhere"
