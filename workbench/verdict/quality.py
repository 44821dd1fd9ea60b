"""The verdict's quality part: what FP8 does to what a student learns over training, from studies that ran
(`workbench study`, `--study DIR` once per study). The speed part measures step 0 only; a study trains every arm
from the same weights on the same batches over seeds, and judges each arm's paired gap to torch bf16 against its
own bf16 noise floor. This reads what the studies' reports wrote (study.compare.load: headline.json,
arms.csv, gaps.csv; a study without a report, or with done points its report has not read, gets one first) and
never pools noise floors across studies.

    python -m workbench verdict MODEL --study results/studies/real-finetune --study results/studies/real-pruned ...
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workbench import results
from workbench.config import ConfigError
from workbench.study.compare import describe, flag, load
from workbench.study.spec import METRIC_NAMES, REFERENCE_ARM, STUDY_FILE
from workbench.verdict.measured import _num

METRIC = "kl_teacher_student_t1_nats"  # the study's own headline metric: how far the student is from its teacher
NUMBERS = ("gap_pct_mean", "gap_pct_ci_low", "gap_pct_ci_high", "noise_floor_pct", "diff_mean", "diff_ci_low",
           "diff_ci_high", "step0_mean", "end_mean")
WORDS = {True: "within the noise", False: "outside the noise", None: "noise unknown (no noise floor yet)"}


def check(study_dirs: list[str | Path] | str) -> list[Path]:
    """The folders, each a study (its study.json): refused up front, naming --study. A string is one folder, or a
    JSON list of them (papermill's `-p studies '[...]'` passes the list as its text)."""
    if isinstance(study_dirs, str):
        study_dirs = json.loads(study_dirs) if study_dirs.lstrip().startswith("[") else [study_dirs]
    dirs = [Path(d) for d in study_dirs]
    for d in dirs:
        if not (d / STUDY_FILE).is_file():
            raise ConfigError(f"--study {d}: not a study folder (no {STUDY_FILE}); pass the folder `workbench study "
                              f"--name NAME --out DIR` wrote, DIR/NAME")
    return dirs


def read(study_dirs: list[str | Path] | str, model: str | None = None) -> list[dict[str, Any]]:
    """Per study: what it distilled, its headline sentence, and each FP8 / bf16 arm's gap to torch bf16 in KL to
    the teacher and held-out perplexity, with its interval and the study's noise floor. `model` (the verdict's):
    `other_model` says whether the study's teacher folder has another name (None: unknown, a teacher trained in the
    study). A study whose report or files cannot be read is refused naming --study."""
    out = []
    for d in check(study_dirs):
        try:
            study, head, rows = load(d)
        except (OSError, ValueError, KeyError, results.OutputError) as e:
            raise ConfigError(f"--study {d}: its report cannot be read ({type(e).__name__}: {e})") from e
        # compare's rows as they are (the figure takes them back), their CSV cells as numbers, flags or None
        arms = [{"arm": r["arm"], "metric": r["metric"], "n_seeds": int(_num(r["n_seeds"]) or 0),
                 **{k: _num(r[k]) for k in NUMBERS}, **{k: flag(r[k]) for k in ("within_noise", "flattened")}}
                for r in rows]
        teacher, student = describe(study)
        trained_here = teacher == "trained here"
        other = None if model is None or trained_here else Path(model).name.casefold() != teacher.casefold()
        out.append({"study": d.name, "folder": str(d), "teacher": teacher, "student": student,
                    "finetuned": study.student_is_teacher, "trained_here": trained_here, "other_model": other,
                    "seeds_planned": len(study.seeds), "refused": bool(head.get("refused")),
                    "sentence": head.get("sentence"), "arms_not_flattened": head.get("arms_not_flattened") or [],
                    "gpus": head.get("gpus") or [], "code_versions": head.get("code_versions") or [], "arms": arms})
    return out


def arm_of(recipe: str) -> tuple[str, str]:
    """(the study arm that trains `recipe`'s layers, what of the recipe no study arm has, '' for nothing): a verdict
    recipe with an FP8 head (te_fp8_delayed_head) or FP8 attention too is its layers' recipe there."""
    arm, head, rest = recipe.partition("_head")
    if not head:
        return arm, ""
    return arm, "its FP8 head and attention" if rest == "_attention" else "its FP8 head"


def gap(study: dict[str, Any], recipe: str, metric: str = METRIC) -> dict[str, Any] | None:
    """The study's row of `recipe`'s arm (te_fp8_delayed, torchao_float8, ...) and `metric`, where the study has it."""
    arm = arm_of(recipe)[0]
    return next((a for a in study["arms"] if a["arm"] == arm and a["metric"] == metric), None)


def _what(s: dict[str, Any]) -> str:
    """What the study trained, in words; marked where its teacher is not the verdict's model."""
    if s["finetuned"]:
        what = f"{s['teacher']} fine-tuned"
    elif s["trained_here"]:
        what = f"{s['student']} students of a teacher trained in the study"
    else:
        what = f"{s['student']} students of {s['teacher']}"
    return what + (", not this verdict's model" if s.get("other_model") else "")


def _to(s: dict[str, Any]) -> str:
    return "the original model" if s["finetuned"] else "the teacher"


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:+.1f}%"


