"""The verdict's files: verdict.json (the prediction and the GPU part), verdict.md (one page) and verdict.png /
.svg (the expected step split, bf16 against each FP8 recipe), each written atomically (workbench.results)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench import results
from workbench.verdict import calibration, quality

PARTS = ("layer_gemms", "lm_head", "attention", "optimizer", "logits_loss", "elementwise", "fp8_casts")
COLOURS = ("#4c72b0", "#55a868", "#c44e52", "#8c8c8c", "#b0b0b0", "#d0d0d0", "#dd8452")


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}"


def _range(r: dict) -> str:
    if r["recipe"] == "bf16":
        return "1.00x (the denominator)"
    if r.get("speedup_expected") is None:
        return "—"
    return f"{r['speedup_expected']:.2f}x ({r['speedup_low']:.2f}–{r['speedup_high']:.2f})"


def measured_sentence(m: dict[str, Any]) -> str | None:
    """The GPU part in one sentence with numbers, or None where it did not run."""
    if m.get("status") != "ok":
        return None
    b, d = m["best_fp8"], m["denominator"]
    if not b:
        why = "; ".join(f"{r['variant']} {r['student']}: {r['reason']}" for r in m["not_run"][:3])
        return f"Measured: no FP8 row ran ({why})."
    parts = [f"{b['what']}, `{b['student']}`: {b['speedup_vs_fastest_bf16']:.2f}x your fastest bf16 path "
             f"({d['what']}, `{d['student']}`, {d['step_ms']:.1f} ms)"]
    if b["speedup_vs_compiled_bf16"]:
        parts.append(f"{b['speedup_vs_compiled_bf16']:.2f}x compiled HF bf16")
    if b["mem_vs_fastest_bf16"] is not None:
        parts.append(f"peak memory {b['mem_vs_fastest_bf16']:+.0%}")
    if b.get("kl_teacher_student_t1_nats_step0") is not None:
        parts.append(f"before training it is {b['kl_teacher_student_t1_nats_step0']:.3g} nats/token (KL) from the "
                     f"model's bf16 forward, top-1 agreement {b['top1_agreement_step0']:.3f}")
    if b.get("predicted_speedup"):
        parts.append(f"predicted {b['predicted_speedup']:.2f}x")
    j = m["judgement"]
    return f"Measured: {'; '.join(parts)}. {'Recommended' if j['recommended'] else 'Not recommended'}: {j['why']}."


def headline(verdict: dict[str, Any]) -> str:
    """One sentence with numbers: the measurement where the GPU part ran, the prediction beside it, and where
    studies were given, what the FP8 recipe does to what the student learns (quality.py)."""
    recipes = verdict["prediction"]["recipes"][1:]
    rows = [r for r in recipes if r["eligible"] and r.get("speedup_expected") and r["calibrated"]]
    ceil = verdict["prediction"]["ceilings"]
    m = verdict["measured"]
    measured = measured_sentence(m) or f"GPU part: {m['status']} ({m['reason']})."
    if not rows:
        return " ".join(filter(None, [f"No speed-up predicted on {ceil['gpu']}: no calibrated FP8 recipe is eligible "
                                      f"here or the GPU is unknown ({ceil['peak_source']}). {measured}",
                                      quality_sentence(verdict)]))
    top = max(rows, key=lambda r: r["speedup_expected"])
    pays = ("FP8 pays" if top["speedup_low"] > 1 else "FP8 does not pay" if top["speedup_high"] < 1
            else "within the prediction's range of bf16: FP8 may not pay")
    predicted = (f"Predicted on {ceil['gpu']}: {top['what']}: {_range(top)} the fastest bf16 path (TE bf16 layers, "
                 f"graphed; ideal bound {top['speedup_ideal']:.2f}x); {pays}.")
    outside = verdict["prediction"].get("calibration", {}).get("outside")
    if outside:
        predicted += f" Outside the calibrated range ({outside}): expect larger misses."
    speed = f"{measured} {predicted}" if m.get("status") == "ok" else f"{predicted} {measured}"
    return " ".join(filter(None, [speed, quality_sentence(verdict, top["recipe"])]))


def studied_recipe(verdict: dict[str, Any], predicted: str | None) -> str | None:
    """The FP8 recipe the quality part is about: the measured fastest FP8 row's, else the predicted best one's."""
    m = verdict.get("measured") or {}
    best = m.get("best_fp8") if m.get("status") == "ok" else None
    return (best or {}).get("recipe") or predicted


def quality_sentence(verdict: dict[str, Any], predicted: str | None = None) -> str | None:
    """The studies' answer for the verdict's FP8 recipe, and a warning where it is beyond a study's noise floor."""
    studies = verdict.get("quality") or []
    recipe = studied_recipe(verdict, predicted)
    said = quality.sentence(studies, recipe)
    beyond = quality.outside(studies, recipe)
    if said and beyond:
        said += (f" So FP8's step comes with a student that ends measurably elsewhere than bf16's in "
                 f"{', '.join(f'`{b}`' for b in beyond)}: read that study before adopting it.")
    return said


