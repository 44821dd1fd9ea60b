"""The one timing module: every step time, teacher time and memory peak in the workbench comes from here.

Rules: warm-up steps run untimed; the device is synchronized before the timed region
(so queued work such as teacher targets or warm-up is not counted) and after it; on CUDA each step is
bracketed by CUDA events recorded on the stream, on CPU by perf_counter. Peak-memory counters are reset
right before the timed region. Median, p20, p80 and mean are reported, per-step times kept.

What else a measurement does is the caller's config (BenchConfig.repeats, .profile), passed to
`measure()`: more timed blocks of the same warmed-up step for the noise figure (how much the median
moves between measurements), and one block under torch.profiler for the kernel-time cross-check. Both
run after the reported block, so they never change its times or memory peaks.

Every CUDA measurement also says how busy the GPU was (`Timing.gpu_busy_share`): the profiled block's
GPU busy time where one ran, else a short block of BUSY_PROBE_STEPS steps under the profiler (`busy_probe`),
over the reported median. Below profiler.HOST_BOUND_BELOW the host set the pace, not the GPU.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from workbench.measure import profiler

BUSY_PROBE_STEPS = 3  # a few profiled steps are enough for a busy share; the profiler's start costs more than they do

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
class RepeatStats:
    """Medians of `n` back-to-back timed blocks and how far they spread (how much the median moves
    between measurements of the same step)."""

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


def repeat_medians(block: Callable[[], "Timing"], n: int) -> RepeatStats:
    """Run `block` (one timed measurement returning a Timing) `n` times; keep each median."""
    return RepeatStats([m for m in (block().median for _ in range(n)) if m is not None])


@dataclass
class Timing:
    times_ms: list[float] = field(default_factory=list)
    """The first timed block's per-step times: the figures a row reports."""
    repeats: RepeatStats = field(default_factory=lambda: RepeatStats([]))
    """Median of every timed block of `measure(repeats=n)`, the first block's included."""
    profile: dict[str, Any] | None = None
    """`profiler.profiled_block` of one more block under torch.profiler (`measure(profile=True)`)."""
    gpu_busy_ms: float | None = None
    """GPU busy time per step (kernels and copies, overlaps counted once) seen by the profiler; None on a CPU."""

    @property
    def gpu_busy_share(self) -> float | None:
        """gpu_busy_ms over the reported median step: how much of the step the GPU worked."""
        return self.gpu_busy_ms / self.median if self.gpu_busy_ms is not None and self.median else None

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

    def repeat_summary(self, prefix: str) -> dict[str, Any]:
        """Row cells of the repeated blocks; the medians as a JSON list (one cell of a CSV row)."""
        return {f"{prefix}_repeats": len(self.repeats.medians_ms),
                f"{prefix}_repeat_medians": json.dumps(self.repeats.medians_ms),
                f"{prefix}_repeat_spread_pct": self.repeats.spread_pct}


def measure(step: Callable[[], Any], warmup: int, iters: int, clock, before_timed: Callable[[], None] | None = None,
            after_timed: Callable[[], None] | None = None, repeats: int = 1, profile: bool = False,
            busy_probe: bool = False) -> Timing:
    """Run `step` warmup + iters times; time only the last `iters`, each on its own.

    `before_timed` runs after the warm-up sync (reset peak-memory stats there); `after_timed` right after
    the timed block's final sync and before anything else touches the device (read the peaks there).
    Then, on the already warmed-up step: `repeats - 1` more timed blocks (each one's median goes to
    `.repeats`, the noise figure) and, with `profile`, one more block under torch.profiler
    (`.profile`, see workbench.measure.profiler), or, with `busy_probe` on a CUDA clock, BUSY_PROBE_STEPS steps
    under it for `.gpu_busy_ms` alone. The returned times and the peaks are the first block's:
    the extra blocks only cost time."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        step()
    clock.sync()  # drain warm-up and anything queued before: it must not land in the first timed step
    if before_timed is not None:
        before_timed()
    t = _timed_block(step, iters, clock)
    if after_timed is not None:
        after_timed()
    more = repeat_medians(lambda: _timed_block(step, iters, clock), repeats - 1)
    t.repeats = RepeatStats(([t.median] if t.median is not None else []) + more.medians_ms)
    if profile:
        t.profile = profiler.profiled_block(lambda: _timed_block(step, iters, clock))
        t.gpu_busy_ms = t.profile.get("gpu_busy_ms_per_step")
    elif busy_probe and isinstance(clock, CudaClock):
        t.gpu_busy_ms = profiler.profiled_block(
            lambda: _timed_block(step, BUSY_PROBE_STEPS, clock)).get("gpu_busy_ms_per_step")
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


class Phases(dict):
    """Wall seconds of a run's phases, in order: `before_run_s` (the process's age when the run began) and
    `start_s` from the run's start `t0` to this object; `mark(name)` adds the time since the last mark."""

    def __init__(self, t0: float):
        super().__init__()
        self._last = time.monotonic()
        age = process_age_s()
        self["before_run_s"] = None if age is None else round(age - (self._last - t0), 2)
        self["start_s"] = round(self._last - t0, 2)

    def mark(self, name: str) -> dict:
        now = time.monotonic()
        self[name], self._last = round(now - self._last, 2), now
        return dict(self)


def process_age_s() -> float | None:
    """Seconds since this process started (imports, config, a sweep worker's start), from Linux's /proc; None
    elsewhere."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
