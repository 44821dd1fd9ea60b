"""The text, tokenizer and teacher caches: verified on read, rebuilt when damaged, built by one process
while another waits, checked writable before any training; a diverged teacher refused, never cached; a
teacher's non-finite outputs blamed on the teacher; what a run refuses up front leaves no run folder."""
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest
import torch

from workbench import cli, config, results
from workbench.data import TextDataError, TextSpec, cache, load_text
from workbench.data.text import documents
from workbench.run import runner
from workbench.train import Data, objectives
from workbench.train.teacher import lm_teacher

ROOT = Path(__file__).resolve().parents[2]

TEACHER = ["--preset", "gpt-cpu", "--set", "corpus_mb=0.2", "--set", "teacher_steps=5"]


def teacher(capsys, out, *sets: str):
    """`workbench teacher` in this process: (exit code, its JSON line or None, stdout, stderr)."""
    rc = cli.main(["teacher", *TEACHER, "--out", str(out), *(a for s in sets for a in ("--set", s))])
    o = capsys.readouterr()
    lines = o.out.strip().splitlines()
    info = json.loads(lines[-1]) if rc == 0 and lines else None
    return rc, info, o.out, o.err


def run_folders(out):
    return sorted(p.name for p in out.iterdir() if p.name != "cache") if out.exists() else []


# ---- a diverged teacher; non-finite teacher outputs -------------------------------------------------
def test_a_diverged_teacher_is_refused_and_never_cached(tmp_path, capsys):
    rc, _, _, err = teacher(capsys, tmp_path, "teacher_lr=1e9", "teacher_steps=20")
    assert rc == 2 and "diverged" in err and "lm.teacher_lr" in err and "lm.teacher_steps" in err, err
    assert not list((tmp_path / "cache").glob("teacher-*/meta.json"))  # nothing cached to be reused
    for meta in (tmp_path / "cache").glob("*/meta.json"):  # the text's meta: strict JSON
        json.loads(meta.read_text(), parse_constant=lambda c: pytest.fail(f"{meta} holds {c}"))


def test_a_cache_entry_never_records_nan(tmp_path):
    entry = cache.Entry(tmp_path / "x")
    with entry.building() as meta:
        assert meta is None
        with pytest.raises(ValueError):
            entry.commit({"final_loss": float("nan")})
    assert not (tmp_path / "x" / "meta.json").exists()


def _nan_llama(folder):
    transformers = pytest.importorskip("transformers")
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=32))
    with torch.no_grad():
        model.lm_head.weight[3, 5] = float("nan")  # bad weights: every logit of token 3 is NaN
    model.save_pretrained(folder)
    return folder


def test_non_finite_teacher_outputs_are_the_teachers_fault_not_the_students(tmp_path):
    hf = _nan_llama(tmp_path / "nan-llama")
    cfg = config.from_preset("gpt-cpu", kind="llama", vocab=256, tokenizer="bytes", corpus_mb=0.2, teacher=str(hf),
                             seq_len=32, steps=2, backends="torch_fp32")
    with pytest.raises(config.ConfigError, match=r"the teacher's outputs are not finite.*lm.teacher="):
        runner.run(cfg, out=tmp_path / "out", run_id="nan", progress=False)
    assert run_folders(tmp_path / "out") == []  # refused: no half a run folder


def test_the_shared_batch_fingerprint_holds_for_nan_targets():
    """The check that a student wrote into the shared batches compares bit patterns: NaN equals itself."""
    batch = (torch.zeros(2, 3, dtype=torch.long), objectives.Targets(torch.tensor([[1.0, float("nan")]])))
    data = Data(train=[batch], bench=[batch], eval=[batch])
    assert torch.equal(data.fingerprint(), data.fingerprint())
    before = data.fingerprint()
    batch[1].out[0, 0] = 2.0
    assert not torch.equal(data.fingerprint(), before)  # a real change still shows


