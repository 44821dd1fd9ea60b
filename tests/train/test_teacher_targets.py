"""Teacher targets whose memory does not grow with the run's length (distill.teacher_mode) and the
head-fused loss (distill.loss_impl=fused_head), on a CPU."""
import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from workbench import backends, config
from workbench.config import ConfigError, DistillConfig
from workbench.models import CausalLM, LMShape
from workbench.models.lm import HeadFeatures
from workbench.train import lm_task, loop, teacher_targets
from workbench.train.objectives import lm_objectives as lo
from workbench.train.objectives.head_loss import head_fused_loss
from workbench.train.teacher_targets import topk_store as tt
from workbench.train.teacher_targets.online import OnlineBatches

# The loss kernels' settings as a distill config, at the defaults these tests were written for (T = 1, no CE)
D = functools.partial(DistillConfig, loss="forward_kl", temperature=1.0, ce_weight=0.0)

CPU = torch.device("cpu")


def tiny(**over):
    base = dict(corpus_mb=0.05, tokenizer="bytes", vocab=256, hidden=32, intermediate=64, layers=1, heads=2, seq_len=16,
                batch=2, steps=5, eval_batches=1, warmup=0, iters=1, teacher="random", topk=256, temperature=2.0,
                no_kd_student=False)
    return config.from_preset("gpt-cpu", **{**base, **over})


# ---- identical students ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def three_modes(tmp_path_factory):
    """One student per teacher mode, k = vocab: top-k over every token is the full distribution."""
    cache = tmp_path_factory.mktemp("cache")
    out = {}
    for mode in ("precomputed", "online", "topk"):
        cfg = tiny(teacher_mode=mode).validate()
        task = lm_task.LMTask(cfg, CPU, None, cache)
        data = task.make_data()
        student = loop.prepare(backends.make("torch_fp32"), cfg, task, CPU)
        metrics, losses = loop.run_student(student, cfg, task, data, CPU)
        out[mode] = task, data, metrics, losses
    return out


def test_online_topk_and_precomputed_teachers_train_identical_students(three_modes):
    pre, online, topk = (three_modes[m] for m in ("precomputed", "online", "topk"))
    assert [t.info["teacher_mode"] for t, *_ in (pre, online, topk)] == ["precomputed", "online", "topk"]
    assert isinstance(online[1].train, OnlineBatches) and isinstance(topk[1].train, tt.TopKBatches)
    # the same teacher forward on the same batches, the same loss: bit for bit
    assert online[3] == pre[3]
    # the top-k loss is other arithmetic (k + 1 buckets, checkpointed) of the same distribution
    np.testing.assert_allclose(topk[3], pre[3], rtol=1e-5)
    for key in ("kl_teacher_student_t1_nats", "heldout_ce_nats", "top1_agreement"):
        assert topk[2][key] == pytest.approx(pre[2][key], rel=1e-4), key
    assert pre[2]["initial_loss"] == online[2]["initial_loss"] == pytest.approx(topk[2]["initial_loss"], rel=1e-6)


def test_every_mode_is_recorded_with_why(three_modes):
    for mode, (task, *_) in three_modes.items():
        cells = task.cells()
        assert cells["teacher_mode"] == mode and cells["teacher_mode_reason"] == "requested"
        assert cells["teacher_topk"] == (256 if mode == "topk" else None)
    topk_task = three_modes["topk"][0]
    assert topk_task.loss_impl == "checkpointed"  # what the top-k loss runs as, not the fused one auto picks
    assert Path(topk_task.info["teacher_topk_store"], "meta.json").exists()


def test_a_top_k_run_reuses_its_store(three_modes):
    task = three_modes["topk"][0]
    folder = Path(task.info["teacher_topk_store"])
    stamp = (folder / "values.bin").stat().st_mtime_ns
    again = lm_task.LMTask(task.cfg, CPU, None, task.cache_dir)
    again.make_data()
    assert again.info["teacher_topk_store"] == str(folder) and again.info["teacher_topk_rebuilt"] is None
    assert (folder / "values.bin").stat().st_mtime_ns == stamp


