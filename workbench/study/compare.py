"""Studies side by side: the real-teacher studies (pruned, random, fine-tuned) beside the trained-here one, each
arm's paired gap to torch bf16 against that study's own noise floor, in one table, one figure and one page.

    workbench study --compare real-pruned real-random real-finetune distill-quality-64mb --out results/studies

It reads what each study's report wrote (headline.json, arms.csv, gaps.csv: the result files are the contract) and
writes <out>/comparison/: comparison.csv, comparison.png / .svg, README.md. A study without a report yet, or with
done points its report has not read (unreported_points), gets one first. The noise floors are never pooled: each
study's gaps are judged against its own, as its report does.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from workbench import results
from workbench.bench.cells import truthy
from workbench.config import ConfigError
from workbench.study.figures import interval_xerr
from workbench.study.readme import md_table
from workbench.study.report import report
from workbench.study.spec import METRIC_NAMES, REFERENCE_ARM, STUDY_FILE, Study, given
from workbench.sweep.index import read_index

COMPARED = ("kl_teacher_student_t1_nats", "heldout_ppl")
UNKNOWN_COLOR = "#999999"  # a gap whose study has no noise floor yet
GAP_COLUMNS = ("n_seeds", "gap_pct_mean", "gap_pct_ci_low", "gap_pct_ci_high", "noise_floor_pct", "within_noise",
               "diff_mean", "diff_ci_low", "diff_ci_high", "noise_floor_abs")
COLUMNS = ["study", "teacher", "student", "arm", "metric", "seeds_planned", *GAP_COLUMNS, "step0_mean", "end_mean",
           "flattened", "refused"]


def describe(study: Study) -> tuple[str, str]:
    """(teacher, student) in words, from the study's fixed overrides: a folder's name, or how the preset makes it."""
    teacher, student = given(study.fixed, "lm.teacher"), given(study.fixed, "lm.student")
    teacher = Path(str(teacher)).name if teacher else "trained here"
    if study.student_is_teacher:
        return teacher, "the teacher itself (fine-tuned)"
    return teacher, Path(str(student)).name if student else "randomly initialised"


def study_rows(study_dir: Path) -> list[dict[str, Any]]:
    """One row per arm (the reference and noise arms aside) and compared metric of one study."""
    return load(study_dir)[2]


def load(study_dir: Path) -> tuple[Study, dict[str, Any], list[dict[str, Any]]]:
    """(the study, its headline.json, study_rows): its report read once (made first where it is missing or has not
    read done points)."""
    if not (study_dir / STUDY_FILE).exists():
        raise ConfigError(f"{study_dir}: no study here (no {STUDY_FILE})")
    if not (study_dir / "headline.json").exists() or unreported_points(study_dir):
        report(study_dir)
    study = Study.from_dict(results.read_json(study_dir / STUDY_FILE))
    head = results.read_json(study_dir / "headline.json")
    arms = results.read_csv(study_dir / "arms.csv").set_index("arm")
    gaps = results.read_csv(study_dir / "gaps.csv") if (study_dir / "gaps.csv").exists() else pd.DataFrame()
    teacher, student = describe(study)
    rows = []
    for arm in study.arms:
        if arm.name == REFERENCE_ARM or arm.noise:
            continue
        a = arms.loc[arm.name].to_dict() if arm.name in arms.index else {}
        for m in COMPARED:
            g = gaps[(gaps["arm"] == arm.name) & (gaps["metric"] == m)] if len(gaps) else gaps
            g = g.iloc[0].to_dict() if len(g) else {}
            rows.append({"study": study_dir.name, "teacher": teacher, "student": student, "arm": arm.name, "metric": m,
                         "seeds_planned": len(study.seeds), **{c: g.get(c) for c in GAP_COLUMNS},
                         "step0_mean": a.get(f"{m}_step0_mean"), "end_mean": a.get(f"{m}_mean"),
                         "flattened": a.get("flattened"), "refused": bool(head.get("refused"))})
    return study, head, rows


def unreported_points(study_dir: Path) -> list[str]:
    """Done points (index.csv) whose folders are here but whose students the report (study.csv) has not read: a
    report written by an earlier call, then more points ran (the pruned study's archive at 3e25bd0). Empty where the
    folder cannot be written (its report is read as it is) and where the points' folders are gone (a reference copy
    keeps the report alone: reporting it again would lose it)."""
    table = study_dir / "study.csv"
    if not table.exists() or not os.access(study_dir, os.W_OK):
        return []
    index = read_index(study_dir)
    reported = results.read_csv(table)
    read = set(reported.loc[reported["status"] == "ok", "point"].astype(str)) if "point" in reported else set()
    done = index.loc[index["status"] == "done", "point"].astype(str)
    return sorted(p for p in done if p not in read and (study_dir / p).is_dir())


def compare(study_dirs: list[str | Path], out: str | Path) -> pd.DataFrame:
    """The studies' rows side by side, written with the figure and the page into `out`; returns the table."""
    dirs = [Path(d) for d in study_dirs]
    if len(dirs) < 2:
        raise ConfigError(f"--compare needs two or more study folders, got {len(dirs)}")
    table = pd.DataFrame([r for d in dirs for r in study_rows(d)], columns=COLUMNS)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results.write_csv(out / "comparison.csv", table)
    from workbench.results import plots

    fig = figure(table)
    results.write_figure(fig, out, "comparison")
    plots.plt.close(fig)
    heads = {d.name: results.read_json(d / "headline.json").get("sentence") for d in dirs}
    (out / "README.md").write_text(page(table, heads), encoding="utf-8")
    return table