# ---- two processes building one teacher --------------------------------------------------------------
@pytest.mark.slow
def test_two_processes_build_one_teacher_once(tmp_path):
    """Two `workbench teacher` started together into one --out: one trains, the other waits on the entry's
    lock and reuses its teacher; no temporary file is left."""
    cmd = [sys.executable, "-m", "workbench", "teacher", *TEACHER, "--set", "teacher_steps=60", "--out", str(tmp_path)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    infos = [json.loads(log.strip().splitlines()[-1]) for log in logs]
    assert sorted(i["teacher_cached"] for i in infos) == [False, True], logs
    assert infos[0]["teacher_checkpoint"] == infos[1]["teacher_checkpoint"]
    assert not list((tmp_path / "cache").rglob("*.tmp"))


def test_a_second_builder_waits_for_the_first_and_reuses_its_entry(tmp_path):
    entry, lines = cache.Entry(tmp_path / "e"), []
    with entry.building() as meta:
        assert meta is None
        entry.write_file("a.bin", lambda f: f.write(b"abc"))
        entry.commit({"k": 1})
    other = cache.Entry(tmp_path / "e", say=lines.append)
    with other.lock():  # another process would block here: the lock is a file beside the folder
        pass
    with other.building() as meta:
        assert meta["k"] == 1 and meta["files"]["a.bin"]["bytes"] == 3
    assert lines == []


# ---- damaged entries -------------------------------------------------------------------------------
def _damage(folder_of, how):
    if how == "teacher.pt truncated":
        path = folder_of("teacher") / "teacher.pt"
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)
    elif how == "train.npy cut":
        path = folder_of("text") / "train.npy"
        path.write_bytes(path.read_bytes()[:1000])
    elif how == "tokenizer.json garbage":
        (folder_of("text") / "tokenizer.json").write_bytes(b"\x00garbage" * 100)
    elif how == "heldout.npy deleted":
        (folder_of("text") / "heldout.npy").unlink()
    return {"teacher.pt truncated": "teacher"}.get(how, "text")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """An --out whose cache holds the text and teacher of TEACHER, and what `workbench teacher` said."""
    out = tmp_path_factory.mktemp("built")
    assert cli.main(["teacher", *TEACHER, "--out", str(out)]) == 0
    return out


def _copy(built, tmp_path, capsys):
    """A copy of `built` in tmp_path and the teacher's info there (a cache hit)."""
    shutil.copytree(built / "cache", tmp_path / "cache")
    capsys.readouterr()
    rc, info, _, err = teacher(capsys, tmp_path)
    assert rc == 0 and info["teacher_cached"] is True, err
    return info


@pytest.mark.parametrize("how", ["teacher.pt truncated", "train.npy cut", "tokenizer.json garbage",
                                 "heldout.npy deleted"])
def test_a_damaged_cache_entry_is_rebuilt_with_one_line(built, tmp_path, capsys, how):
    first = _copy(built, tmp_path, capsys)

    def folder_of(kind):
        return Path(first["teacher_checkpoint" if kind == "teacher" else "text_folder"])

    which = _damage(folder_of, how)
    rc, again, out, err = teacher(capsys, tmp_path)
    assert rc == 0, err
    said = [line for line in out.splitlines() if "is damaged" in line]
    assert len(said) == 1 and str(folder_of(which)) in said[0] and "rebuilding" in said[0], out
    assert again["teacher_cached"] is (which != "teacher")  # the text's key is its corpus: the same teacher
    assert again["teacher_heldout_ppl"] == pytest.approx(first["teacher_heldout_ppl"], rel=1e-5)
    for kind in ("text", "teacher"):  # rebuilt whole: a plain hit next time
        assert cache.Entry(folder_of(kind)).damage() is None


def test_an_entry_without_its_file_record_is_rebuilt(tmp_path):
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "meta.json").write_text('{"old": true}')  # what an older workbench wrote
    lines = []
    entry = cache.Entry(tmp_path / "e", say=lines.append)
    assert entry.read() is None
    with entry.building() as meta:
        assert meta is None
    assert len(lines) == 1 and "older workbench" in lines[0]
    assert "older workbench" in entry.damaged  # why, kept for the caller's own records (the top-k store's task.json)