def test_streamed_batches_are_checked_by_what_they_share(three_modes):
    _, data, *_ = three_modes["online"]
    assert data.train.shared_tensors()[0] is data.train.windows
    before = data.fingerprint()
    data.train.windows[0, 0, 0] += 1  # a student that wrote into the shared tokens would be caught
    assert not torch.equal(before, data.fingerprint())
    data.train.windows[0, 0, 0] -= 1


def test_auto_is_precomputed_where_the_logits_fit_else_online_saying_why():
    mode, *fits = teacher_targets.choose("auto", lambda train: "gpu")
    assert (mode.name, *fits) == ("precomputed", "the precomputed logits fit (gpu)", "gpu")

    def too_big(train):
        if train:
            raise ConfigError("the teacher's logits of the training batches (4300.0 GiB) fit neither place")
        return "gpu"

    mode, why, where = teacher_targets.choose("auto", too_big)
    assert mode.name == "online" and where is None and "4300.0 GiB" in why and why.endswith("-> online")
    with pytest.raises(ConfigError, match="fit neither"):
        teacher_targets.choose("precomputed", too_big)  # asked for explicitly: refused up front, as before
    assert teacher_targets.choose("topk", too_big)[0].name == "topk"


def test_the_distillation_step_adds_the_online_teachers_forward():
    step = teacher_targets.step_cells
    assert step("online", 3.0, 10.0) == {"teacher_step_ms_median": 3.0, "distill_step_ms_median": 13.0}
    assert step("topk", 3.0, 10.0) == {"teacher_step_ms_median": 0.0, "distill_step_ms_median": 10.0}
    assert step("online", 3.0, None)["distill_step_ms_median"] is None  # a skipped student: unknown


@pytest.mark.parametrize("over, match", [
    ({"teacher_mode": "offline"}, "distill.teacher_mode"),
    ({"teacher_mode": "topk", "topk": 300}, "distill.topk=300 must be at most model.vocab=256"),
    ({"teacher_mode": "topk", "loss_impl": "fused_head"}, "distill.loss_impl='fused_head' needs full teacher logits"),
    ({"topk": 0}, "distill.topk must be a positive integer"),
    ({"loss_impl": "fused_head", "loss": "jsd"}, "fused_head' computes forward_kl only"),
])
def test_bad_teacher_mode_settings_are_refused_naming_the_field(over, match):
    """The name by the configuration's Literal; what a mode refuses by the mode, which every driver asks
    before it starts anything (runner.check_registered) and the task again once model.vocab is resolved."""
    from workbench.run import runner

    for check in (runner.check_registered, teacher_targets.check):
        with pytest.raises(ConfigError, match=match):
            check(tiny(**over).validate())


# ---- the top-k loss -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["forward_kl", "reverse_kl", "jsd"])
def test_top_k_over_the_whole_vocabulary_is_the_full_divergence(kind):
    torch.manual_seed(0)
    s, t = torch.randn(12, 40, requires_grad=True), torch.randn(12, 40) * 3
    values, indices, rest = tt.topk_targets(t, 40, 2.0)
    assert torch.isneginf(rest).all()  # an empty tail
    got = lo.topk_kd_per_token(s, values, indices, rest, kind, 2.0)
    want = lo.kd_per_token(s, t, kind, 2.0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    (grad,) = torch.autograd.grad(got.sum(), s)
    assert torch.isfinite(grad).all()  # the empty tail's floor keeps 0 * inf out of the backward


def test_top_k_forward_kl_is_the_kl_of_the_bucketed_distributions():
    torch.manual_seed(1)
    s, t, k, temp = torch.randn(5, 30, dtype=torch.float64), torch.randn(5, 30, dtype=torch.float64), 4, 1.5
    values, indices, rest = tt.topk_targets(t, k, temp)
    got = lo.topk_kd_per_token(s, values, indices, rest, "forward_kl", temp)
    p, q = torch.softmax(t / temp, -1), torch.softmax(s / temp, -1)
    top = torch.zeros_like(p, dtype=torch.bool).scatter(-1, indices, True)
    pb = torch.cat([p.gather(-1, indices), (p * ~top).sum(-1, keepdim=True)], -1)
    qb = torch.cat([q.gather(-1, indices), (q * ~top).sum(-1, keepdim=True)], -1)
    want = (pb * (pb.log() - qb.log())).sum(-1) * temp ** 2
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)  # the teacher side runs in fp32


