"""The verdict's quality part: what FP8 does to what a student learns over training, from studies that ran
(`workbench study`, `--study DIR` once per study). The speed part measures step 0 only; a study trains every arm
from the same weights on the same batches over seeds, and judges each arm's paired gap to torch bf16 against its
own bf16 noise floor. This reads what the studies' reports wrote (study.compare.study_rows: headline.json,
arms.csv, gaps.csv; a study without a report gets one first) and never pools noise floors across studies.

    python -m workbench verdict MODEL --study results/studies/real-finetune --study results/studies/real-pruned ...
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from workbench import results
from workbench.config import ConfigError
from workbench.study.spec import METRIC_NAMES, REFERENCE_ARM, STUDY_FILE

METRIC = "kl_teacher_student_t1_nats"  # the study's own headline metric: how far the student is from its teacher
WORDS = {True: "within the noise", False: "outside the noise", None: "noise unknown (no noise floor yet)"}


def check(study_dirs: list[str | Path]) -> list[Path]:
    """The folders, each a study (its study.json): refused up front, naming --study, before any GPU time is spent."""
    dirs = [Path(d) for d in study_dirs]
    for d in dirs:
        if not (d / STUDY_FILE).is_file():
            raise ConfigError(f"--study {d}: not a study folder (no {STUDY_FILE}); pass the folder `workbench study "
                              f"--name NAME --out DIR` wrote, DIR/NAME")
    return dirs


def _num(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _within(v: Any) -> bool | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return str(v).strip().lower() in ("true", "1", "1.0")


def read(study_dirs: list[str | Path], model: str | None = None) -> list[dict[str, Any]]:
    """Per study: what it distilled, its headline sentence, and each FP8 / bf16 arm's gap to torch bf16 in KL to
    the teacher and held-out perplexity, with its interval and the study's noise floor. `model` (the verdict's):
    `other_model` says where the study's teacher is another folder (its name differs), which the page names."""
    from workbench.study.compare import study_rows  # the studies' own reader (pandas): only when asked for

    out = []
    for d in check(study_dirs):
        rows = study_rows(d)
        head = results.read_json(d / "headline.json")
        arms = [{"arm": r["arm"], "metric": r["metric"], "n_seeds": int(_num(r["n_seeds"]) or 0),
                 "gap_pct": _num(r["gap_pct_mean"]), "ci_low_pct": _num(r["gap_pct_ci_low"]),
                 "ci_high_pct": _num(r["gap_pct_ci_high"]), "noise_floor_pct": _num(r["noise_floor_pct"]),
                 "within_noise": _within(r["within_noise"]), "diff": _num(r["diff_mean"]),
                 "diff_ci_low": _num(r["diff_ci_low"]), "diff_ci_high": _num(r["diff_ci_high"]),
                 "step0": _num(r["step0_mean"]), "end": _num(r["end_mean"]),
                 "flattened": _within(r["flattened"])} for r in rows]
        first = rows[0] if rows else {}
        teacher = first.get("teacher")
        other = None if model is None or teacher in (None, "trained here") else Path(model).name != teacher
        out.append({"study": d.name, "folder": str(d), "teacher": teacher, "other_model": other,
                    "student": first.get("student"), "seeds_planned": first.get("seeds_planned"),
                    "refused": bool(head.get("refused")), "sentence": head.get("sentence"),
                    "arms_not_flattened": head.get("arms_not_flattened") or [], "gpus": head.get("gpus") or [],
                    "code_versions": head.get("code_versions") or [], "arms": arms})
    return out


def arm_of(recipe: str) -> str:
    """The study arm that trains `recipe`'s layers: a verdict recipe with an FP8 head (te_fp8_delayed_head, ...) is its
    layers' recipe there, the studies' heads staying bf16."""
    return recipe.split("_head")[0]


def gap(study: dict[str, Any], recipe: str, metric: str = METRIC) -> dict[str, Any] | None:
    """The study's row of `recipe`'s arm (te_fp8_delayed, torchao_float8, ...) and `metric`, where it ran."""
    for a in study["arms"]:
        if a["arm"] == arm_of(recipe) and a["metric"] == metric and a["gap_pct"] is not None:
            return a
    return None


def _what(s: dict[str, Any]) -> str:
    """What the study trained, in words: '<teacher> fine-tuned' (its students start as the teacher), else
    '<student> students of <teacher>'; marked where the teacher is not the verdict's model."""
    what = (f"{s['teacher']} fine-tuned" if str(s["student"]).startswith("the teacher itself")
            else f"{s['student']} students of {s['teacher']}")
    return what + (", not this verdict's model" if s.get("other_model") else "")


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:+.1f}%"


