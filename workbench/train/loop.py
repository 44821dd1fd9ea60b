"""Train, evaluate and time one student against precomputed teacher targets.

Every student sees the same batches in the same order (the lists in `Data`), starts from the same
weights (each is a converted copy of one reference model), and its timed step contains only its own forward, loss,
backward and optimizer update: teacher targets were computed and synchronized before.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.distributed.tensor import DTensor

from workbench import results
from workbench.backends import Backend, Ranks, Student
from workbench.env import te as _te
from workbench.measure import flops, profiler, timing
from workbench.train import objectives, optim
from workbench.train.optim import make_optimizer, reset_optimizer, te_fused_adam  # noqa: F401 (loop.* callers)


@dataclass
class Data:
    """Token batches (on the device) and their teacher targets, shared by all students."""

    train: list[tuple[torch.Tensor, objectives.Targets]]
    bench: list[tuple[torch.Tensor, objectives.Targets]]
    eval: list[tuple[torch.Tensor, objectives.Targets]]

    def fingerprint(self) -> torch.Tensor:
        """Checksums of every batch's tokens and targets. Students share these tensors, so one that
        writes into them (e.g. a graph keeping a batch as its static input) silently changes what the
        next students train and are measured on; the runner compares this before and after each."""
        # Training batches that are streamed (host-placed logits, an online teacher, a top-k store: see
        # logits_placement.HostBatches, teacher_targets) hand a student only fresh device copies of their targets,
        # which it cannot write back: only what they keep and share (`shared_tensors`) is checked, and nothing is
        # copied to the device for this check.
        streamed = getattr(self.train, "shared_tensors", None)
        checked = [(t, []) for t in streamed()] if streamed else []
        checked += [(tokens, targets.tensors()) for tokens, targets in (*(self.train if streamed is None else []),
                                                                         *self.bench, *self.eval)]
        # each sum to the host first: streamed batches keep their tokens on the host, the others are on the device
        return torch.stack([_bit_sum(t).cpu() for tokens, tensors in checked for t in (tokens, *tensors)])


_SAME_WIDTH_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bit_sum(t: torch.Tensor) -> torch.Tensor:
    """The int64 sum of a tensor's values read as integers of their width (a view, no copy: LM logits are GBs):
    exact, and a NaN in it is a bit pattern like any other, so a float sum's NaN (never equal to itself,
    and hiding every other change) cannot make unchanged batches look changed."""
    return (t.view(_SAME_WIDTH_INT[t.element_size()]) if t.is_floating_point() else t).sum(dtype=torch.int64)


class Diverged(RuntimeError):
    pass


def update(model: torch.nn.Module, opt: torch.optim.Optimizer, student: Student, task,
           scaler: Any = None) -> Callable[[torch.Tensor, objectives.Targets], torch.Tensor]:
    """The body of one optimizer step, gradients not zeroed: forward under the student's context, the task's
    loss, backward and the optimizer's update (scaled with a grad scaler). The eager step and the captured
    graph both run this one body, so a graphed student trains exactly what an eager one does."""
    def body(tokens: torch.Tensor, targets: objectives.Targets) -> torch.Tensor:
        with student.forward_context():  # wraps the forward only (TE: autocast must not wrap backward)
            out = task.forward(model, tokens)  # what the task's loss takes (logits, hidden states, head features)
        loss = task.loss(out, targets)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss

    return body


def make_step(model: torch.nn.Module, opt: torch.optim.Optimizer, student: Student, task,
              scaler: Any = None) -> Callable[[torch.Tensor, objectives.Targets], torch.Tensor]:
    """One optimizer step of the task's loss; returns the (fp32) loss tensor without synchronizing."""
    body = update(model, opt, student, task, scaler)

    def step(tokens: torch.Tensor, targets: objectives.Targets) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        return body(tokens, targets).detach()

    return step


def _sync_time(fn, device: torch.device) -> tuple[Any, float]:
    """Wall time of a one-off (compilation, graph capture), synchronized on both sides."""
    clock = timing.clock_for(device)
    clock.sync()
    t0 = time.perf_counter()
    out = fn()
    clock.sync()
    return out, (time.perf_counter() - t0) * 1e3