# ---- the store: kill, damage, memory --------------------------------------------------------------------
def recipe(steps=3, k=8, vocab=64, batch=2, seq_len=8):
    return {"teacher": "fake", "steps": steps, "batch": batch, "seq_len": seq_len, "k": k, "vocab": vocab,
            "temperature": 1.0, "value_dtype": "float32"}


def windows_and_teacher(r):
    gen = torch.Generator().manual_seed(0)
    windows = [torch.randint(0, r["vocab"], (r["batch"], r["seq_len"] + 1), generator=gen) for _ in range(r["steps"])]
    table = torch.randn(r["vocab"], r["vocab"], generator=gen)
    return windows, lambda w: table[w[:, :-1]]  # a deterministic stand-in teacher: logits from the token


def build(folder, r, **kw):
    windows, teacher = windows_and_teacher(r)
    tt.build_store(folder, r, windows, teacher, **kw)


def test_the_store_holds_the_top_k_of_every_step(tmp_path):
    r = recipe()
    build(tmp_path / "s", r)
    store = tt.TopKStore(tmp_path / "s", r)
    windows, teacher = windows_and_teacher(r)
    batches = tt.TopKBatches(store, CPU)
    tokens, targets = batches[2]
    values, indices, rest = tt.topk_targets(teacher(windows[2]), r["k"], 1.0)
    assert torch.equal(tokens, windows[2][:, :-1]) and torch.equal(targets.next_tokens, windows[2][:, 1:])
    assert torch.equal(targets.out, values) and torch.equal(targets.indices.long(), indices)
    assert targets.indices.dtype == torch.int16  # vocab < 32768
    torch.testing.assert_close(targets.rest_lse, rest)
    assert [b[0].shape for b in batches] == [tokens.shape] * 3


KILLED_BUILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path[:0] = [sys.argv[2], sys.argv[3]]
    from test_teacher_targets import build, recipe, tt

    def on_step(i):
        if i == 1:
            Path(sys.argv[1] + ".started").touch()
            time.sleep(600)  # killed here, half-written

    folder, r = Path(sys.argv[1]), recipe(steps=4)
    tt.ensure_store(folder, r, lambda: build(folder, r, on_step=on_step))  # as a run does: under the store's lock
