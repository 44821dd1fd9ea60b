"""How the workbench imports Transformer Engine: a TE whose import crashes, hangs, exits or raises becomes a
reason (a fallback row), never a dead or hung run; torch's cuDNN is loaded by path before TE.

The TE packages here are *fakes* written into a temporary folder (real TE cannot exist on a CPU machine);
the real import and the one-cuDNN check run on the H200 (tests/gpu/test_gpu.py)."""
import os
import shutil
import subprocess
import sys

import pytest

from workbench.env import te as _te

FAKE_TE = {  # what transformer_engine/pytorch/__init__.py does on import
    "segfault": "import ctypes\nctypes.string_at(0)\n",
    "exit": "import sys\nsys.exit(3)\n",
    "hang": "import time\ntime.sleep(600)\n",
    "raises": "raise OSError('libcudnn_graph.so.9: undefined symbol: fake')\n",
    "fine": "X = 1\n",
}


@pytest.fixture
def fake_te(tmp_path, monkeypatch):
    """Put a fake transformer_engine with the given import behaviour first on the path (this process
    and its children), and forget any earlier load()."""
    def install(kind):
        pkg = tmp_path / kind / "transformer_engine"
        (pkg / "pytorch").mkdir(parents=True)
        (pkg / "common").mkdir()
        (pkg / "__init__.py").write_text("")
        (pkg / "common" / "__init__.py").write_text("")
        (pkg / "common" / "recipe.py").write_text("")
        (pkg / "pytorch" / "__init__.py").write_text(FAKE_TE[kind])
        monkeypatch.syspath_prepend(str(tmp_path / kind))
        monkeypatch.setenv("PYTHONPATH", str(tmp_path / kind) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        _te.load.cache_clear()
    yield install
    _te.load.cache_clear()
    for name in [m for m in sys.modules if m.startswith("transformer_engine")]:
        del sys.modules[name]


@pytest.mark.parametrize("kind, words", [
    ("segfault", "killed the interpreter (SIGSEGV)"),
    ("exit", "exited the interpreter (exit code 3)"),
    ("raises", "does not import: OSError: libcudnn_graph.so.9: undefined symbol: fake"),
])
def test_a_te_import_that_crashes_exits_or_raises_is_a_reason(fake_te, kind, words):
    fake_te(kind)
    te, recipe, why = _te.load()
    assert te is None and words in why, why
    assert "transformer_engine.pytorch" not in sys.modules  # never imported into this process


def test_a_te_import_that_hangs_is_a_reason_after_the_timeout(fake_te, monkeypatch):
    fake_te("hang")
    assert "hung (no answer after 3 s" in _te.import_check(timeout_s=3)


def test_a_working_te_is_imported_here_after_the_child_check(fake_te):
    fake_te("fine")
    te, recipe, why = _te.load()
    assert why == "" and te.X == 1


def test_no_te_installed_is_a_reason_without_a_child_process(monkeypatch):
    monkeypatch.setattr(_te.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(_te.subprocess, "run", lambda *a, **k: pytest.fail("no child when TE is absent"))
    _te.load.cache_clear()
    try:
        assert "No module named 'transformer_engine'" in _te.load()[2]
    finally:
        _te.load.cache_clear()


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build stand-in shared libraries")
def test_pin_cudnn_maps_every_library_of_torchs_copy_from_one_folder(tmp_path, monkeypatch):
    """Stand-in cuDNN libraries (empty shared objects named like cuDNN 9's) in a pip-like folder:
    pin_cudnn loads each by absolute path, so /proc/self/maps shows them all from that one folder."""
    lib = tmp_path / "nvidia" / "cudnn" / "lib"
    lib.mkdir(parents=True)
    src = tmp_path / "empty.c"
    src.write_text("int workbench_fake_cudnn_symbol(void) { return 0; }\n")
    names = [f"{base}.so.9" for base in _te.CUDNN_LIBS]
    for name in names:
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib / name), str(src)], check=True)
    monkeypatch.setattr(_te, "torch_cudnn_dir", lambda: str(lib))
    monkeypatch.delenv("CUDNN_PATH", raising=False)
    loaded = _te.pin_cudnn()
    assert [os.path.basename(p) for p in loaded] == names
    assert str(lib) in _te.mapped_cudnn_dirs()
    assert os.environ["CUDNN_PATH"] == str(lib)  # TE's own loader looks there first