def test_an_entrys_files_written_side_by_side_are_put_in_place_whole_or_not_at_all(tmp_path):
    """Entry.writing (the top-k store's four files, a piece of each per step): under temporary names until the
    block ends, then renamed into place and recorded for commit(); an error inside leaves none of them."""
    folder, entry = tmp_path / "e", cache.Entry(tmp_path / "e")
    with entry.building() as meta:
        assert meta is None and entry.damaged == ""  # a plain miss
        with pytest.raises(RuntimeError, match="stopped"):
            with entry.writing("a.bin", "b.bin") as files:
                files["a.bin"].write(b"a")
                raise RuntimeError("stopped")
        assert list(folder.iterdir()) == [] and entry.written == {}
        with entry.writing("a.bin", "b.bin") as files:
            for step in range(3):
                files["a.bin"].write(b"a" * (step + 1))
                files["b.bin"].write(b"b")
            assert not (folder / "a.bin").exists() and not (folder / "b.bin").exists()
            assert sorted(p.name.split(".")[1] for p in folder.glob(".*.tmp")) == ["a", "b"]
        entry.commit({"k": 1})
    assert sorted(p.name for p in folder.iterdir()) == ["a.bin", "b.bin", "meta.json"]
    assert (folder / "a.bin").read_bytes() == b"aaaaaa" and (folder / "b.bin").read_bytes() == b"bbb"
    meta = cache.Entry(folder).read()
    assert meta["files"]["a.bin"] == {"bytes": 6, "sha256": hashlib.sha256(b"aaaaaa").hexdigest()}
    assert meta["files"]["b.bin"] == {"bytes": 3, "sha256": hashlib.sha256(b"bbb").hexdigest()}


FULL_DISK = textwrap.dedent("""
    import resource, signal, sys
    from pathlib import Path
    from workbench.data import cache
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), as on a full disk
    entry = cache.Entry(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    try:
        with entry.writing("a.bin", "b.bin") as files:
            files["a.bin"].write(b"a" * 6000)  # still in the file's buffer: close() flushes it, and fails
            raise RuntimeError("stopped")
    except BaseException as e:
        print(type(e).__name__, sorted(p.name for p in Path(sys.argv[1]).iterdir()))
""")


def test_side_by_side_files_are_removed_when_closing_them_fails_too(tmp_path):
    # a full disk fails the block and then each file's close (its buffer's flush): the temporaries go all the same,
    # and the block's own error is the one raised
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path / "e")], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.split() == ["RuntimeError", "[]"], done.stdout + done.stderr


# ---- an unwritable cache; a teacher that cannot be cached -------------------------------------------
def test_an_unwritable_cache_is_found_before_any_training(built, tmp_path, capsys, monkeypatch):
    info = _copy(built, tmp_path, capsys)  # the text is cached; the teacher's folder cannot be made again
    blocked = Path(info["teacher_checkpoint"])
    shutil.rmtree(blocked)
    blocked.write_text("a file where the teacher's folder goes")

    def no_training(*a, **k):
        raise AssertionError("trained although the cache cannot be written")

    monkeypatch.setattr(lm_teacher, "train_lm", no_training)
    rc, _, _, err = teacher(capsys, tmp_path)
    assert rc == 2 and str(blocked) in err and "not writable" in err, err
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "cache").write_text("not a folder")  # the whole cache: found before the tokenizer trains
    monkeypatch.setattr("workbench.data.text.train_bpe", no_training)
    rc, _, _, err = teacher(capsys, tmp_path / "ro")
    assert rc == 2 and str(tmp_path / "ro" / "cache") in err and "not writable" in err, err


