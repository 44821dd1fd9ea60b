"""One workbench run: probe -> teacher targets -> every student -> result files -> plots.

    from workbench import config

    from workbench.run import runner
    run_dir = runner.run(config.from_preset("cpu-smoke"), out="results")

Writes results/<run_id>/ (see workbench.results), done.json last. A student that cannot run here becomes a row with
status 'skipped' and the reason; one that fails or diverges becomes an 'error' / 'diverged' row; the
other students still run.
"""
from __future__ import annotations

import datetime as _dt
import gc
import json
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from workbench import backends, results
from workbench.config import Config
from workbench.env import install, probe
from workbench.env import te as _te
from workbench.jax_side import runner as jax_runner
from workbench.measure import profiler, timing
from workbench.models import kinds
from workbench.run import parallel, rows, slow_path
from workbench.train import Data, Diverged, run_student, task_setup, tasks, teacher_targets
from workbench.train.teacher import lm_teacher


def resolve_device(cfg: Config) -> torch.device:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        from workbench.config import ConfigError

        raise ConfigError("device='cuda' but no CUDA GPU is visible; allowed here: 'auto' or 'cpu'")
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def teacher_dtype(cfg: Config, device: torch.device) -> torch.dtype | None:
    """The torch autocast dtype of the teacher's forward (and of a language-model teacher's training);
    None = fp32. 'auto': bf16 autocast on a bf16-capable GPU (an fp32 teacher forward costs ~3x a
    student step at the large size), fp32 on CPU. 'fp8': what TE does not run in FP8 runs in bf16 (fp16 on a
    GPU without bf16), which is also the whole forward where FP8 cannot run (workbench.train.teacher.teacher_precision);
    fp32 on CPU."""
    p = cfg.distill.teacher_precision
    if p == "auto":
        return torch.bfloat16 if device.type == "cuda" and probe.native_bf16(device) else None
    if p == "fp8":
        return backends.amp_dtype(device) if device.type == "cuda" else None
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[p]


def time_teacher(cfg: Config, task, data: Data, device: torch.device) -> tuple[dict, dict | None]:
    """The teacher forward per batch, in its precision, measured on its own (it is never part of a student
    step): its row cells (median; repeat medians and spread) and, with cfg.bench.profile, the profiled
    block's record."""
    tokens = data.bench[0][0]

    def fwd():
        with task.teacher_precision.forward():
            task.teacher(tokens)

    t = timing.measure(fwd, cfg.bench.warmup, cfg.bench.iters, timing.clock_for(device),
                       repeats=cfg.bench.repeats, profile=cfg.bench.profile)
    return {"teacher_ms_median": t.median, **t.repeat_summary("teacher_ms")}, t.profile


def _write_profile(run_dir: Path, who: str, record: dict | None) -> None:
    """A profiled block's whole record (per-kernel detail included) as run_dir/profile-<who>.json."""
    if record is not None:
        results.write_json(profiler.profile_path(run_dir, who), record)


def new_run_id(cfg: Config) -> str:
    return f"{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{cfg.preset}"


def check_registered(cfg: Config) -> None:
    """What the configuration, a leaf, cannot check: that its students name backends of the backends' registry,
    its model kind is one of the kinds' registry, and a language model's teacher mode allows the rest of it (the
    teacher modes' registry). Every driver asks it before it starts anything: a run, a notebook run, `workbench
    config`, the bench and each point of a sweep's plan."""
    backends.check_specs(cfg.backends)
    kinds.get(cfg.model.kind)
    if kinds.is_lm(cfg.model.kind):
        teacher_targets.check(cfg)