""")


def _paused_build(folder: Path) -> subprocess.Popen:
    """Another process building the store at `folder` (recipe(steps=4)) under its lock, paused half-written at
    step 1."""
    here = str(Path(__file__).parent)
    proc = subprocess.Popen([sys.executable, "-c", KILLED_BUILD, str(folder), here, str(Path(here).parents[1])])
    deadline = time.monotonic() + 120  # a bound on a hang, not a timed assertion
    while not Path(f"{folder}.started").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the build did not start")
        time.sleep(0.1)
    return proc


def _temporaries(folder: Path) -> list[str]:
    """The files a build writes before it renames them into place (data.cache.Entry.writing)."""
    return sorted(p.name for p in folder.glob(".*.tmp"))


def test_a_store_killed_mid_write_never_looks_complete_and_is_built_again(tmp_path):
    folder, r = tmp_path / "topk-x", recipe(steps=4)
    proc = _paused_build(folder)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (folder / "meta.json").exists() and not list(folder.glob("*.bin"))  # nothing under its own name
    assert [n.split(".")[1] for n in _temporaries(folder)] == ["indices", "rest_lse", "values", "windows"]
    with pytest.raises(tt.DamagedStore, match="meta.json is missing"):
        tt.TopKStore(folder, r)
    said = []
    store, why = tt.ensure_store(folder, r, lambda: build(folder, r), say=said.append)
    assert len(store) == 4 and why == "" and said == []  # a plain miss (its lock died with it): built, no word
    assert _temporaries(folder) == []  # the killed build's leftovers are gone
    assert sorted(p.name for p in folder.iterdir()) == ["indices.bin", "meta.json", "rest_lse.bin", "values.bin",
                                                        "windows.bin"]


def test_a_live_build_is_waited_for_and_a_killed_one_is_built_again_by_the_waiter(tmp_path):
    """Liveness is the store's lock (a file lock the kernel, or a shared file system's lock manager, drops when
    its holder dies, whatever host or container it ran in), never a process ID: a second process waits while the
    first builds, and builds the store itself once the first is killed."""
    import threading

    folder, r = tmp_path / "topk-x", recipe(steps=4)
    proc = _paused_build(folder)
    said, got = [], {}
    waiter = threading.Thread(target=lambda: got.update(
        got=tt.ensure_store(folder, r, lambda: build(folder, r), say=said.append)))
    try:
        waiter.start()
        deadline = time.monotonic() + 60  # a bound on a hang, not a timed assertion
        while not said and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(said) == 1 and "waiting for another process building" in said[0]
        assert waiter.is_alive() and not (folder / "meta.json").exists()
        assert len(_temporaries(folder)) == 4  # the live build's files, left alone
    finally:
        proc.kill()
        proc.wait()
    waiter.join(120)
    store, why = got["got"]
    assert len(store) == 4 and why == "" and len(said) == 1
    assert _temporaries(folder) == []


def test_a_build_stopped_by_an_error_leaves_no_store_and_the_next_one_builds_it(tmp_path):
    folder, r = tmp_path / "topk-x", recipe(steps=4)

    def stop(i):
        if i == 1:
            raise RuntimeError("stopped mid-write")

    with pytest.raises(RuntimeError, match="stopped mid-write"):
        tt.ensure_store(folder, r, lambda: build(folder, r, on_step=stop))
    assert sorted(p.name for p in folder.iterdir()) == []  # no meta.json, no file, no temporary file
    said = []
    store, why = tt.ensure_store(folder, r, lambda: build(folder, r), say=said.append)
    assert len(store) == 4 and why == "" and said == []  # the lock was released: no wait


@pytest.mark.parametrize("damage, match, reported", [
    (lambda f: f.joinpath("values.bin").write_bytes(b"\0" * 5), "values.bin has 5 bytes", True),
    (lambda f: _flip_a_byte(f / "indices.bin"), "indices.bin changed after it was written", True),
    (lambda f: f.joinpath("meta.json").write_text("{"), "meta.json is unreadable", True),
    (lambda f: f.joinpath("windows.bin").unlink(), "windows.bin is missing", True),
    # no meta.json is a plain miss, as a killed build leaves: rebuilt without a reason
    (lambda f: f.joinpath("meta.json").unlink(), "meta.json is missing", False),
])
def test_a_damaged_store_is_refused_by_its_check_and_rebuilt(tmp_path, damage, match, reported):
    r, folder = recipe(), tmp_path / "s"
    build(folder, r)
    good = tt.TopKStore(folder, r).host(1)["values"].clone()
    damage(folder)
    with pytest.raises(tt.DamagedStore, match=match):
        tt.TopKStore(folder, r)
    said = []
    store, why = tt.ensure_store(folder, r, lambda: build(folder, r), say=said.append)
    assert torch.equal(store.host(1)["values"], good)
    if reported:
        assert why.startswith("the top-k store was damaged and was rebuilt: ") and match in why
        assert len(said) == 1 and match in said[0] and str(folder) in said[0]
    else:
        assert why == "" and said == []


@pytest.mark.parametrize("meta, reason", [
    (lambda m: {**m, "format": 1}, "meta.json is of format 1, this workbench writes format 2"),
    (lambda m: {**m, "recipe": {**m["recipe"], "k": 4}}, "meta.json was written for another recipe"),
    # format 1, before the store was a cache entry: its record is keyed by array, not file name; its format is
    # the reason, not a file its record does not name
    (lambda m: {**m, "format": 1, "files": {name.removesuffix(".bin"): v for name, v in m["files"].items()}},
     "meta.json is of format 1, this workbench writes format 2"),
])
def test_a_store_of_another_format_or_recipe_is_rebuilt_saying_which(tmp_path, meta, reason):
    r, folder = recipe(), tmp_path / "s"
    build(folder, r)
    good = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps(meta(good)))
    with pytest.raises(tt.DamagedStore, match=reason):
        tt.TopKStore(folder, r)
    said = []
    store, why = tt.ensure_store(folder, r, lambda: build(folder, r), say=said.append)
    assert why == f"the top-k store was damaged and was rebuilt: {reason}"
    assert len(said) == 1 and reason in said[0]
    assert json.loads((folder / "meta.json").read_text()) == good and len(store) == r["steps"]


def test_a_rebuild_removes_the_old_store_before_writing_the_new_one(tmp_path):
    # a store is GBs: the old one and the new one never sit on the disk together
    r, folder = recipe(), tmp_path / "s"
    build(folder, r)
    (folder / "meta.json").write_text(json.dumps({**json.loads((folder / "meta.json").read_text()), "format": 1}))
    seen = []
    tt.ensure_store(folder, r, lambda: build(folder, r, on_step=lambda i: seen.append(
        sorted(p.name for p in folder.iterdir() if not p.name.endswith(".tmp")))))
    assert seen == [[]] * r["steps"]  # while it wrote: no meta.json, no .bin of the old store


def test_the_leftovers_of_a_format_1_build_killed_mid_way_are_removed(tmp_path):
    # format 1 built in <store>.tmp-<pid>-<id>/ beside a lock file and renamed it; a killed one left both
    r, folder = recipe(), tmp_path / "topk-x"
    old = tmp_path / "topk-x.tmp-123-abcd1234"
    old.mkdir()
    (old / "values.bin").write_bytes(b"\0" * 64)
    (tmp_path / ".topk-x.tmp-123-abcd1234.lock").touch()
    other = tmp_path / "topk-y.tmp-9-ffff0000"  # another store's: not this one's to clear
    other.mkdir()
    tt.ensure_store(folder, r, lambda: build(folder, r))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".topk-x.lock", "topk-x", "topk-y.tmp-9-ffff0000"]


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[3] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_store_of_another_recipe_is_not_taken_for_this_one(tmp_path):
    build(tmp_path / "s", recipe(k=8))
    with pytest.raises(tt.DamagedStore, match="another recipe"):
        tt.TopKStore(tmp_path / "s", recipe(k=4))


def test_a_store_that_fails_its_check_after_a_fresh_build_is_refused(tmp_path):
    r, folder = recipe(), tmp_path / "s"

    def bad_build():
        build(folder, r)
        (folder / "rest_lse.bin").write_bytes(b"")

    with pytest.raises(ConfigError, match="fails its check right after being built.*0 bytes on disk"):
        tt.ensure_store(folder, r, bad_build)
    with pytest.raises(ConfigError, match="fails its check right after being built.*meta.json is missing"):
        tt.ensure_store(tmp_path / "t", r, lambda: None)  # a build that wrote nothing


def test_a_fresh_store_is_hashed_once_as_it_is_written(tmp_path, monkeypatch):
    # GBs on a real teacher: the check right after the build compares sizes; the next open checks the hashes
    from workbench.data import cache

    hashed = []
    real = cache.sha256
    monkeypatch.setattr(cache, "sha256", lambda path: hashed.append(Path(path).name) or real(path))
    r, folder = recipe(), tmp_path / "s"
    tt.ensure_store(folder, r, lambda: build(folder, r))
    assert sorted(hashed) == ["indices.bin", "rest_lse.bin", "values.bin", "windows.bin"]
    hashed.clear()
    tt.ensure_store(folder, r, lambda: pytest.fail("built again"))
    assert sorted(hashed) == ["indices.bin", "rest_lse.bin", "values.bin", "windows.bin"]


def _rss_bytes() -> int:
    """The process's whole resident memory, file-backed pages included (what ru_maxrss / top report): a
    memory-mapped store's read pages count here and stay, so this catches a store that is mapped."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the process's memory from /proc (Linux)")
