"""The timer: warm-up excluded, synchronized before and after the timed region (a counting fake clock)."""
import pytest
import torch

from workbench import flops, timing
from workbench.config import ModelConfig


class CountingClock:
    """Fake device clock: time advances only when a step runs; logs every sync and mark."""

    def __init__(self):
        self.log, self.now = [], 0.0

    def sync(self):
        self.log.append("sync")

    def mark(self):
        self.log.append("mark")
        return self.now

    def elapsed_ms(self, a, b):
        return b - a


def test_warmup_excluded_and_synchronized():
    clock = CountingClock()
    durations = iter([100.0, 100.0, 100.0] + [1.0, 2.0, 3.0, 4.0, 5.0])  # 3 slow warm-ups, 5 timed

    def step():
        clock.log.append("step")
        clock.now += next(durations)

    t = timing.measure(step, warmup=3, iters=5, clock=clock, before_timed=lambda: clock.log.append("reset"))
    assert t.times_ms == [1.0, 2.0, 3.0, 4.0, 5.0]  # no warm-up time leaks in
    # warm-ups, then a sync (drains queued work), then the reset, then mark/step/mark per step, then a sync
    assert clock.log[:5] == ["step", "step", "step", "sync", "reset"]
    assert clock.log[5:-1] == ["mark", "step", "mark"] * 5
    assert clock.log[-1] == "sync"
    assert t.median == 3.0 and t.mean == 3.0
    assert t.p20 == pytest.approx(1.8) and t.p80 == pytest.approx(4.2)


def test_summary_keys_and_empty():
    assert set(timing.Timing([1.0]).summary("step_ms")) == {"step_ms_median", "step_ms_p20", "step_ms_p80", "step_ms_mean"}
    assert timing.Timing([]).median is None


def test_cpu_memory_is_unknown_not_zero():
    assert timing.peak_memory_mb(torch.device("cpu")) == (None, None)
    assert timing.allocated_mb(torch.device("cpu")) is None


def test_seed_step_is_the_tutorials_40_gflop():
    """REFERENCE §1: the seed size is 'a student step of 40 GFLOP' (a literal, not the formula again)."""
    m = ModelConfig(hidden=512, intermediate=2048, layers=3, seq_len=128, batch=8)
    assert flops.train_flops(m) == 40_265_318_400