def run(cfg: Config, out: str | Path = "results", run_id: str | None = None, requested: dict | None = None,
        progress: bool = True) -> Path:
    """Run every student in `cfg.backends`; return the run folder. `out` is the parent folder.
    With parallel.nproc > 1 outside torchrun, the run is launched under torchrun (workbench.run.parallel)."""
    check_registered(cfg)
    cfg = task_setup.resolve_lm(cfg.validate())  # model.vocab from a Hugging Face teacher / student, tokenizers checked
    device = resolve_device(cfg)
    if parallel.should_launch(cfg):
        return parallel.launch(cfg, out, run_id, new_run_id(cfg), progress)
    world, device = parallel.setup(cfg, device)
    try:
        return _run(cfg, world, device, out, run_id, requested, progress and world.writes)
    finally:
        world.close()
        # TE's attention switches back to what this process started with: a forced backend
        # (options.te_attention) must not follow a notebook or an in-process sweep into its next run
        _te.force_attention("auto")


def _run(cfg: Config, world: parallel.World, device, out, run_id, requested, progress: bool) -> Path:
    """The run on this process; under torchrun every rank runs it and only rank 0 writes files."""
    t0 = time.monotonic()
    run_dir = world.on_rank0(lambda: results.create_run_dir(out, run_id, new_run_id(cfg)))  # exclusive
    run_id = run_dir.name
    tdtype = teacher_dtype(cfg, device)
    env = _write_start(cfg, world, run_dir, device, tdtype, requested)
    try:
        phases = timing.Phases(t0)  # the seconds before the first student: a study's point pays them every time
        # Every rank builds its task at once: the text and teacher caches are built by one process (a lock
        # on each entry), the others wait on that lock, not at a collective bounded by parallel.timeout_s
        task = tasks.for_config(cfg, device, tdtype, cache_dir=results.cache_dir(out))
        phases.mark("task_s")  # text, tokenizer, teacher (trained, loaded or from the cache)
        if task.teacher_precision.reason:
            _say(progress, f"[teacher] {task.teacher_precision.reason}")
        # every rank distils rank 0's teacher into its weights
        world.share_modules((task.teacher, task.reference), device)
        data = task.make_data(shard=world.rank)
        task.info["phase_s"] = phases.mark("data_s")  # the teacher shared, batches, teacher targets (top-k store)
        if world.writes:  # after the data: making it records the top-k store's folder and size in task.info
            results.write_json(run_dir / "task.json", task.info)
    except Exception:  # refused before any student ran: no folder of a run that never was
        if world.writes:
            results.discard_run_dir(run_dir)
        raise
    if world.writes:
        teacher_cells, teacher_profile = time_teacher(cfg, task, data, device)
        _write_profile(run_dir, "teacher", teacher_profile)
    student_rows, loss_rows = _all_students(cfg, run_dir, task, data, device, progress, world)
    if world.writes:
        df = rows.frame(student_rows, rows.run_cells(cfg, run_id, env, task, teacher_cells), task, env)
        results.write_csv(run_dir / "students.csv", df)
        results.write_csv(run_dir / "losses.csv", pd.DataFrame(loss_rows, columns=["step", "student", "loss"]))
        results.write_json(run_dir / "summary.json", summarize(cfg, env, df, run_id, device, task.teacher_precision))
        from workbench.results import plots  # matplotlib only once there is something to plot

        plots.plot_run(run_dir)
        # last: the run is complete
        results.mark_complete(run_dir, run_id=run_id, wall_s=round(time.monotonic() - t0, 2))
    world.barrier()  # every rank returns once the files are there
    return run_dir


def _write_start(cfg: Config, world: parallel.World, run_dir: Path, device, tdtype, requested) -> dict | None:
    """Rank 0's env.json and config.json, the files a run writes before its task; the probed environment
    (None on the other ranks)."""
    if not world.writes:
        return None
    env = probe.probe()
    env["te_install"] = install.last_summary()
    results.write_json(run_dir / "env.json", env)
    results.write_json(run_dir / "config.json", {
        "schema_version": results.SCHEMA_VERSION, "run_id": run_dir.name,
        "requested": requested or {}, "config": cfg.to_dict(),
        "derived": {"device": str(device), "teacher_dtype": str(tdtype or torch.float32),
                    "world_size": world.world_size, "strategy": world.strategy},
    })
    return env