def capture_step(model: torch.nn.Module, fwd: torch.nn.Module, opt: torch.optim.Optimizer, student: Student,
                 task, batch: tuple[torch.Tensor, objectives.Targets], warmup: int = 3):
    """Capture forward, loss, backward and optimizer step in one CUDA graph; return a replaying step.

    The warm-up iterations that capture needs really update the weights, so weights, optimizer state
    and the student's own state (TE's FP8 scaling history) are restored afterwards: the graphed student
    still starts from the shared init, and from the same FP8 scales as its eager run.
    For TE students the capture holds te.autocast's exit (the forward amax reduction and delayed-scaling
    scale update) and the backward's update: TE skips them only inside its own make_graphed_callables.
    """
    tokens, targets = batch
    s_tokens = tokens.clone()
    s_targets = targets.clone()
    snapshot = {k: v.detach().clone() for k, v in model.state_dict().items() if torch.is_tensor(v)}
    eager = make_step(fwd, opt, student, task)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs requires
        for _ in range(warmup):
            eager(s_tokens, s_targets)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)  # grads are then allocated (not accumulated) inside the graph
    with torch.cuda.graph(graph):
        s_loss = update(fwd, opt, student, task)(s_tokens, s_targets)
    with torch.no_grad():
        model.load_state_dict(snapshot, strict=False)  # copy_ into the same tensors: the graph's addresses hold
    reset_optimizer(opt)
    student.reset_after_capture()

    def step(tokens: torch.Tensor, targets: objectives.Targets) -> torch.Tensor:
        s_tokens.copy_(tokens)
        for static, new in zip(s_targets.tensors(), targets.tensors()):
            static.copy_(new)
        graph.replay()
        return s_loss  # a static buffer: read it before the next replay

    # The graph holds raw addresses, not references: the optimizer (its moments, master weights, step count,
    # learning rate) and the model must live as long as the step. Nothing else may hold the optimizer (a caller
    # keeps only the step), and once collected its memory went to the next allocation: TE FusedAdam's state
    # was overwritten by initial_loss's reference copy and the second step read garbage (loss inf).
    step.keep_alive = (model, fwd, opt)
    return step