def test_streaming_the_store_does_not_grow_the_processs_own_memory(tmp_path):
    """The store is read step by step with positioned reads into reused buffers: file pages stay in the kernel's
    page cache, never in the process's resident memory, so what the run holds does not grow with its steps
    (precomputed logits would, and so did a memory-mapped store: its mapped pages are resident)."""
    r = recipe(steps=64, k=512, vocab=512, batch=4, seq_len=64)  # 64 steps x 256 tokens x 512 x 6 B: 50 MB
    windows, teacher = windows_and_teacher(r)
    tt.build_store(tmp_path / "s", r, windows, teacher)
    del windows
    store = tt.TopKStore(tmp_path / "s", r)
    size = store.layout.nbytes()
    assert size > 48 * 2**20
    batches = tt.TopKBatches(store, CPU)
    next(iter(batches))  # allocator warm-up: one step's tensors
    before = _rss_bytes()
    checksum = 0.0
    for tokens, targets in batches:
        checksum += float(targets.out.sum())  # every byte of every step is read
    grown = _rss_bytes() - before
    assert grown < size / 4, f"resident memory grew {grown / 2**20:.1f} MiB over a {size / 2**20:.0f} MiB store"


# ---- the head-fused loss --------------------------------------------------------------------------------
@pytest.mark.parametrize("ce_weight", [0.0, 0.4, 1.0])
def test_the_head_fused_loss_equals_the_checkpointed_loss_and_its_gradients(ce_weight):
    torch.manual_seed(0)
    h = torch.randn(3, 17, 24, requires_grad=True)
    w = (torch.randn(96, 24) / 5).requires_grad_()
    t, y = torch.randn(3, 17, 96), torch.randint(0, 96, (3, 17))
    y[0, :5] = lo.IGNORE_INDEX
    d = D(temperature=2.0, ce_weight=ce_weight, loss_chunk_tokens=10)
    ref = lo.lm_loss(h @ w.t(), t, y, D(**{**vars(d), "loss_impl": "checkpointed"}))
    ref_h, ref_w = torch.autograd.grad(ref, (h, w))
    got = head_fused_loss(HeadFeatures((h, w)), None if ce_weight == 1 else t, y, d)
    got_h, got_w = torch.autograd.grad(got, (h, w))
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_h, ref_h, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got_w, ref_w, rtol=1e-5, atol=1e-7)
    with torch.no_grad():  # evaluation: the same loss, no gradients kept
        assert float(head_fused_loss(HeadFeatures((h, w)), t, y, d)) == pytest.approx(float(ref), rel=1e-6)