def _all_students(cfg: Config, run_dir: Path, task, data: Data, device, progress: bool, world: parallel.World):
    """Every student of the run, one after the other (and, for language models, the baseline trained on
    cross-entropy only): (rows, loss rows). A student that changes the shared batches is flagged, and the
    batches are rebuilt for the ones after it. In a distributed run each student's row is merged from every
    rank's, followed by its one-process reference row (rank 0 alone) when parallel.scaling_reference asks."""
    ctx = backends.Context(device=device, cfg=cfg)
    student_rows, loss_rows, curve_rows = [], [], []
    data_sums = data.fingerprint()
    no_kd = task.no_kd() if cfg.distill.no_kd_student else None
    runs = [(spec, spec, task) for spec in cfg.backends]
    runs += [(cfg.baseline, f"{cfg.baseline}:no_kd", no_kd)] if no_kd else []
    for spec, name, student_task in runs:
        def alone():  # the same student on rank 0 alone, from the same memory floor
            _free(device)
            return _split(*_one_student(spec, cfg, ctx, student_task, data, device, progress,
                                        name=f"{name}{results.REFERENCE_SUFFIX}"))
        own = _split(*_one_student(spec, cfg, ctx, student_task, data, device, progress, name=name, world=world))
        done = _across_ranks(cfg, world, own, alone) if world.active else [own]
        for row, losses, profile, curve in done:
            rows.one_process_unless_merged(row)
            if world.writes:
                _write_profile(run_dir, row["student"], profile)
            curve_rows += [{"student": row["student"], **point} for point in curve]
            student_rows.append(row)
            loss_rows += [{"step": i + 1, "student": row["student"], "loss": v} for i, v in enumerate(losses)]
        if not torch.equal(data.fingerprint(), data_sums):
            rows.changed_batches(student_rows[-len(done)])
            _say(progress, f"[{name}] changed the shared batches; rebuilding them")
            data = None  # free this frame's damaged copy first: at the large sizes the batches take GBs
            data = task.make_data(shard=world.rank)
            data_sums = data.fingerprint()  # the next students are checked against the rebuilt batches
        _free(device)
    if curve_rows and world.writes:  # held-out metrics during training (train.eval_every)
        results.write_csv(run_dir / "eval_curve.csv", pd.DataFrame(curve_rows))
    return student_rows, loss_rows


def _split(row: dict, losses: list[float]) -> tuple[dict, list[float], dict | None, list[dict]]:
    """(row, losses, profile, curve): the profiled block's record and the eval curve go to their own files."""
    return row, losses, row.pop("profile", None), row.pop("curve", None) or []


