"""A student's row of students.csv, built in one place: every cell the run writes is set here or comes
from a function this module calls (the trainer's metrics, the backend's `describe`, the slow-path check),
and `frame` puts them in the file's order (`results.students_frame`).

    row = rows.new("te_fp8:delayed")          # the student as configured
    rows.ran_as(row, backend)                 # what the backend says it is and runs as
    ...                                       # its metrics (workbench.train.run_student)
    df = rows.frame(rows_of_the_run, rows.run_cells(cfg, run_id, env, task, teacher_cells), task, env)

A distributed student's row is merged from every rank's (`merge_ranks`), followed by its one-process
reference row (`scaling`). The summary's comparisons come from what each backend declares (`declared`).
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from workbench import backends, results
from workbench.run import slow_path
from workbench.train import teacher_targets


def new(spec: str, name: str | None = None) -> dict[str, Any]:
    """The row of one student before it runs: who it is, and 'ok' until something says otherwise."""
    backend, _, recipe = spec.partition(":")
    return {"student": name or spec, "backend": backend, "recipe": recipe or None, "mode": None,
            "status": "ok", "reason": ""}


def ran_as(row: dict, backend) -> None:
    """The cells the backend answers: its name and recipe as resolved, its mode and GEMM precision."""
    row.update(backend=backend.name, recipe=backend.recipe, mode=backend.mode, gemm_precision=backend.gemm_precision,
               framework=backend.framework)


def ran_in(row: dict, student) -> None:
    """The precision its GEMMs ran in, read from the prepared student (a fallback's dtype is decided there; its
    backend's when it failed before), also when it diverged or failed."""
    row["gemm_precision"] = student.gemm_precision


def one_process_unless_merged(row: dict) -> None:
    """world_size 1 for a row no merge over ranks set (a run on one process, a one-GPU reference row)."""
    row.setdefault("world_size", 1)


def skipped(row: dict, reason: str) -> None:
    row.update(status="skipped", mode=None, reason=reason)


def fell_back(row: dict, fallback, reason: str) -> None:
    """A TE student that ran PyTorch autocast instead: the row keeps its name and says so."""
    row.update(status="fallback", mode=fallback.mode, reason=f"{reason} -> ran PyTorch autocast instead")


def failed(row: dict, error: Exception) -> None:
    row.update(status="error", reason=f"{type(error).__name__}: {error}".strip()[:2000])


def diverged(row: dict, error) -> None:
    row.update(error.metrics, status="diverged", reason=str(error), steps_run=len(error.losses))


def changed_batches(row: dict) -> None:
    """Its own numbers may be fine, but what the other students saw after it would not be the same data."""
    row.update(status="error", reason=(
        "this student wrote into the batches shared by all students; they were rebuilt for the next "
        "students. " + row["reason"]).strip())


def run_cells(cfg, run_id: str, env: dict, task, teacher_cells: dict) -> dict[str, Any]:
    """The cells every row of a run shares: schema, run id, the teacher's timing, the task, the resolved
    config (`cfg_<field>`) and the environment stamp."""
    return {"schema_version": results.SCHEMA_VERSION, "run_id": run_id, **teacher_cells, **task.cells(),
            **{f"cfg_{k}": (",".join(v) if isinstance(v, list) else v) for k, v in cfg.flat().items()},
            **{k: env.get(k) for k in results.ENV_STAMP}}


def frame(rows: list[dict], common: dict, task, env: dict) -> pd.DataFrame:
    """students.csv: every row joined with the run's cells and, for language models, its distillation step
    (an online teacher's forward added); the slow-path verdicts; the file's column order."""
    mode = task.info.get("teacher_mode")
    rows = [{**row, **common, **(teacher_targets.step_cells(
        mode, common.get("teacher_ms_median"), row.get("step_ms_median")) if mode else {})} for row in rows]
    slow_path.mark_rows(rows, task.info, env)
    return results.students_frame(rows)


# ---- a distributed student ------------------------------------------------------------------------
def merge_ranks(rows: list[dict], losses: list[list[float]], world) -> tuple[dict, list[float]]:
    """One student's row of a distributed run from every rank's row, and its loss curve (the mean over
    ranks, i.e. the global batch's loss). Step-time cells are the slowest rank's; memory the largest (with
    that rank's floor); a rank that failed makes the row fail with its reason."""
    row = dict(rows[0])
    if len({r["status"] for r in rows}) > 1:  # the ranks disagree: the row is the first failed rank's
        rank, bad = next(((i, r) for i, r in enumerate(rows) if r["status"] not in results.RAN), (0, rows[0]))
        row.update(status=bad["status"], reason=f"rank {rank}: {bad['reason']}".strip())
    _merge_times(row, rows, world.world_size)
    _merge_memory(row, rows)
    if any(r.get("initial_loss") is not None for r in rows):
        row["initial_loss_ranks"] = json.dumps([r.get("initial_loss") for r in rows])
    if losses and all(len(x) == len(losses[0]) for x in losses) and losses[0]:
        curve = [float(v) for v in np.mean(losses, axis=0)]
        if row.get("final_train_loss") is not None:
            row.update(first_step_loss=curve[0], final_train_loss=curve[-1])
    else:
        curve = losses[0] if losses else []
    row.update(world_size=world.world_size, strategy=world.strategy, scaling_efficiency=None)  # see scaling()
    return row, curve


def _merge_times(row: dict, rows: list[dict], world_size: int) -> None:
    medians = [r.get("step_ms_median") for r in rows]
    if all(m is not None for m in medians):
        slowest = rows[int(np.argmax(medians))]
        row.update({k: v for k, v in slowest.items() if k.startswith("step_ms_")})
        row["step_ms_median_rank_median"] = float(np.median(medians))
        row["step_ms_median_ranks"] = json.dumps(medians)
        if slowest.get("tokens_per_s") is not None:  # every rank steps its own batch at the slowest one's pace
            row["tokens_per_s"] = slowest["tokens_per_s"] * world_size
        row["tflops"] = slowest.get("tflops")  # per GPU


def _merge_memory(row: dict, rows: list[dict]) -> None:
    peaks = [r.get("peak_mem_allocated_mb") for r in rows]
    if any(p is not None for p in peaks):
        top = max((i for i, p in enumerate(peaks) if p is not None), key=lambda i: peaks[i])
        row["peak_mem_allocated_mb"] = peaks[top]
        row["peak_mem_allocated_mb_ranks"] = json.dumps(peaks)
        # the floor of the rank with that peak: peak - floor (scaling's student memory) is one rank's
        row["mem_floor_mb"] = rows[top].get("mem_floor_mb")
        row["mem_floor_mb_ranks"] = json.dumps([r.get("mem_floor_mb") for r in rows])
        row["peak_mem_reserved_mb"] = max((r.get("peak_mem_reserved_mb") or 0) for r in rows)


def scaling(row: dict, reference: dict) -> dict:
    """The distributed row's weak-scaling efficiency: the one-process step time over its own (1.0 is
    perfect: N ranks step N batches in the time one took for one)."""
    a, b = reference.get("step_ms_median"), row.get("step_ms_median")
    eff = a / b if a and b and reference.get("status") in results.RAN and row.get("status") in results.RAN else None
    return {**row, "scaling_efficiency": eff}


# ---- what the summary compares ---------------------------------------------------------------------
def cells(df: pd.DataFrame, student: str | None) -> dict[str, Any]:
    """A student's row as a dict, NaN as None; {} for no student."""
    if student is None or student not in set(df["student"]):
        return {}
    r = df[df["student"] == student].iloc[0].to_dict()
    return {k: (None if isinstance(v, float) and pd.isna(v) else v) for k, v in r.items()}


def _declares(df: pd.DataFrame, **want) -> pd.Series:
    """Which rows' backends declare every attribute in `want` (a backend no longer registered: none); `fp8`:
    whether it runs low-precision GEMMs (`backends.low_precision`)."""
    def ok(name):
        cls = backends.declared(name)
        return cls is not None and all((backends.low_precision(name) if k == "fp8" else getattr(cls, k)) == v
                                       for k, v in want.items())
    return df["backend"].map(ok).astype(bool) if len(df) else pd.Series([], dtype=bool)


def te_path(ran: pd.DataFrame) -> str | None:
    """The tutorial's 'TE path' student: the first TE student that ran, an FP8 one when one ran."""
    te = ran[_declares(ran, family="te")]
    fp8 = te[_declares(te, fp8=True)]
    return (fp8 if len(fp8) else te)["student"].iloc[0] if len(te) else None


def bf16_reference(ran: pd.DataFrame, backend: str | None) -> str | None:
    """The bf16 student `backend`'s numbers are compared with: the first of its declared counterparts that
    ran (the base class's for no backend)."""
    cls = (backends.declared(backend) if backend else None) or backends.Backend
    return next((s for s in cls.bf16_counterparts if cells(ran, s)), None)


def fastest_bf16(ran: pd.DataFrame) -> str | None:
    """The bf16 student with the lowest median step (its own path: compiled, TE bf16 layers, graphed: whichever ran
    fastest): the denominator the headline speed-ups name. Only students that ran their own backend (status ok), and
    never a no-KD student (it skips the distillation loss: less work). A PyTorch path: another framework's rows (the
    JAX comparator) stand beside the PyTorch ratios, not under them."""
    def bf16(spec: str) -> bool:
        try:
            b = backends.make(spec)
            return b.gemm_precision == "bf16" and b.framework == "torch"
        except Exception:  # a spec this version no longer knows
            return False

    ok = ran[(ran["status"] == "ok") & ran["step_ms_median"].notna()] if len(ran) else ran
    cand = ok[ok["student"].map(lambda s: ":no_kd" not in s and bf16(s)).astype(bool)] if len(ok) else ok
    return str(cand.loc[cand["step_ms_median"].astype(float).idxmin(), "student"]) if len(cand) else None


def fp8_vs_bf16(df: pd.DataFrame, ran: pd.DataFrame) -> dict[str, dict]:
    """Every FP8 student that ran ok (its backend declares fp8) against its bf16 reference: the loss, eval,
    held-out perplexity and KL-to-teacher ratios."""
    def ratio(a, b):
        return a / b if a is not None and b else None

    out = {}
    for student in df[_declares(df, fp8=True) & (df["status"] == "ok")]["student"]:
        r = cells(df, student)
        ref = cells(ran, bf16_reference(ran, r["backend"]))
        out[student] = {k: ratio(r.get(col), ref.get(col)) for k, col in (
            ("final_loss_ratio", "final_train_loss"), ("eval_mse_ratio", "eval_mse"),
            ("heldout_ppl_ratio", "heldout_ppl"), ("kl_to_teacher_ratio", "kl_teacher_student_t1_nats"))}
    return out
