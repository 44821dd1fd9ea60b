"""The language-model path end to end on a CPU: a GPT student distilled from a trained GPT teacher on the
offline corpus, the no-KD student beside it, the held-out metrics in the rows; a Hugging Face model as
teacher and as student."""
import json

import pandas as pd
import pytest
from hf_fixtures import tiny_llama

from workbench import config, results
from workbench.run import runner


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm")
    cfg = config.from_preset("gpt-cpu", corpus_mb=0.3, backends="torch_fp32,te_fp8:delayed", eval_every=20)
    return cfg, runner.run(cfg, out=out, run_id="gpt", progress=False)


def test_gpt_cpu_writes_the_usual_files_with_the_lm_metrics(gpt_run):
    cfg, run_dir = gpt_run
    for name in ("students.csv", "losses.csv", "summary.json", "config.json", "env.json", "task.json",
                 "loss_curves.png", "step_time.png", "heldout_quality.png", "done.json"):
        assert (run_dir / name).exists(), name
    df = results.load(run_dir).set_index("student")
    assert list(df.index) == ["torch_fp32", "te_fp8:delayed", "torch_fp32:no_kd"]
    for col in ("heldout_ce_nats", "heldout_ppl", "kl_teacher_student_t1_nats", "top1_agreement",
                "teacher_heldout_ppl", "tflops", "tokens_per_s"):
        assert df[col].notna().all(), col
    assert (df["initial_loss"] == df.loc["torch_fp32", "initial_loss"]).all()  # no-KD too: the same measure
    assert results.load_summary(run_dir)["initial_losses_equal"]
    assert df.loc["te_fp8:delayed", "status"] == "fallback"  # no TE on a CPU: says so, still runs
    # the requested loss_impl ('auto') is in cfg_loss_impl; what ran is on every row, as in task.json
    assert (df["loss_impl"] == "fused").all() and (df["cfg_loss_impl"] == "auto").all()
    losses = results.load_losses(run_dir)
    assert len(losses) == cfg.train.steps * 3


def test_distillation_brings_the_student_closer_to_its_teacher_than_text_alone(gpt_run):
    _, run_dir = gpt_run
    df = results.load(run_dir).set_index("student")
    kd, no_kd = df.loc["torch_fp32"], df.loc["torch_fp32:no_kd"]
    assert kd["kl_teacher_student_t1_nats"] < no_kd["kl_teacher_student_t1_nats"]
    assert kd["top1_agreement"] > no_kd["top1_agreement"]


def test_the_teacher_is_trained_once_and_reused(gpt_run, tmp_path):
    cfg, run_dir = gpt_run
    first = results.read_json(run_dir / "task.json")
    assert first["teacher_source"] == "train" and first["teacher_cached"] is False
    again = runner.run(cfg.replace(steps=2, backends="torch_fp32", no_kd_student=False),
                       out=run_dir.parent, run_id="again", progress=False)
    second = results.read_json(again / "task.json")
    assert second["teacher_cached"] is True and second["teacher_checkpoint"] == first["teacher_checkpoint"]
    assert (first["teacher_logits"], first["teacher_logits_requested"]) == ("gpu", "auto")  # a CPU run: its memory
    # where the time before the first student went (a study's point pays it every time)
    for phases in (first["phase_s"], second["phase_s"]):
        assert set(phases) == {"before_run_s", "start_s", "task_s", "data_s"} and min(phases.values()) >= 0


def test_lm_config_errors_name_the_field():
    with pytest.raises(config.ConfigError, match="distill.loss must be one of"):
        config.from_preset("gpt-cpu", loss="mse")
    with pytest.raises(config.ConfigError, match="model.hidden=100 must be a multiple of model.heads=8"):
        config.from_preset("gpt-cpu", hidden=100, heads=8)
    with pytest.raises(config.ConfigError, match="lm.tokenizer"):
        config.from_preset("gpt-cpu", tokenizer="words")
    with pytest.raises(
        config.ConfigError, match=r"distill.loss_impl must be one of \['auto', 'checkpointed', 'fused', 'fused_head'\]"
    ):
        config.from_preset("gpt-cpu", loss_impl="triton")
    with pytest.raises(
        config.ConfigError, match="distill.loss_impl='fused' computes forward_kl only, not distill.loss='jsd'"
    ):
        config.from_preset("gpt-cpu", loss_impl="fused", loss="jsd")


