"""GPU-only checks of what CPU tests cannot reach: CUDA-graph capture keeps students matched, TE FP8
trains, peak memory is measured. Run on the H200 with scripts/gpu_tests.sh; skipped without CUDA."""
import gc
import json
import math
import weakref

import pandas as pd
import pytest
import torch

from workbench import backends, config, results
from workbench.env import te as _te
from workbench.run import parallel, runner
from workbench.train import loop, tasks

pytestmark = pytest.mark.gpu


def _run_dir(tmp_path, run_id, **overrides):
    cfg = config.from_preset("seed", **{"steps": 6, "warmup": 2, "iters": 5, "eval_batches": 2, **overrides})
    return runner.run(cfg, out=tmp_path, run_id=run_id, progress=False)


def _run(tmp_path, run_id, **overrides):
    return results.load(_run_dir(tmp_path, run_id, **overrides)).set_index("student")


def test_graphed_step_trains_like_the_eager_one(tmp_path):
    """Capture runs real warm-up updates and restores them: the graphed student must start where the
    eager one starts and follow it (same batches, same maths, bf16 rounding aside)."""
    eager = _run(tmp_path, "eager", backends="torch_bf16", fused_optimizer=True)
    graphed = _run(tmp_path, "graphed", backends="torch_bf16", fused_optimizer=True, graphs=True)
    e, g = eager.loc["torch_bf16"], graphed.loc["torch_bf16"]
    assert bool(g["graphed"]) and g["capture_ms"] > 0
    assert g["initial_loss"] == pytest.approx(e["initial_loss"], rel=1e-6)
    assert g["first_step_loss"] == pytest.approx(e["first_step_loss"], rel=1e-3)
    assert g["final_train_loss"] == pytest.approx(e["final_train_loss"], rel=2e-2)
    assert g["peak_mem_allocated_mb"] > 0