def f(v: float | None, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


def _measured_section(verdict: dict[str, Any]) -> list[str]:
    m = verdict["measured"]
    if m.get("status") != "ok":
        return [f"{m['status']}: {m['reason']}"]
    out = [f"Bench: `{m['bench_dir']}`. Denominator: the fastest bf16 row, {m['denominator']['what']} "
           f"(`{m['denominator']['student']}`, {m['denominator']['step_ms']:.2f} ms).", "",
           "| variant | student | step ms | x fastest bf16 | x compiled bf16 | peak MiB (vs fastest bf16) | "
           "step-0 KL, nats | step-0 top-1 | predicted |", "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(m["rows"], key=lambda r: r["step_ms"]):
        out.append(f"| {r['what']} | `{r['student']}` | {r['step_ms']:.2f} | {r['speedup_vs_fastest_bf16']:.2f} | "
                   f"{f(r['speedup_vs_compiled_bf16'], '.2f')} | {f(r['peak_mem_mb'], '.0f')} "
                   f"({f(r['mem_vs_fastest_bf16'], '+.0%')}) | {f(r['kl_teacher_student_t1_nats_step0'], '.3g')} | "
                   f"{f(r['top1_agreement_step0'], '.3f')} | {f(r['predicted_speedup'], '.2f')} |")
    out += ["", *[f"- not run: {r['variant']} `{r['student']}` ({r['status']}): {r['reason']}" for r in m["not_run"]],
            *_misses(verdict)]
    if m.get("best_fp8_split_ms"):
        split = ", ".join(f"{k} {v:.2f}" for k, v in sorted(m["best_fp8_split_ms"].items(), key=lambda kv: -kv[1]))
        out += ["", f"Where the fastest FP8 row's step goes (profiler, ms a step): {split}."]
    return out


def _misses(verdict: dict[str, Any]) -> list[str]:
    """A measured row off its prediction by more than the quoted range, with the term that is wrong where known."""
    calibrated = {r["recipe"]: r["calibrated"] for r in verdict["prediction"]["recipes"]}
    out = []
    for r in verdict["measured"]["rows"]:
        p = r.get("predicted_speedup")
        if not p or abs(p / r["speedup_vs_fastest_bf16"] - 1) <= calibration.TOLERANCE:
            continue
        why = ("not calibrated: the prediction puts its FP8 GEMMs on TE's graphed step, while it ran on "
               f"{r['what']}, whose own bf16 step is slower (it is {f(r['speedup_vs_compiled_bf16'], '.2f')}x "
               "compiled HF bf16)" if r["variant"] == "hf-compile" else
               "not calibrated: no H200 profile of this recipe yet" if not calibrated.get(r["recipe"], True) else
               "a calibrated recipe outside its range: recalibrate (scripts/verdict_calibration.py)")
        out.append(f"- off its prediction: `{r['student']}` ({r['what']}) measured "
                   f"{r['speedup_vs_fastest_bf16']:.2f}x, predicted {p:.2f}x: {why}.")
    return out


def _recipe_table(p: dict) -> list[str]:
    out = ["| recipe | eligible | calibrated | ideal ms | expected ms | speed-up vs fastest bf16, expected (range) | "
           "ideal bound | why not |", "|---|---|---|---|---|---|---|---|"]
    for r in p["recipes"]:
        ideal = "" if r["recipe"] == "bf16" or r.get("speedup_ideal") is None else f"{r['speedup_ideal']:.2f}x"
        out.append(f"| {r['what']} | {'yes' if r['eligible'] else 'no'} | {'yes' if r['calibrated'] else 'no'} | "
                   f"{_ms(r.get('ideal_ms'))} | {_ms(r.get('expected_ms'))} | {_range(r)} | {ideal} | "
                   f"{r['reason'] or ''} |")
    return out


def _eligibility_table(p: dict) -> list[str]:
    e = p["eligibility"]
    out = ["| GEMM | layers | M | K | N | TFLOP a step | tensor scaling (%16) | block scaling (%128) |",
           "|---|---|---|---|---|---|---|---|"]
    for g in e["gemms"]:
        cells = [("yes" if g[r]["eligible"] else f"no: {g[r]['reason'].split(':')[0]}") for r in ("tensor", "block")]
        out.append(f"| {g['name']} | {g['layers']} | {g['m']} | {g['k']} | {g['n']} | {g['tflop_per_step']:.2f} | "
                   + " | ".join(cells) + " |")
    a, te = e["attention"], e["te_layers"]
    fp8 = {True: "yes", False: "no", None: "unknown"}[a["fp8"]["eligible"]]
    return [*out, "", f"- **FP8 attention** (head_dim {a['head_dim']}, {a['heads']} heads, {a['kv_heads']} KV heads): "
            f"{fp8}: {a['fp8']['reason']}",
            f"- **TE decoder layers**: {'supported' if te['supported'] else 'not supported'}: {te['reason']}"]


def markdown(verdict: dict[str, Any]) -> str:
    p = verdict["prediction"]
    f, fl, model = p["flops"], p["floors"], p["model"]
    lines = [f"# Verdict: {model['source']} ({model['model_type']}), {p['run']['tokens_per_step']} tokens a step",
             "", headline(verdict), "", "## Predicted speed-up by recipe", "", *_recipe_table(p), "",
             "![expected step split](verdict.png)", "", "## FP8 eligibility", "", *_eligibility_table(p), "",
             "## FLOPs of a training step", "", "| part | TFLOP | share |", "|---|---|---|"]
    for key, name in (("layer_gemms", "decoder-layer GEMMs"), ("lm_head", "LM head"), ("attention", "attention")):
        lines.append(f"| {name} | {f[key + '_tflop']:.2f} | {f['share'][key]:.1%} |")
    lines += [f"| total | {f['total_tflop']:.2f} | |", "",
              *[f"- {k}: {v}" for k, v in f["formulas"].items()],
              f"- the project's own count (lm_train_flops_per_token): {f['project_count_tflop']:.2f} TFLOP", "",
              "## Memory-bound floors (not shrunk by FP8)", "", "| part | GB a step | ms |", "|---|---|---|",
              *[f"| {k} | {fl['gb'][k]:.2f} | {_ms(fl['ms'][k])} |" for k in fl["gb"]], "",
              "## Assumptions", "", *[f"- {a}" for a in p["assumptions"]], "",
              "## Measured on the GPU", "", *_measured_section(verdict), "",
              "## Quality over training", "", *quality.section(verdict.get("quality") or []),
              *(["![each study's gaps to torch bf16 against its own noise floor](verdict_quality.png)", ""]
                if verdict.get("quality") else []), "",
              "## Reproduce", "", f"    {verdict['command']}", ""]
    return "\n".join(lines)


def figure(verdict: dict[str, Any]):
    """Stacked bars: each path's expected step split into its parts, a tick at its ideal (compute-only) time, and the
    expected speed-up beside each FP8 bar; None where no time is predicted (an unknown GPU)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in verdict["prediction"]["recipes"] if r.get("parts_ms")]
    if not rows:
        return None
    measured = _measured_ms(verdict)
    fig, ax = plt.subplots(figsize=(11, 1.6 + 0.6 * len(rows)))
    for i, r in enumerate(rows):
        left = 0.0
        for part, colour in zip(PARTS, COLOURS):
            width = r["parts_ms"].get(part) or 0.0
            ax.barh(i, width, left=left, color=colour, label=part.replace("_", " ") if i == 0 else None)
            left += width
        if r.get("ideal_ms"):
            ax.plot([r["ideal_ms"]] * 2, [i - 0.4, i + 0.4], color="black", lw=1)  # compute only, at the peaks
        label = "denominator" if r["recipe"] == "bf16" else _range(r) + ("" if r["calibrated"] else ", not calibrated")
        if r["recipe"] in measured:  # the GPU part ran it: the measured step beside the expected one
            ms, ratio = measured[r["recipe"]]
            ax.plot(ms, i, marker="D", ls="none", color="crimson", ms=7, zorder=3, label="measured" if not i else None)
            label += f"; measured {ms:.1f} ms" + ("" if r["recipe"] == "bf16" else f", {ratio:.2f}x")
            left = max(left, ms)
        ax.annotate(label, (left, i), xytext=(14, 0), textcoords="offset points", va="center", fontsize=9)
    ax.set_yticks(range(len(rows)), [r["recipe"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, max([r["expected_ms"] for r in rows] + [ms for ms, _ in measured.values()]) * 1.6)
    p = verdict["prediction"]
    ax.set_xlabel(f"expected step time, ms (calibrated on the H200; black tick: ideal, compute only at "
                  f"{p['ceilings']['peak_source'].split(' (')[0]} peaks; red: measured) — {p['ceilings']['gpu']}")
    ax.set_title(f"{p['model']['source']}: {p['flops']['total_tflop']:.3g} TFLOP a step at "
                 f"{p['run']['tokens_per_step']} tokens", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)  # outside: never over a bar's label
    fig.tight_layout()
    return fig


def _measured_ms(verdict: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """recipe -> (measured step ms, speed-up vs the fastest bf16) of its fastest measured row; 'bf16': the
    denominator. Empty when the GPU part did not run."""
    m = verdict.get("measured") or {}
    if m.get("status") != "ok":
        return {}
    out = {"bf16": (m["denominator"]["step_ms"], 1.0)}
    for r in sorted(m["rows"], key=lambda r: -r["step_ms"]):  # the fastest row of a recipe written last
        if r.get("recipe"):
            out[r["recipe"]] = (r["step_ms"], r["speedup_vs_fastest_bf16"])
    return out


def write(verdict: dict[str, Any], out: Path) -> list[Path]:
    """verdict.json, verdict.md and the figure into `out`; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [results.write_json(out / "verdict.json", verdict),
             results.write_bytes(out / "verdict.md", markdown(verdict).encode())]
    import matplotlib.pyplot as plt

    for name, fig in (("verdict", figure(verdict)),
                      ("verdict_quality", quality.figure(verdict["quality"]) if verdict.get("quality") else None)):
        if fig is not None:
            paths += results.write_figure(fig, out, name)
            plt.close(fig)
    return paths
