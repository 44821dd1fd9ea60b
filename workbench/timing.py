"""The one timing module: every step time, teacher time and memory peak in the workbench comes from here.

Rules (REFERENCE §4): warm-up steps run untimed; the device is synchronized before the timed region
(so queued work such as teacher targets or warm-up is not counted) and after it; on CUDA each step is
bracketed by CUDA events recorded on the stream, on CPU by perf_counter. Peak-memory counters are reset
right before the timed region. Median, p20, p80 and mean are reported, per-step times kept.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch


class CpuClock:
    def sync(self) -> None:  # CPU work is synchronous: nothing to wait for
        pass

    def mark(self) -> float:
        return time.perf_counter()

    def elapsed_ms(self, start: float, end: float) -> float:
        return (end - start) * 1e3


class CudaClock:
    def __init__(self, device: torch.device):
        self.device = device

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def mark(self) -> torch.cuda.Event:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def elapsed_ms(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return start.elapsed_time(end)  # valid only after sync(): measure() syncs before reading


def clock_for(device: torch.device):
    return CudaClock(device) if device.type == "cuda" else CpuClock()


@dataclass
class Timing:
    times_ms: list[float] = field(default_factory=list)

    def stat(self, q: float) -> float | None:
        return float(np.percentile(self.times_ms, q)) if self.times_ms else None

    @property
    def median(self) -> float | None:
        return self.stat(50)

    @property
    def p20(self) -> float | None:
        return self.stat(20)

    @property
    def p80(self) -> float | None:
        return self.stat(80)

    @property
    def mean(self) -> float | None:
        return float(np.mean(self.times_ms)) if self.times_ms else None

    def summary(self, prefix: str) -> dict[str, float | None]:
        return {f"{prefix}_median": self.median, f"{prefix}_p20": self.p20,
                f"{prefix}_p80": self.p80, f"{prefix}_mean": self.mean}


def measure(step: Callable[[], Any], warmup: int, iters: int, clock, before_timed: Callable[[], None] | None = None,
            after_timed: Callable[[], None] | None = None) -> Timing:
    """Run `step` warmup + iters times; time only the last `iters`, each on its own.

    `before_timed` runs after the warm-up sync (reset peak-memory stats there); `after_timed` right after
    the timed block's final sync and before anything else touches the device (read the peaks there)."""
    for _ in range(warmup):
        step()
    clock.sync()  # drain warm-up and anything queued before: it must not land in the first timed step
    if before_timed is not None:
        before_timed()
    t = _timed_block(step, iters, clock)
    if after_timed is not None:
        after_timed()
    if _OBSERVER is not None:  # only inside `observe()` (workbench bench); never changes `t`
        _OBSERVER.after_measure(step, iters, clock, t)
    return t


def _timed_block(step: Callable[[], Any], iters: int, clock) -> Timing:
    """`iters` steps, each bracketed by its own marks; one sync at the end, before reading them."""
    marks = []
    for _ in range(iters):
        start = clock.mark()
        step()
        marks.append((start, clock.mark()))
    clock.sync()  # every end event has completed before we read it
    return Timing([clock.elapsed_ms(a, b) for a, b in marks])


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def allocated_mb(device: torch.device) -> float | None:
    """Memory allocated by torch right now, MiB; None where unknown (CPU)."""
    return torch.cuda.memory_allocated(device) / 1024 ** 2 if device.type == "cuda" else None


def peak_memory_mb(device: torch.device) -> tuple[float | None, float | None]:
    """(max allocated, max reserved) in MiB since the last reset; (None, None) where unknown (CPU)."""
    if device.type != "cuda":
        return None, None
    mib = 1024 ** 2
    return torch.cuda.max_memory_allocated(device) / mib, torch.cuda.max_memory_reserved(device) / mib


# ---- noise and observation (workbench bench) -------------------------------------------------
# The bench needs two things from every timed region without changing how a run times it: repeated
# medians (target P4: how much does the median move between measurements?) and one extra block run
# under the profiler (the kernel-time cross-check). `observe()` collects both from every `measure()`
# call made while it is active -- including the ones inside runner.run / train.run_student -- by
# running the same warmed-up `step` again *after* the returned timing was taken. The run's own numbers
# (step_ms_median, peak memory) are untouched; the extra blocks only cost time.


@dataclass
class RepeatStats:
    """Medians of `n` back-to-back timed blocks and how far they spread."""

    medians_ms: list[float]

    @property
    def median_ms(self) -> float | None:
        return float(np.median(self.medians_ms)) if self.medians_ms else None

    @property
    def spread_pct(self) -> float | None:
        """(max - min) / median of the block medians, in percent; None with fewer than 2 blocks."""
        m = self.median_ms
        if len(self.medians_ms) < 2 or not m:
            return None
        return (max(self.medians_ms) - min(self.medians_ms)) / m * 100.0

    def summary(self) -> dict[str, Any]:
        return {"repeats": len(self.medians_ms), "repeat_medians_ms": list(self.medians_ms),
                "median_of_medians_ms": self.median_ms, "median_spread_pct": self.spread_pct}


def repeat_medians(block: Callable[[], Timing], n: int) -> RepeatStats:
    """Run `block` (one timed measurement returning a Timing) `n` times; keep each median."""
    return RepeatStats([m for m in (block().median for _ in range(n)) if m is not None])


@dataclass
class Observation:
    """What `observe()` saw of one `measure()` call."""

    median_ms: float | None  # the median measure() returned (matches the row that reports it)
    iters: int
    noise: RepeatStats  # the returned block first, then the repeats
    extra: dict[str, Any] = field(default_factory=dict)  # what `extra_block` returned

    def to_dict(self) -> dict[str, Any]:
        return {"median_ms": self.median_ms, "iters": self.iters, **self.noise.summary(), **self.extra}


class _Observer:
    def __init__(self, repeats: int, extra_block):
        self.repeats, self.extra_block = repeats, extra_block
        self.observations: list[Observation] = []

    def after_measure(self, step, iters: int, clock, first: Timing) -> None:
        def block() -> Timing:
            return _timed_block(step, iters, clock)

        more = repeat_medians(block, self.repeats - 1)  # none when repeats is 1
        noise = RepeatStats(([first.median] if first.median is not None else []) + more.medians_ms)
        extra = self.extra_block(block) if self.extra_block is not None else {}
        self.observations.append(Observation(first.median, iters, noise, extra))


_OBSERVER: _Observer | None = None


class observe:
    """Context manager: while active, every `measure()` also runs `repeats - 1` more timed blocks of
    the same step (noise), then `extra_block(block)` if given (e.g. one block under torch.profiler).

        with timing.observe(repeats=3) as seen:
            runner.run(cfg, ...)
        seen.observations  # one Observation per measure() call, in call order

    Not reentrant: the bench observes one run at a time.
    """

    def __init__(self, repeats: int = 1, extra_block: Callable[[Callable[[], Timing]], dict] | None = None):
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        self._observer = _Observer(repeats, extra_block)

    @property
    def observations(self) -> list[Observation]:
        return self._observer.observations

    def __enter__(self) -> "observe":
        global _OBSERVER
        if _OBSERVER is not None:
            raise RuntimeError("timing.observe() is already active")
        _OBSERVER = self._observer
        return self

    def __exit__(self, *exc) -> None:
        global _OBSERVER
        _OBSERVER = None