def test_a_hugging_face_llama_as_teacher_and_as_student(tmp_path):
    hf = tiny_llama(tmp_path / "tiny-llama", vocab=256, layers=2)
    cfg = config.from_preset("gpt-cpu", kind="llama", vocab=256, tokenizer="bytes", corpus_mb=0.2, teacher=str(hf),
                             student=str(hf), steps=3, backends="torch_fp32,torch_bf16", no_kd_student=False)
    run_dir = runner.run(cfg, out=tmp_path, run_id="hf", progress=False)
    df = results.load(run_dir).set_index("student")
    assert (df["status"] == "ok").all(), df["reason"].to_dict()
    assert df.loc["torch_fp32", "initial_loss"] == df.loc["torch_bf16", "initial_loss"]
    assert pd.notna(df.loc["torch_fp32", "heldout_ppl"]) and df.loc["torch_fp32", "tflops"] > 0
    assert results.read_json(run_dir / "task.json")["teacher_source"] == str(hf)


def test_held_out_metrics_during_training_make_a_curve(gpt_run):
    cfg, run_dir = gpt_run
    curve = pd.read_csv(run_dir / "eval_curve.csv")
    df = results.load(run_dir).set_index("student")
    steps = list(range(cfg.train.eval_every, cfg.train.steps + 1, cfg.train.eval_every))
    for student, c in curve.groupby("student"):
        assert list(c["step"]) == steps, student
        # the last point is the row's own held-out result
        assert c["heldout_ppl"].iloc[-1] == pytest.approx(df.loc[student, "heldout_ppl"])
    assert (run_dir / "heldout_curves.png").exists()


