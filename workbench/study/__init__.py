"""Distillation-quality studies: does FP8 change what a student learns from its teacher, beyond the noise?

    python -m workbench study --preset distill-quality                 # every arm x 3 seeds (a GPU)
    python -m workbench study --preset distill-quality-cpu             # 2 arms x 3 seeds, a CPU, a minute
    python -m workbench study --preset distill-quality --set lm.student=DIR --set lm.teacher=DIR
    python -m workbench study --name distill-quality                   # resume (or re-report) a study

A study is a sweep (workbench.sweep: resumable, one papermill run per point, a Dask worker per GPU) whose
points are seeds, then the quality report over them. Each arm is one student (a backend spec, or the
no-KD student); each seed is one point, a run of every arm from the same initial weights on the same
batches, so the arms of one seed are paired by construction. The teacher is trained once, before the
first point, with its own seed (lm.teacher_seed) and cached: every seed distils the same teacher and is
measured on the same held-out tokens; the seed varies only the students' init and batch order.

The noise floor: a second torch bf16 arm (`torch_bf16_b`) trains the same student as the reference arm
from another init and batch order (its points run at train.seed + NOISE_SEED_OFFSET). The floor of a
metric is the root mean square over seeds of the paired relative differences between the two bf16 arms
(quality_stats.noise_floor_pct): how far apart two bf16 students land when only their seed differs. An
arm's gap to the reference (paired by seed, in %) is "within noise" when its 95% Student-t interval
contains 0 or |mean gap| is below that floor (quality_stats.within_noise).

<out>/<name>/   (default out: results/studies)
  study.json    the study (preset, arms, seeds, --set): a bare --name resumes it
  teacher.json  the teacher: where it is cached, its held-out perplexity (`workbench teacher`)
  sweep.json, index.csv, <point>/, cache/     the sweep's own files (workbench.sweep)
  study.csv     one row per arm x seed: status, reason, held-out ppl, KL, top-1, final train loss, path
  curves.csv    the held-out curves of every arm x seed (eval_curve.csv of the points)
  arms.csv      per arm: mean, sd and 95% interval over seeds of each metric; did its curve flatten
  gaps.csv      per arm and metric: the paired gap to the reference in %, its interval, the noise floor,
                within_noise (not written when the study refuses: a KD student beat its teacher)
  headline.json the headline sentence and its numbers;  README.md  the same, with the tables
  heldout_curves.png, gap_vs_noise.png (+ .svg)            the figures, drawn from the files above
  quality_report.ipynb                                      the executed report notebook
"""
from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from workbench import config, results

from workbench.study import stats as qs
from workbench.config import ConfigError

DEFAULT_ROOT = Path("results") / "studies"
STUDY_FILE, TEACHER_FILE = "study.json", "teacher.json"
NOISE_SEED_OFFSET = 1000  # the noise arm's points: train.seed + this (another init and batch order)
REFERENCE_ARM, NOISE_ARM = "torch_bf16", "torch_bf16_b"
METRICS = ("heldout_ppl", "kl_teacher_student_t1_nats", "top1_agreement", "final_train_loss")
METRIC_NAMES = {"heldout_ppl": "held-out perplexity", "kl_teacher_student_t1_nats": "held-out KL to the teacher",
                "top1_agreement": "top-1 agreement", "final_train_loss": "final train loss"}
PER_POINT = ("seed", "train.seed", "backends", "baseline", "no_kd_student", "distill.no_kd_student")
REPORT_NOTEBOOK_NAME = "quality_report.ipynb"


@dataclass(frozen=True)
class Arm:
    name: str
    """The arm's name in the study's files."""
    student: str
    """The backend spec it trains (as in `backends`: 'te_fp8:delayed'); the no-KD arm: the baseline's."""
    kd: bool = True
    """False: the student trained on cross-entropy only (distill.no_kd_student)."""
    noise: bool = False
    """True: the arm runs at the seeds shifted by NOISE_SEED_OFFSET (another init and batch order)."""