def test_a_student_trained_with_the_head_fused_loss_matches_the_checkpointed_one():
    """The model hands over its final hidden states and head weight; the gradients reach every parameter."""
    shape = LMShape(kind="gpt", vocab=64, hidden=16, intermediate=32, layers=1, heads=2, seq_len=8)
    torch.manual_seed(0)
    a = CausalLM(shape)
    b = CausalLM(shape)
    b.load_state_dict(a.state_dict())
    tokens, y, t = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8)), torch.randn(2, 8, 64)
    features = a(tokens, features=True)
    torch.testing.assert_close(features.logits(), b(tokens))
    head_fused_loss(features, t, y, D(ce_weight=0.5, loss_chunk_tokens=5)).backward()
    lo.lm_loss(b(tokens), t, y, D(ce_weight=0.5, loss_chunk_tokens=5, loss_impl="checkpointed")).backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_a_run_with_the_head_fused_loss_trains_like_the_fused_one(tmp_path):
    runs = {}
    for impl in ("fused", "fused_head"):
        cfg = tiny(loss_impl=impl).validate()
        task = lm_task.LMTask(cfg, CPU, None, tmp_path)
        student = loop.prepare(backends.make("torch_fp32"), cfg, task, CPU)
        metrics, losses = loop.run_student(student, cfg, task, task.make_data(), CPU)
        runs[impl] = losses, task.cells()["loss_impl"]
    np.testing.assert_allclose(runs["fused_head"][0], runs["fused"][0], rtol=1e-5)
    assert runs["fused_head"][1] == "fused_head"


def test_a_top_k_runs_task_json_records_its_store(tmp_path):
    """task.json is written after the data are made, so it names the store the run streamed and its size."""
    from workbench import results
    from workbench.run import runner

    cfg = tiny(teacher_mode="topk", topk=8, backends="torch_fp32", baseline="torch_fp32", no_kd_student=False)
    run_dir = runner.run(cfg.validate(), out=tmp_path / "runs", run_id="topk", progress=False)
    task = results.read_json(run_dir / "task.json")
    assert task["teacher_mode"] == "topk"
    assert Path(task["teacher_topk_store"]).is_dir()
    assert task["teacher_topk_store_bytes"] > 0
    assert task["teacher_topk_store_gib"] == round(task["teacher_topk_store_bytes"] / 2**30, 4)
    # the store's key, and the teacher's content it holds, so two runs' stores can be told apart by their task.json
    assert Path(task["teacher_topk_store"]).name == f"topk-{task['teacher_topk_key']}"
    assert len(task["teacher_weights_sha256"]) == 64


