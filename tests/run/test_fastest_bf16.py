"""Every run's summary names the honest denominator (issue 35): the fastest bf16 student that ran its own backend,
never a no-KD student, and each student's speed-up against it."""
import pandas as pd

from workbench import results
from workbench.run import rows


def _ran(*students):
    return pd.DataFrame([{"student": s, "backend": s.split(":")[0], "status": st, "step_ms_median": ms}
                         for s, st, ms in students])


def test_the_fastest_bf16_student_is_the_denominator():
    ran = _ran(("torch_bf16", "ok", 10.0), ("te_bf16", "ok", 8.0), ("te_fp8:delayed", "ok", 6.0),
               ("torch_bf16:no_kd", "ok", 5.0), ("torch_fp32", "ok", 20.0))
    assert rows.fastest_bf16(ran) == "te_bf16"  # not the no-KD row (less work), not FP8 or fp32
    fell_back = _ran(("te_bf16", "fallback", 7.0), ("torch_bf16", "ok", 10.0))
    assert rows.fastest_bf16(fell_back) == "torch_bf16"  # a fallback row ran PyTorch, not TE bf16
    assert rows.fastest_bf16(_ran(("torch_fp32", "ok", 20.0))) is None
    # a faster bf16 row of another framework (the JAX comparator) stands beside the PyTorch denominator
    assert rows.fastest_bf16(_ran(("torch_bf16", "ok", 10.0), ("jax:bf16", "ok", 4.0))) == "torch_bf16"


def test_the_summary_names_it_and_divides_by_it(smoke_run):
    _, run_dir = smoke_run
    s = results.read_json(run_dir / "summary.json")
    df = results.load(run_dir).set_index("student")
    name = s["fastest_bf16_student"]
    assert name == "torch_bf16"  # cpu-smoke's only bf16 student
    for student, x in s["speedup_vs_fastest_bf16"].items():
        if x is not None:
            assert x == df.loc[name, "step_ms_median"] / df.loc[student, "step_ms_median"]
    assert s["speedup_vs_fastest_bf16"][name] == 1.0
