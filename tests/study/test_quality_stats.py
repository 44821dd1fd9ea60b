"""The study's statistics against values computed by hand."""
import math

import pytest

from workbench.study import stats as qs


def test_summary_mean_sd_and_t_interval_by_hand():
    # values 1, 2, 6: mean 3; deviations -2, -1, 3 -> sum of squares 14, sd = sqrt(14 / 2) = sqrt(7)
    s = qs.summary([1.0, 2.0, 6.0])
    assert s["n"] == 3 and s["mean"] == pytest.approx(3.0)
    assert s["sd"] == pytest.approx(math.sqrt(7))
    half = 4.3027 * math.sqrt(7) / math.sqrt(3)  # t(0.975, 2) = 4.3027
    assert (s["ci_low"], s["ci_high"]) == pytest.approx((3 - half, 3 + half))


def test_summary_is_unknown_where_it_cannot_be_computed():
    assert qs.summary([]) == {"n": 0, "mean": None, "sd": None, "ci_low": None, "ci_high": None}
    one = qs.summary([5.0, None, float("nan")])  # unknown values are left out, not counted as 0
    assert one["n"] == 1 and one["mean"] == 5.0 and one["sd"] is None and one["ci_low"] is None


def test_t_quantiles():
    assert qs.t975(1) == pytest.approx(12.7062) and qs.t975(2) == pytest.approx(4.3027)
    assert qs.t975(30) == pytest.approx(2.0423)
    assert qs.t975(60) == pytest.approx(2.0003, abs=2e-4)  # the expansion beyond the table
    with pytest.raises(ValueError):
        qs.t975(0)


def test_t_quantiles_agree_with_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 5, 10, 29, 31, 45, 100, 1000):
        assert qs.t975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=2e-4)


def test_paired_gaps_are_per_seed_and_skip_unpaired_seeds():
    ref = {1: 10.0, 2: 20.0, 3: 40.0}
    arm = {1: 11.0, 2: 19.0, 4: 99.0}  # seed 3 missing from the arm, seed 4 from the reference
    assert qs.paired_gaps_pct(ref, arm) == pytest.approx({1: 10.0, 2: -5.0})


def test_noise_floor_is_the_root_mean_square_of_the_bf16_pairs():
    ref = {1: 100.0, 2: 100.0, 3: 100.0}
    noise = {1: 103.0, 2: 96.0, 3: 100.0}  # gaps 3, -4, 0 -> sqrt((9 + 16 + 0) / 3)
    assert qs.noise_floor_pct(ref, noise) == pytest.approx(math.sqrt(25 / 3))
    # a consistent difference is noise of that size, not a floor of 0 (what an sd would say)
    assert qs.noise_floor_pct(ref, {1: 110.0, 2: 110.0, 3: 110.0}) == pytest.approx(10.0)
    assert qs.noise_floor_pct({1: 1.0}, {1: 2.0}) is None


def test_within_noise_rule():
    crosses_zero = {"mean": 2.0, "ci_low": -1.0, "ci_high": 5.0}
    clear = {"mean": 4.0, "ci_low": 3.0, "ci_high": 5.0}
    assert qs.within_noise(crosses_zero, floor_pct=0.1) is True  # the interval contains 0
    assert qs.within_noise(clear, floor_pct=5.0) is True  # |gap| 4 < floor 5
    assert qs.within_noise(clear, floor_pct=3.0) is False  # interval clear of 0 and |gap| above the floor
    assert qs.within_noise({"mean": -4.0, "ci_low": -5.0, "ci_high": -3.0}, floor_pct=3.0) is False
    assert qs.within_noise(clear, floor_pct=None) is False
    assert qs.within_noise({"mean": 4.0, "ci_low": None, "ci_high": None}, None) is None
    assert qs.within_noise({"mean": None}, 1.0) is None


def test_teacher_beaten_names_kd_students_only():
    rows = [{"arm": "te_fp8_delayed", "seed": 1, "kd": True, "heldout_ppl": 20.0, "teacher_heldout_ppl": 25.0},
            {"arm": "torch_bf16", "seed": 1, "kd": True, "heldout_ppl": 30.0, "teacher_heldout_ppl": 25.0},
            {"arm": "no_kd_bf16", "seed": 1, "kd": False, "heldout_ppl": 10.0, "teacher_heldout_ppl": 25.0},
            {"arm": "te_bf16", "seed": 2, "kd": True, "heldout_ppl": None, "teacher_heldout_ppl": 25.0}]
    assert qs.teacher_beaten(rows) == [{"arm": "te_fp8_delayed", "seed": 1, "heldout_ppl": 20.0,
                                        "teacher_heldout_ppl": 25.0}]


def test_flattened():
    assert qs.flattened([2.0, 1.5, 1.0, 0.99]) == (pytest.approx(1.0), True)
    assert qs.flattened([2.0, 1.5, 1.2]) == (pytest.approx(20.0), False)
    assert qs.flattened([1.0]) == (None, None)