def test_a_teacher_that_cannot_be_cached_is_used_with_a_note(built, tmp_path, capsys, monkeypatch):
    """A full disk while the teacher is saved (a fake: torch.save writes part of it, then ENOSPC)."""
    real_save = torch.save

    def full_disk(obj, f, *a, **k):
        f.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    shutil.rmtree(Path(_copy(built, tmp_path, capsys)["teacher_checkpoint"]))  # the text cached, not the teacher
    monkeypatch.setattr(torch, "save", full_disk)
    rc, info, out, err = teacher(capsys, tmp_path)
    assert rc == 0, err
    assert info["teacher_cached"] is False and "No space left on device" in info["teacher_cache_error"]
    assert "could not be written" in out
    folder = Path(info["teacher_checkpoint"])
    assert not list(folder.glob(".*.tmp")) and not (folder / "meta.json").exists()
    monkeypatch.setattr(torch, "save", real_save)
    rc, again, _, _ = teacher(capsys, tmp_path)  # the disk has room again: trained and cached now
    assert again["teacher_cached"] is False and "teacher_cache_error" not in again
    assert (folder / "meta.json").exists()


# ---- found before the teacher trains; no run folder for a refused run --------------------------------
def _no_teacher_training(monkeypatch):
    def no_training(*a, **k):
        raise AssertionError("the teacher trained before the refusal")

    monkeypatch.setattr(lm_teacher, "train_lm", no_training)


def test_a_missing_student_folder_is_refused_before_the_teacher_trains_and_leaves_no_run(tmp_path, monkeypatch, capsys):
    _no_teacher_training(monkeypatch)
    rc = cli.main(["run", *TEACHER, "--out", str(tmp_path), "--set", f"student={tmp_path / 'nothing'}"])
    err = capsys.readouterr().err
    assert rc == 2 and "lm.student" in err and "nothing" in err, err
    assert run_folders(tmp_path) == []


def test_a_sequence_longer_than_the_held_out_split_names_the_fields(tmp_path, monkeypatch, capsys):
    _no_teacher_training(monkeypatch)
    rc = cli.main(["run", *TEACHER, "--out", str(tmp_path), "--set", "corpus_mb=0.05", "--set", "seq_len=20000",
                   "--set", "tokenizer=bytes", "--set", "vocab=256"])
    err = capsys.readouterr().err
    assert rc == 2 and "heldout split" in err and "lm.corpus_mb" in err and "model.seq_len" in err, err
    assert "max_bytes" not in err
    assert run_folders(tmp_path) == []


def test_absurd_integers_are_refused_before_the_run_folder_exists(tmp_path, capsys):
    rc = cli.main(["run", *TEACHER, "--out", str(tmp_path), "--set", "vocab=99999999999999999999"])
    err = capsys.readouterr().err
    assert rc == 2 and "model.vocab must be at most 2147483647" in err and "Traceback" not in err, err
    assert run_folders(tmp_path) == []
    with pytest.raises(config.ConfigError, match="train.seed must be at most"):
        config.from_preset("cpu-smoke", seed=2**40)


# ---- Hugging Face folders ----------------------------------------------------------------------------
def _llama(folder, positions=128):
    transformers = pytest.importorskip("transformers")
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=positions)).save_pretrained(folder)
    return folder


def test_a_truncated_safetensors_file_is_one_line(tmp_path):
    from workbench.models.hf import load_causal_lm

    weights = _llama(tmp_path / "cut") / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(config.ConfigError, match="no Hugging Face causal LM loads from"):
        load_causal_lm(str(tmp_path / "cut"))


def test_a_model_with_fewer_positions_than_seq_len_names_both(tmp_path, monkeypatch, capsys):
    hf = _llama(tmp_path / "short", positions=32)
    _no_teacher_training(monkeypatch)
    rc = cli.main(["run", *TEACHER, "--out", str(tmp_path / "out"), "--set", "kind=llama", "--set", "vocab=256",
                   "--set", "tokenizer=bytes", "--set", f"teacher={hf}", "--set", "seq_len=64"])
    err = capsys.readouterr().err
    assert rc == 2 and "lm.teacher" in err and "max_position_embeddings=32" in err and "model.seq_len=64" in err, err
    assert run_folders(tmp_path / "out") == []


# ---- the corpus ----------------------------------------------------------------------------------------
def test_a_binary_corpus_file_is_refused(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"PK\x03\x04" + bytes(range(256)) * 40)
    with pytest.raises(TextDataError, match=r"weights.bin: not text \(a NUL byte"):
        load_text(TextSpec(files=[str(tmp_path / "weights.bin")], tokenizer="bytes"), tmp_path / "cache")


