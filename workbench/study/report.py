"""A study's report: its points collected into arm x seed rows, the arms and gaps tables, the headline,
README.md and the figures, all from the result files; and the execution of the report notebook that
writes them. The file list is in `workbench.study`."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from workbench import results
from workbench.config import ConfigError
from workbench.study import figures
from workbench.study import stats as qs
from workbench.study.readme import readme
from workbench.study.spec import (
    METRIC_NAMES,
    METRICS,
    NOISE_ARM,
    NOISE_SEED_OFFSET,
    REFERENCE_ARM,
    REPORT_NOTEBOOK_NAME,
    STEP0,
    STUDY_FILE,
    TEACHER_FILE,
    Study,
    arm_of,
    sweep_spec,
)

# ---- collecting the points -----------------------------------------------------------------------
WALLS = results.WALL_CELLS


def point_students(grid: dict) -> list[str]:
    """The students.csv names the point of `grid` trains: its backends, and its baseline's no-KD student."""
    return [*grid["backends"], *([f"{grid['baseline']}:no_kd"] if grid["no_kd_student"] else [])]


def collect(study: Study, study_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(study rows: one per arm x seed, curves): from every planned point; an arm x seed whose point is not
    complete is a row with status 'missing' and the point's state as its reason."""
    from workbench.sweep.index import read_index
    from workbench.sweep.plan import plan

    try:
        index = read_index(study_dir).set_index("point")
    except results.DamagedResults:
        index = pd.DataFrame()
    rows, curves = [], []
    for point in plan(sweep_spec(study)):
        point_seed = int(point.grid["seed"])
        folder = study_dir / point.id
        # the arms this point trains (a seed's arms may be split over points: point_groups), as its rows map to them
        expected = [found[0] for name in point_students(point.grid) if (found := arm_of(study, name, point_seed))]
        if not results.is_complete(folder):
            state = index.loc[point.id].to_dict() if point.id in index.index else {}
            why = f"point {point.id} not complete ({state.get('status') or 'not run'}"
            why += f": {state['error']})" if isinstance(state.get("error"), str) else ")"
            seed = point_seed % NOISE_SEED_OFFSET
            rows += [{"arm": a.name, "seed": seed, "student": a.student, "kd": a.kd, "point": point.id,
                      "status": "missing", "reason": why} for a in expected]
            continue
        df = results.read_students(folder)
        task = results.read_json(folder / "task.json") if (folder / "task.json").exists() else {}
        for r in df.to_dict("records"):
            found = arm_of(study, r["student"], point_seed)
            if found is None:
                continue
            arm, seed = found
            rows.append({"arm": arm.name, "seed": seed, "student": arm.student, "kd": arm.kd, "point": point.id,
                         "status": r.get("status"), "reason": r.get("reason") or None,
                         **{m: r.get(m) for m in (*METRICS, *STEP0)},
                         "teacher_heldout_ppl": r.get("teacher_heldout_ppl"),
                         "step_ms_median": r.get("step_ms_median"), "compiled": r.get("compiled"),
                         "graph_scope": r.get("graph_scope"), "train_seed": point_seed,
                         **{w: r.get(w) for w in WALLS},
                         "teacher_sha": task.get("teacher_weights_sha256"), "git_sha": r.get("git_sha"),
                         "gpu_name": r.get("gpu_name")})
        curve_file = folder / "eval_curve.csv"
        if curve_file.exists():
            for r in pd.read_csv(curve_file).to_dict("records"):
                found = arm_of(study, r["student"], point_seed)
                if found:
                    curves.append({"arm": found[0].name, "seed": found[1], "step": r["step"],
                                   **{m: r.get(m) for m in METRICS[:3]}})
    study_df = pd.DataFrame(rows)
    study_df = study_df.where(study_df.notna(), None) if len(study_df) else study_df
    ran = {(r["arm"], r["seed"]) for r in _ran(study_df).to_dict("records")} if len(study_df) else set()
    curves = [c for c in curves if (c["arm"], c["seed"]) in ran]  # a fallback's curve is not its arm's
    return study_df, pd.DataFrame(curves, columns=["arm", "seed", "step", *METRICS[:3]])


def with_step0(curves: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    """The curves with each run's step-0 figures (students.csv's *_step0, before the first step, in the student's
    own precision) as step 0, for a fine-tuning study's figure: a fine-tuned FP8 student's KL starts where the cast
    puts it, not at the first evaluation. curves.csv keeps the evaluations alone (the flattening rule reads their
    last interval)."""
    ran = _ran(df)
    cols = [m for m in METRICS[:3] if f"{m}_step0" in ran]
    if curves.empty or not cols:
        return curves
    have = set(zip(curves["arm"], curves["seed"]))
    rows = [{"arm": r["arm"], "seed": r["seed"], "step": 0, **{m: r[f"{m}_step0"] for m in cols}}
            for r in ran.to_dict("records") if (r["arm"], r["seed"]) in have and pd.notna(r.get(f"{cols[0]}_step0"))]
    if not rows:
        return curves
    out = pd.concat([pd.DataFrame(rows), curves], ignore_index=True)
    order = {a: i for i, a in enumerate(dict.fromkeys(curves["arm"]))}  # the legend keeps the curves' arm order
    return out.iloc[out["arm"].map(order).argsort(kind="stable")].reset_index(drop=True)


def _ran(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of students that ran as themselves: a fallback (TE FP8 run as PyTorch autocast) is not its arm."""
    return df[df["status"] == "ok"] if len(df) else df


def _by_seed(df: pd.DataFrame, arm: str, metric: str) -> dict[int, Any]:
    part = _ran(df)
    part = part[part["arm"] == arm] if len(part) else part
    return {int(r["seed"]): r[metric] for _, r in part.iterrows()}


def arms_table(study: Study, df: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """Per arm: seeds run, each metric's mean / sd / 95% interval over seeds, the path it ran, whether its mean
    held-out curves (KL, perplexity) moved less than qs.FLAT_THRESHOLD_PCT over their last interval."""
    out = []
    for a in study.arms:
        mine = df[df["arm"] == a.name] if len(df) else df
        ran = _ran(mine)
        row: dict[str, Any] = {"arm": a.name, "student": a.student, "kd": a.kd, "seeds_run": len(ran),
                               "seeds_planned": len(study.seeds),
                               "not_run": "; ".join(sorted({f"{r.status}: {r.reason}" for r in mine.itertuples()
                                                            if r.status != "ok"})) or None}
        for m in (*METRICS, *STEP0):
            s = qs.summary(ran[m] if len(ran) and m in ran else [])
            row.update({f"{m}_{k}": s[k] for k in ("mean", "sd", "ci_low", "ci_high")})
        for m in ("step_ms_median", *WALLS):
            row[f"{m}_mean"] = qs.summary(ran[m] if len(ran) and m in ran else [])["mean"]
        row["path"] = ", ".join(sorted({_path(r) for r in ran.to_dict("records")})) or None
        c = curves[curves["arm"] == a.name] if len(curves) else curves
        flat = []
        for m, key in (("kl_teacher_student_t1_nats", "kl"), ("heldout_ppl", "ppl")):
            mean_curve = c.groupby("step")[m].mean().sort_index().tolist() if len(c) else []
            change, ok = qs.flattened(mean_curve)
            row[f"{key}_last_change_pct"] = change
            flat.append(ok)
        row["flattened"] = None if None in flat else all(flat)
        out.append(row)
    return pd.DataFrame(out)


def _path(r: dict[str, Any]) -> str:
    compiled = r.get("compiled") is True or str(r.get("compiled")).lower() == "true"
    scope = r.get("graph_scope") if isinstance(r.get("graph_scope"), str) else None
    return " + ".join([p for p in ("compiled" if compiled else "eager", f"graph:{scope}" if scope else None) if p])


def gaps_table(study: Study, df: pd.DataFrame) -> pd.DataFrame:
    """Per arm (but the reference) and metric: the paired gap to the reference in % and in the metric's unit, with
    their 95% intervals, the noise floors and the within-noise verdict (stats.gap_row)."""
    out = []
    for m in METRICS:
        ref, noise = _by_seed(df, REFERENCE_ARM, m), _by_seed(df, NOISE_ARM, m)
        floors = qs.noise_floor_pct(ref, noise), qs.noise_floor_abs(ref, noise)
        out += [{"arm": a.name, "metric": m, **qs.gap_row(ref, _by_seed(df, a.name, m), *floors)}
                for a in study.arms if a.name != REFERENCE_ARM]
    return pd.DataFrame(out)


# ---- the report ----------------------------------------------------------------------------------
def _pct(v: float | None, sign: bool = True) -> str:
    return (
        "unknown" if v is None or (isinstance(v, float) and math.isnan(v)) else (f"{v:+.1f}%" if sign else f"{v:.1f}%")
    )


NATS_METRICS = ("kl_teacher_student_t1_nats", "final_train_loss")  # their paired difference is quoted in nats
OVERFIT_NATS = 0.5  # a teacher whose held-out loss exceeds its last training loss by this much learnt its text


def why_beaten(df: pd.DataFrame, teacher_ppl: float, teacher_train_loss: float | None) -> str:
    """Why KD students passed their teacher (held-out perplexity `teacher_ppl`), from the files: whether the
    no-KD students (the text alone) pass it too, and the teacher's last training loss against its held-out loss."""
    ran = _ran(df)
    no_kd = ran[~ran["kd"].astype(bool)]["heldout_ppl"].dropna()
    stronger = "train a stronger teacher (lm.teacher_steps, lm.teacher_hidden, lm.teacher_layers)."
    if len(no_kd) and no_kd.mean() < teacher_ppl:
        return (f"The text alone takes a student past it (no-KD students {no_kd.mean():.2f} < teacher "
                f"{teacher_ppl:.2f}): {stronger}")
    alone = f"The text alone does not (no-KD students {no_kd.mean():.2f}); " if len(no_kd) else ""
    if teacher_train_loss is not None and math.log(teacher_ppl) - teacher_train_loss > OVERFIT_NATS:
        return (f"{alone}the teacher learnt its training text by heart (last training loss "
                f"{teacher_train_loss:.2f} nats against {math.log(teacher_ppl):.2f} held out), so its soft labels "
                "carry the students past it: give it more text (lm.corpus_mb: the built-in corpus goes on into the "
                "installed packages' sources; or lm.corpus_files) rather than more steps.")
    return alone + stronger if alone else stronger.capitalize()


def headline(study: Study, df: pd.DataFrame, gaps: pd.DataFrame | None, beaten: list[dict],
             teacher: dict[str, Any] | None = None) -> dict[str, Any]:
    """The headline's numbers and its sentence, from the tables above (and teacher.json, for a refusal's why)."""
    metric, arm = study.headline_metric, study.headline_arm
    out: dict[str, Any] = {"study": study.name, "arm": arm, "reference": REFERENCE_ARM, "metric": metric,
                           "refused": bool(beaten), "teacher_beaten_by": beaten}
    if beaten:
        who = "; ".join(f"{b['arm']} seed {b['seed']}: {b['heldout_ppl']:.2f} < teacher {b['teacher_heldout_ppl']:.2f}"
                        for b in beaten[:5])
        why = why_beaten(df, beaten[0]["teacher_heldout_ppl"], (teacher or {}).get("teacher_final_loss"))
        out["sentence"] = (f"Refused: no distillation-quality answer, because {len(beaten)} KD student(s) ended better "
                           f"than their teacher on held-out perplexity ({who}), so the gaps would not measure "
                           f"distillation from a better model. {why}")
        return out
    label = arm.replace("te_fp8_", "FP8 ").replace("_", " ") if arm.startswith("te_fp8_") else arm
    row = gaps[(gaps["arm"] == arm) & (gaps["metric"] == metric)] if gaps is not None and len(gaps) else pd.DataFrame()
    ref = (
        gaps[gaps["metric"] == metric]["noise_floor_pct"] if gaps is not None and len(gaps) else pd.Series(dtype=float)
    )
    floor = None if ref.empty or pd.isna(ref.iloc[0]) else float(ref.iloc[0])
    out["noise_floor_pct"] = floor
    floor_text = f"the bf16 noise floor is {_pct(floor, sign=False)}"
    if row.empty or not row.iloc[0]["n_seeds"]:
        mine = df[df["arm"] == arm] if len(df) else df
        reasons = sorted({str(r) for r in mine["reason"].dropna()}) if len(mine) else []
        why = reasons[0] if reasons else "no seed of it ran"
        out["sentence"] = f"{label} did not run here ({why}); {floor_text}."
        return out
    g = {k: (None if pd.isna(v) else v) for k, v in row.iloc[0].to_dict().items()}
    out.update(gap_pct=g["gap_pct_mean"], ci_low_pct=g["gap_pct_ci_low"], ci_high_pct=g["gap_pct_ci_high"],
               n_seeds=int(g["n_seeds"]), within_noise=g["within_noise"])
    verdict = {True: "within noise", False: "outside the noise", None: "noise unknown"}[g["within_noise"]]
    nats = ""
    if metric in NATS_METRICS and g.get("diff_mean") is not None:
        out.update(diff_nats=g["diff_mean"], diff_ci_low_nats=g["diff_ci_low"], diff_ci_high_nats=g["diff_ci_high"])
        span = "" if g["diff_ci_low"] is None else f" [{g['diff_ci_low']:+.4f}, {g['diff_ci_high']:+.4f}]"
        floor_abs = "" if g.get("noise_floor_abs") is None else f", noise floor {g['noise_floor_abs']:.4f}"
        nats = f"; in nats {g['diff_mean']:+.4f}{span}{floor_abs}"
    interval = f"[{_pct(g['gap_pct_ci_low'])}, {_pct(g['gap_pct_ci_high'])}]"
    name = METRIC_NAMES[metric].replace("to the teacher", "to the original model") if study.student_is_teacher \
        else METRIC_NAMES[metric]
    out["sentence"] = (f"{label} changes {name} by {_pct(g['gap_pct_mean'])} (95% interval "
                       f"{interval}, {int(g['n_seeds'])} seeds{nats}); {floor_text}: {verdict}.")
    if study.student_is_teacher:
        out["sentence"] += drift(df, metric, arm, label, out)
    return out


def drift(df: pd.DataFrame, metric: str, arm: str, label: str, out: dict[str, Any]) -> str:
    """A fine-tuning study's step 0 -> end of `metric` for `arm` and the bf16 reference (means over seeds, each
    student measured in its own precision before its first step); recorded in `out`, returned as a sentence."""
    ran = _ran(df)
    means = {}
    for a in (arm, REFERENCE_ARM):
        mine = ran[ran["arm"] == a] if len(ran) else ran
        means[a] = tuple(qs.summary(mine[c] if len(mine) and c in mine else [])["mean"]
                         for c in (f"{metric}_step0", metric))
    out["step0_end"] = {a: {"step0": v[0], "end": v[1]} for a, v in means.items()}
    if None in means[arm] or None in means[REFERENCE_ARM]:
        return ""
    unit = " nats" if metric in NATS_METRICS else ""
    (a0, a1), (r0, r1) = means[arm], means[REFERENCE_ARM]
    return (f" Step 0 -> end (means over seeds, each in its own precision): {label} {a0:.4f} -> {a1:.4f}{unit}, "
            f"torch bf16 {r0:.4f} -> {r1:.4f}{unit}.")


def report(
    study_dir: str | Path, headline_arm: str | None = None, headline_metric: str | None = None
) -> dict[str, Any]:
    """Write the study's tables, headline, README and figures from its points; return the headline (about
    `headline_arm` and `headline_metric`; None: the study's). The quality_report notebook calls this; so can
    anyone, on a study no driver is running."""
    study_dir = Path(study_dir)
    study = Study.from_dict(results.read_json(study_dir / STUDY_FILE))
    if headline_arm is not None and study.arm(headline_arm) is None:
        raise ConfigError(
            f"headline_arm {headline_arm!r} is no arm of the study; allowed: {[a.name for a in study.arms]}"
        )
    if headline_metric is not None and headline_metric not in METRICS:
        raise ConfigError(f"headline_metric {headline_metric!r}: allowed {list(METRICS)}")
    study.headline_arm = headline_arm or study.headline_arm
    study.headline_metric = headline_metric or study.headline_metric
    df, curves = collect(study, study_dir)
    results.write_csv(study_dir / "study.csv", df)
    results.write_csv(study_dir / "curves.csv", curves)
    arms = arms_table(study, df, curves)
    results.write_csv(study_dir / "arms.csv", arms)
    # a fine-tuned model that ends below its own held-out perplexity is what fine-tuning does, not a refusal
    beaten = qs.teacher_beaten(_ran(df).to_dict("records")) if len(df) and not study.student_is_teacher else []
    gaps = None
    for stale in ("gaps.csv", "gap_vs_noise.png", "gap_vs_noise.svg"):
        (study_dir / stale).unlink(missing_ok=True)  # a refusal must not leave an earlier answer behind
    if not beaten:
        gaps = gaps_table(study, df)
        results.write_csv(study_dir / "gaps.csv", gaps)
    teacher = results.read_json(study_dir / TEACHER_FILE) if (study_dir / TEACHER_FILE).exists() else {}
    head = headline(study, df, gaps, beaten, teacher)
    ran = _ran(df)
    head["teacher_heldout_ppl"] = (float(ran["teacher_heldout_ppl"].dropna().iloc[0])
                                   if len(ran) and ran["teacher_heldout_ppl"].notna().any() else None)
    head["teacher_cached_at"] = teacher.get("teacher_checkpoint")
    head["arms_not_flattened"] = [r["arm"] for r in arms.to_dict("records") if r["flattened"] is False]
    # one each, unless resumed elsewhere (a study resumed from an archive on another machine: another GPU model)
    for key, col in (("teachers", "teacher_sha"), ("code_versions", "git_sha"), ("gpus", "gpu_name")):
        head[key] = sorted({str(v) for v in ran[col].dropna()}) if len(ran) and col in ran else []
    results.write_json(study_dir / "headline.json", head)
    from workbench.results import plots

    # step 0 on the fine-tuning figure only: a distilled student's step 0 (random or pruned weights, perplexity up
    # to the vocabulary's size) would flatten every curve against the axis
    shown = with_step0(curves, df) if study.student_is_teacher else curves
    fig = figures.heldout_curves(study, shown, head["teacher_heldout_ppl"])
    results.write_figure(fig, study_dir, "heldout_curves")
    plots.plt.close(fig)
    if gaps is not None:
        fig = figures.gap_vs_noise(study, gaps)
        results.write_figure(fig, study_dir, "gap_vs_noise")
        plots.plt.close(fig)
    (study_dir / "README.md").write_text(readme(study, head, arms, gaps), encoding="utf-8")
    return head


def run_report_notebook(study_dir: Path, progress: bool = False) -> Path:
    """Execute the quality_report notebook on the study (it writes the files above); returns the executed copy."""
    from workbench.notebook import NOTEBOOKS, kernel_uses_this_python, papermill_execute

    study_dir = Path(study_dir).resolve()
    kernel_uses_this_python()
    executed = study_dir / REPORT_NOTEBOOK_NAME
    from importlib import resources

    with resources.as_file(NOTEBOOKS / REPORT_NOTEBOOK_NAME) as source:
        papermill_execute(str(source), str(executed), parameters={"study_dir": str(study_dir)},
                          progress_bar=progress, cwd=str(study_dir))
    return executed
