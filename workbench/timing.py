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


def measure(step: Callable[[], Any], warmup: int, iters: int, clock, before_timed: Callable[[], None] | None = None) -> Timing:
    """Run `step` warmup + iters times; time only the last `iters`, each on its own."""
    for _ in range(warmup):
        step()
    clock.sync()  # drain warm-up and anything queued before: it must not land in the first timed step
    if before_timed is not None:
        before_timed()
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


def peak_memory_mb(device: torch.device) -> tuple[float | None, float | None]:
    """(max allocated, max reserved) in MiB since the last reset; (None, None) where unknown (CPU)."""
    if device.type != "cuda":
        return None, None
    mib = 1024 ** 2
    return torch.cuda.max_memory_allocated(device) / mib, torch.cuda.max_memory_reserved(device) / mib