@dataclass
class Study:
    name: str
    preset: str
    """The config preset every point starts from."""
    fixed: dict[str, Any] = field(default_factory=dict)
    """Overrides every point gets (the preset's, then --set)."""
    arms: list[Arm] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    headline_arm: str = "te_fp8_delayed"
    headline_metric: str = "kl_teacher_student_t1_nats"
    study_preset: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "arms": [asdict(a) for a in self.arms]}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Study":
        return Study(**{**d, "arms": [Arm(**a) for a in d["arms"]]})

    def arm(self, name: str) -> Arm | None:
        return next((a for a in self.arms if a.name == name), None)


GPU_ARMS = [Arm("torch_bf16", "torch_bf16"), Arm("te_bf16", "te_bf16"), Arm("te_fp8_delayed", "te_fp8:delayed"),
            Arm("te_fp8_current", "te_fp8:current"), Arm("torchao_float8", "torchao_float8:tensorwise"),
            Arm("no_kd_bf16", "torch_bf16", kd=False), Arm(NOISE_ARM, "torch_bf16", noise=True)]

# distill-quality: sized for one H200 in ~8 minutes with the teacher (scripts/gpu_quality.sh). The teacher is
# 3x wider and 1.5x deeper than the student and trains 1.5x the students' steps on the whole built-in corpus;
# the students train long enough for their held-out curves to flatten (checked in arms.csv). Fastest correct
# path: torch and torchao students compiled with their whole step in one CUDA graph, TE students' whole step
# in one graph (options.te_graph=step).
PRESETS: dict[str, dict[str, Any]] = {
    "distill-quality": {
        "preset": "lm-distill", "arms": GPU_ARMS, "seeds": [1, 2, 3],
        "set": {"vocab": 4096, "hidden": 256, "intermediate": 1024, "layers": 4, "heads": 4, "seq_len": 256,
                "batch": 32, "steps": 800, "lr": 1e-3, "eval_every": 100, "eval_batches": 8,
                "warmup": 3, "iters": 10, "compile": True, "graphs": True, "te_graph": "step",
                "corpus_mb": 12.0, "teacher_hidden": 768, "teacher_layers": 6, "teacher_steps": 1200,
                "teacher_lr": 6e-4, "teacher_seed": 0, "temperature": 1.0},
    },
    # two arms that run on a CPU (the reference and the noise arm) x 3 seeds, plus TE FP8 delayed, which a CPU
    # cannot run: its rows say why, and the headline says it did not run
    "distill-quality-cpu": {
        "preset": "gpt-cpu", "seeds": [1, 2, 3],
        "arms": [Arm("torch_bf16", "torch_bf16"), Arm("te_fp8_delayed", "te_fp8:delayed"),
                 Arm(NOISE_ARM, "torch_bf16", noise=True)],
        "set": {"steps": 30, "eval_every": 10, "eval_batches": 2, "warmup": 1, "iters": 2, "corpus_mb": 0.3,
                "teacher_steps": 150, "teacher_seed": 0},
    },
}


def from_preset(name: str, overrides: dict[str, Any] | None = None, seeds: list[int] | None = None,
                study_name: str | None = None) -> Study:
    """The named study with `--set` overrides (passed to every point) and optionally other seeds."""
    if name not in PRESETS:
        raise ConfigError(f"unknown study preset {name!r}; allowed: {sorted(PRESETS)}")
    overrides = dict(overrides or {})
    fixed_here = [k for k in overrides if k in PER_POINT]
    if fixed_here:
        raise ConfigError(f"--set {fixed_here[0]}: the study sets seed, backends, baseline and no_kd_student per "
                          "point (its arms); pick seeds with --seeds")
    p = PRESETS[name]
    study = Study(name=results.check_name(study_name or name, "study name"), preset=p["preset"],
                  fixed={**p["set"], **overrides}, arms=list(p["arms"]), seeds=list(seeds or p["seeds"]),
                  study_preset=name)
    check(study)
    return study


def check(study: Study) -> None:
    """What the report needs: the reference and noise arms, distinct arm names, seeds in [0, offset)."""
    names = [a.name for a in study.arms]
    if len(set(names)) != len(names):
        raise ConfigError(f"study arms: a name twice in {names}")
    for needed in (REFERENCE_ARM, NOISE_ARM):
        if needed not in names:
            raise ConfigError(f"study arms must include {needed!r} (the reference / the noise floor), got {names}")
    bad = [s for s in study.seeds if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < NOISE_SEED_OFFSET]
    if bad or len(set(study.seeds)) != len(study.seeds) or len(study.seeds) < 2:
        raise ConfigError(f"--seeds: two or more distinct integers in [0, {NOISE_SEED_OFFSET}), got {study.seeds}")


