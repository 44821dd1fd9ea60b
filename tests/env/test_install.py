"""install-te: plans for simulated machines (plain probe dicts), the offline wheelhouse route, and the
real pip subprocess path against a local wheelhouse of stand-in packages (never the project's venv,
never the network: --no-index, --target tmp_path)."""
from __future__ import annotations

import importlib.metadata
import io
import json
import os
import sys
import tarfile
from pathlib import Path

import pytest
from te_fixtures import FAKE_VERSION, build_wheelhouses, fake_nvcc, machine

from workbench import cli
from workbench.env import facts, install, install_plan, probe


def step(p: install_plan.Plan, name: str) -> install_plan.Step:
    return next(s for s in p.steps if s.name == name)


# ------------------------------------------------------------------ plans for a table of simulated machines
CPU_ONLY = machine(torch="2.13.0+cpu", torch_cuda=None, torch_cuda_major=None, gpu_name=None, compute_capability=None,
                   nvcc_path=None, nvcc_version=None)
CUDA12_NO_NVCC = machine(nvcc_path=None, nvcc_version=None, nvcc_exists=False)
CUDA13_FULL = machine(torch="2.11.0+cu130", torch_cuda="13.0", torch_cuda_major=13, nvcc_version="13.0",
                      nvcc_path="/usr/local/cuda-13.0/bin/nvcc", cuda_home="/usr/local/cuda-13.0",
                      cpu_cores=64, mem_available_gb=32.0)
T4 = machine(gpu_name="Tesla T4", compute_capability="7.5")
A100 = machine(gpu_name="NVIDIA A100-SXM4-80GB", compute_capability="8.0")
H100 = machine()
INCONSISTENT = machine(
    te_packages={
        "transformer-engine": "2.8.0",
        "transformer-engine-cu12": "2.8.0",
        "transformer-engine-cu13": "2.9.0",
        "transformer-engine-torch": "2.9.0",
    },
    te_consistent=False,
    te_available=False,
    te_consistency=[
        {"check": "same_version", "ok": False, "detail": "different versions"},
        {"check": "one_core", "ok": False, "detail": "transformer-engine-cu12, transformer-engine-cu13"},
    ],
    te_import_error="AssertionError: Transformer Engine package version mismatch. "
    "Found transformer_engine_torch v2.9.0",
)

PLAN_TABLE = [  # (id, machine, plan kwargs, ok, core extra, build, expected words in refusals+warnings)
    ("cpu-only", CPU_ONLY, {}, False, None, "maybe", ["CPU build", "no CUDA GPU"]),
    ("cuda12-no-nvcc-pypi", CUDA12_NO_NVCC, {}, True, "core_cu12", "maybe", ["if it compiles: nvcc not found"]),
    (
        "cuda12-no-nvcc-forced-build",
        CUDA12_NO_NVCC,
        {"build_from_source": True},
        False,
        "core_cu12",
        "yes",
        ["nvcc not found"],
    ),
    ("cuda13-nvcc-cudnn-build", CUDA13_FULL, {"build_from_source": True}, True, "core_cu13", "yes", []),
    ("t4-cc75", T4, {}, False, "core_cu12", "maybe", ["7.5", "below 8.0", "fp16"]),
    ("a100-bf16-no-fp8", A100, {}, True, "core_cu12", "maybe", ["bf16 only, no FP8"]),
    ("h100-cc90", H100, {}, True, "core_cu12", "maybe", []),
    ("te-inconsistent", INCONSISTENT, {"version": "2.9.0"}, True, "core_cu12", "maybe", []),
]


@pytest.mark.parametrize("case", PLAN_TABLE, ids=[c[0] for c in PLAN_TABLE])
def test_plan_for_simulated_machine(case):
    _, env, kwargs, ok, core_extra, build, words = case
    p = install_plan.plan(env, **kwargs)
    assert p.ok is ok, p.render()
    assert p.core_extra == core_extra
    assert p.build == build
    said = " ".join(p.refusals + p.warnings)
    for w in words:
        assert w in said, f"{w!r} not in {said!r}"
    if not ok:
        assert p.steps == []  # a refused plan runs nothing
    else:
        install_step = step(p, "transformer-engine")
        assert "--no-build-isolation" in install_step.argv
        assert install_step.argv[:3] == [env["python_executable"], "-m", "pip"]
    json.dumps(p.to_dict())  # plan.json is plain data


