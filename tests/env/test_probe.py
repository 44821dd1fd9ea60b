"""The probe: every key the rest of the workbench reads, the new install fields, TE package discovery
through package metadata, the consistency rules, nvcc / cuDNN discovery, and its two printed forms."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from te_fixtures import fake_nvcc, machine

from workbench import cli
from workbench.env import probe, probe_cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CORE_KEYS = {"python", "platform", "torch", "torch_cuda", "gpu_name", "compute_capability", "cuda_home", "nvcc_exists",
             "nvcc_path", "cudnn_header_exists", "git_sha", "te_available", "te_import_error", "te_version",
             *(f"{k}_available" for k in probe.CAPABILITY_CHECKS), *(f"{k}_reason" for k in probe.CAPABILITY_CHECKS)}
INSTALL_KEYS = {
    "driver",
    "nvcc_version",
    "cudnn_pip_header",
    "cudnn_pip_root",
    "cudnn_pip_packages",
    "cudnn_system_header",
    "cudnn_torch",
    "te_packages",
    "te_consistency",
    "te_consistent",
    "torch_cxx11_abi",
    "torch_cuda_major",
    "python_tag",
    "machine",
    "cpu_cores",
    "mem_available_gb",
    "python_executable",
}


@pytest.fixture(scope="module")
def env():
    return probe.probe()


def test_probe_has_every_key_and_is_json(env):
    assert CORE_KEYS | INSTALL_KEYS <= set(env)
    assert json.loads(json.dumps(env)) == env


def test_probe_times_each_of_its_groups(env):
    """A point's start on a GPU machine is 15-17 s: env.json says which of the probe's groups take them."""
    assert list(env["probe_s"]) == ["te_load", "cuda_available", "python", "torch", "gpu", "toolkit", "cudnn", "host",
                                    "te", "jax"]
    assert all(isinstance(s, float) and s >= 0 for s in env["probe_s"].values())


def test_probe_reports_the_gpu_and_abi_flag_of_whatever_machine_runs_it(env):
    import torch

    assert isinstance(env["torch_cxx11_abi"], bool)
    if not torch.cuda.is_available():
        assert env["gpu_name"] is None and env["fp8_available"] is False
    # TE may or may not be installed here (a GPU box, an NGC container): the keys agree either way
    assert (env["te_packages"] == {}) is (env["te_consistent"] is None) is (env["te_consistency"] == [])


def test_probe_without_te_packages_has_no_consistency_verdict(monkeypatch):
    monkeypatch.setattr(probe, "te_packages", lambda: {})  # hides a TE installed on this machine
    env = probe.probe()
    assert env["te_packages"] == {} and env["te_consistency"] == [] and env["te_consistent"] is None


def test_probe_with_te_packages_checks_them(tmp_path, monkeypatch):
    for name, version in GOOD.items():  # metadata only: shadows a real TE's, if there is one
        _fake_dist(tmp_path, name.replace("-", "_"), version)
    monkeypatch.syspath_prepend(str(tmp_path))
    env = probe.probe()
    assert env["te_packages"].items() >= GOOD.items()
    checks = {c["check"]: c["ok"] for c in env["te_consistency"]}
    assert checks["same_version"] is (set(env["te_packages"].values()) == {"2.20.2"})
    assert checks["extension_imports"] is env["te_available"] and isinstance(env["te_consistent"], bool)


def _fake_dist(root, name: str, version: str) -> None:
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_te_packages_are_found_through_package_metadata(tmp_path, monkeypatch):
    _fake_dist(tmp_path, "transformer_engine", "2.20.2")
    _fake_dist(tmp_path, "transformer_engine_cu13", "2.20.2")
    _fake_dist(tmp_path, "transformer-engine-torch", "2.19.0")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert probe.te_packages() == {"transformer-engine": "2.20.2", "transformer-engine-cu13": "2.20.2",
                                   "transformer-engine-torch": "2.19.0"}


def _checks(**changes) -> dict:
    env = machine(**changes)
    return {c["check"]: c["ok"] for c in probe.consistency(env)}


GOOD = {"transformer-engine": "2.20.2", "transformer-engine-cu12": "2.20.2", "transformer-engine-torch": "2.20.2"}


def test_consistency_of_a_good_set():
    assert _checks(te_packages=GOOD, te_available=True) == {
        "same_version": True, "meta_package": True, "one_core": True, "core_matches_torch_cuda": True,
        "torch_extension": True, "extension_imports": True}


@pytest.mark.parametrize("packages,changes,failing", [
    ({**GOOD, "transformer-engine-torch": "2.19.0"}, {}, "same_version"),
    (GOOD, {"torch_cuda": "13.0", "torch_cuda_major": 13}, "core_matches_torch_cuda"),
    ({**GOOD, "transformer-engine-cu13": "2.20.2"}, {}, "one_core"),
    ({k: v for k, v in GOOD.items() if k != "transformer-engine-torch"}, {}, "torch_extension"),
    ({k: v for k, v in GOOD.items() if k != "transformer-engine"}, {}, "meta_package"),
], ids=["versions-differ", "core-cu12-with-torch-cu13", "two-cores", "no-extension", "no-meta"])
def test_consistency_flags_the_broken_rule(packages, changes, failing):
    assert _checks(te_packages=packages, te_available=True, **changes)[failing] is False


def test_consistency_is_empty_without_te():
    assert probe.consistency(machine()) == []


def test_nvcc_version_is_read_from_nvcc(tmp_path):
    nvcc = fake_nvcc(tmp_path, "echo 'Cuda compilation tools, release 12.4, V12.4.131'")
    assert probe._nvcc(str(tmp_path)) == (str(nvcc), "12.4", None)


def test_nvcc_printing_non_utf8_bytes_still_gives_its_version(tmp_path):
    nvcc = fake_nvcc(
        tmp_path, r"printf 'nvcc: NVIDIA (R) \377\376 Cuda compiler\nCuda compilation tools, release 13.0, V13.0.48\n'"
    )
    assert probe._nvcc(str(tmp_path)) == (str(nvcc), "13.0", None)


@pytest.mark.parametrize("script,words", [
    (r"printf '\033[31m\377\376garbage\000\n'", ["printed no 'release X.Y'", "garbage"]),
    ("echo 'nvcc: error while loading shared libraries: libnvvm.so.4' >&2; exit 127",
     ["exited 127", "nvcc: error while loading shared libraries: libnvvm.so.4"]),
    ("exit 1", ["exited 1", "no output"]),
], ids=["garbage", "broken-library", "silent-failure"])
def test_a_broken_nvcc_is_reported_with_what_it_said(tmp_path, script, words):
    nvcc = fake_nvcc(tmp_path, script)
    path, version, problem = probe._nvcc(str(tmp_path))
    assert (path, version) == (str(nvcc), None)
    for w in words:
        assert w in problem
    assert problem.isprintable()  # no ESC or NUL from its output


def test_the_probe_command_survives_an_nvcc_printing_garbage(tmp_path):
    """Before, its non-UTF-8 output raised UnicodeDecodeError in the probe, and so in every run."""
    fake_nvcc(tmp_path, r"printf '\377\376\033[2J\n'")
    env = {**os.environ, "CUDA_HOME": str(tmp_path), "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run([sys.executable, "-m", "workbench", "probe", "--json"], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert found["nvcc_path"] == str(tmp_path / "bin" / "nvcc") and found["nvcc_version"] is None
    assert "printed no 'release X.Y'" in found["nvcc_problem"]


def test_probe_out_to_an_unwritable_place_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert cli.main(["probe", "--out", str(tmp_path / "file" / "env.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out" in err and "Traceback" not in err


def test_pip_cudnn_headers_are_found_on_sys_path(tmp_path, monkeypatch):
    # torch's cuDNN wheel (nvidia/cudnn) and a CUDA 13 tree that sorts first and may hold an older cuDNN
    for folder in ("cudnn", "cu13"):
        header = tmp_path / "nvidia" / folder / "include" / "cudnn.h"
        header.parent.mkdir(parents=True)
        header.write_text("")
    _fake_dist(tmp_path, "nvidia_cudnn_cu12", "9.1.0.70")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = probe._cudnn_headers(None)
    assert found["cudnn_pip_root"] == os.path.join(str(tmp_path), "nvidia", "cudnn")
    assert found["cudnn_pip_packages"] == {"nvidia-cudnn-cu12": "9.1.0.70"} and found["cudnn_header_exists"]


def test_human_table_groups_sections_and_lists_every_capability_with_reason(env):
    text = probe_cli.table(env)
    for section in ("[system]", "[torch]", "[GPU]", "[toolkit]", "[Transformer Engine]", "[TE capability]"):
        assert section in text
    for key in probe.CAPABILITY_CHECKS:
        assert f"\n  {key} " in text


def test_cli_probe_json_includes_install_fields(capsys):
    assert cli.main(["probe", "--json"]) == 0
    assert INSTALL_KEYS <= set(json.loads(capsys.readouterr().out))


def test_git_sha_override_wins_over_the_checkout(monkeypatch):
    """A copy sent to another machine may carry a stale .git: the sender's WORKBENCH_GIT_SHA wins."""
    from workbench.env import probe

    monkeypatch.delenv("WORKBENCH_GIT_SHA", raising=False)
    here = probe._git_sha()  # this checkout's HEAD (None where git is absent)
    monkeypatch.setenv("WORKBENCH_GIT_SHA", "abc1234")
    assert probe._git_sha() == "abc1234" != here
