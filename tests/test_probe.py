"""The probe: every key the rest of the workbench reads, the new install fields, TE package discovery
through package metadata, the consistency rules, nvcc / cuDNN discovery, and its two printed forms."""
from __future__ import annotations

import json
import os
import stat

import pytest

from te_fixtures import machine
from workbench import cli, probe

CORE_KEYS = {"python", "platform", "torch", "torch_cuda", "gpu_name", "compute_capability", "cuda_home", "nvcc_exists",
             "nvcc_path", "cudnn_header_exists", "git_sha", "te_available", "te_import_error", "te_version",
             *(f"{k}_available" for k in probe.CAPABILITY_CHECKS), *(f"{k}_reason" for k in probe.CAPABILITY_CHECKS)}
INSTALL_KEYS = {"driver", "nvcc_version", "cudnn_pip_header", "cudnn_pip_root", "cudnn_pip_packages", "cudnn_system_header",
                "cudnn_torch", "te_packages", "te_consistency", "te_consistent", "torch_cxx11_abi", "torch_cuda_major",
                "python_tag", "machine", "cpu_cores", "mem_available_gb", "python_executable"}


@pytest.fixture(scope="module")
def env():
    return probe.probe()


def test_probe_has_every_key_and_is_json(env):
    assert CORE_KEYS | INSTALL_KEYS <= set(env)
    assert json.loads(json.dumps(env)) == env


def test_probe_on_this_cpu_machine_reports_no_te_and_the_abi_flag(env):
    import torch

    if not torch.cuda.is_available():
        assert env["gpu_name"] is None and env["fp8_available"] is False
    assert env["te_packages"] == {} and env["te_consistent"] is None


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
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    assert probe._nvcc(str(tmp_path)) == (str(nvcc), "12.4")


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
    text = probe.table(env)
    for section in ("[system]", "[torch]", "[GPU]", "[toolkit]", "[Transformer Engine]", "[TE capability]"):
        assert section in text
    for key in probe.CAPABILITY_CHECKS:
        assert f"\n  {key} " in text


def test_cli_probe_json_includes_install_fields(capsys):
    assert cli.main(["probe", "--json"]) == 0
    assert INSTALL_KEYS <= set(json.loads(capsys.readouterr().out))


def test_git_sha_override_wins_over_the_checkout(monkeypatch):
    """A copy sent to another machine may carry a stale .git: the sender's WORKBENCH_GIT_SHA wins."""
    from workbench import probe

    monkeypatch.delenv("WORKBENCH_GIT_SHA", raising=False)
    here = probe._git_sha()  # this checkout's HEAD (None where git is absent)
    monkeypatch.setenv("WORKBENCH_GIT_SHA", "abc1234")
    assert probe._git_sha() == "abc1234" != here