def test_pypi_plan_uses_documented_spec_with_core_for_torch_cuda_major():
    p = install_plan.plan(CUDA13_FULL, version="2.20.2")
    assert p.steps[-1].argv[-1] == "transformer_engine[pytorch,core_cu13]==2.20.2"


def test_build_env_names_this_gpu_and_sizes_jobs_to_memory():
    p = install_plan.plan(CUDA13_FULL, build_from_source=True)
    env = step(p, "transformer-engine").env
    assert env["NVTE_FRAMEWORK"] == "pytorch"
    assert env["NVTE_CUDA_ARCHS"] == "90"
    assert env["MAX_JOBS"] == str(32 // facts.GB_PER_BUILD_JOB)  # 64 cores, but 32 GB hold 8 jobs
    assert env["CUDA_HOME"] == "/usr/local/cuda-13.0"
    assert env["CUDNN_PATH"] == CUDA13_FULL["cudnn_pip_root"]
    assert env["NVTE_PYTORCH_FORCE_BUILD"] == "TRUE"
    argv = step(p, "transformer-engine").argv
    assert argv[argv.index("--no-binary") + 1] == "transformer_engine_torch"


def test_build_env_explicit_max_jobs_wins_and_cc_12_is_written_120():
    env = install_plan.build_env(machine(compute_capability="12.0"), max_jobs=3)
    assert env["MAX_JOBS"] == "3" and env["NVTE_CUDA_ARCHS"] == "120"


def test_a100_build_targets_sm80():
    assert install_plan.build_env(A100)["NVTE_CUDA_ARCHS"] == "80"


def test_nvcc_major_mismatch_refuses_a_build():
    p = install_plan.plan(machine(torch="2.11.0+cu130", torch_cuda="13.0", torch_cuda_major=13), build_from_source=True)
    assert not p.ok and any("nvcc 12.4" in r and "#553" in r for r in p.refusals)


def test_missing_cudnn_headers_refuse_a_build():
    p = install_plan.plan(
        machine(cudnn_pip_root=None, cudnn_pip_header=None, cudnn_system_header=None), build_from_source=True
    )
    assert not p.ok and any("cudnn.h" in r for r in p.refusals)


def test_inconsistent_te_is_uninstalled_completely_before_one_pinned_install():
    p = install_plan.plan(INCONSISTENT, version="2.9.0")
    assert [s.name for s in p.steps] == ["uninstall", "transformer-engine"]
    assert sorted(p.steps[0].argv[-4:]) == sorted(INCONSISTENT["te_packages"])
    assert "inconsistent" in p.steps[0].why


def test_healthy_install_means_nothing_to_do_unless_reinstall():
    healthy = machine(te_available=True, te_consistent=True, te_version="2.9.0",
                      te_packages={"transformer-engine": "2.9.0", "transformer-engine-cu12": "2.9.0",
                                   "transformer-engine-torch": "2.9.0"})
    assert install_plan.plan(healthy).steps == [] and "nothing to do" in install_plan.plan(healthy).notes[0]
    assert [s.name for s in install_plan.plan(healthy, reinstall=True).steps] == ["uninstall", "transformer-engine"]
    assert install_plan.plan(healthy, version="2.10.0").steps  # another version requested


def test_force_turns_refusals_into_warnings():
    p = install_plan.plan(T4, force=True)
    assert p.ok and p.steps and any(w.startswith("(--force)") for w in p.warnings)


# ------------------------------------------------------------------------------- offline wheelhouse plans
def _touch(folder: Path, *names: str) -> Path:
    folder.mkdir(exist_ok=True)
    for n in names:
        (folder / n).write_bytes(b"")
    return folder


def test_offline_plan_pins_the_wheelhouse_version_and_uses_the_prebuilt_extension(tmp_path):
    tag = H100["python_tag"]
    wh = _touch(
        tmp_path / "wh",
        "transformer_engine-2.19.0-py3-none-any.whl",
        "transformer_engine-2.20.2-py3-none-any.whl",
        "transformer_engine_cu12-2.20.2-py3-none-manylinux_2_28_x86_64.whl",
        f"transformer_engine_torch-2.20.2-{tag}-{tag}-linux_{H100['machine']}.whl",
        "transformer_engine_torch-2.20.2.tar.gz",
    )
    p = install_plan.plan(H100, find_links=str(wh), no_index=True)
    assert p.ok and p.version == "2.20.2" and p.build == "no"
    argv = step(p, "transformer-engine").argv
    assert {"--no-index", "--no-deps", "--no-build-isolation"} <= set(argv)
    assert argv[-3:] == [
        "transformer_engine==2.20.2",
        "transformer_engine_cu12==2.20.2",
        "transformer_engine_torch==2.20.2",
    ]


def test_offline_plan_builds_when_only_the_extension_sdist_fits_this_python(tmp_path):
    wh = _touch(tmp_path / "wh", "transformer_engine-2.20.2-py3-none-any.whl",
                "transformer_engine_cu12-2.20.2-py3-none-manylinux_2_28_x86_64.whl",
                "transformer_engine_torch-2.20.2-cp39-cp39-linux_x86_64.whl", "transformer_engine_torch-2.20.2.tar.gz")
    p = install_plan.plan(H100, find_links=str(wh), no_index=True)
    assert p.build == "yes" and "sdist" in p.build_reason
    assert step(p, "transformer-engine").env["NVTE_CUDA_ARCHS"] == "90"


def test_offline_plan_refuses_a_wheelhouse_without_the_extension(tmp_path):
    wh = _touch(tmp_path / "wh", "transformer_engine-2.20.2-py3-none-any.whl",
                "transformer_engine_cu12-2.20.2-py3-none-manylinux_2_28_x86_64.whl")
    p = install_plan.plan(H100, find_links=str(wh), no_index=True)
    assert not p.ok and any("transformer-engine-torch==2.20.2" in r for r in p.refusals)


def test_offline_plan_refuses_a_core_for_the_wrong_cuda_major(tmp_path):
    wh = _touch(
        tmp_path / "wh",
        "transformer_engine-2.20.2-py3-none-any.whl",
        "transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl",
        "transformer_engine_torch-2.20.2.tar.gz",
    )
    p = install_plan.plan(H100, find_links=str(wh), no_index=True)  # torch is CUDA 12
    assert any("transformer-engine-cu12==2.20.2" in r for r in p.refusals)


def test_no_index_needs_a_wheelhouse():
    assert any("--find-links" in r for r in install_plan.plan(H100, no_index=True).refusals)


# ----------------------------------------------------------- the real subprocess path, local wheelhouse
@pytest.fixture(scope="module")
def wheelhouses(tmp_path_factory):
    return build_wheelhouses(tmp_path_factory.mktemp("wheelhouses"))


def _te_in_project_venv() -> set[str]:
    """The TE distributions the project's own environment has (none on CI; some on a GPU box or NGC)."""
    return {f"{d.metadata['Name']} {d.version}" for d in importlib.metadata.distributions()
            if (d.metadata["Name"] or "").lower().startswith("transformer")}


@pytest.fixture
def project_venv_untouched():
    """The installs below go to --target folders: the project's environment keeps whatever TE it had."""
    before = _te_in_project_venv()
    yield
    assert _te_in_project_venv() == before


def test_install_from_local_wheelhouse_succeeds_and_records_everything(wheelhouses, tmp_path, project_venv_untouched):
    good, _ = wheelhouses
    site = tmp_path / "site"
    o = install.install_te(machine(), find_links=str(good), no_index=True, target=str(site), out=tmp_path / "results",
                           progress=False)
    assert o.te_mode == "transformer_engine" and o.ok, o.reason
    assert [s["name"] for s in o.steps] == ["runtime-deps", "transformer-engine"]
    assert all(s["returncode"] == 0 for s in o.steps)
    assert o.te_version == FAKE_VERSION
    assert (site / "transformer_engine" / "pytorch" / "__init__.py").exists() and (site / "tiny_dep.py").exists()
    run = Path(o.run_dir)
    assert {p.name for p in run.iterdir()} >= {
        "install.log",
        "plan.json",
        "probe_before.json",
        "probe_after.json",
        "outcome.json",
    }
    log = (run / "install.log").read_text()
    assert "Successfully installed transformer_engine-9.9.0" in log and "[exit 0]" in log
    after = json.loads((run / "probe_after.json").read_text())
    assert after["te_available"] and after["te_packages"] == {
        "transformer-engine": FAKE_VERSION,
        "transformer-engine-cu12": FAKE_VERSION,
        "transformer-engine-torch": FAKE_VERSION,
    }
    assert json.loads((run / "outcome.json").read_text())["te_mode"] == "transformer_engine"
    assert install.last_outcome(tmp_path / "results")["run_dir"] == o.run_dir
    assert "einops" in " ".join(json.loads((run / "plan.json").read_text())["warnings"])  # required, not in wheelhouse


def test_failed_extension_build_falls_back_with_log_and_diagnosis(wheelhouses, tmp_path, project_venv_untouched):
    _, broken = wheelhouses
    o = install.install_te(machine(), find_links=str(broken), no_index=True, target=str(tmp_path / "site"),
                           out=tmp_path / "results", progress=False)
    assert o.te_mode == "fallback" and not o.ok
    assert o.steps[-1] == {**o.steps[-1], "name": "transformer-engine", "returncode": 1}
    assert "failed (exit 1)" in o.reason and "cuDNN" in o.reason
    assert o.diagnosis[0]["id"] == "cudnn_headers_missing"
    assert "fatal error: cudnn.h" in o.diagnosis[0]["evidence"]
    assert any("CUDNN_PATH=" in c for c in o.diagnosis[0]["fix"])
    log = Path(o.log).read_text()
    assert "fatal error: cudnn.h: No such file or directory" in log and "[exit 1]" in log
    assert any("Failed" in line or "ERROR" in line for line in o.log_tail)
    saved = json.loads((Path(o.run_dir) / "outcome.json").read_text())
    assert saved["te_mode"] == "fallback" and saved["diagnosis"][0]["id"] == "cudnn_headers_missing"


def test_streamed_output_reaches_the_caller(wheelhouses, tmp_path, capsys):
    good, _ = wheelhouses
    install.install_te(machine(), find_links=str(good), no_index=True, target=str(tmp_path / "site"),
                       out=tmp_path / "results", progress=True)
    out = capsys.readouterr().out
    assert "Successfully installed tiny-dep-1.0" in out and "install-te: transformer_engine:" in out


def test_refused_install_runs_nothing_and_records_the_reason(tmp_path):
    o = install.install_te(T4, out=tmp_path, progress=False)
    assert o.refused and o.te_mode == "fallback" and o.steps == []
    assert "below 8.0" in o.reason
    run = Path(o.run_dir)
    assert (run / "outcome.json").exists() and not (run / "probe_after.json").exists()


@pytest.fixture
def probed_as(monkeypatch):
    """Make the CLI's probe return a simulated machine, whatever this one has (CPU CI, a GPU box with TE)."""
    def use(env: dict) -> None:
        monkeypatch.setattr(probe, "probe", lambda: env)
    return use


def test_cli_dry_run_prints_the_plan_and_exits_2_when_refused(capsys, probed_as):
    probed_as(T4)
    rc = cli.main(["install-te", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 2 and "preflight: REFUSED" in out and "below 8.0" in out


# ------------------------------------------------------------------------- nvcc that exists but is broken
BROKEN_NVCC = machine(nvcc_version=None, nvcc_problem="`nvcc --version` exited 127: nvcc: error while loading "
                                                      "shared libraries: libnvvm.so.4")


def test_a_broken_nvcc_refuses_a_build_from_source():
    p = install_plan.plan(BROKEN_NVCC, build_from_source=True)
    assert not p.ok and p.steps == []
    assert any(r.startswith("nvcc present but unusable: `nvcc --version` exited 127: nvcc: error while loading")
               for r in p.refusals), p.refusals


def test_a_broken_nvcc_is_a_warning_where_pip_may_not_compile():
    p = install_plan.plan(BROKEN_NVCC)
    assert p.ok and any(w.startswith("if it compiles: nvcc present but unusable") for w in p.warnings)


def test_an_nvcc_printing_garbage_found_by_the_probe_refuses_the_build(tmp_path):
    nvcc = fake_nvcc(tmp_path, r"printf '\033[1m\377\376 segmentation fault\n'")
    path, version, problem = probe._nvcc(str(tmp_path))
    p = install_plan.plan(machine(nvcc_path=path, nvcc_version=version, nvcc_problem=problem, cuda_home=str(tmp_path)),
                     build_from_source=True)
    refusal = next(r for r in p.refusals if r.startswith("nvcc present but unusable"))
    assert str(nvcc) in refusal and "segmentation fault" in refusal and refusal.isprintable()


# ------------------------------------------------------------------------ user input: one line, exit 2
def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def test_cli_version_that_is_not_a_version_names_the_field_and_what_is_allowed(capsys, probed_as):
    probed_as(H100)
    assert cli.main(["install-te", "--version", "nope", "--dry-run"]) == 2
    line = _one_line_error(capsys)
    assert "--version 'nope'" in line and "PEP 440" in line


def test_cli_max_jobs_below_one_is_refused(capsys, probed_as):
    probed_as(H100)
    assert cli.main(["install-te", "--max-jobs", "0", "--build-from-source", "--dry-run"]) == 2
    assert "--max-jobs 0" in _one_line_error(capsys)


def test_cli_out_that_cannot_be_created_is_one_line(tmp_path, capsys, probed_as):
    probed_as(T4)
    (tmp_path / "file").write_text("")
    assert cli.main(["install-te", "--out", str(tmp_path / "file" / "install")]) == 2
    assert "--out" in _one_line_error(capsys)


def test_find_links_to_a_missing_folder_is_refused_with_its_name(tmp_path):
    p = install_plan.plan(H100, find_links=str(tmp_path / "missing"), no_index=True)
    assert not p.ok and any(f"--find-links {tmp_path / 'missing'}: not a folder" == r for r in p.refusals)


def test_find_links_to_an_unreadable_folder_is_refused(tmp_path, monkeypatch):
    def unreadable(folder):  # a fake: this CI machine runs as root, for whom no folder is unreadable
        raise PermissionError(13, "Permission denied", str(folder))

    monkeypatch.setattr(install_plan, "scan_wheelhouse", unreadable)
    p = install_plan.plan(H100, find_links=str(tmp_path), no_index=True)
    assert not p.ok and any("cannot read the folder (Permission denied)" in r for r in p.refusals)


def test_a_truncated_sdist_in_the_wheelhouse_does_not_stop_the_plan(tmp_path):
    wh = _touch(tmp_path / "wh", "transformer_engine-2.20.2-py3-none-any.whl",
                "transformer_engine_cu12-2.20.2-py3-none-manylinux_2_28_x86_64.whl")
    whole = tmp_path / "whole.tar.gz"
    with tarfile.open(whole, "w:gz") as t:
        data = os.urandom(200_000)  # incompressible, so a cut lands inside the archive
        for name, payload in (("transformer_engine_torch-2.20.2/PKG-INFO", b"Name: transformer_engine_torch\n"),
                              ("transformer_engine_torch-2.20.2/big", data)):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            t.addfile(info, io.BytesIO(payload))
    (wh / "transformer_engine_torch-2.20.2.tar.gz").write_bytes(whole.read_bytes()[:100_000])  # a cut download
    p = install_plan.plan(H100, find_links=str(wh), no_index=True)
    assert p.ok and p.build == "yes"


def test_last_outcome_passes_over_a_damaged_record(tmp_path):
    for stamp, text in (("20260101-000000", '{"te_mode": "fallback"}'), ("20260102-000000", '{"te_mode": "trans')):
        (tmp_path / stamp).mkdir()
        (tmp_path / stamp / "outcome.json").write_text(text)  # the newest was cut off mid-write
    assert install.last_outcome(tmp_path) == {"te_mode": "fallback"}


def test_build_env_points_cuda_home_at_a_pip_nvcc_when_the_system_has_none():
    env = install_plan.build_env(machine(cuda_home=None, nvcc_path="/venv/site-packages/nvidia/cu13/bin/nvcc"))
    assert env["CUDA_HOME"] == env["CUDA_PATH"] == "/venv/site-packages/nvidia/cu13"


def test_the_fp8_smoke_test_runs_as_a_module_and_says_why_without_te(tmp_path):
    """fp8_smoke runs `python -m workbench.env.smoke` in the target interpreter; where TE does not import (here),
    it fails with the loader's reason rather than a traceback about a missing module."""
    from workbench.env import te as _te

    _, _, why = _te.load()
    found = install.fp8_smoke(sys.executable, log=io.StringIO())
    assert found["ok"] is False and why and why.splitlines()[-1].strip() in found["error"]
    assert "No module named workbench.env.smoke" not in found["error"]


# ------------------------------------------------------------------------ TE's JAX extension (install-te --jax)
JAX_GPU = machine(jax_version="0.11.2", jax_cuda13_plugin_version="0.11.2")
HEALTHY_TE = dict(te_available=True, te_consistent=True, te_version="2.20.2",
                  te_packages={"transformer-engine": "2.20.2", "transformer-engine-cu12": "2.20.2",
                               "transformer-engine-torch": "2.20.2"})


def test_jax_builds_the_extension_after_cudnn_frontend_pinned_to_the_installed_te():
    """Beside a healthy PyTorch side the plan is the JAX steps alone: the frontend first (the build reads its
    headers from the installed distribution), then the extension compiled against the installed jax."""
    p = install_plan.plan(machine(**HEALTHY_TE, jax_version="0.11.2", jax_cuda12_plugin_version="0.11.2"), jax=True)
    assert p.ok and [s.name for s in p.steps] == ["cudnn-frontend", "transformer-engine-jax"]
    assert step(p, "cudnn-frontend").argv[-2:] == ["--no-deps", "nvidia-cudnn-frontend"]  # headers, not its kernels
    build = step(p, "transformer-engine-jax")
    assert build.argv[-1] == "transformer_engine_jax==2.20.2" and "--no-build-isolation" in build.argv
    assert build.env["NVTE_FRAMEWORK"] == "jax" and build.env["NVTE_CUDA_ARCHS"] == "90"
    assert build.env["PYTHONPATH"] == install_plan.PARALLEL_BUILD  # its sources compile on MAX_JOBS threads
    assert "CUDNN_PATH" in build.env and "NVTE_PYTORCH_FORCE_BUILD" not in build.env
    assert not any(n.startswith("nothing to do") for n in p.notes)
    assert [s.name for s in install_plan.plan(machine(**HEALTHY_TE)).steps] == []  # without --jax: nothing to do


def test_jax_follows_the_pytorch_install_from_the_same_offline_wheelhouse(tmp_path):
    tag = H100["python_tag"]
    house = _touch(tmp_path / "wh", "transformer_engine-2.20.2-py3-none-any.whl",
                   "transformer_engine_cu12-2.20.2-py3-none-manylinux_2_28_x86_64.whl",
                   f"transformer_engine_torch-2.20.2-{tag}-{tag}-linux_x86_64.whl",
                   "transformer_engine_jax-2.20.2.tar.gz")
    p = install_plan.plan(JAX_GPU, find_links=str(house), no_index=True, jax=True)
    assert p.ok and [s.name for s in p.steps][-3:] == ["transformer-engine", "cudnn-frontend", "transformer-engine-jax"]
    build = step(p, "transformer-engine-jax")
    assert build.argv[-1] == "transformer_engine_jax==2.20.2"
    assert build.argv[build.argv.index("--find-links") + 1] == str(house) and "--no-index" in build.argv


@pytest.mark.parametrize("changes,words", [
    ({}, "jax is not installed"),
    ({"jax_version": "0.11.2"}, "has no CUDA plugin"),
    ({"jax_version": "0.11.2", "jax_cuda12_plugin_version": "0.11.2", "nvcc_path": None, "nvcc_version": None},
     "nvcc not found"),
])
def test_jax_refuses_what_its_build_cannot_have(changes, words):
    p = install_plan.plan(machine(**HEALTHY_TE, **changes), jax=True)
    assert not p.ok and p.steps == [] and any(r.startswith("--jax:") and words in r for r in p.refusals), p.refusals
    assert install_plan.plan(machine(**HEALTHY_TE, **changes), jax=True, force=True).ok  # --force runs anyway


def test_the_cli_passes_jax_to_the_plan(capsys, probed_as):
    probed_as(JAX_GPU)
    assert cli.main(["install-te", "--jax", "--dry-run", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert "transformer_engine_jax" in printed["commands"][-1] and "NVTE_FRAMEWORK=jax" in printed["commands"][-1]


def test_a_failed_step_is_diagnosed_from_its_own_output_not_what_followed(tmp_path):
    """The verification after a failed step writes to the same log (TE's warning about a missing JAX .so, on the
    H200): the doctor must read the failed step's lines alone, or it names the wrong cause."""
    log = tmp_path / "install.log"
    step_text = "$ pip install\nERROR: No matching distribution found for transformer-engine-torch==9.9.9\n[exit 1]\n"
    log.write_text("plan\n" + step_text + "$ fp8 smoke test\nRuntimeWarning: Detected a Jax installation but could "
                   "not find the shared object file for the Transformer Engine Jax extension library.\n")
    start = len("plan\n")
    failed = (install_plan.Step("transformer-engine", ["pip"]), start, start + len(step_text))
    o = install._step_failed(H100, {"te_available": False}, None, [{"name": "transformer-engine", "returncode": 1}],
                             failed, log)
    assert [d["id"] for d in o.diagnosis] == ["package_not_in_index"], o.diagnosis
