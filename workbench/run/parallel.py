"""One run over several processes: torchrun launches them, DDP or FSDP2 spreads each student over them.

    workbench run --preset large --set nproc=2 --set strategy=fsdp2      # launches torchrun itself
    torchrun --standalone --nproc-per-node 2 -m workbench run --preset large --set strategy=fsdp2

`runner.run` with `parallel.nproc > 1`, outside torchrun, creates the run folder, runs the command
`torchrun_command` builds (the same config, that run id and folder) and returns the folder rank 0 wrote;
the notebook's run cell and the panel go through it too. Multi-node uses torchrun's own c10d rendezvous:
start the same command on every node, each with its node rank (two "nodes" on one host shown here):

    workbench run --preset large --run-id two-nodes --set nproc=1 --set nnodes=2 --set node_rank=0 \\
        --set rdzv_endpoint=localhost:29511 &
    workbench run --preset large --run-id two-nodes --set nproc=1 --set nnodes=2 --set node_rank=1 \\
        --set rdzv_endpoint=localhost:29511

Inside torchrun every rank builds the same task at once (one process builds each cache entry, the others
wait on its lock, not at a collective bounded by parallel.timeout_s), the reference
student's weights are broadcast from rank 0 (matched init by construction), and each rank trains on its own
batches (`task.make_data(shard=rank)`; held-out batches are shared): the global batch is world size x
model.batch. Each student is converted, then wrapped (DDP, or FSDP2: `fully_shard` on every element of
every ModuleList, i.e. per block, then the root); TE FP8 reduces its amax over the data-parallel group. TE FP8
students with options.te_fp8_weights under FSDP2 follow TE's own recipe instead (TE >= 2.16): built on the meta
device, sharded, then initialised shard by shard from the shared weights (`TEFP8.sharded`).
Only rank 0 writes files. A row then carries the slowest rank's step time (`step_ms_*`), the median over
ranks, every rank's median and peak memory (JSON lists), tokens/s of all ranks together and, with
`parallel.scaling_reference`, the weak-scaling efficiency against the same student trained and timed
alone on rank 0 (row '<student>@1gpu'): one-GPU step time / distributed step time.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from workbench import results
from workbench.backends import LOW_PRECISION, Ranks, StepPolicy, Student
from workbench.config import PRESETS, Config, ConfigError
from workbench.run import rows
from workbench.train import Diverged, loop


def in_torchrun() -> bool:
    """True in a process torchrun started (it sets RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def should_launch(cfg: Config) -> bool:
    p = cfg.parallel
    return (p.nproc > 1 or p.nnodes > 1) and not in_torchrun()


# ---- launching ----------------------------------------------------------------------------------
def cli_args(cfg: Config) -> list[str]:
    """`--preset P --set field=value ...`: the command-line form of cfg (its preset, or 'seed' for a config
    not made from one, and every field that differs from it)."""
    preset = cfg.preset if cfg.preset in PRESETS else "seed"
    base = PRESETS[preset]().flat()
    out = ["--preset", preset]
    for name, value in cfg.flat().items():
        if base[name] != value:
            out += ["--set", f"{name}={json.dumps(value) if isinstance(value, list) else value}"]
    return out


def torchrun_command(cfg: Config, out: str | Path, run_id: str, python: str = sys.executable) -> list[str]:
    """The torchrun command line of one run over cfg.parallel's processes (pure: builds, never runs)."""
    p = cfg.parallel
    cmd = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(p.nproc)]
    if p.nnodes > 1:  # torchrun's own rendezvous: every node runs this with its node rank
        cmd += ["--nnodes", str(p.nnodes), "--node-rank", str(p.node_rank), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", p.rdzv_endpoint, "--rdzv-id", run_id]
    else:
        cmd += ["--standalone"]  # a free local port, no rendezvous server to name
    return cmd + ["-m", "workbench", "run", "--out", str(out), "--run-id", run_id, *cli_args(cfg)]


LAUNCHED_ENV = "WORKBENCH_LAUNCHED"
"""Set for the ranks of a run `launch` started: the launcher reports the run (its summary line), they do not."""


def reports_run(cfg: Config) -> bool:
    """Whether this process prints the run's summary line: rank 0 on node 0 of a torchrun started by hand,
    the launcher of one `launch` started (its ranks' output is relayed: rank 0 printing too made it twice)."""
    if in_torchrun():
        return os.environ.get("RANK") == "0" and not os.environ.get(LAUNCHED_ENV)
    return cfg.parallel.node_rank == 0


class LaunchError(RuntimeError):
    """torchrun (or one of its ranks) failed; the message carries the end of its output."""


def launch(cfg: Config, out: str | Path, run_id: str | None, auto_id: str, progress: bool = True) -> Path:
    """Run cfg under torchrun; return the run folder rank 0 wrote. Node 0 creates the folder (exclusively,
    and hands it to rank 0); the ranks' output is relayed line by line (also into a notebook)."""
    if cfg.parallel.nnodes > 1 and run_id is None:
        raise ConfigError("a multi-node run needs --run-id (run_id), the same on every node")
    if cfg.parallel.node_rank == 0:
        run_dir = results.create_run_dir(out, run_id, auto_id)
    else:  # another node's rank 0 writes the files
        run_dir = results.output_root(out) / results.check_name(run_id, "run id")
    cmd = torchrun_command(cfg, run_dir.parent, run_dir.name)
    env = {**os.environ, results.HANDOVER_ENV: str(run_dir), LAUNCHED_ENV: "1", "PYTHONUNBUFFERED": "1"}
    tail: deque[str] = deque(maxlen=40)
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        try:
            for line in proc.stdout:
                tail.append(line)
                if progress:
                    print(line, end="", flush=True)
        except BaseException:  # a notebook interrupt reaches this process only: torchrun and its ranks must stop too
            proc.terminate()  # torchrun passes SIGTERM on to its ranks
            raise
    if proc.returncode:
        raise LaunchError(f"torchrun exited with {proc.returncode} ({' '.join(cmd)}); its last lines:\n{''.join(tail)}")
    return run_dir


# ---- inside torchrun ----------------------------------------------------------------------------
@dataclasses.dataclass
class World:
    """This process's place in the run: rank, world size, strategy; world size 1 outside torchrun."""

    rank: int = 0
    world_size: int = 1
    strategy: str | None = None

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def writes(self) -> bool:
        """Only rank 0 writes result files."""
        return self.rank == 0

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def gather(self, obj: Any) -> list[Any]:
        """obj of every rank, in rank order (small Python objects: rows, losses)."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def from_rank0(self, obj: Any) -> Any:
        """Rank 0's obj on every rank (a small Python object: a path, a row)."""
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def on_rank0(self, fn) -> Any:
        """fn() run by rank 0 alone while the other ranks wait (bounded by parallel.timeout_s, like every
        collective), its result handed to every rank: a run folder, the row of a student timed on one GPU."""
        out = fn() if self.writes else None
        self.barrier()
        return self.from_rank0(out)

    def share_modules(self, modules, device: torch.device) -> None:
        """Every rank's copy of `modules` set to rank 0's (`broadcast_module`): one teacher, one initial state."""
        if self.active:
            for module in modules:
                broadcast_module(module, device)

    def prepare(self, backend, cfg: Config, task, device: torch.device) -> tuple[Student, Any]:
        """(student, on_step) of `backend`: trained by every rank, its model spread for the strategy (`spread`) and a
        per-step check that stops all ranks together (`stop_together`); a process alone trains it as it is."""
        if not self.active:
            return loop.prepare(backend, cfg, task, device), None
        ranks = Ranks(dist.group.WORLD, shard if self.strategy == "fsdp2" else None)
        return spread(loop.prepare(backend, cfg, task, device, ranks), self, backend, device), stop_together(device)

    def merged(self, row: dict, losses: list[float]) -> tuple[dict, list[float]]:
        """One student's row and loss curve from every rank's (`rows.merge_ranks`); a process alone keeps its own."""
        if not self.active:
            return row, losses
        gathered = self.gather((row, losses))
        return rows.merge_ranks([r for r, _ in gathered], [x for _, x in gathered], self)

    def close(self) -> None:
        if self.active and dist.is_initialized():
            dist.destroy_process_group()


def setup(cfg: Config, device: torch.device) -> tuple[World, torch.device]:
    """Join torchrun's process group (nccl on CUDA, gloo on CPU), each rank on cuda:LOCAL_RANK; the
    collectives time out after parallel.timeout_s, so a dead rank fails the run instead of hanging it."""
    if not in_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        return World(), device
    local = int(os.environ.get("LOCAL_RANK", 0))
    timeout = _dt.timedelta(seconds=cfg.parallel.timeout_s)
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    return World(dist.get_rank(), dist.get_world_size(), cfg.parallel.strategy), device


def broadcast_module(module: torch.nn.Module, device: torch.device) -> None:
    """Every tensor of `module` (parameters and buffers) set to rank 0's, wherever it lives (NCCL
    broadcasts from the GPU)."""
    with torch.no_grad():
        for t in module.state_dict().values():
            if torch.is_tensor(t):
                buf = t.to(device)
                dist.broadcast(buf, src=0)
                t.copy_(buf)


def shard(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2: `fully_shard` on every element of every ModuleList (per block), then the root."""
    for m in list(model.modules()):
        if isinstance(m, torch.nn.ModuleList):
            for block in m:
                fully_shard(block)
    return fully_shard(model)


def wrap(model: torch.nn.Module, world: World, device: torch.device) -> torch.nn.Module:
    """The converted student spread over the ranks: DDP, or FSDP2 per block then the root."""
    if world.strategy == "fsdp2":
        return shard(model)
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


FSDP2_TE_RECIPE = ("FSDP2: TE's recipe for FP8 weights (quantized_model_init on the meta device, fully_shard per "
                   "block then the root, reset_parameters, each shard loaded from the shared init; TE FusedAdam's "
                   "fp32 master weights sharded like the parameters)")
FSDP2_PLAIN = "FSDP2: plain fully_shard of the converted TE model"
FSDP2_PLAIN_FP8 = (f"{FSDP2_PLAIN} (weights in model.param_dtype, quantized in each step; options.te_fp8_weights=true "
                   "runs TE's FSDP2 recipe for FP8 weights)")


def spread(student: Student, world: World, backend, device: torch.device) -> Student:
    """A student of `backend` trained by every rank: its model wrapped for the strategy (unless its backend
    already sharded it: TE's own recipe for FP8 weights under FSDP2) and its graphs not applied (a note says so;
    TE FP8 reduced its amax over the data-parallel group: `Ranks`)."""
    model = student.model if student.sharded else wrap(student.model, world, device)
    return dataclasses.replace(student, model=model, policy=spread_policy(student, world, backend))


def spread_policy(student: Student, world: World, backend) -> StepPolicy:
    """The student's step policy on every rank: eager, and notes that say so and which FSDP2 path ran."""
    p = student.policy
    notes = list(p.notes)
    if p.graph is not None:
        notes.append(f"graphs not applied: CUDA graphs of a {world.strategy} step are not supported here; ran eager")
    if world.strategy == "fsdp2" and backend.family == "te":
        if student.sharded:
            notes.append(FSDP2_TE_RECIPE)
        else:
            notes.append(FSDP2_PLAIN_FP8 if student.gemm_precision in LOW_PRECISION else FSDP2_PLAIN)
    return dataclasses.replace(p, graph=None, notes=tuple(notes))


def stop_together(device: torch.device):
    """run_student's on_step in a distributed run: when any rank's loss is non-finite every rank stops at
    that step (Diverged), instead of one leaving the others waiting in the next step's collectives."""
    def on_step(step: int, loss: float) -> None:
        bad = torch.tensor([0.0 if math.isfinite(loss) else 1.0], device=device)
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        if bad.item() and math.isfinite(loss):
            raise Diverged(f"non-finite loss on another rank at training step {step}")
    return on_step