@pytest.mark.parametrize("optimizer", ["adamw", "te_fused_adam"])
def test_the_whole_step_graph_keeps_its_optimizer_alive(optimizer, tmp_path):
    """The graph holds the optimizer state's raw addresses. The caller keeps only the step (runner,
    prepare_step), so the step must keep the optimizer: before, it was collected, the next allocations (here:
    NaN everywhere the pool had room; in the runner: initial_loss's reference copy) overwrote its moments and
    master weights, and TE FusedAdam's second step gave loss inf (results/reference/h200/probes/)."""
    if optimizer == "te_fused_adam" and _te.load()[0] is None:
        pytest.skip("Transformer Engine does not import here")
    cuda = torch.device("cuda")
    cfg = config.from_preset("seed", steps=4, param_dtype="bf16", fused_optimizer=True, optimizer=optimizer)
    task = tasks.for_config(cfg, cuda, runner.teacher_dtype(cfg, cuda), cache_dir=tmp_path)
    data = task.make_data()
    student = backends.make("torch_bf16").prepare(task.reference, cfg, cuda)
    model = student.model
    model.train()
    opt, _ = loop.make_optimizer(model, cfg, cuda, capturable=True)
    step = loop.capture_step(model, model, opt, student, task, data.train[0])
    alive = weakref.ref(opt)
    del opt, model
    gc.collect()
    assert alive() is not None
    free = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    junk = [torch.full((n,), float("nan"), device=cuda) for n in (free // 16, free // 16, free // 8, 1 << 14, 1 << 10)]
    del junk
    losses = [float(step(*batch)) for batch in data.train]
    assert all(map(math.isfinite, losses)), losses
    assert losses[-1] < losses[0]


@pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")
def test_te_fp8_students_start_matched_and_track_bf16(tmp_path):
    df = _run(tmp_path, "te", backends="te_bf16,te_fp8:delayed,te_fp8:current", baseline="te_bf16")
    assert (df["status"] == "ok").all(), df["reason"].to_dict()
    init = df["initial_loss"]
    assert (init.max() - init.min()) / init.mean() <= 1e-5
    ratio = df["final_train_loss"] / df.loc["te_bf16", "final_train_loss"]
    assert ratio.between(0.8, 1.25).all(), ratio.to_dict()


@pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")
def test_te_graphed_fp8_keeps_the_shared_init(tmp_path):
    df = _run(tmp_path, "te-graphs", backends="torch_bf16,te_fp8:delayed,te_fp8:current,te_bf16", graphs=True,
              fused_optimizer=True)
    assert (df["status"] == "ok").all(), df["reason"].to_dict()
    assert df["graphed"].all()
    init = df["initial_loss"]
    assert (init.max() - init.min()) / init.mean() <= 1e-5
    # graphed students leave nothing behind: every student starts from the same allocated floor (the H200
    # bench before the gc fix showed later graphed TE students' peaks GBs higher). The first TE student
    # allocates TE's process-wide workspaces once (results/reference/h200/graphed/seed: the floor rises
    # from 182 to 312 MiB at the first TE student, to 344 at the first FP8 one, then stays), so floors are
    # compared from it on.
    floor = df["mem_floor_mb"]
    assert floor.notna().all()
    after_te = floor.loc["te_fp8:delayed":]
    assert after_te.max() - after_te.min() < 1.0, floor.to_dict()
    assert floor.max() - floor.min() < 128, floor.to_dict()


@pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")
def test_the_workbench_te_import_maps_one_cudnn_copy():
    """After the workbench's TE loading (pin_cudnn, then TE) every cuDNN library in this process comes
    from one folder, torch's: a second copy is the mix that breaks TE's fused attention and torch's check."""
    import torch

    assert len(_te.mapped_cudnn_dirs()) == 1, _te.mapped_cudnn_dirs()
    assert torch.backends.cudnn.version() is not None  # torch's own version check does not raise


@pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")
def test_te_selects_a_fused_or_flash_attention_backend():
    """With one cuDNN copy TE's cuDNN fused attention loads (flash-attn may be absent); the probe reports it."""
    att = _te.attention_backend()
    assert att["selected"] and not att["selected"].startswith("unfused"), att
    assert not att["fell_back_to_slower"], att
    assert len(att["cudnn_dirs"]) == 1, att


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_under_torchrun_start_matched_and_report_scaling(tmp_path):
    """`seed` over two GPUs (DDP, NCCL) through runner.run's torchrun launch: one set of files from rank 0, every
    rank starting every student from the same weights, and per-rank step time and memory in the rows."""
    students = "torch_bf16,te_fp8:delayed" if _te.load()[0] is not None else "torch_bf16"
    cfg = config.from_preset("seed", steps=4, warmup=2, iters=5, eval_batches=2, nproc=2, backends=students)
    run_dir = runner.run(cfg, out=tmp_path, run_id="two", progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["two"]
    df = results.load(run_dir).set_index("student")
    assert (df["status"] == "ok").all(), df["reason"].to_dict()
    two = df[df["world_size"] == 2]
    assert list(two.index) == students.split(",") and (two["scaling_efficiency"] > 0).all()
    for cell in (*two["peak_mem_allocated_mb_ranks"], *two["step_ms_median_ranks"]):  # per-rank memory and time
        assert len(json.loads(cell)) == 2 and min(json.loads(cell)) > 0
    assert all(f"{s}{results.REFERENCE_SUFFIX}" in df.index for s in two.index)  # each efficiency's reference row
    assert results.load_summary(run_dir)["initial_losses_equal"] is True


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")
def test_fsdp2_fp8_weights_follow_tes_recipe_over_2_gpus(tmp_path):
    """FSDP2 with FP8 weights by TE's recipe (meta device, shard, initialise; TE FusedAdam's fp32 masters
    sharded like the parameters; TE >= 2.16) over two GPUs, beside the plain-FSDP2 TE FP8 student (bf16
    weights cast to FP8 in each step). Both ranks start exactly where the same student starts alone on rank 0
    (@1gpu: the one-GPU FP8-weight path quantizes the same shared values with the same initial delayed scale),
    and within FP8 rounding (10 %) of the bf16-weight student. The two students run the same FP8 GEMMs on the
    same batches from the same init and differ only in where the weights are quantized (once per optimizer
    step from the fp32 master, or in every forward from the bf16 weight): FP8 rounding noise, bounded at
    0.8-1.25x in the final loss as the one-GPU FP8-weight test bounds it against its reference; an optimizer
    that does not step leaves the loss where it started (checked to fall). Masters left at TE's own random
    init would still train, so these bounds do not tell them from the shared init's."""
    common = dict(steps=12, warmup=2, iters=5, eval_batches=2, nproc=2, strategy="fsdp2", optimizer="te_fused_adam",
                  param_dtype="bf16", backends="te_fp8:delayed", baseline="te_fp8:delayed")
    runs = {}
    for run_id, fp8_weights in (("recipe", True), ("plain", False)):
        cfg = config.from_preset("seed", te_fp8_weights=fp8_weights, scaling_reference=fp8_weights, **common)
        runs[run_id] = df = results.load(runner.run(cfg, out=tmp_path, run_id=run_id, progress=False)).set_index(
            "student"
        )
        assert (df["status"] == "ok").all(), df["reason"].to_dict()
    recipe, plain = runs["recipe"].loc["te_fp8:delayed"], runs["plain"].loc["te_fp8:delayed"]
    alone = runs["recipe"].loc["te_fp8:delayed@1gpu"]
    assert parallel.FSDP2_TE_RECIPE in recipe["notes"] and parallel.FSDP2_PLAIN_FP8 in plain["notes"]
    assert recipe["world_size"] == 2 and recipe["optimizer"] == "FusedAdam"
    ranks = json.loads(recipe["initial_loss_ranks"])
    assert ranks[1] == pytest.approx(ranks[0], rel=1e-6)
    assert recipe["initial_loss"] == pytest.approx(alone["initial_loss"], rel=1e-5)
    assert recipe["initial_loss"] == pytest.approx(plain["initial_loss"], rel=0.1)
    assert recipe["final_train_loss"] < recipe["first_step_loss"]
    assert 0.8 <= recipe["final_train_loss"] / plain["final_train_loss"] <= 1.25


def _lm_run(tmp_path, run_id, **overrides):
    """A tiny GPT run on real text (random teacher): seconds on the H200."""
    cfg = config.from_preset("gpt-cpu", **{**dict(corpus_mb=0.2, teacher="random", steps=6, warmup=1, iters=3,
                                                  eval_batches=1, no_kd_student=False), **overrides})
    run_dir = runner.run(cfg, out=tmp_path, run_id=run_id, progress=False)
    return results.load(run_dir).set_index("student"), run_dir


@pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")
def test_a_forced_unfused_attention_is_what_te_selects_and_auto_afterwards_is_tes_own_pick(tmp_path):
    """TE reads NVTE_*_ATTN when it selects and caches its selection per attention input: the forcing must
    reach the selection, and a later auto student in the same process must not inherit it."""
    forced, _ = _lm_run(tmp_path, "unfused", backends="te_bf16", baseline="te_bf16", te_attention="unfused")
    row = forced.loc["te_bf16"]
    assert row["status"] == "ok", row["reason"]
    assert (row["attention_requested"], row["attention_backend"]) == ("unfused", "unfused")
    auto, _ = _lm_run(tmp_path, "auto", backends="te_bf16", baseline="te_bf16")
    assert not str(auto.loc["te_bf16", "attention_backend"]).startswith("unfused"), auto.loc["te_bf16"].to_dict()


def test_host_placed_teacher_logits_train_like_gpu_placed_ones(tmp_path):
    """Pinned host logits copied one step ahead on a side stream: the same losses as logits kept on the GPU
    (a missing stream wait would train on half-copied logits)."""
    losses = {}
    for where in ("gpu", "host"):
        _, run_dir = _lm_run(tmp_path, where, backends="torch_fp32", baseline="torch_fp32", teacher_logits=where)
        assert results.read_json(run_dir / "task.json")["teacher_logits"] == where
        losses[where] = list(results.load_losses(run_dir)["loss"])
    assert losses["host"] == pytest.approx(losses["gpu"], rel=1e-6)


def test_the_fused_logit_loss_trains_like_the_checkpointed_one_eager_and_in_the_whole_step_graph(tmp_path,
                                                                                                  monkeypatch):
    """The default distill.loss_impl (auto: fused for forward_kl) on CUDA: the chunk's maths torch.compile'd,
    the gradient written in the forward, inside a whole-step CUDA graph too. Same students, same batches: every
    loss curve within bf16 rounding of the checkpointed loss's (2 %), and the same starting weights; the compiled
    chunk really ran."""
    from workbench.train.objectives import lm_objectives

    used = []
    real = lm_objectives.compiled_chunk
    monkeypatch.setattr(lm_objectives, "compiled_chunk", lambda: used.append(1) or real())
    students = "torch_bf16,te_fp8:delayed" if _te.load()[0] is not None else "torch_bf16"
    for graphs in (False, True):
        # with the no-KD student: its cross-entropy alone is the fused loss's other compiled graph (no KD term)
        kw = dict(backends=students, baseline="torch_bf16", param_dtype="bf16", fused_optimizer=True, graphs=graphs,
                  te_graph="step", no_kd_student=True)
        ref, ref_dir = _lm_run(tmp_path, f"checkpointed-{graphs}", loss_impl="checkpointed", **kw)
        assert not used
        got, got_dir = _lm_run(tmp_path, f"fused-{graphs}", **kw)
        assert used and results.read_json(got_dir / "task.json")["loss_impl"] == "fused"
        used.clear()
        assert (got["status"] == "ok").all() and "torch_bf16:no_kd" in got.index, got["reason"].to_dict()
        assert got["initial_loss"].tolist() == pytest.approx(ref["initial_loss"].tolist(), rel=1e-5)
        for student in got.index:
            assert _losses(got_dir, student) == pytest.approx(_losses(ref_dir, student), rel=0.02), student


@pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")
def test_te_delayed_scaling_trains_the_same_with_held_out_evaluation_in_between(tmp_path):
    """Evaluation forwards under FP8 must not feed the amax history (kept by TE's get/reset_fp8_meta_tensors)."""
    kw = dict(backends="te_fp8:delayed", baseline="te_fp8:delayed", te_amax_compute_algo="most_recent")
    without = _run(tmp_path, "no-eval", **kw)
    with_eval = _run(tmp_path, "eval", eval_every=1, **kw)
    assert (with_eval["status"] == "ok").all(), with_eval["reason"].to_dict()
    for col in ("first_step_loss", "final_train_loss"):
        assert with_eval.loc["te_fp8:delayed", col] == pytest.approx(without.loc["te_fp8:delayed", col], rel=1e-6)


def _delayed_states(model):
    """Every TE module's delayed-scaling state, cloned: [(scale, amax_history)] per direction it has."""
    metas = [m.fp8_meta for m in model.modules() if isinstance(getattr(m, "fp8_meta", None), dict)]
    return [(s.scale.clone(), s.amax_history.clone()) for meta in metas for key in ("scaling_fwd", "scaling_bwd")
            if hasattr(s := meta.get(key), "amax_history")]


@pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")
def test_step0_metrics_are_in_the_rows_and_leave_te_delayed_scaling_as_it_was(tmp_path):
    """Every LM student is evaluated in its own precision before its first training step (loop.step0_metrics):
    the rows carry it, finite. Its FP8 forwards leave delayed scaling's scales and amax histories as they
    were: TE's initial state (scale 1, empty history) on a fresh student, which its first training step then
    finds, and to the bit the state a training step reached."""
    df, _ = _lm_run(tmp_path, "step0", backends="torch_bf16,te_fp8:delayed", baseline="torch_bf16")
    assert (df["status"] == "ok").all(), df["reason"].to_dict()
    for col in ("heldout_ppl_step0", "kl_teacher_student_t1_nats_step0", "top1_agreement_step0"):
        assert df[col].map(math.isfinite).all(), (col, df[col].to_dict())
    assert df["top1_agreement_step0"].between(0, 1).all() and (df["heldout_ppl_step0"] > 1).all()
    kl = df["kl_teacher_student_t1_nats_step0"]
    assert kl["te_fp8:delayed"] != kl["torch_bf16"]  # the same weights, FP8's arithmetic

    cuda = torch.device("cuda")
    cfg = config.from_preset("gpt-cpu", corpus_mb=0.2, teacher="random", steps=2, eval_batches=1)
    task = tasks.for_config(cfg, cuda, runner.teacher_dtype(cfg, cuda), tmp_path / "cache")
    data = task.make_data()
    _te.reset_fp8_state()
    student = backends.make("te_fp8:delayed").prepare(task.reference, cfg, cuda)
    model = student.model.train()
    assert set(loop.step0_metrics(student, task, data)) == {
        "heldout_ppl_step0", "kl_teacher_student_t1_nats_step0", "top1_agreement_step0"}
    for scale, history in _delayed_states(model):  # a fresh student: TE's initial state after the evaluation
        assert bool((scale == 1).all()) and not bool(history.any())
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    loop.make_step(model, opt, student, task)(*data.train[0])
    trained = _delayed_states(model)
    assert trained and any(bool(history.any()) for _, history in trained)  # the step recorded its amaxes
    loop.step0_metrics(student, task, data)
    after = _delayed_states(model)
    assert len(after) == len(trained)
    assert all(torch.equal(a, b) for x, y in zip(after, trained) for a, b in zip(x, y))


def _losses(run_dir, student):
    df = pd.read_csv(run_dir / "losses.csv")
    return df[df["student"] == student]["loss"].tolist()


@pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")
def test_te_whole_step_graph_starts_matched_and_trains_like_its_eager_run(tmp_path):
    """options.te_graph=step: forward under TE autocast, loss, backward, AdamW and the FP8 scale updates in one
    CUDA graph. Capture's warm-up steps are undone (weights, AdamW, TE's amax history and scales), so the
    graphed students start from the shared init and the same fresh FP8 scales as their eager runs, and
    follow them. Tolerances: the first 3 steps run the same kernels on the same state (0.5 %); later steps
    may drift by FP8/bf16 rounding, so the mean of the last 4 losses within 3 %."""
    students = "torch_bf16,te_fp8:delayed,te_fp8:current,te_bf16"
    common = dict(backends=students, fused_optimizer=True, steps=12)
    eager_dir = _run_dir(tmp_path, "eager", **common)
    step_dir = _run_dir(tmp_path, "step", graphs=True, te_graph="step", **common)
    e, g = (results.load(d).set_index("student") for d in (eager_dir, step_dir))
    assert (e["status"] == "ok").all() and (g["status"] == "ok").all(), g["reason"].to_dict()
    assert (g["graph_scope"] == "step").all() and (g["capture_ms"] > 0).all()
    init = pd.concat([e["initial_loss"], g["initial_loss"]])
    assert (init.max() - init.min()) / init.mean() <= 1e-5, init.to_dict()
    for s in ("te_fp8:delayed", "te_fp8:current", "te_bf16"):
        le, lg = _losses(eager_dir, s), _losses(step_dir, s)
        assert len(lg) == len(le) == 12
        # the first steps run the same kernels on the same weights and FP8 scales: a scale left over from
        # capture's warm-up shows here (at seed, delayed scaling's step 2 is 0.743 from fresh scales, 0.723
        # from warm ones)
        assert lg[:3] == pytest.approx(le[:3], rel=5e-3), (s, le[:3], lg[:3])
        assert sum(lg[-4:]) / 4 == pytest.approx(sum(le[-4:]) / 4, rel=3e-2), (s, le, lg)
        assert lg[-1] < lg[0], (s, lg)  # replays train


@pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")
def test_a_scheduled_rate_reaches_the_whole_step_graph_as_it_reaches_the_eager_step(tmp_path):
    """train.lr_schedule in a captured step: the graph reads its rate from a device tensor filled before each
    replay. A rate baked in at capture would leave the graphed scheduled run equal to the graphed constant one;
    here a long warm-up (the first steps at a fraction of train.lr) must move the graphed losses away from the
    constant ones as much as it moves the eager losses."""
    students = "torch_bf16,te_fp8:current"
    common = dict(backends=students, fused_optimizer=True, steps=6, lr=3e-3)
    warm = dict(lr_schedule="linear", lr_warmup_steps=5)
    runs = {(g, w): _run_dir(tmp_path, f"{g}-{w}", **common, **(dict(graphs=True, te_graph="step") if g else {}),
                             **(warm if w else {})) for g in (False, True) for w in (False, True)}
    for d in runs.values():
        df = results.load(d)
        assert (df["status"] == "ok").all(), df["reason"].to_dict()
    for s in students.split(","):
        eager_gap = _losses(runs[False, True], s)[3] - _losses(runs[False, False], s)[3]
        graph_gap = _losses(runs[True, True], s)[3] - _losses(runs[True, False], s)[3]
        assert abs(eager_gap) > 1e-3, (s, eager_gap)  # three updates at 1/5..3/5 of the rate: another loss
        assert graph_gap == pytest.approx(eager_gap, rel=0.25), (s, eager_gap, graph_gap)


@pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")
def test_te_fused_adam_whole_step_graph_and_fp8_weights_train(tmp_path):
    """TE's FusedAdam (fp32 masters of bf16 parameters, bf16 moments) inside the whole-step graph, and FP8
    primary weights (eager): both start from the shared init and end near the AdamW TE FP8 student (FP8 noise
    and a different optimizer kernel: 0.8-1.25x). FP8 weights' initial_loss is the loss of the FP8-rounded
    weights, so it is only close (10 %)."""
    fp8 = dict(backends="te_fp8:delayed,te_fp8:current", baseline="te_fp8:delayed")
    ref = _run(tmp_path, "ref", **fp8, fused_optimizer=True, param_dtype="bf16", steps=12)
    adam = _run(tmp_path, "adam", **fp8, param_dtype="bf16", steps=12, graphs=True, te_graph="step",
                optimizer="te_fused_adam", moments_dtype="bf16")
    fp8w = _run(tmp_path, "fp8w", **fp8, param_dtype="bf16", steps=12, optimizer="te_fused_adam",
                te_fp8_weights=True)
    for df in (adam, fp8w):
        assert (df["status"] == "ok").all(), df["reason"].to_dict()
        assert (df["optimizer"] == "FusedAdam").all()
        ratio = df["final_train_loss"] / ref["final_train_loss"]
        assert ratio.between(0.8, 1.25).all(), ratio.to_dict()
    assert (adam["graph_scope"] == "step").all()
    assert adam["initial_loss"].tolist() == pytest.approx(ref["initial_loss"].tolist(), rel=1e-5)
    assert fp8w["initial_loss"].tolist() == pytest.approx(ref["initial_loss"].tolist(), rel=0.1)


@pytest.mark.skipif(_te.load()[0] is None, reason="Transformer Engine does not import here")
def test_an_fp8_teacher_runs_in_fp8_and_its_targets_are_the_bf16_teachers_within_fp8_rounding(tmp_path):
    """teacher_precision=fp8: the teacher ran in TE FP8, the students trained on its targets, and those are
    the bf16 teacher's within FP8 rounding. E4M3 keeps 3 mantissa bits: a relative rounding error of at most
    2^-4, ~3.6% RMS per quantised operand, ~5% per GEMM output with both operands quantised, and the seed
    teacher's residual stream is dominated by its unquantised embedding: a relative MSE of a few 1e-3 (E4M3
    per-tensor current scaling simulated in torch on this teacher gives 0.0017). Bounded at 0.05; a wrong
    scale, transpose or weight gives ~1. Above 1e-5: FP8 really ran (bf16 against itself gives 0)."""
    df = _run(tmp_path, "fp8-teacher", backends="torch_bf16,te_fp8:current", teacher_precision="fp8")
    assert (df["teacher_precision_used"] == "fp8").all(), df["teacher_precision_reason"].to_dict()
    assert (df["status"] == "ok").all(), df["reason"].to_dict()
    assert (df["teacher_ms_median"] > 0).all()
    cuda = torch.device("cuda")

    def held_out_targets(precision):
        cfg = config.from_preset("seed", teacher_precision=precision, eval_batches=4)
        task = tasks.MLPTask(cfg, cuda, runner.teacher_dtype(cfg, cuda))
        assert task.teacher_precision.used == precision, task.teacher_precision.reason
        return torch.cat([t.out for _, t in task.make_data().eval])

    fp8, bf16 = held_out_targets("fp8"), held_out_targets("bf16")
    rel_mse = float((fp8 - bf16).pow(2).mean() / bf16.pow(2).mean())
    assert 1e-5 < rel_mse < 0.05, rel_mse
