"""Teacher modes (distill.teacher_mode) behind one registry: where the training batches' teacher targets come
from, so that memory need not grow with train.steps.

    from workbench.train import teacher_targets
    mode = teacher_targets.get("online")
    mode.teacher_in_step                         # True: its teacher's forward runs once per training step
    mode.loss_impls                              # the loss implementations it allows (None: every one)
    mode.train_batches(task, windows, shard)     # how it supplies the training batches

A mode is one file in this folder that calls `register(...)` (precomputed.py, online.py, topk.py); the files
are discovered, as the model kinds are. 'auto' is no mode but a choice: `choose` resolves it (precomputed where
its logits fit, else online). The configuration, a leaf, lists the names as a Literal for the CLI and the
notebooks; a test keeps that list and this registry in agreement, and the run asks `check` what the modes
refuse. Every student of a run sees the same batches and the same targets, whatever the mode.
"""
from __future__ import annotations

import collections.abc
import functools
import importlib
import pkgutil
from typing import Any, Callable

from workbench.config import ConfigError

AUTO = "auto"  # distill.teacher_mode's choice between modes, resolved by `choose`


class TeacherMode:
    """One distill.teacher_mode: what it declares (class attributes) and how it supplies training batches."""

    name = ""
    teacher_in_step = False
    """Its teacher's forward runs per training step (fetched with the batch, outside the student's timed step):
    a row's distillation step adds the teacher's time (`step_cells`). False: it ran before any student."""
    full_train_logits = False
    """The training batches' full logits are held (on the GPU or pinned host memory, as
    distill.teacher_logits says): the placement check counts them."""
    topk = False
    """Its targets are the teacher's top-k logits: the timed batches take the same form, so the timed step
    runs the same loss."""
    stores_targets = False
    """Its targets are written to the cache folder, keyed by the teacher's weights (hashed before any FP8 copy)."""
    loss_impls: tuple[str, ...] | None = None
    """The distill.loss_impl values it allows (the first is what 'auto' becomes); None: every one."""

    def check(self, cfg: Any) -> None:
        """Refuse, naming the field, what this mode cannot run: an explicit loss implementation it does not allow."""
        d = cfg.distill
        if self.loss_impls is not None and d.loss_impl not in (AUTO, *self.loss_impls):
            raise ConfigError(f"distill.teacher_mode={self.name!r} runs the loss as {' or '.join(self.loss_impls)}; "
                              f"distill.loss_impl={d.loss_impl!r} is not allowed with it: set distill.loss_impl="
                              f"{' or '.join((AUTO, *self.loss_impls))}, or another distill.teacher_mode")

    def loss_impl(self, resolved: str) -> str:
        """The loss implementation that runs: `resolved` (lm_objectives.resolve_impl) where allowed, else its own."""
        return resolved if self.loss_impls is None or resolved in self.loss_impls else self.loss_impls[0]

    def record(self, cfg: Any) -> dict[str, Any]:
        """What task.json and every row record of this mode besides its name (teacher_topk: its k, or None)."""
        return {"teacher_topk": cfg.distill.topk if self.topk else None}

    def train_batches(self, task, windows: list, shard: int) -> collections.abc.Sequence:
        """The training batches (tokens, Targets) of the token `windows` [batch, seq_len + 1], for `task` (an
        LMTask: its teacher, device and task.json) and data-parallel rank `shard`."""
        raise NotImplementedError


MODES: dict[str, TeacherMode] = {}


def register(mode: TeacherMode) -> TeacherMode:
    MODES[mode.name] = mode
    return mode


HELPERS = ("logits_placement", "topk_store")  # files of this folder that are the modes' tools, not modes


@functools.cache
def _load_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name not in HELPERS:
            importlib.import_module(f"{__name__}.{info.name}")


def names() -> list[str]:
    """Every teacher mode the registry knows ('auto' is a choice among them, not one of them)."""
    _load_all()
    return sorted(MODES)


def get(name: str) -> TeacherMode:
    """The mode named `name`; an unknown name raises ConfigError naming the field and what is allowed."""
    _load_all()
    if name not in MODES:
        raise ConfigError(f"distill.teacher_mode must be one of {[AUTO, *names()]}, got {name!r}")
    return MODES[name]


def requested(name: str) -> TeacherMode:
    """The mode distill.teacher_mode asks for; 'auto' (resolved later, by `choose`) answers as a mode that
    declares nothing, as both of its outcomes (precomputed, online) do."""
    return TeacherMode() if name == AUTO else get(name)


def check(cfg: Any) -> None:
    """What the requested mode refuses in `cfg` (ConfigError naming the field), before anything is built."""
    requested(cfg.distill.teacher_mode).check(cfg)


def choose(name: str, place: Callable[[int], str]) -> tuple[TeacherMode, str, str | None]:
    """(mode, why, placement of precomputed logits or None). `place(train_steps_factor)` is the precomputed
    placement check (logits_placement.place_teacher_logits): called with 1 for the training batches' logits, 0
    for the timed and held-out batches' alone (they keep full logits on the device in every mode); it raises
    ConfigError when they do not fit. 'auto': precomputed where its logits fit, else online."""
    if name != AUTO:
        mode = get(name)
        where = place(1 if mode.full_train_logits else 0)
        return mode, "requested", where if mode.full_train_logits else None
    try:
        where = place(1)
    except ConfigError as e:
        place(0)
        return get("online"), f"the precomputed logits do not fit ({e}) -> online", None
    return get("precomputed"), f"the precomputed logits fit ({where})", where


def step_cells(name: str, teacher_ms: float | None, step_ms: float | None) -> dict:
    """A row's distillation step: the student's step (step_ms_median, alone) plus the teacher's forward it
    needs per step (a mode whose teacher runs in the step: teacher_ms_median, measured apart; else none, it ran
    before)."""
    teacher = teacher_ms if get(name).teacher_in_step else 0.0
    total = None if step_ms is None or teacher is None else step_ms + teacher
    return {"teacher_step_ms_median": teacher, "distill_step_ms_median": total}