def sentence(quality: list[dict[str, Any]], recipe: str | None) -> str | None:
    """The quality part in one sentence for `recipe` (the measured fastest FP8 row's, else the predicted one's):
    each study's KL gap to torch bf16 and whether it is within that study's own noise floor; None without studies."""
    if not quality:
        return None
    if recipe is None:
        return "Quality over training: no FP8 recipe to look up in the studies."
    parts = []
    for s in quality:
        if s["refused"]:
            parts.append(f"`{s['study']}` refused (its KD students beat their teacher)")
            continue
        g = gap(s, recipe)
        if g is None:
            parts.append(f"`{s['study']}` did not run {arm_of(recipe)}")
            continue
        floor = "" if g["noise_floor_pct"] is None else f", bf16 noise floor {g['noise_floor_pct']:.1f}%"
        nats = "" if g["diff"] is None else f" ({g['diff']:+.4f} nats)"
        to = "the original model" if s["student"].startswith("the teacher itself") else "the teacher"
        parts.append(f"`{s['study']}` ({_what(s)}, {g['n_seeds']} seeds): KL to {to} "
                     f"{_pct(g['gap_pct'])}{nats} [{_pct(g['ci_low_pct'])}, {_pct(g['ci_high_pct'])}]{floor}: "
                     f"{WORDS[g['within_noise']]}")
    arm = arm_of(recipe) + ("" if arm_of(recipe) == recipe else f" (the studies' arm for {recipe}; head bf16)")
    return f"Quality over training, {arm} against {REFERENCE_ARM}: " + "; ".join(parts) + "."


def outside(quality: list[dict[str, Any]], recipe: str | None) -> list[str]:
    """The studies (not refused) where `recipe` changes KL to the teacher beyond their own bf16 noise floor."""
    return [s["study"] for s in quality if recipe and not s["refused"]
            and (g := gap(s, recipe)) is not None and g["within_noise"] is False]


def section(quality: list[dict[str, Any]]) -> list[str]:
    """verdict.md's quality section: each study's headline, then its arms' gaps in a table."""
    if not quality:
        return ["Untested by this verdict (no `--study`; the speed part measures step 0 only). A study of what FP8 "
                "does to what the student learns, against the bf16 noise floor: `python -m workbench study --preset "
                "distill-quality --set lm.teacher=<model folder> --set lm.student=<model folder>`, then "
                "`--study <its folder>` here."]
    out = []
    for s in quality:
        out += [f"### `{s['study']}`: {_what(s)}", "",
                f"{s['sentence'] or 'no headline'} (`{s['folder']}`; GPUs: {', '.join(s['gpus']) or 'unknown'}; "
                f"code {', '.join(s['code_versions']) or 'unknown'})", ""]
        if s["arms_not_flattened"]:
            out += [f"Not flattened (curves still moving at the end): {', '.join(map(str, s['arms_not_flattened']))}.",
                    ""]
        out += [f"| arm | metric | seeds | gap to {REFERENCE_ARM} [95% interval] | difference | noise floor | "
                "judgement |", "|---|---|---:|---|---:|---:|---|"]
        to = "the original model" if str(s["student"]).startswith("the teacher itself") else "the teacher"
        for a in s["arms"]:
            name = METRIC_NAMES[a["metric"]].replace("the teacher", to)
            diff = "" if a["diff"] is None else f"{a['diff']:+.4f}"
            floor = "" if a["noise_floor_pct"] is None else f"{a['noise_floor_pct']:.1f}%"
            judged = "not run" if a["gap_pct"] is None else WORDS[a["within_noise"]]
            out.append(f"| {a['arm']} | {name} | {a['n_seeds']} | {_pct(a['gap_pct'])} "
                       f"[{_pct(a['ci_low_pct'])}, {_pct(a['ci_high_pct'])}] | {diff} | {floor} | {judged} |")
        out.append("")
    return out


def figure(quality: list[dict[str, Any]]):
    """The studies' gaps side by side (study.compare's figure: each arm's interval, its own study's noise band)."""
    import pandas as pd

    from workbench.study.compare import figure as side_by_side

    keys = {"gap_pct": "gap_pct_mean", "ci_low_pct": "gap_pct_ci_low", "ci_high_pct": "gap_pct_ci_high"}
    table = pd.DataFrame([{"study": s["study"], **{keys.get(k, k): v for k, v in a.items()}}
                          for s in quality for a in s["arms"]])
    return side_by_side(table.astype({c: float for c in ("gap_pct_mean", "gap_pct_ci_low", "gap_pct_ci_high",
                                                             "noise_floor_pct")}))

