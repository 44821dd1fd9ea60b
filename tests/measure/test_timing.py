"""The timer: warm-up excluded, synchronized before and after the timed region (a counting fake clock);
repeats and profiling are arguments of measure() and land in each student's own row."""
import json

import pandas as pd
import pytest
import torch

from workbench import config, results
from workbench.config import ModelConfig
from workbench.measure import flops, profiler, timing
from workbench.run import runner


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


def test_repeats_follow_the_reported_block_and_leave_it_alone():
    clock = CountingClock()
    durations = iter([1.0, 3.0, 2.0] + [10.0, 10.0, 10.0] + [5.0, 5.0, 5.0])  # reported block, then 2 repeats

    def step():
        clock.log.append("step")
        clock.now += next(durations)

    t = timing.measure(step, warmup=0, iters=3, clock=clock, after_timed=lambda: clock.log.append("peaks"),
                       repeats=3)
    assert t.times_ms == [1.0, 3.0, 2.0] and t.median == 2.0  # the row's figures: the first block only
    # peaks read right after the first block's final sync, before any repeat touches the device
    assert clock.log[:12] == ["sync"] + ["mark", "step", "mark"] * 3 + ["sync", "peaks"]
    assert clock.log.count("step") == 9
    assert t.repeats.medians_ms == [2.0, 10.0, 5.0] and t.repeats.spread_pct == pytest.approx(8 / 5 * 100)
    cells = t.repeat_summary("step_ms")
    assert cells["step_ms_repeats"] == 3 and json.loads(cells["step_ms_repeat_medians"]) == [2.0, 10.0, 5.0]
    assert cells["step_ms_repeat_spread_pct"] == pytest.approx(160.0) and t.profile is None
    one = timing.measure(lambda: None, 0, 2, timing.CpuClock())  # the default: one block, no spread
    assert len(one.repeats.medians_ms) == 1 and one.repeats.spread_pct is None
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        timing.measure(lambda: None, 0, 1, timing.CpuClock(), repeats=0)


def test_profile_is_one_more_block_under_the_profiler_on_cpu():
    calls = []
    t = timing.measure(lambda: calls.append(sum(range(1000))), 1, 3, timing.CpuClock(), profile=True)
    assert len(calls) == 1 + 3 + 3 and len(t.times_ms) == 3  # warm-up, the reported block, the profiled one
    assert t.profile["profiled_step_ms_median"] is not None
    assert t.profile["kernel_ms_per_step"] is None and t.profile["profiler_reason"]  # CPU work: no kernel time, and why


def test_no_module_level_observer():
    """Repeats and profiling are measure()'s arguments: nothing in the module changes what a call does."""
    assert not hasattr(timing, "observe") and not hasattr(timing, "_OBSERVER")
    state = {n: v for n, v in vars(timing).items() if not n.startswith("__") and isinstance(v, (list, dict, set))}
    assert state == {}


def test_cpu_run_writes_repeats_and_profile_into_each_students_row(tmp_path):
    cfg = config.from_preset("cpu-smoke", steps=2, warmup=1, iters=2, eval_batches=1, repeats=3, profile=True,
                             backends="torch_fp32,te_fp8:delayed", baseline="torch_fp32", device="cpu")
    run_dir = runner.run(cfg, out=tmp_path, run_id="r", progress=False)
    df = results.load(run_dir)
    ran = df[df["status"].isin(["ok", "fallback"])]
    assert len(ran) >= 1
    for r in ran.to_dict("records"):
        medians = json.loads(r["step_ms_repeat_medians"])
        assert r["step_ms_repeats"] == 3 and len(medians) == 3 and medians[0] == pytest.approx(r["step_ms_median"])
        assert pd.notna(r["step_ms_repeat_spread_pct"]) and pd.notna(r["profiled_step_ms_median"])
        assert pd.isna(r["kernel_ms_per_step"]) and r["profiler_reason"]  # on a CPU: no kernel time, and why
        record = json.loads(profiler.profile_path(run_dir, r["student"]).read_text())
        assert record["profiled_step_ms_median"] == pytest.approx(r["profiled_step_ms_median"])
        assert len(json.loads(r["teacher_ms_repeat_medians"])) == 3 and pd.notna(r["teacher_ms_repeat_spread_pct"])
    assert profiler.profile_path(run_dir, "teacher").exists()
    assert profiler.profile_path(run_dir, "te_fp8:delayed").name == "profile-te_fp8-delayed.json"
    for r in df[~df["status"].isin(["ok", "fallback"])].to_dict("records"):  # never timed: no record
        assert not profiler.profile_path(run_dir, r["student"]).exists()


def test_summary_keys_and_empty():
    assert set(timing.Timing([1.0]).summary("step_ms")) == {
        "step_ms_median",
        "step_ms_p20",
        "step_ms_p80",
        "step_ms_mean",
    }
    assert timing.Timing([]).median is None


def test_cpu_memory_is_unknown_not_zero():
    assert timing.peak_memory_mb(torch.device("cpu")) == (None, None)
    assert timing.allocated_mb(torch.device("cpu")) is None


def test_seed_step_is_the_tutorials_40_gflop():
    """The tutorial's seed size is 'a student step of 40 GFLOP' (a literal, not the formula again)."""
    m = ModelConfig(hidden=512, intermediate=2048, layers=3, seq_len=128, batch=8)
    assert flops.train_flops(m) == 40_265_318_400