def figure(table: pd.DataFrame):
    """Per compared metric, every study's arms (grouped by study) with their 95% intervals; behind each row the grey
    band of its own study's noise floor."""
    from workbench.results import plots

    labels = list(dict.fromkeys(zip(table["study"], table["arm"])))
    fig, axes = plots.plt.subplots(1, len(COMPARED), figsize=(12, 0.42 * len(labels) + 2.0), squeeze=False)
    for n, (ax, m) in enumerate(zip(axes[0], COMPARED)):
        t = table[table["metric"] == m].set_index(["study", "arm"])
        for i, key in enumerate(labels):
            r = t.loc[key] if key in t.index else None
            if r is None:
                continue
            if pd.notna(r["noise_floor_pct"]):
                ax.fill_betweenx([i - 0.4, i + 0.4], -r["noise_floor_pct"], r["noise_floor_pct"], color="#bbbbbb",
                                 alpha=0.5, lw=0)
            if pd.isna(r["gap_pct_mean"]):
                ax.text(0, i, "not run", ha="center", va="center", fontsize=7, color="#777777")
                continue
            # no noise floor yet (its noise arm has not run, or one seed): neither within nor outside
            ax.errorbar(r["gap_pct_mean"], i, xerr=interval_xerr(r), fmt="o", capsize=3,
                        color={True: "#4c72b0", False: "#c44e52"}.get(flag(r["within_noise"]), UNKNOWN_COLOR))
        for i in range(1, len(labels)):
            if labels[i][0] != labels[i - 1][0]:
                ax.axhline(i - 0.5, color="black", lw=0.6)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(range(len(labels)), [f"{s}: {a}" for s, a in labels] if n == 0 else [], fontsize=8)
        ax.set_ylim(len(labels) - 0.5, -0.5)
        ax.set(xlabel=f"gap to {REFERENCE_ARM}, % (95% interval over seeds)", title=METRIC_NAMES[m])
        ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle("Studies side by side: grey band, each study's own bf16 noise floor; blue within noise, red outside, "
                 "grey dot unknown (no floor yet)", fontsize=10)
    fig.tight_layout()
    return fig


def _cell(v: Any, fmt: str) -> str:
    return "" if v is None or (isinstance(v, float) and pd.isna(v)) else format(v, fmt)


def page(table: pd.DataFrame, heads: dict[str, str | None]) -> str:
    """README.md: each study's headline, then per metric the arms of every study side by side."""
    parts = ["# Studies side by side", "", "Each study's headline (its own README has the rest):", ""]
    parts += [f"- `{s}`: {h or 'no headline'}" for s, h in heads.items()]
    for m in COMPARED:
        unit = "nats" if m == "kl_teacher_student_t1_nats" else "ppl"
        shown = [{"study": r["study"], "teacher": r["teacher"], "student": r["student"], "arm": r["arm"],
                  "seeds": f"{_cell(r['n_seeds'], '.0f') or 0}/{r['seeds_planned']}",
                  "gap % [95%]": _span(r["gap_pct_mean"], r["gap_pct_ci_low"], r["gap_pct_ci_high"], "+.2f")
                  or "not run",
                  "noise floor %": _cell(r["noise_floor_pct"], ".2f"),
                  "verdict": "refused" if r["refused"] else
                  {True: "within noise", False: "outside"}.get(flag(r["within_noise"]), "unknown"),
                  f"diff {unit} [95%]": _span(r["diff_mean"], r["diff_ci_low"], r["diff_ci_high"], "+.4f"),
                  "step 0 -> end": "" if pd.isna(r["end_mean"]) else
                  f"{_cell(r['step0_mean'], '.4f')} -> {r['end_mean']:.4f}",
                  "flattened": {True: "yes", False: "no"}.get(flag(r["flattened"]), "")}
                 for r in table[table["metric"] == m].to_dict("records")]
        parts += ["", f"## {METRIC_NAMES[m]}", "", md_table(pd.DataFrame(shown))]
    parts += ["", "Figure: `comparison.png`; rows: `comparison.csv`. Gaps are paired by seed within a study; the noise "
                  "floor is that study's (torch bf16 against itself from another init and batch order)."]
    return "\n".join(parts) + "\n"


def _span(mean: Any, low: Any, high: Any, fmt: str) -> str:
    """'mean [low, high]', '' without a mean."""
    return "" if pd.isna(mean) else f"{mean:{fmt}} [{_cell(low, fmt)}, {_cell(high, fmt)}]"


def flag(v: Any) -> bool | None:
    """A flag cell read back from CSV (cells.truthy), None where it is empty."""
    return None if v is None or (isinstance(v, float) and pd.isna(v)) else truthy(v)
