"""The CLI as a user runs it (subprocesses)."""
import json
import subprocess
import sys

import pytest


def wb(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "workbench", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


@pytest.mark.slow
def test_run_writes_results_and_prints_summary_last(tmp_path):
    p = wb(
        "run",
        "--preset",
        "cpu-smoke",
        "--set",
        "steps=3",
        "--set",
        "iters=2",
        "--out",
        str(tmp_path),
        "--run-id",
        "cli",
    )
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["preset"] == "cpu-smoke" and summary["run_dir"].endswith("cli")
    assert (tmp_path / "cli" / "students.csv").exists()


@pytest.mark.parametrize("args, needle", [
    (["--set", "hidden=-1"], "model.hidden must be a positive integer"),
    (["--set", "hidden"], "--set expects field=value"),
    (["--set", "backends=torch_bf16,te_fp9"], "unknown backend 'te_fp9'"),
    (["--set", "loss=kl"], "distill.loss must be one of"),
    (["--preset", "huge"], "invalid choice: 'huge' (choose from 'seed', 'cpu-smoke', 'large', 'gpt-cpu'"),
    (["--set", "hiden=1024"], "unknown config field 'hiden' (did you mean 'hidden'?)"),
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


def test_version():
    from workbench import __version__

    p = wb("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"workbench {__version__}"


@pytest.mark.parametrize("command", ["run", "notebook", "bench", "config"])
def test_every_command_offers_every_preset(command):
    from workbench import config

    p = wb(command, "--help")
    assert p.returncode == 0, p.stderr
    flat = " ".join(p.stdout.split()).replace("- ", "-")  # argparse wraps the help (lm-\ndistill)
    assert all(name in flat for name in config.PRESETS), flat


def test_config_prints_the_resolved_config_and_runs_nothing(tmp_path):
    p = wb("config", "--preset", "cpu-smoke", "--set", "hidden=96", "--set", "backends=torch_bf16", "--set",
           "baseline=torch_bf16", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    cfg = json.loads(p.stdout)
    assert cfg["model"]["hidden"] == 96 and cfg["preset"] == "cpu-smoke" and cfg["backends"] == ["torch_bf16"]
    assert not any(tmp_path.iterdir())
    bad = wb("config", "--preset", "cpu-smoke", "--set", "hiden=96")
    assert bad.returncode == 2 and "did you mean 'hidden'?" in bad.stderr


@pytest.mark.parametrize("typed, needle", [
    ("runn", "unknown command 'runn': did you mean 'run'?"),
    ("notebok", "did you mean 'notebook'?"),
    ("xyzzy", "choose from probe, run, config"),
])
def test_a_mistyped_command_gets_the_closest_one(typed, needle):
    p = wb(typed, "--preset", "cpu-smoke")
    assert p.returncode == 2 and needle in p.stderr, p.stderr
