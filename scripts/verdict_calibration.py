"""The verdict's prediction against the H200's committed measurements: writes
results/reference/h200/verdict/calibration.csv and calibration.md (workbench/verdict/check.py holds the cases).

    .venv/bin/python scripts/verdict_calibration.py
"""
from pathlib import Path

from workbench import results
from workbench.verdict import calibration, check

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / check.H200 / "verdict"


def main() -> None:
    t = check.table(ROOT)
    OUT.mkdir(parents=True, exist_ok=True)
    results.write_bytes(OUT / "calibration.csv", t.to_csv(index=False, float_format="%.4g").encode())
    lines = ["| bench | shape | recipe | fitted | bf16 ms measured / expected | FP8 ms measured / expected | "
             "speed-up measured | expected | ideal | miss |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in t.itertuples():
        recipe = r.recipe if r.calibrated else f"{r.recipe} (not calibrated)"
        lines.append(f"| {r.bench} | {r.shape} | {recipe} | {'yes' if r.fitted else 'no'} | {r.bf16_ms_measured:.2f} / "
                     f"{r.bf16_ms_expected:.2f} | {r.fp8_ms_measured:.2f} / {r.fp8_ms_expected:.2f} | "
                     f"{r.speedup_measured:.3f} | {r.speedup_expected:.3f} | {r.speedup_ideal:.2f} | {r.miss:+.1%} |")
    cal = t[t["calibrated"]]
    held = cal[~cal["fitted"]]["miss"].abs().max()
    b = check.best(t)
    best = ["| bench | shape | best FP8 measured | speed-up | best FP8 expected | speed-up | miss |",
            "|---|---|---|---|---|---|---|"]
    best += [f"| {r.bench} | {r.shape} | {r.best_measured} | {r.speedup_measured:.3f} | {r.best_expected} | "
             f"{r.speedup_expected:.3f} | {r.miss:+.1%} |" for r in b.itertuples()]
    ao = t[t["recipe"] == "torchao_float8"]
    text = "\n".join([
        "# The verdict's prediction against the H200 (written by scripts/verdict_calibration.py)", "",
        "Measured: the committed benches of each shape (8192 tokens a step, TE layers, the whole step in one CUDA "
        "graph; the fastest bf16 row of each bench is TE bf16 layers graphed, the denominator; `verdict/<shape>/` "
        "are the `workbench verdict` runs, measured after the constants were fixed). Expected: "
        "`workbench.verdict.predict` (constants in `workbench/verdict/calibration.py`). 'fitted': the constants "
        "were read off that shape's profiler split; the others are held out.", "", *lines, "",
        f"## The target: best FP8 / fastest bf16 within +-{check.TARGET:.0%}", "", *best, "",
        f"Largest miss of the best ratio: {b['miss'].abs().max():.1%}. Every calibrated row: largest miss "
        f"{cal['miss'].abs().max():.1%}, {held:.1%} on the held-out shapes; the verdict "
        f"quotes +-{calibration.TOLERANCE:.0%} around its expected speed-up. The ideal model (compute only at the "
        "datasheet peaks) overshoots every shape by 30-50%: it misses attention's efficiency, the memory-bound "
        "floors (the KD loss's logits passes most of all) and FP8's casts and scale kernels, which at SmolLM2-135M's "
        "hidden 576 cost more than FP8's GEMMs save.", "",
        "Held out, Qwen2.5-0.5B (hidden 896, vocab 151936) is the largest miss: the model under-credits FP8 there. "
        "Its profiler split (`qwen2.5-0.5b/breakdown/`) names the term: the layer GEMMs at hidden 896 run at 0.62 "
        "(bf16, 28.7 ms) and 0.60 (FP8, 14.9 ms) of the datasheet against the 0.80 and 0.75 the model gives them "
        "(23.1 and 12.7 ms expected); the same ~20% shortfall costs bf16 twice the milliseconds. The bf16 step is "
        "still predicted within 1.2%, because the floor factors absorb its shortfall, and "
        "they are charged to the FP8 step too. A GEMM efficiency that depends on K would fix it; the profiles name "
        "each GEMM kernel but not its shape yet.", "",
        f"Not calibrated, torchao float8 ({', '.join(f'{r.shape} {r.miss:+.0%}' for r in ao.itertuples())}): the term "
        "that is wrong is the path under it. The prediction puts torchao's FP8 GEMMs on TE's graphed step; torchao "
        "runs on the compiled Hugging Face model, whose bf16 step is itself slower than TE's graphed bf16 layers "
        f"(against compiled HF bf16 torchao is {ao['speedup_vs_compiled_bf16_measured'].min():.2f}-"
        f"{ao['speedup_vs_compiled_bf16_measured'].max():.2f}x). Its expected time needs a "
        "calibration of the compiled HF step, which no H200 profile gives yet.", ""])
    results.write_bytes(OUT / "calibration.md", text.encode())
    print(text)


if __name__ == "__main__":
    main()