# ---- the store's key: the teacher's content (issue 33, item 1) -----------------------------------------------
def _topk_run(cache, **over):
    """(task, its training batches) of a top-k run whose store lives in `cache`."""
    task = lm_task.LMTask(tiny(teacher_mode="topk", topk=16, **over).validate(), CPU, None, cache)
    return task, task.make_data().train


def _store_matches_its_teacher(task, train) -> bool:
    tokens, targets = train[0]
    with torch.no_grad():
        values, _, _ = tt.topk_targets(task.teacher(tokens), 16, task.cfg.distill.temperature)
    return torch.equal(targets.out, values)


def test_a_top_k_store_is_not_reused_for_a_random_teacher_of_another_seed(tmp_path):
    """lm.teacher_seed makes another random teacher: reusing the first one's store would train the second run
    against the first teacher while its KL is measured against its own."""
    five, _ = _topk_run(tmp_path, teacher_seed=5)
    six, train = _topk_run(tmp_path, teacher_seed=6)
    assert six.info["teacher_topk_store"] != five.info["teacher_topk_store"]
    assert six.info["teacher_weights_sha256"] != five.info["teacher_weights_sha256"]
    assert _store_matches_its_teacher(six, train)


def test_a_top_k_store_is_not_reused_after_a_teachers_weights_are_replaced_in_place(tmp_path):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "teacher"
    shape = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape)).save_pretrained(folder)
    over = dict(kind="llama", teacher=str(folder))
    first, _ = _topk_run(tmp_path / "cache", **over)
    torch.manual_seed(1)  # the same folder, path and shapes; other weights
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape)).save_pretrained(folder)
    second, train = _topk_run(tmp_path / "cache", **over)
    assert second.info["teacher_topk_store"] != first.info["teacher_topk_store"]
    assert _store_matches_its_teacher(second, train)
    again, _ = _topk_run(tmp_path / "cache", **over)  # the same content: the same store, found again
    assert again.info["teacher_topk_store"] == second.info["teacher_topk_store"]


def test_the_registry_and_the_configs_literal_name_the_same_modes():
    """The configuration (a leaf) lists the modes for the CLI and the notebooks; the registry is their truth."""
    from workbench.config import DistillConfig, choices

    assert teacher_targets.names() == sorted(w for w in choices(DistillConfig)["teacher_mode"] if w != "auto")
    with pytest.raises(ConfigError, match=r"distill.teacher_mode must be one of \['auto', 'online'"):
        teacher_targets.get("offline")


def test_the_head_fused_backward_runs_once():
    """Its kept gradients are scaled in place by the backward: a second one would scale them twice."""
    h, w = torch.randn(6, 8, requires_grad=True), torch.randn(16, 8, requires_grad=True)
    loss = head_fused_loss(HeadFeatures((h, w)), torch.randn(6, 16), torch.randint(0, 16, (6,)), D(ce_weight=0.5))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="head-fused loss's backward .* runs once"):
        loss.backward()


def test_processes_that_need_one_store_at_once_build_it_once(tmp_path):
    """Two studies of one teacher side by side (`study --cache`) ask for the same store at once: the first builds
    it under the store's lock, the second waits (saying so) and opens that one, building nothing. Threads stand in
    for the processes (each its own lock file handle, as two processes have)."""
    import threading

    folder, r = tmp_path / "topk-x", recipe(steps=4)
    go, waiting, builds = threading.Event(), threading.Event(), []

    def first_build():
        builds.append("first")
        assert go.wait(60)  # a bound on a hang: released once the second is seen waiting
        build(folder, r)

    first = threading.Thread(target=lambda: tt.ensure_store(folder, r, first_build))
    first.start()
    while not builds:  # the first holds the lock and is building
        time.sleep(0.01)

    def said(line):
        assert "waiting for another process building" in line
        waiting.set()
        go.set()

    second = {}
    t = threading.Thread(target=lambda: second.update(
        got=tt.ensure_store(folder, r, lambda: builds.append("second"), say=said)))
    t.start()
    t.join(60)
    first.join(60)
    assert waiting.is_set() and builds == ["first"]
    store, why = second["got"]
    assert len(store) == 4 and why == ""