def parse_seeds(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds expects integers separated by commas, e.g. 1,2,3; got {text!r}") from None


# ---- the study as a sweep ------------------------------------------------------------------------
def point_overrides(study: Study) -> list[dict[str, Any]]:
    """The grid: per seed, one point with every arm that runs at that seed, then one with the noise arms."""
    out = []
    for seed in study.seeds:
        for noise in (False, True):
            arms = [a for a in study.arms if a.noise == noise]
            students = list(dict.fromkeys(a.student for a in arms if a.kd))
            no_kd = [a for a in arms if not a.kd]
            if not students:
                continue
            baseline = no_kd[0].student if no_kd else students[0]
            if baseline not in students:
                students.append(baseline)  # the no-KD student is the baseline backend's (runner)
            out.append({"seed": seed + (NOISE_SEED_OFFSET if noise else 0), "backends": students,
                        "baseline": baseline, "no_kd_student": bool(no_kd)})
    return out


def sweep_spec(study: Study):
    from workbench.sweep.plan import Spec

    return Spec(name=study.name, preset=study.preset, fixed=dict(study.fixed), grid={"point": point_overrides(study)})


def arm_of(study: Study, student: str, point_seed: int) -> tuple[Arm, int] | None:
    """(arm, study seed) of a students.csv row of the point at `point_seed`; None for rows of no arm."""
    noise = point_seed >= NOISE_SEED_OFFSET
    seed = point_seed - NOISE_SEED_OFFSET if noise else point_seed
    for a in study.arms:
        if a.noise == noise and (student == (a.student if a.kd else f"{a.student}:no_kd")):
            return a, seed
    return None


# ---- the teacher ---------------------------------------------------------------------------------
def ensure_teacher(study: Study, study_dir: Path) -> dict[str, Any] | None:
    """Train (or find) the study's one teacher before any point runs, in its own process (no GPU memory
    held by this driver): every point then finds it in <study>/cache. None when the teacher is not
    trained here (lm.teacher is a Hugging Face folder, or 'random')."""
    first = {**study.fixed, **point_overrides(study)[0]}
    cfg = config.from_preset(study.preset, **first)
    if cfg.model.kind == "mlp" or cfg.lm.teacher != "train":
        return None
    sets = [f"--set={k}={_cli_value(v)}" for k, v in first.items()]
    cmd = [sys.executable, "-m", "workbench", "teacher", "--preset", study.preset, "--out", str(study_dir), *sets]
    print(f"workbench study: the teacher (trained once, then cached for every point)", file=sys.stderr)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        raise RuntimeError(f"the teacher could not be trained (exit {proc.returncode}): {' '.join(cmd)}")
    info = json.loads(lines[-1])
    results.write_json(study_dir / TEACHER_FILE, info)
    return info


def _cli_value(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


# ---- collecting the points -----------------------------------------------------------------------
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
        expected = [a for a in study.arms if a.noise == (point_seed >= NOISE_SEED_OFFSET)]
        if not results.is_complete(folder):
            state = index.loc[point.id].to_dict() if point.id in index.index else {}
            why = f"point {point.id} not complete ({state.get('status') or 'not run'}"
            why += f": {state['error']})" if isinstance(state.get("error"), str) else ")"
            seed = point_seed % NOISE_SEED_OFFSET
            rows += [{"arm": a.name, "seed": seed, "student": a.student, "kd": a.kd, "point": point.id,
                      "status": "missing", "reason": why} for a in expected]
            continue
        df = results.read_students(folder)
        for r in df.to_dict("records"):
            found = arm_of(study, r["student"], point_seed)
            if found is None:
                continue
            arm, seed = found
            rows.append({"arm": arm.name, "seed": seed, "student": arm.student, "kd": arm.kd, "point": point.id,
                         "status": r.get("status"), "reason": r.get("reason") or None,
                         **{m: r.get(m) for m in METRICS}, "teacher_heldout_ppl": r.get("teacher_heldout_ppl"),
                         "step_ms_median": r.get("step_ms_median"), "compiled": r.get("compiled"),
                         "graph_scope": r.get("graph_scope"), "train_seed": point_seed})
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
        for m in METRICS:
            s = qs.summary(ran[m] if len(ran) else [])
            row.update({f"{m}_{k}": s[k] for k in ("mean", "sd", "ci_low", "ci_high")})
        row["step_ms_median_mean"] = qs.summary(ran["step_ms_median"] if len(ran) else [])["mean"]
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
    """Per arm (but the reference) and metric: the gap to the reference in %, paired by seed, its mean, sd and
    95% interval, the metric's noise floor and the within-noise verdict."""
    out = []
    for m in METRICS:
        ref = _by_seed(df, REFERENCE_ARM, m)
        floor = qs.noise_floor_pct(ref, _by_seed(df, NOISE_ARM, m))
        for a in study.arms:
            if a.name == REFERENCE_ARM:
                continue
            gaps = qs.paired_gaps_pct(ref, _by_seed(df, a.name, m))
            s = qs.summary(gaps.values())
            out.append({"arm": a.name, "metric": m, "n_seeds": s["n"], "gap_pct_mean": s["mean"], "gap_pct_sd": s["sd"],
                        "gap_pct_ci_low": s["ci_low"], "gap_pct_ci_high": s["ci_high"], "noise_floor_pct": floor,
                        "within_noise": qs.within_noise(s, floor),
                        "gap_pct_by_seed": json.dumps({str(k): v for k, v in gaps.items()})})
    return pd.DataFrame(out)


# ---- the report ----------------------------------------------------------------------------------
def _pct(v: float | None, sign: bool = True) -> str:
    return "unknown" if v is None or (isinstance(v, float) and math.isnan(v)) else (f"{v:+.1f}%" if sign else f"{v:.1f}%")


def headline(study: Study, df: pd.DataFrame, gaps: pd.DataFrame | None, beaten: list[dict]) -> dict[str, Any]:
    """The headline's numbers and its sentence, from the tables above."""
    metric, arm = study.headline_metric, study.headline_arm
    out: dict[str, Any] = {"study": study.name, "arm": arm, "reference": REFERENCE_ARM, "metric": metric,
                           "refused": bool(beaten), "teacher_beaten_by": beaten}
    if beaten:
        who = "; ".join(f"{b['arm']} seed {b['seed']}: {b['heldout_ppl']:.2f} < teacher {b['teacher_heldout_ppl']:.2f}"
                        for b in beaten[:5])
        out["sentence"] = (f"Refused: no distillation-quality answer, because {len(beaten)} KD student(s) ended better "
                           f"than their teacher on held-out perplexity ({who}); they learned past the teacher from the "
                           "text, so the gaps would measure the cross-entropy term, not distillation. Train a stronger "
                           "teacher (lm.teacher_steps, lm.teacher_hidden, lm.teacher_layers).")
        return out
    label = arm.replace("te_fp8_", "FP8 ").replace("_", " ") if arm.startswith("te_fp8_") else arm
    row = gaps[(gaps["arm"] == arm) & (gaps["metric"] == metric)] if gaps is not None and len(gaps) else pd.DataFrame()
    ref = gaps[gaps["metric"] == metric]["noise_floor_pct"] if gaps is not None and len(gaps) else pd.Series(dtype=float)
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
    out["sentence"] = (f"{label} changes {METRIC_NAMES[metric]} by {_pct(g['gap_pct_mean'])} (95% interval "
                       f"[{_pct(g['gap_pct_ci_low'])}, {_pct(g['gap_pct_ci_high'])}], {int(g['n_seeds'])} seeds); "
                       f"{floor_text}: {verdict}.")
    return out


def report(study_dir: str | Path, headline_arm: str | None = None, headline_metric: str | None = None) -> dict[str, Any]:
    """Write the study's tables, headline, README and figures from its points; return the headline (about
    `headline_arm` and `headline_metric`; None: the study's). The quality_report notebook calls this; so can
    anyone, on a study no driver is running."""
    study_dir = Path(study_dir)
    study = Study.from_dict(results.read_json(study_dir / STUDY_FILE))
    if headline_arm is not None and study.arm(headline_arm) is None:
        raise ConfigError(f"headline_arm {headline_arm!r} is no arm of the study; allowed: {[a.name for a in study.arms]}")
    if headline_metric is not None and headline_metric not in METRICS:
        raise ConfigError(f"headline_metric {headline_metric!r}: allowed {list(METRICS)}")
    study.headline_arm = headline_arm or study.headline_arm
    study.headline_metric = headline_metric or study.headline_metric
    df, curves = collect(study, study_dir)
    results.write_csv(study_dir / "study.csv", df)
    results.write_csv(study_dir / "curves.csv", curves)
    arms = arms_table(study, df, curves)
    results.write_csv(study_dir / "arms.csv", arms)
    beaten = qs.teacher_beaten(_ran(df).to_dict("records")) if len(df) else []
    gaps = None
    for stale in ("gaps.csv", "gap_vs_noise.png", "gap_vs_noise.svg"):
        (study_dir / stale).unlink(missing_ok=True)  # a refusal must not leave an earlier answer behind
    if not beaten:
        gaps = gaps_table(study, df)
        results.write_csv(study_dir / "gaps.csv", gaps)
    head = headline(study, df, gaps, beaten)
    teacher = results.read_json(study_dir / TEACHER_FILE) if (study_dir / TEACHER_FILE).exists() else {}
    ran = _ran(df)
    head["teacher_heldout_ppl"] = (float(ran["teacher_heldout_ppl"].dropna().iloc[0])
                                   if len(ran) and ran["teacher_heldout_ppl"].notna().any() else None)
    head["teacher_cached_at"] = teacher.get("teacher_checkpoint")
    head["arms_not_flattened"] = [r["arm"] for r in arms.to_dict("records") if r["flattened"] is False]
    results.write_json(study_dir / "headline.json", head)
    from workbench.results import plots

    fig = heldout_curves(study, curves)
    results.write_figure(fig, study_dir, "heldout_curves")
    plots.plt.close(fig)
    if gaps is not None:
        fig = gap_vs_noise(study, gaps)
        results.write_figure(fig, study_dir, "gap_vs_noise")
        plots.plt.close(fig)
    (study_dir / "README.md").write_text(readme(study, head, arms, gaps), encoding="utf-8")
    return head


def _md(df: pd.DataFrame) -> str:
    def cell(v):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return ""
        return f"{v:.4g}" if isinstance(v, float) else str(v).replace("|", "/")
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join(lines)


def readme(study: Study, head: dict, arms: pd.DataFrame, gaps: pd.DataFrame | None) -> str:
    """README.md: the headline, the teacher, the arms and the gaps, every number from the files beside it."""
    cols = ["arm", "seeds_run", "heldout_ppl_mean", "heldout_ppl_sd", "kl_teacher_student_t1_nats_mean",
            "kl_teacher_student_t1_nats_sd", "top1_agreement_mean", "final_train_loss_mean", "step_ms_median_mean",
            "path", "kl_last_change_pct", "flattened", "not_run"]
    parts = [f"# Distillation-quality study `{study.name}`", "", f"**{head['sentence']}**", "",
             f"Teacher held-out perplexity: {head.get('teacher_heldout_ppl') or 'unknown'} (one teacher, "
             f"lm.teacher_seed, reused by every seed); seeds {study.seeds}; config preset `{study.preset}` with "
             f"`{json.dumps(study.fixed, sort_keys=True)}`.", "", "## Arms (arms.csv: mean, sd, 95% interval over seeds)", "",
             _md(arms.reindex(columns=cols))]
    if head.get("arms_not_flattened"):
        parts += ["", f"Held-out curves still moving by more than {qs.FLAT_THRESHOLD_PCT}% over their last interval: "
                      f"{', '.join(head['arms_not_flattened'])} (train longer: train.steps)."]
    if gaps is not None:
        g = gaps[gaps["metric"].isin(["kl_teacher_student_t1_nats", "heldout_ppl"])]
        parts += ["", f"## Gaps to `{REFERENCE_ARM}` in % (gaps.csv: paired by seed)", "",
                  _md(g.drop(columns=["gap_pct_by_seed"]))]
    parts += ["", "## Rules", "",
              f"- Noise floor of a metric: the root mean square over seeds of 100 (b_s - r_s) / r_s, r = `{REFERENCE_ARM}`, "
              f"b = `{NOISE_ARM}` (the same student from another init and batch order, train.seed + {NOISE_SEED_OFFSET}).",
              "- A gap (100 (arm_s - r_s) / r_s, paired by seed: same init, batches and teacher) is within noise when its "
              "95% Student-t interval contains 0 or |mean gap| is below the noise floor.",
              "- The study refuses an answer when a KD student ends with a lower held-out perplexity than its teacher.",
              f"- A curve has flattened when its last interval moved its mean by less than {qs.FLAT_THRESHOLD_PCT}%.",
              "", "Figures: `heldout_curves.png`" + (", `gap_vs_noise.png`" if gaps is not None else "") +
              "; rows: `study.csv`; curves: `curves.csv`.", ""]
    return "\n".join(parts)


# ---- figures (read only the study's tables) -------------------------------------------------------
def _arm_style(study: Study, name: str) -> dict[str, Any]:
    from workbench.results import plots

    a = study.arm(name)
    color = plots.student_color(a.student if a and a.kd and not a.noise else name)
    return {"color": color, "ls": "--" if a and (a.noise or not a.kd) else "-"}


def heldout_curves(study: Study, curves: pd.DataFrame):
    """Held-out KL to the teacher and perplexity against the training step: per arm the mean over seeds,
    the band its min and max."""
    from workbench.results import plots

    fig, axes = plots.plt.subplots(1, 2, figsize=(11, 4.8))
    if curves.empty:
        for ax in axes:
            plots.nothing_to_plot(ax, "no held-out curve (train.eval_every 0, or no point complete)")
        return fig
    for arm, c in curves.groupby("arm", sort=False):
        style = _arm_style(study, arm)
        for ax, m in zip(axes, ("kl_teacher_student_t1_nats", "heldout_ppl")):
            g = c.groupby("step")[m]
            mean, lo, hi = g.mean(), g.min(), g.max()
            ax.plot(mean.index, mean.values, marker=".", label=f"{arm} ({c['seed'].nunique()} seeds)", **style)
            ax.fill_between(mean.index, lo.values, hi.values, color=style["color"], alpha=0.15, lw=0)
    axes[0].set(xlabel="training step", ylabel="nats per token", title="KL(teacher ‖ student), T=1, held out")
    axes[1].set(xlabel="training step", ylabel="perplexity", title="held-out perplexity")
    axes[1].set_yscale("log")
    plots.plain_log_axis(axes[1].yaxis)
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Study {study.name}: mean over seeds, band min to max", fontsize=10)
    fig.tight_layout()
    return fig


def gap_vs_noise(study: Study, gaps: pd.DataFrame):
    """Each arm's paired gap to the reference (mean, 95% interval) against the bf16 noise floor (the grey
    band, +- the floor): an interval inside the band or across 0 is noise."""
    from workbench.results import plots

    fig, axes = plots.plt.subplots(1, 2, figsize=(11, 0.6 * len(study.arms) + 2.2))
    for ax, m in zip(axes, ("kl_teacher_student_t1_nats", "heldout_ppl")):
        g = gaps[(gaps["metric"] == m) & gaps["gap_pct_mean"].notna()].reset_index(drop=True)
        floor = gaps[gaps["metric"] == m]["noise_floor_pct"].dropna()
        if len(floor):
            ax.axvspan(-floor.iloc[0], floor.iloc[0], color="#bbbbbb", alpha=0.4,
                       label=f"bf16 noise floor ±{floor.iloc[0]:.2f}%")
        ax.axvline(0, color="black", lw=0.8)
        for i, r in g.iterrows():
            lo = r["gap_pct_mean"] - r["gap_pct_ci_low"] if pd.notna(r["gap_pct_ci_low"]) else 0
            hi = r["gap_pct_ci_high"] - r["gap_pct_mean"] if pd.notna(r["gap_pct_ci_high"]) else 0
            ax.errorbar(r["gap_pct_mean"], i, xerr=[[lo], [hi]], fmt="o", capsize=4, color=_arm_style(study, r["arm"])["color"])
        ax.set_yticks(range(len(g)), [f"{r.arm}{' (noise)' if r.within_noise is True else ''}" for r in g.itertuples()])
        ax.invert_yaxis()
        ax.set(xlabel=f"gap to {REFERENCE_ARM}, % (95% interval over seeds)", title=METRIC_NAMES[m])
        ax.grid(True, axis="x", alpha=0.3)
        if len(floor):
            ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Study {study.name}: paired gaps vs the bf16 noise floor", fontsize=10)
    fig.tight_layout()
    return fig


def run_report_notebook(study_dir: Path, progress: bool = False) -> Path:
    """Execute the quality_report notebook on the study (it writes the files above); returns the executed copy."""
    import papermill as pm

    from workbench.notebook import NOTEBOOKS, kernel_uses_this_python

    study_dir = Path(study_dir).resolve()
    kernel_uses_this_python()
    executed = study_dir / REPORT_NOTEBOOK_NAME
    from importlib import resources

    with resources.as_file(NOTEBOOKS / REPORT_NOTEBOOK_NAME) as source:
        pm.execute_notebook(str(source), str(executed), parameters={"study_dir": str(study_dir)},
                            kernel_name="python3", language="python", progress_bar=progress, cwd=str(study_dir))
    return executed


# ---- CLI -----------------------------------------------------------------------------------------
def add_arguments(p) -> None:
    p.add_argument("--preset", default=None, help=f"study preset: {', '.join(PRESETS)} (a bare --name resumes)")
    p.add_argument("--name", default=None, help="study name, the folder <out>/<name> (default: the preset's name)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override for every point, e.g. --set lm.student=DIR --set lm.teacher=DIR")
    p.add_argument("--seeds", default=None, help="the students' seeds, e.g. 1,2,3 (default: the preset's)")
    p.add_argument("--out", default=str(DEFAULT_ROOT), help="parent folder of the study folder")
    p.add_argument("--workers", default="auto", help="workers of the sweep's Dask cluster (see `sweep --help`)")
    p.add_argument("--no-report", action="store_true", help="run the points, skip the report")
    p.add_argument("--report-only", action="store_true", help="only (re)write the report of an existing study")


def study_from_args(args) -> Study:
    name = args.name or args.preset
    if not name:
        raise ConfigError("give --preset (a study preset) or --name of an existing study")
    stored = Path(args.out) / results.check_name(name, "study name") / STUDY_FILE
    if not args.preset and stored.exists():
        study = Study.from_dict(results.read_json(stored))  # resume, plus any new --set
        study.fixed.update(config.parse_set(args.overrides))
        check(study)
        return study
    if not args.preset:
        raise ConfigError(f"no study {stored.parent}: give --preset ({', '.join(PRESETS)})")
    return from_preset(args.preset, config.parse_set(args.overrides), parse_seeds(args.seeds), name)


def main(args) -> int:
    from workbench.sweep import run as sweep

    study = study_from_args(args)
    study_dir = sweep.sweep_folder(results.output_root(args.out), study.name)
    if args.report_only:
        if not (study_dir / STUDY_FILE).exists():
            print(f"workbench study: no report: no study folder {study_dir}", file=sys.stderr)
            return 1
        head = report(study_dir)
        print(json.dumps({"study_dir": str(study_dir), **head}, default=str))
        return 0 if not head["refused"] else 1
    spec = sweep_spec(study)
    study_dir.mkdir(parents=True, exist_ok=True)
    results.write_json(study_dir / STUDY_FILE, study.to_dict())
    signal.signal(signal.SIGTERM, sweep.interrupt)  # a kill stops the study like Ctrl-C: a rerun resumes
    try:
        ensure_teacher(study, study_dir)
        summary = sweep.run_sweep(spec, root=args.out, workers=args.workers)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(f"workbench study: interrupted; run the same command (or --name {study.name}) to resume", file=sys.stderr)
        return 130
    summary["study_dir"] = summary.pop("sweep_dir")
    rc = 1 if summary["failed"] else 0
    if not args.no_report:
        run_report_notebook(study_dir)
        head = results.read_json(study_dir / "headline.json")
        summary["headline"] = head["sentence"]
        if head["refused"]:
            print(f"workbench study: {head['sentence']}", file=sys.stderr)
            rc = 1
    print(json.dumps(summary, default=str))  # last line: machine-readable
    return rc