def test_the_teacher_command_works_on_its_own_default_preset(tmp_path, capsys):
    """`workbench teacher` with no --preset trains gpt-cpu's teacher (the run's 'auto' picks an MLP preset, which
    has no teacher to train); a preset without one is refused naming those that have."""
    import json

    from workbench import cli, teacher

    assert teacher.DEFAULT_PRESET in teacher.teacher_presets() and "lm-distill" in teacher.teacher_presets()
    assert cli.main(["teacher", "--out", str(tmp_path), "--set", "corpus_mb=0.2", "--set", "teacher_steps=5"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["teacher_heldout_ppl"] > 1
    assert cli.main(["teacher", "--preset", "auto", "--out", str(tmp_path)]) == 2
    assert "take --preset gpt-cpu or lm-distill" in capsys.readouterr().err


def test_the_teacher_command_trains_once_then_finds_it(tmp_path, capsys):
    import json

    from workbench import cli

    # 1e8 student steps of host-placed logits fit nowhere: the teacher command, which builds no training
    # batch, must not refuse over them
    argv = ["teacher", "--preset", "gpt-cpu", "--out", str(tmp_path), "--set", "corpus_mb=0.2",
            "--set", "teacher_steps=5", "--set", "steps=100000000", "--set", "teacher_logits=host"]
    assert cli.main(argv) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert cli.main(argv) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["teacher_cached"] is False and second["teacher_cached"] is True
    assert first["teacher_checkpoint"] == second["teacher_checkpoint"] and second["teacher_heldout_ppl"] > 1
    assert cli.main(["teacher", "--preset", "cpu-smoke", "--out", str(tmp_path)]) == 2
    assert "model.kind" in capsys.readouterr().err


@pytest.mark.slow
def test_a_language_model_sweep_through_papermill_with_its_plots_and_report(tmp_path):
    """Two sizes of a GPT student, each point one papermill execution of the main notebook: the teacher is
    trained once for the sweep, each executed notebook shows the held-out plots, the report reads both."""
    import nbformat

    from workbench.sweep import index, plan, run

    fixed = {"corpus_mb": 0.2, "steps": 6, "eval_every": 3, "teacher_steps": 5, "iters": 2, "warmup": 1,
             "teacher_intermediate": 512, "teacher_heads": 4,  # one teacher, whatever the student's size
             "eval_batches": 2, "backends": "torch_fp32", "baseline": "torch_fp32", "no_kd_student": False}
    spec = plan.Spec("lm", "gpt-cpu", fixed, {"hidden": [32, 64]})
    summary = run.run_sweep(spec, root=tmp_path, progress=False)
    assert (summary["done"], summary["failed"]) == (2, 0)
    points = index.complete_points(tmp_path / "lm")
    checkpoints = {results.read_json(p / "task.json")["teacher_checkpoint"] for p in points}
    assert len(checkpoints) == 1  # one teacher for the whole sweep
    for p in points:
        nb = nbformat.read(p / "distill_benchmark.ipynb", as_version=4)
        cell = next(c for c in nb.cells if "language_model_plots" in c.source)
        images = [o for o in cell.outputs if "image/png" in o.get("data", {})]
        assert len(images) == 2, p  # held-out quality, and its curve during training
    report_dir = run.report_only(tmp_path / "lm", reference="torch_fp32")
    report = pd.read_csv(report_dir / "sweep.csv")
    assert sorted(report["cfg_hidden"]) == [32, 64] and report["heldout_ppl"].notna().all()


def test_a_random_teacher_of_the_students_shape_is_not_their_copy(tmp_path):
    import torch

    from workbench.train import lm_task

    cfg = config.from_preset("gpt-cpu", corpus_mb=0.2, teacher="random", teacher_hidden=0, teacher_layers=0)
    task = lm_task.LMTask(cfg, torch.device("cpu"), None, tmp_path)
    t, s = task.teacher.state_dict(), task.reference.state_dict()
    assert t.keys() == s.keys() and not all(torch.equal(t[k], s[k]) for k in t)


def test_lm_shapes_that_cannot_work_are_refused_up_front():
    with pytest.raises(config.ConfigError, match="bytes tokenizer needs at least 256"):
        config.from_preset("gpt-cpu", tokenizer="bytes", vocab=128)
    with pytest.raises(config.ConfigError, match="teacher's width 100 must be a multiple of its 6 heads"):
        config.from_preset("gpt-cpu", teacher_hidden=100)


GIB = 2**30


def test_teacher_logits_go_to_the_gpu_when_they_fit_else_to_the_host_else_the_run_is_refused():
    from workbench.train.teacher_targets.logits_placement import place_teacher_logits as place

    # lm-a at 300 steps: 512 MiB of logits per batch, 150 GiB for training, 3 GiB for the timed and held-out ones
    train, kept = 300 * GIB // 2, 3 * GIB
    assert place("auto", 10 * GIB, kept, 140 * GIB, 100 * GIB) == "gpu"
    assert place("auto", train, kept, 140 * GIB, 256 * GIB) == "host"  # 153 GiB > 60% of 140 free
    assert place("host", 10 * GIB, kept, 140 * GIB, 100 * GIB) == "host"
    assert place("auto", train, kept, None, None) == "gpu"  # a CPU run: the run's device, nothing to check
    with pytest.raises(config.ConfigError, match=r"distill.teacher_logits='gpu': the teacher's logits need 153.0 GiB "
                                                 r"on the GPU, 140.0 GiB are free .*set distill.teacher_logits=host"):
        place("gpu", train, kept, 140 * GIB, 256 * GIB)
    with pytest.raises(config.ConfigError, match=r"training batches \(150.0 GiB\) fit neither place: the GPU has 140.0 "
                                                 r"GiB free, the host 100.0 GiB available"):
        place("auto", train, kept, 140 * GIB, 100 * GIB)
    # two ranks on one host each pin their own 60 GiB: 120 GiB > 80% of 100 GiB, though one rank's would fit
    assert place("host", 60 * GIB, kept, 140 * GIB, 100 * GIB) == "host"
    with pytest.raises(config.ConfigError, match=r"\(60.0 GiB on each of this host's 2 ranks\) fit neither place"):
        place("host", 60 * GIB, kept, 140 * GIB, 100 * GIB, host_ranks=2)
    with pytest.raises(
        config.ConfigError, match=r"timed and held-out batches need 3.0 GiB on the GPU, 4.0 GiB are free"
    ):
        place("host", 10 * GIB, kept, 4 * GIB, 100 * GIB)
    with pytest.raises(config.ConfigError, match="distill.teacher_logits must be one of"):
        config.from_preset("gpt-cpu", teacher_logits="disk")


def _tiny_gpt(**overrides):
    """A GPT of a few thousand parameters on byte tokens with a random teacher: seconds on a CPU."""
    return config.from_preset("gpt-cpu", **{**dict(vocab=256, tokenizer="bytes", corpus_mb=0.1, teacher="random",
                                                  hidden=32, heads=4, intermediate=64, layers=1, seq_len=16, batch=4,
                                                  steps=5, eval_batches=1, warmup=0, iters=1), **overrides})


def test_host_placed_logits_are_judged_for_every_rank_of_the_host(tmp_path, monkeypatch):
    """Under torchrun every rank of a host pins its own training batches' logits: the host's first rank
    checks the memory for LOCAL_WORLD_SIZE of them, not one."""
    import torch

    from workbench.train import lm_task
    from workbench.train.teacher_targets import logits_placement

    cfg = _tiny_gpt(teacher_logits="host", teacher_mode="precomputed")  # auto would turn to the online teacher
    need = cfg.train.steps * cfg.model.batch * cfg.model.seq_len * cfg.model.vocab * 4  # fp32 logits on a CPU
    monkeypatch.setattr(lm_task, "_memory_gb", lambda: (None, 1.5 * need / logits_placement.HOST_LOGITS_SHARE / 2**30))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert lm_task.LMTask(cfg, torch.device("cpu"), None, tmp_path).info["teacher_logits"] == "host"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(config.ConfigError, match="on each of this host's 2 ranks"):
        lm_task.LMTask(cfg, torch.device("cpu"), None, tmp_path)
    # a later rank of the host: rank 0 judged for all of them before anything was pinned; this one needs
    # its own share only (counting the others again against what they left would refuse what fits)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert lm_task.LMTask(cfg, torch.device("cpu"), None, tmp_path).info["teacher_logits"] == "host"


def test_training_on_host_placed_teacher_logits_gives_the_same_losses(tmp_path):
    """The host path (HostBatches: copied per step, one ahead) against logits kept with the batches; on a
    CPU both are the same memory, so this checks the code path end to end, bit for bit (the GPU's copies:
    tests/gpu/test_gpu.py)."""
    import torch

    from workbench import backends
    from workbench.train import lm_task, loop
    from workbench.train.teacher_targets import logits_placement

    cfg = _tiny_gpt(eval_every=2)
    losses = {}
    for where in ("gpu", "host"):
        task = lm_task.LMTask(cfg.replace(teacher_logits=where), torch.device("cpu"), None, tmp_path)
        data = task.make_data()
        assert task.info["teacher_logits"] == where and isinstance(data.train, logits_placement.HostBatches) == (
            where == "host"
        )
        assert len(data.train) == cfg.train.steps
        student = loop.prepare(backends.make("torch_fp32"), task.cfg, task, torch.device("cpu"))
        _, losses[where] = loop.run_student(student, task.cfg, task, data, torch.device("cpu"))
    assert losses["host"] == losses["gpu"]


def test_the_fused_loss_trains_like_the_checkpointed_one(tmp_path, monkeypatch):
    """distill.loss_impl=fused end to end (its gradient written in the forward): the distilled and the
    no-KD student follow the checkpointed loss's curves to fp32 rounding, and the fused loss really ran."""
    import torch

    from workbench import backends
    from workbench.train import lm_task, loop
    from workbench.train.objectives import lm_objectives

    calls = []
    real = lm_objectives._FusedForwardKL.apply
    monkeypatch.setattr(lm_objectives._FusedForwardKL, "apply", lambda *a: calls.append(1) or real(*a))

    cfg = _tiny_gpt(steps=6, loss_chunk_tokens=24)
    curves = {}
    for impl in ("checkpointed", "fused"):
        task = lm_task.LMTask(cfg.replace(loss_impl=impl), torch.device("cpu"), None, tmp_path)
        assert task.info["loss_impl"] == impl
        data = task.make_data()
        for name, t in (("kd", task), ("no-kd", task.no_kd())):
            calls.clear()
            student = loop.prepare(backends.make("torch_fp32"), task.cfg, t, torch.device("cpu"))
            _, curves[impl, name] = loop.run_student(student, task.cfg, t, data, torch.device("cpu"))
            # one per training step, and the timed ones
            assert len(calls) == (cfg.train.steps + cfg.bench.iters if impl == "fused" else 0), (impl, name)
    for name in ("kd", "no-kd"):
        assert curves["fused", name] == pytest.approx(curves["checkpointed", name], rel=1e-4)
    assert curves["fused", "kd"][-1] < curves["fused", "kd"][0]
    # the default, 'auto': fused for forward_kl, checkpointed for a loss it cannot fuse; task.json says which
    for loss, ran in (("forward_kl", "fused"), ("jsd", "checkpointed")):
        info = lm_task.LMTask(cfg.replace(loss=loss), torch.device("cpu"), None, tmp_path).info
        assert (info["loss_impl"], info["loss_impl_requested"]) == (ran, "auto")
    # where it could not run compiled (CUDA without Triton), auto falls back and an explicit 'fused' is refused
    monkeypatch.setattr(lm_objectives, "can_fuse", lambda device: False)
    assert lm_task.LMTask(cfg, torch.device("cpu"), None, tmp_path).info["loss_impl"] == "checkpointed"
    with pytest.raises(config.ConfigError, match="distill.loss_impl='fused' runs compiled .* Triton"):
        lm_task.LMTask(cfg.replace(loss_impl="fused"), torch.device("cpu"), None, tmp_path)


def test_a_hugging_face_models_vocabulary_sets_model_vocab(tmp_path):
    """model.vocab comes from the model (320 here, the preset says 256): the run's rows and config.json say 320."""
    hf = tiny_llama(tmp_path / "tiny", vocab=320, layers=1)
    cfg = config.from_preset("gpt-cpu", kind="llama", vocab=256, tokenizer="bytes", corpus_mb=0.2, teacher=str(hf),
                             steps=2, backends="torch_fp32", no_kd_student=False)
    run_dir = runner.run(cfg, out=tmp_path, run_id="hf", progress=False)
    assert results.read_json(run_dir / "config.json")["config"]["model"]["vocab"] == 320
    assert results.load(run_dir)["cfg_vocab"].tolist() == [320]


def test_a_students_wall_time_is_split_into_its_phases(gpt_run):
    # setup (build, compile, capture), training steps, held-out evaluations (step 0, the curve's, the last) and the
    # timed region add up to the student's wall time, less the few untimed lines between them
    _, run_dir = gpt_run
    df = results.load(run_dir)
    ran = df[df["status"].isin(results.RAN)]
    assert not ran.empty
    phases = ran[["setup_wall_s", "train_wall_s", "eval_wall_s", "bench_wall_s"]]
    assert (phases > 0).all().all()
    total = phases.sum(axis=1)
    assert (total <= ran["student_wall_s"] + 0.05).all() and (total >= 0.9 * ran["student_wall_s"] - 0.1).all()


def test_a_teacher_trained_here_is_fingerprinted_in_task_json(gpt_run):
    # a study resumed on another machine trains its teacher again: the report tells the two apart by this hash
    cfg, run_dir = gpt_run
    assert cfg.lm.teacher == "train"
    task = json.loads((run_dir / "task.json").read_text())
    assert len(task["teacher_weights_sha256"]) == 64