def sentence(quality: list[dict[str, Any]], recipe: str | None) -> str | None:
    """The quality part in one sentence for `recipe` (the measured fastest FP8 row's, else the predicted one's):
    each study's KL gap to torch bf16 and whether it is within that study's own noise floor; None without studies."""
    if not quality:
        return None
    if recipe is None:
        return "Quality over training: no FP8 recipe to look up in the studies."
    arm, beyond = arm_of(recipe)
    parts = []
    for s in quality:
        g = gap(s, recipe)
        if s["refused"]:
            parts.append(f"`{s['study']}` refused (its KD students beat their teacher)")
        elif g is None:
            parts.append(f"`{s['study']}` has no {arm} arm")
        elif g["gap_pct_mean"] is None:
            parts.append(f"`{s['study']}` has no gap for {arm} yet ({g['n_seeds']} seeds in its report)")
        else:
            floor = "" if g["noise_floor_pct"] is None else f", bf16 noise floor {g['noise_floor_pct']:.1f}%"
            nats = "" if g["diff_mean"] is None else f"; {g['diff_mean']:+.4f} nats"
            span = f"{_pct(g['gap_pct_mean'])} [{_pct(g['gap_pct_ci_low'])}, {_pct(g['gap_pct_ci_high'])}]"
            parts.append(f"`{s['study']}` ({_what(s)}, {g['n_seeds']} seeds): KL to {_to(s)} {span}{nats}{floor}: "
                         f"{WORDS[g['within_noise']]}")
    label = arm if not beyond else f"{arm} (the studies' arm for {recipe}: {beyond} not studied)"
    return f"Quality over training, {label} against {REFERENCE_ARM}: " + "; ".join(parts) + "."


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
        for a in s["arms"]:
            name = METRIC_NAMES[a["metric"]].replace("the teacher", _to(s))
            diff = "" if a["diff_mean"] is None else f"{a['diff_mean']:+.4f}"
            floor = "" if a["noise_floor_pct"] is None else f"{a['noise_floor_pct']:.1f}%"
            judged = "not run" if a["gap_pct_mean"] is None else WORDS[a["within_noise"]]
            out.append(f"| {a['arm']} | {name} | {a['n_seeds']} | {_pct(a['gap_pct_mean'])} "
                       f"[{_pct(a['gap_pct_ci_low'])}, {_pct(a['gap_pct_ci_high'])}] | {diff} | {floor} | {judged} |")
        out.append("")
    return out


def figure(quality: list[dict[str, Any]]):
    """The studies' gaps side by side (study.compare's figure: each arm's interval, its own study's noise band)."""
    import pandas as pd

    from workbench.study.compare import figure as side_by_side

    table = pd.DataFrame([{"study": s["study"], **a} for s in quality for a in s["arms"]])
    return side_by_side(table.astype({c: float for c in NUMBERS}))
