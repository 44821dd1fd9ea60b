"""The profiler keeps every kernel of the step (an unknown one in "other", by name) and the gap between kernels:
what workbench.verdict.breakdown needs to account for every millisecond."""
import types

import torch

from workbench.measure import profiler

# (name, start us, end us) over two steps, names as the H200 profile of a TE FP8 step reported them
INTERVALS = [("nvjet_sm90_qrtst_128x160_128x5_2x1_v_bz_coopA_algo2_TNT", 0, 600),
             ("nvjet_sm90_qrtst_128x160_128x5_2x1_v_bz_coopA_algo2_TNT", 700, 1300),
             ("cast_transpose_optimized_kernel(__nv_bfloat16 const*)", 1300, 1400),
             ("some_kernel_no_pattern_knows", 1400, 1450),
             ("void at::native::" + "x" * 300 + "A", 1450, 1460),  # two long names equal over 160 characters
             ("void at::native::" + "x" * 300 + "B", 1460, 1470),
             ("Memcpy HtoD (Pageable -> Device)", 1470, 1490)]


def test_every_kernel_is_listed_and_unknown_ones_land_in_other():
    b = profiler.breakdown(INTERVALS, steps=2)
    kernels = b["kernels"]
    assert kernels[0] == {"name": INTERVALS[0][0], "category": "gemm", "launches_per_step": 1.0, "ms_per_step": 0.6}
    unknown = [k for k in kernels if k["name"] == "some_kernel_no_pattern_knows"]
    assert unknown == [{"name": "some_kernel_no_pattern_knows", "category": "other", "launches_per_step": 0.5,
                        "ms_per_step": 0.025}]
    assert all(len(k["name"]) <= profiler.NAME_CHARS for k in kernels)
    merged = [k for k in kernels if k["name"].startswith("void at::native::")]
    assert len(merged) == 1 and merged[0]["launches_per_step"] == 1.0 and merged[0]["ms_per_step"] == 0.01
    # nothing dropped: the list sums to the categories, which sum to the kernel time
    total_ms = sum(e - s for _, s, e in INTERVALS) / 1e3 / 2
    assert abs(sum(k["ms_per_step"] for k in kernels) - total_ms) < 1e-9
    assert abs(sum(b["kernel_categories_ms_per_step"].values()) - total_ms) < 1e-9
    assert b["top_kernels"] and len(b["top_kernels"]) <= profiler.TOP_KERNELS  # the old keys stay


def test_profiled_block_records_the_gap(monkeypatch):
    class Profile:  # torch.profiler.profile as a context manager that records nothing
        def __init__(self, **kw):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.profiler, "profile", Profile)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(profiler, "_gpu_intervals", lambda prof: INTERVALS)
    out = profiler.profiled_block(lambda: types.SimpleNamespace(times_ms=[1.0, 1.0], median=1.0))
    assert out["profiler_reason"] == ""
    busy = out["gpu_busy_ms_per_step"]
    assert abs(busy - 0.695) < 1e-9  # 0..1490 us less the 100 us pause at 600..700, over two steps
    assert out["gap_ms_per_step"] == round(1.0 - busy, 4)
    # 'other': the unknown kernel and the two long-named ones
    assert len(out["kernels"]) == 5 and out["kernel_categories_ms_per_step"]["other"] == 0.035
    assert "not the same count" in out["step_timeline"]["reason"]  # 7 activities over 2 steps: no boundary


def test_step_timeline_keeps_one_step_in_order_and_reads_back():
    step = [("nvjet_gemm_fwd", 0, 50), ("triton_red_fused_logsumexp_0", 50, 60), ("nvjet_gemm_fwd", 60, 100)]
    iv = [(n, s + off, e + off) for off in (0, 1000, 2000) for n, s, e in step]
    b = profiler.breakdown(iv, steps=3)
    tl = profiler.step_timeline(iv, 3, b["kernels"])
    assert tl["step"] == 1 and tl["data"].count(":") == 6
    rows = profiler.timeline({"kernels": b["kernels"], "step_timeline": tl})
    assert [(r["name"], r["start_us"], r["us"]) for r in rows] == [
        ("nvjet_gemm_fwd", 0.0, 50.0), ("triton_red_fused_logsumexp_0", 50.0, 10.0), ("nvjet_gemm_fwd", 60.0, 40.0)]
    assert rows[0]["category"] == "gemm" and profiler.timeline({}) == []