def _free(device) -> None:
    """What the last student left behind, freed: each student's memory peak starts from the same floor
    (the one-GPU reference of a distributed student too). gc first: graphed / compiled students hold
    reference cycles (callables <-> module), and the H200 bench showed later students' peaks growing by GBs
    when only empty_cache ran. On two H200s this brought an FSDP2 student's one-GPU reference back to the
    run's floor; a DDP student's gradient buckets (allocated in DDP's _pre_forward) sometimes outlive it
    all the same (1.7 GB at `large`), which is why the scaling table counts memory above each row's floor."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def _across_ranks(cfg: Config, world: parallel.World, own: tuple, alone) -> list[tuple]:
    """One student of a distributed run: its row merged from every rank's (profile and curve: rank 0's),
    then, with parallel.scaling_reference, its one-process reference row, run by `alone()` on rank 0 while
    the other ranks wait. [(row, losses, profile, curve)], in that order."""
    row, losses, profile, curve = own
    row, losses = world.merged(row, losses)
    if not (cfg.parallel.scaling_reference and row["status"] in results.RAN):
        return [(row, losses, profile, curve)]
    ref: list = []  # rank 0's (row, losses, profile, curve); every rank is handed its row

    def reference_row() -> dict:
        ref.extend(alone())
        return ref[0]

    row = rows.scaling(row, world.on_rank0(reference_row))
    return [(row, losses, profile, curve)] + ([tuple(ref)] if ref else [])


def _one_student(spec: str, cfg: Config, ctx, task, data: Data, device, progress: bool, name: str | None = None,
                 world: parallel.World | None = None):
    row = rows.new(spec, name)
    try:
        return _try_student(row, spec, cfg, ctx, task, data, device, progress, world)
    except Exception as e:  # one failing student must not take down the others; the row says why
        rows.failed(row, e)
        _say(progress, traceback.format_exc())
        return row, []


def _try_student(row: dict, spec: str, cfg: Config, ctx, task, data: Data, device, progress: bool, world=None):
    backend = backends.make(spec)
    rows.ran_as(row, backend)
    ok, reason = backend.availability(ctx)
    row["reason"] = reason  # an available backend may still carry a note (e.g. fp16 instead of bf16)
    if not ok:
        fb = backend.fallback(ctx, reason)
        if fb is None:
            rows.skipped(row, reason)
            _say(progress, f"[{row['student']}] skipped: {reason}")
            return row, []
        rows.fell_back(row, fb, reason)
        backend = fb
    _say(progress, f"[{row['student']}] training {cfg.train.steps} steps ({row['mode']})")
    if backend.framework == "jax":  # the JAX comparator trains in its own framework, on the same batches
        cells, losses = jax_runner.train(cfg, task.reference, data, backend.recipe)
        row.update(cells)
        _say(progress, done_line(row))
        return row, losses
    student = None
    try:
        student, on_step = (world or parallel.World()).prepare(backend, cfg, task, device)
        metrics, losses = run_student(student, cfg, task, data, device,
                                      on_step=_with_progress(on_step, progress, row["student"], cfg.train.steps))
        row.update(metrics)
    except Diverged as e:
        rows.diverged(row, e)
        losses = e.losses
    finally:  # what ran, also when it diverged or failed: a fallback's dtype is known once it is prepared
        rows.ran_in(row, student or backend)
    if row.get("attention_warning"):
        _say(progress, f"[{row['student']}] warning: {row['attention_warning']}")
    _say(progress, done_line(row))
    return row, losses


def _g4(x: Any) -> str:
    """A number as a person reads it: four significant digits ('652.2', '0.1235'); 'n/a' for none."""
    return "n/a" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.4g}"


def done_line(row: dict) -> str:
    """The student's closing progress line: status, final loss, median step time and the held-out quality
    (perplexity and KL for a language model, else the output MSE), each to four significant digits."""
    held_out = (f"held-out ppl {_g4(row['heldout_ppl'])}, KL to teacher {_g4(row.get('kl_teacher_student_t1_nats'))}"
                if row.get("heldout_ppl") is not None else f"eval mse {_g4(row.get('eval_mse'))}")
    return (f"[{row['student']}] {row['status']}: final loss {_g4(row.get('final_train_loss'))}, "
            f"step {_g4(row.get('step_ms_median'))} ms, {held_out}")


def _with_progress(on_step, progress: bool, who: str, steps: int):
    """`on_step` (or nothing), preceded by a line every lm_teacher.progress_every steps of training."""
    every = lm_teacher.progress_every(steps)
    if not progress or steps <= every:
        return on_step

    def step(i: int, loss: float) -> None:
        if i % every == 0 and i < steps:
            _say(progress, f"[{who}] step {i}/{steps}, loss {loss:.4g}")
        if on_step:
            on_step(i, loss)

    return step


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(msg, flush=True)


def summarize(cfg: Config, env: dict, df: pd.DataFrame, run_id: str, device, teacher) -> dict[str, Any]:
    """The tutorial's summary keys (same meaning, correct numbers) plus what they were missing. Which student
    is the TE path and which are compared with bf16 follows from what their backends declare (rows.te_path)."""
    ran = results.ran(df)
    te_spec = rows.te_path(ran)
    base, te = rows.cells(df, cfg.baseline), rows.cells(df, te_spec)

    def ratio(a, b):
        return a / b if a is not None and b else None

    # a diverged student measured its initial loss before training: it still says whether init matched
    started = df[df["status"].isin(results.STARTED)]
    init = started["initial_loss"].dropna().astype(float).tolist()
    if "initial_loss_ranks" in started:  # a distributed run: every rank measured every student's start
        init += [v for cell in started["initial_loss_ranks"].dropna() for v in json.loads(cell) if v is not None]
    spread = float((max(init) - min(init)) / abs(np.mean(init))) if init else None
    world = int(df["world_size"].max()) if "world_size" in df and df["world_size"].notna().any() else 1
    base_ms = base.get("step_ms_median")
    fastest = rows.fastest_bf16(ran)
    fastest_ms = rows.cells(df, fastest).get("step_ms_median") if fastest else None
    return {
        # the tutorial's keys
        "gpu_name": env.get("gpu_name"), "compute_capability": env.get("compute_capability"),
        "te_available": env.get("te_available"), "fp8_available": env.get("fp8_available"),
        "fp8_reason": env.get("fp8_reason"), "mode": te.get("mode") or "Fallback-PyTorch",
        "baseline_eval_mse": base.get("eval_mse"), "te_path_eval_mse": te.get("eval_mse"),
        "baseline_mean_step_ms": base.get("step_ms_mean"), "te_path_mean_step_ms": te.get("step_ms_mean"),
        "baseline_peak_mem_mb": base.get("peak_mem_allocated_mb"),
        "te_path_peak_mem_mb": te.get("peak_mem_allocated_mb"),
        # and more
        "schema_version": results.SCHEMA_VERSION, "run_id": run_id, "preset": cfg.preset, "device": str(device),
        "baseline_student": cfg.baseline, "te_path_student": te_spec,
        "baseline_median_step_ms": base.get("step_ms_median"), "te_path_median_step_ms": te.get("step_ms_median"),
        "teacher_ms_median": df["teacher_ms_median"].iloc[0] if len(df) else None,
        "teacher_dtype": str(teacher.dtype or torch.float32), **teacher.cells(),
        "initial_loss_rel_spread": spread, "initial_losses_equal": spread is not None and spread <= 1e-5,
        "bf16_reference_student": rows.bf16_reference(ran, te.get("backend")),
        "fp8_vs_bf16": rows.fp8_vs_bf16(df, ran),
        "te_install": env.get("te_install"),
        "world_size": world, "strategy": cfg.parallel.strategy if world > 1 else None,
        "scaling_efficiency": ({r["student"]: r.get("scaling_efficiency") for r in ran.to_dict("records")
                                if r.get("world_size") == world} if world > 1 else None),
        "students": {r["student"]: {"status": r["status"], "reason": r["reason"]} for r in df.to_dict("records")},
        "students_with_metrics": len(ran),  # 0: a complete run in which every student diverged, failed or was skipped
        # the baseline's median step / each student's; none for a fallback row (it ran PyTorch, not its backend)
        "speedup_vs_baseline": {r["student"]: ratio(base_ms, r.get("step_ms_median")) if r["status"] == "ok" else None
                                for r in ran.to_dict("records")},
        # the fastest bf16 student's median step / each student's: the honest denominator (rows.fastest_bf16)
        "fastest_bf16_student": fastest,
        "speedup_vs_fastest_bf16": {r["student"]: ratio(fastest_ms, r.get("step_ms_median")) if r["status"] == "ok"
                                    else None for r in ran.to_dict("records")} if fastest else {},
        "gpu_busy_share": {r["student"]: _known(r.get("gpu_busy_share")) for r in ran.to_dict("records")},
        # a slower path than this machine offers (workbench.run.slow_path), by student; {} when none did
        "slow_path": {r["student"]: r["slow_path"] for r in df.to_dict("records")
                      if isinstance(r.get("slow_path"), str)},
        "timings_note": slow_path.CPU_NOTE if device.type == "cpu" else None,
    }


def _known(x):
    return None if x is None or (isinstance(x, float) and np.isnan(x)) else float(x)
