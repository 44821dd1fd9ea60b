"""The GPU runs are one declared table (scripts/gpu_runs.toml, run by scripts/gpu.sh): every run names folders
and scripts that exist, its bash parses, a dry run prints it, and evidence folders hold results, not code."""
from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = re.compile(r"scripts/[\w/.-]+\.(?:sh|py|toml)")
spec = importlib.util.spec_from_file_location("gpu_runs", ROOT / "scripts" / "gpu.py")
gpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu)
RUNS = gpu.load()


def test_evidence_folders_hold_no_code():
    """A probe that made a result lives in scripts/gpu/ and is a run of the table; results/ keeps its output."""
    assert [str(p.relative_to(ROOT)) for p in (ROOT / "results").rglob("*") if p.suffix in (".py", ".sh")] == []


@pytest.mark.parametrize("name", RUNS)
def test_a_run_fills_existing_reference_folders_and_cites_existing_scripts(name):
    run = RUNS[name]
    assert run["fills"] and all(f.startswith("results/reference/") and (ROOT / f).is_dir() for f in run["fills"])
    assert [s for s in SCRIPT.findall(run["run"]) if not (ROOT / s).is_file()] == []
    assert isinstance(run["budget_s"], int) and 0 < run["budget_s"] <= 600, "one device call is at most 600 s"
    parsed = subprocess.run(["bash", "-n"], input=gpu.script(run, {}), text=True, capture_output=True)
    assert parsed.returncode == 0, parsed.stderr


def test_every_program_under_scripts_gpu_is_a_runs():
    """No orphan programs: each file in scripts/gpu/ is called by a run of the table."""
    cited = {s for run in RUNS.values() for s in SCRIPT.findall(run["run"])}
    assert sorted(str(p.relative_to(ROOT)) for p in (ROOT / "scripts/gpu").iterdir() if p.is_file()
                  if str(p.relative_to(ROOT)) not in cited) == []


def test_one_off_gpu_scripts_do_not_grow_back():
    """New GPU work is a table entry; gpu_tests.sh and gpu_verdict.sh stay as the paths docs and habits call."""
    kept = {"gpu.sh", "gpu.py", "gpu_runs.toml", "gpu_env.sh", "gpu_tests.sh", "gpu_verdict.sh"}
    assert sorted(p.name for p in (ROOT / "scripts").glob("gpu*") if p.is_file() and p.name not in kept) == []
    for sh in [*(ROOT / "scripts").glob("*.sh"), *(ROOT / "scripts/gpu").glob("*.sh")]:
        assert subprocess.run(["bash", "-n", str(sh)]).returncode == 0, sh


def test_docs_and_evidence_readmes_cite_existing_scripts():
    texts = [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml", *(ROOT / "docs").glob("*.md"),
             *(ROOT / "results/reference").rglob("README.md"), *(ROOT / "tests").rglob("*.py")]
    # named as history: "since removed"
    removed = {"scripts/gpu_variants.sh"}
    missing = {(str(t.relative_to(ROOT)), s) for t in texts for s in SCRIPT.findall(t.read_text())
               if s not in removed and not (ROOT / s).exists()}
    assert sorted(missing) == []


def test_list_dry_run_and_a_run_on_the_cpu(tmp_path, monkeypatch, capsys):
    assert gpu.main(["list"]) == 0
    listed = capsys.readouterr().out
    assert all(f"\n{name} " in f"\n{listed}" for name in RUNS)
    monkeypatch.delenv("PRESETS", raising=False)
    assert gpu.main(["--dry-run", "core", "PRESETS=seed"]) == 0
    out = capsys.readouterr().out
    assert "export PRESETS=seed\n" in out and "source scripts/gpu_env.sh" in out and "workbench run" in out
    with pytest.raises(SystemExit, match="no knob NOPE"):
        gpu.main(["--dry-run", "core", "NOPE=1"])
    # a real run of a one-entry table: command line over environment over default, extra arguments as "$@"
    table = tmp_path / "runs.toml"
    table.write_text("[echo]\nabout = 'a'\nkind = 'nvidia-h200'\nbudget_s = 1\nfills = ['results/reference']\n"
                     "knobs = { A = 'a0', B = 'b0', C = 'c0' }\n"
                     "run = 'echo \"$A $B $C $# $1\" > \"$OUT/echo.txt\"'\n")
    monkeypatch.setattr(gpu, "TABLE", table)
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setenv("B", "b-env")
    monkeypatch.setenv("C", "c-env")
    assert gpu.main(["echo", "C=c-cli", "x y"]) == 0
    assert (tmp_path / "echo.txt").read_text() == "a0 b-env c-cli 1 x y\n"


def test_carry_counts_the_tree_and_each_path_against_the_cap(tmp_path, monkeypatch, capsys):
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "a.whl").write_bytes(b"x" * 3 * 2**20)
    (tmp_path / "one.tar.gz").write_bytes(b"x" * 2**20)
    monkeypatch.setattr(gpu, "ROOT", tmp_path)
    monkeypatch.setattr(gpu, "tree_bytes", lambda untracked=True, on_disk=False: 2 * 2**20)
    assert gpu.main(["carry", "wheels", "one.tar.gz", "gone"]) == 0
    out = capsys.readouterr().out
    assert "3.0 MiB  wheels" in out and "1.0 MiB  one.tar.gz" in out and "gone (missing here)" in out
    assert "6.0 MiB of 64 MiB" in out and "over" not in out
    monkeypatch.setattr(gpu, "CARRY_CAP", 5 * 2**20)
    assert gpu.main(["carry", "wheels", "one.tar.gz"]) == 1
    assert "over, carry less" in capsys.readouterr().out


def test_the_tree_measure_counts_untracked_files_git_does_not_ignore(tmp_path, monkeypatch):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("/big/\n")
    (tmp_path / "kept.txt").write_bytes(b"k" * 100)
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "w.whl").write_bytes(b"w" * 1000)
    subprocess.run(["git", "add", ".gitignore"], cwd=tmp_path, check=True)
    monkeypatch.setattr(gpu, "ROOT", tmp_path)
    assert gpu.tree_bytes(untracked=False) == len("/big/\n")
    assert gpu.tree_bytes() == len("/big/\n") + 100  # kept.txt travels, the ignored wheel does not
    # the device tool counts blocks on disk: each small file takes at least one (a 62.8 MiB carry in bytes was
    # refused for being 66.3 MiB on disk)
    assert gpu.tree_bytes(on_disk=True) >= 2 * 512 > gpu.tree_bytes()


@pytest.mark.parametrize("studies,imports", [("pruned+random", True), ("finetune", True), ("here", False),
                                             ("here+finetune", True), ("pruned+random here", True), ("bogus", False)])
def test_quality_real_imports_the_model_when_a_study_asked_for_reads_it(studies, imports):
    """At 33626eb a fresh machine's `STUDIES=pruned+random` call skipped the model's import (a second list of names,
    matched with spaces around them) and every point failed: the decision now comes from each study's arguments."""
    run = RUNS["quality-real"]["run"]
    block = run[run.index("what() {"):run.index('if [ -n "$NEEDS_MODEL" ]')]
    text = f'M=/r/model ROOT_DIR=/r RANDOM_SET= STUDIES={studies!r}\n{block}\necho "[$NEEDS_MODEL]"'
    out = subprocess.run(["bash", "-c", text], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["[1]" if imports else "[]"]