def repeated_layers(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The model's stack of decoder layers: its longest ModuleList of modules of one class (a Hugging Face
    model's model.layers, the workbench LM's blocks), or None."""
    stacks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 1
              and len({type(x) for x in m}) == 1]
    return max(stacks, key=len, default=None)


def compiled(model: torch.nn.Module, scope: str) -> tuple[torch.nn.Module, str]:
    """(the forward to call, a note): the whole model in one torch.compile, or with scope 'layers' each of its
    repeated layers compiled in place (one compiled code for all: dynamo treats their parameters as inputs)."""
    layers = repeated_layers(model) if scope == "layers" else None
    if layers is None:
        note = "bench.compile_scope='layers' not applied: no stack of repeated layers" if scope == "layers" else ""
        return torch.compile(model), note
    for layer in layers:
        layer.compile()
    return model, f"compiled per layer ({len(layers)} {type(layers[0]).__name__}; the rest eager)"


def _compile_now(fwd, opt, student: Student, task, batch) -> None:
    """Forward + backward once, under the step's own autocast, so compilation happens here (timed as
    compile_ms) and not in training step 1; the gradients are dropped, the weights are untouched."""
    tokens, targets = batch
    with student.forward_context():
        out = task.forward(fwd, tokens)
    task.loss(out, targets).backward()
    opt.zero_grad(set_to_none=True)


def initial_loss(model: torch.nn.Module, task, batch: tuple[torch.Tensor, objectives.Targets]) -> float:
    """The task's loss, in fp32, of the student's *starting weights* run through a copy of the torch
    reference model. Backend arithmetic (bf16, FP8) differs by design; this isolates whether the weights
    are the same, which is what "matched students" promises."""
    tokens, targets = batch
    ref = copy.deepcopy(task.reference).to(tokens.device).float()
    # a distributed student's state: DDP names it under "module.", FSDP2 holds shards (gathered here)
    state = {k.removeprefix("module."): (v.full_tensor() if isinstance(v, DTensor) else v).float()
             for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    # under the reference's names (a Hugging Face student with TE layers maps its fused tensors back), then
    # the reference's own (the MLP's fused layout)
    inner = getattr(model, "module", model)
    if hasattr(inner, "to_reference_state"):
        state = ref.from_reference_state(inner.to_reference_state(state))
    ref.load_state_dict(state)  # strict: a conversion keeps every weight, so a missing one is a bug
    with torch.no_grad():
        out = task.forward(ref, tokens)
        return float(task.matched_loss(out, targets))


def prepare(backend: Backend, cfg, task, device: torch.device, ranks: Ranks | None = None) -> Student:
    """`backend`'s student of the task's reference model, with what was allocated before it existed (teacher,
    data, cached targets): the same for every student of a run unless an earlier student leaked, so the files
    show it next to the peak."""
    _te.reset_fp8_state()  # no earlier student's FP8 buffers in TE's process-wide registry
    floor = timing.allocated_mb(device)
    t0 = time.monotonic()
    student = backend.prepare(task.reference, cfg, device, ranks)
    return dataclasses.replace(student, mem_floor_mb=floor, prepare_s=time.monotonic() - t0)


def run_student(student: Student, cfg, task, data: Data, device: torch.device,
                on_step: Callable[[int, float], None] | None = None) -> tuple[dict, list[float]]:
    """Train, evaluate and time one prepared student (`prepare`). Returns (metrics, per-step losses). Its
    StepPolicy says how its step runs (compiled, graphed, scaled).

    The metrics are row cells, except `profile` (with cfg.bench.profile): the profiled block's whole
    record, per-kernel detail included, for the student's own profile file.
    Raises Diverged (with the losses so far in .losses) on a non-finite loss.
    """
    t0 = time.monotonic()
    model = student.model
    model.train()
    step, metrics = prepare_step(student, cfg, task, data, device)
    metrics["mem_floor_mb"] = student.mem_floor_mb
    # Measured after compilation and graph capture (which ran real warm-up updates and restored them),
    # so a bad restore shows up here as a mismatch with the other students.
    # on the first held-out batch: the one batch every rank of a data-parallel run shares
    metrics["initial_loss"] = initial_loss(model, task, data.eval[0])
    metrics["setup_wall_s"] = student.prepare_s + time.monotonic() - t0  # build, compile, capture (rounded below)
    t_eval = time.monotonic()
    metrics.update(step0_metrics(student, task, data))  # before training: a diverged row keeps them too
    evals = [time.monotonic() - t_eval]  # seconds of each held-out evaluation: step 0, the curve's, the last
    curve: list[dict] = []
    if cfg.train.eval_every:  # for the run's eval_curve.csv, not a row cell (kept, too, if the student diverges)
        metrics["curve"] = curve

    def after_step(i: int, loss: float) -> None:
        if cfg.train.eval_every and i % cfg.train.eval_every == 0 and i < len(data.train):
            t = time.monotonic()
            curve.append({"step": i, **held_out(student, task, data)})
            evals.append(time.monotonic() - t)
        if on_step:
            on_step(i, loss)

    t_train = time.monotonic()
    losses = train(step, data, metrics, after_step)
    metrics["train_wall_s"] = time.monotonic() - t_train - sum(evals[1:])  # the training steps alone
    t = time.monotonic()
    final = held_out(student, task, data)
    evals.append(time.monotonic() - t)
    metrics.update(final, **student.describe())
    if cfg.train.eval_every:
        curve.append({"step": len(losses), **final})
    train_flops = flops.tokens_per_step(cfg.model) * task.reference.train_flops_per_token()
    t = time.monotonic()
    metrics.update(time_steps(step, cfg, data, device, train_flops))
    # Where a student's wall time goes (a study's point is its students one after another): building and
    # converting it, compiling and capturing its step (setup), its held-out evaluations, its training steps and
    # the timed region (warm-up, timed and profiled steps); student_wall_s is all of it.
    metrics.update(bench_wall_s=time.monotonic() - t, eval_wall_s=sum(evals),
                   student_wall_s=student.prepare_s + time.monotonic() - t0)
    for k in results.WALL_CELLS:
        metrics[k] = round(metrics[k], 2)
    return metrics, losses


def step0_metrics(student: Student, task, data: Data) -> dict[str, Any]:
    """The task's `step0_metrics` (LMs: held-out perplexity, KL to the teacher, top-1 agreement) of the student
    before its first training step, in its own precision, as `<metric>_step0` cells; {} for a task without any.

    The same `held_out` as after training, on the same batches, so the two compare: the converted module in
    eval mode under the student's forward context. A compiled or graphed student evaluates as after training
    too: eager (the compiled `fwd` and the whole-step graph are other callables; a module graphed by TE runs its
    own forward outside the training mode it was captured in). Training stays as it would have been: it runs
    before the timed steps (time_steps) and without gradients (no weight, optimizer state or timing changes),
    reads the held-out batches only, and `outside_training` puts delayed scaling's amax history and scales back
    (a module with none yet gets TE's initial state: what its first training step would have found). In a
    distributed run every rank evaluates, as after training (the held-out batches are every rank's).
    """
    if not task.step0_metrics:
        return {}
    start = held_out(student, task, data)
    return {k + results.STEP0_SUFFIX: start[k] for k in task.step0_metrics}


def held_out(student: Student, task, data: Data) -> dict[str, Any]:
    """The task's held-out metrics of the model as it is now (eval mode for the pass, then back)."""
    student.model.eval()
    try:
        # evaluation must not feed FP8 scaling state into training; and it runs eager, as it did before layers
        # were compiled in place (compile_scope='layers'): no compile of an eval-mode graph inside eval_wall_s
        with student.outside_training(), torch.compiler.set_stance("force_eager"):
            return task.evaluate(student.model, student, data.eval)
    finally:
        student.model.train()


def prepare_step(student: Student, cfg, task, data: Data, device: torch.device):
    """(step, metrics): the student's train step as its policy says (compiled, graphed, scaled),
    with the one-off costs (compile_ms, capture_ms) and notes on switches that did not apply."""
    model, policy = student.model, student.policy
    notes = list(policy.notes)
    graph, fwd = policy.graph, model
    if policy.compile:  # torch.compile only wraps here; compilation itself runs in _compile_now below
        fwd, note = compiled(model, cfg.bench.compile_scope)
        notes += [note] if note else []
        if graph and fwd is model and getattr(model, "masks_change_under_capture", False):
            # layers compiled in place that are handed transformers' masks: its mask code builds a tensor under a
            # capture where warm-up had None, the layers recompile inside the capture and invalidate it (an H100 at
            # 7634e2f, results/reference/cpu/hf_mask_under_capture.txt). The step runs eager, its layers compiled.
            notes.append(f"graph:{graph} not applied: layers compiled in place and transformers' attention masks "
                         "(which change under a capture); the step runs eager, its layers compiled")
            graph = None
    metrics: dict[str, Any] = {"compiled": policy.compile, "graphed": graph is not None,
                               "graph_scope": graph, "compile_ms": None, "capture_ms": None}
    opt, note = make_optimizer(model, cfg, device, capturable=graph == "step", scaled=policy.grad_scaler)
    notes += [note] if note else []
    rates = optim.schedule(opt, cfg.train, len(data.train), device, captured=graph == "step")
    metrics["optimizer"] = type(opt).__name__
    scaler = torch.amp.GradScaler(device.type) if policy.grad_scaler else None
    if policy.compile:
        _, metrics["compile_ms"] = _sync_time(lambda: _compile_now(fwd, opt, student, task, data.train[0]), device)
    if graph == "step":
        step, metrics["capture_ms"] = _sync_time(
            lambda: capture_step(model, fwd, opt, student, task, data.train[0]), device)
        notes.append("graphed step includes copying each batch into the graph's static input buffers")
    elif graph == "fwd_bwd":  # the optimizer step stays eager
        fwd, metrics["capture_ms"] = _sync_time(lambda: student.make_graphed(fwd, data.train[0][0]), device)
        opt.zero_grad(set_to_none=True)
        step = make_step(fwd, opt, student, task, scaler)
    else:
        step = make_step(fwd, opt, student, task, scaler)
    metrics["notes"] = "; ".join(notes)
    return optim.scheduled(step, opt, rates), metrics


def train(step, data: Data, metrics: dict, on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """Every training batch once, in order; the losses (and first/final/steps_run into `metrics`).
    Raises Diverged on a non-finite loss."""
    losses: list[float] = []
    for i, (tokens, targets) in enumerate(data.train):
        loss = float(step(tokens, targets))  # .item() syncs: fine here, training is not timed
        losses.append(loss)
        try:
            if on_step:
                on_step(i + 1, loss)  # may raise Diverged too (a distributed run: another rank's loss)
            if not math.isfinite(loss):
                raise Diverged(f"non-finite loss {loss} at training step {i + 1}")
        except Diverged as err:
            err.losses, err.metrics = losses, metrics
            raise
    metrics.update(first_step_loss=losses[0], final_train_loss=losses[-1], steps_run=len(losses))
    return losses


def time_steps(step, cfg, data: Data, device: torch.device, train_flops: int) -> dict[str, Any]:
    """The timed region: identical bench batches, cycled; losses stay on the device (no sync inside).
    Step-time statistics, throughput, peak memory, the GPU's busy share of the step (a few profiled steps
    when bench.profile is off), and the profiler's summary when asked for."""
    batches = itertools.cycle(data.bench)

    def timed_step():
        step(*next(batches))

    peaks: list = []
    t = timing.measure(timed_step, cfg.bench.warmup, cfg.bench.iters, timing.clock_for(device),
                       before_timed=lambda: timing.reset_peak_memory(device),
                       after_timed=lambda: peaks.extend(timing.peak_memory_mb(device)),
                       repeats=cfg.bench.repeats, profile=cfg.bench.profile, busy_probe=True)
    alloc, reserved = peaks
    out: dict[str, Any] = {
        **t.summary("step_ms"),
        **t.repeat_summary("step_ms"),
        "tokens_per_s": flops.tokens_per_step(cfg.model) / (t.median * 1e-3) if t.median else None,
        "tflops": flops.tflops(train_flops, t.median),
        "train_gflop_per_step": train_flops / 1e9,  # the model's own count: readers need not redo it
        "peak_mem_allocated_mb": alloc, "peak_mem_reserved_mb": reserved,
        # the silent-slowdown evidence of every GPU run (workbench.run.slow_path): None on a CPU
        "gpu_busy_ms_per_step": t.gpu_busy_ms, "gpu_busy_share": t.gpu_busy_share,
    }
    if t.profile is not None:  # the summary in the row; the whole record (per-kernel detail) under "profile"
        out.update({k: t.profile.get(k) for k in profiler.SUMMARY}, profile=t.profile)
    return out