def test_the_corpus_is_read_only_as_far_as_its_budget(tmp_path):
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.write(b"hello world\n" * 100)
        f.write(b"more text\n" * 3_000_000)  # 30 MB, of which 1000 bytes are used
    tracemalloc.start()
    docs = documents(TextSpec(files=[str(big)], max_bytes=1000, tokenizer="bytes"))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert sum(len(t.encode()) for _, t in docs) == 1000
    assert peak < 2_000_000, peak  # not the whole file


def test_a_cut_character_at_the_budget_is_dropped_as_before(tmp_path):
    (tmp_path / "u.txt").write_text("ab€cd", encoding="utf-8")  # '€' is 3 bytes: a budget of 4 cuts it
    assert documents(TextSpec(files=[str(tmp_path / "u.txt")], max_bytes=4, tokenizer="bytes")) == [
        (str(tmp_path / "u.txt"), "ab")
    ]


# ---- torchrun ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_torchrun_ranks_wait_for_the_teacher_on_its_lock_not_a_collective(tmp_path):
    """Two ranks on a CPU (gloo) and a teacher whose training takes longer than parallel.timeout_s: the rank
    that does not train waits on the cache entry's lock (no collective is pending meanwhile), and the run
    prints its summary line once (the launcher's, not rank 0's relayed as well)."""
    timeout_s = 6  # the teacher's 240 steps took 27 s here (results/reference/cpu/test_threads/)
    sets = ["corpus_mb=0.2", "teacher_steps=240", "nproc=2", f"timeout_s={timeout_s}", "scaling_reference=false",
            "steps=4", "warmup=1", "iters=2", "eval_batches=2", "backends=torch_fp32", "no_kd_student=false"]
    proc = subprocess.run([sys.executable, "-m", "workbench", "run", "--preset", "gpt-cpu", "--out", str(tmp_path),
                           "--run-id", "d", *(a for s in sets for a in ("--set", s))],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:]
    task = json.loads((tmp_path / "d" / "task.json").read_text())
    # whichever rank trained it (rank 0's task.json may say cached: the other rank held the lock first)
    trained = json.loads((Path(task["teacher_checkpoint"]) / "meta.json").read_text())
    assert trained["train_s"] > timeout_s, trained  # it did outlast the timeout
    summaries = [line for line in proc.stdout.splitlines() if line.startswith("{") and '"run_dir"' in line]
    assert len(summaries) == 1, proc.stdout[-4000:]
    assert json.loads(summaries[0])["world_size"] == 2


def test_a_full_disk_raising_runtime_error_keeps_the_run_and_says_so_in_its_rows(built, tmp_path, capsys, monkeypatch):
    """PyTorch's zip writer reports a full disk as a RuntimeError, not an OSError: the run still uses the
    teacher it trained, and task.json and every row say it was not cached."""
    def full_disk(obj, f, *a, **k):
        f.write(b"x" * 1000)
        raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0: "
                           "No space left on device")

    shutil.rmtree(Path(_copy(built, tmp_path, capsys)["teacher_checkpoint"]))  # the text cached, not the teacher
    monkeypatch.setattr(torch, "save", full_disk)
    cfg = config.from_preset("gpt-cpu", corpus_mb=0.2, teacher_steps=5, steps=2, backends="torch_fp32",
                             no_kd_student=False, eval_batches=1, warmup=1, iters=2, repeats=1)
    run_dir = runner.run(cfg, out=tmp_path, run_id="full", progress=False)
    info = json.loads((run_dir / "task.json").read_text())
    assert info["teacher_cached"] is False and "No space left on device" in info["teacher_cache_error"]
    rows = results.load(run_dir)
    assert rows["teacher_cache_error"].str.contains("No space left on device").all()
    folder = Path(info["teacher_checkpoint"])
    assert not list(folder.glob(".*.tmp")) and not (folder / "meta.json").exists()
