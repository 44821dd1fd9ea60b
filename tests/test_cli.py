"""The CLI as a user runs it (subprocesses)."""
import json
import subprocess
import sys

import pytest


def wb(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True, cwd=cwd, timeout=600)


@pytest.mark.slow
def test_run_writes_results_and_prints_summary_last(tmp_path):
    p = wb("run", "--preset", "cpu-smoke", "--set", "steps=3", "--set", "iters=2", "--out", str(tmp_path), "--run-id", "cli")
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["preset"] == "cpu-smoke" and summary["run_dir"].endswith("cli")
    assert (tmp_path / "cli" / "students.csv").exists()


@pytest.mark.parametrize("args, needle", [
    (["--set", "hidden=-1"], "model.hidden must be a positive integer"),
    (["--set", "hidden"], "--set expects field=value"),
    (["--set", "backends=torch_bf16,te_fp9"], "unknown backend 'te_fp9'"),
    (["--set", "loss=kl"], "distill.loss must be one of"),
    (["--preset", "huge"], "unknown preset 'huge'"),
])
def test_bad_input_fails_before_any_work(tmp_path, args, needle):
    p = wb("run", *(["--preset", "cpu-smoke"] if "--preset" not in args else []), *args, "--out", str(tmp_path))
    assert p.returncode == 2 and needle in p.stderr
    assert not any(tmp_path.iterdir()), "nothing may be written for invalid input"


def test_probe_json():
    p = wb("probe", "--json")
    assert p.returncode == 0, p.stderr
    env = json.loads(p.stdout)
    assert {"torch", "gpu_name", "te_available", "fp8_available", "fp8_reason"} <= set(env)
