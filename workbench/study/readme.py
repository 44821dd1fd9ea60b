"""A study's README.md: the headline, the teacher, the arms and the gaps, how the points ran (teachers, code
versions, where the students' time went) and the rules, every number from the files beside it (`report`)."""
from __future__ import annotations

import json
import math

import pandas as pd

from workbench import results
from workbench.study import stats as qs
from workbench.study.spec import NOISE_ARM, NOISE_SEED_OFFSET, REFERENCE_ARM, Study


def md_table(df: pd.DataFrame) -> str:
    """A frame as a Markdown table (floats to 4 significant digits, empty for None / NaN)."""
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
    if study.student_is_teacher:  # fine-tuning: where each precision started, beside where it ended
        cols[1:1] = ["heldout_ppl_step0_mean", "kl_teacher_student_t1_nats_step0_mean"]
    parts = [
        f"# Distillation-quality study `{study.name}`",
        "",
        f"**{head['sentence']}**",
        "",
        f"Teacher held-out perplexity: {head.get('teacher_heldout_ppl') or 'unknown'} (one teacher, "
        f"lm.teacher_seed, reused by every seed); seeds {study.seeds}; config preset `{study.preset}` with "
        f"`{json.dumps(study.fixed, sort_keys=True)}`.",
        "",
        "## Arms (arms.csv: mean, sd, 95% interval over seeds)",
        "",
        md_table(arms.reindex(columns=cols)),
    ]
    if study.points_per_gpu > 1:
        parts += ["", f"Step times (`step_ms_median_mean`): up to {study.points_per_gpu} points of this study shared "
                      "each GPU (`--workers K/gpu`), beside whatever else ran there, so they timed each other and are "
                      "no speed evidence; the quality figures do not depend on them."]
    parts += _provenance_and_time(head, arms)
    if head.get("arms_not_flattened"):
        parts += ["", f"Held-out curves still moving by more than {qs.FLAT_THRESHOLD_PCT}% over their last interval: "
                      f"{', '.join(head['arms_not_flattened'])} (train longer: train.steps"
                      + ("" if _schedule(study) else "; or let the rate decay: train.lr_schedule") + ")."]
    if gaps is not None:
        g = gaps[gaps["metric"].isin(["kl_teacher_student_t1_nats", "heldout_ppl"])]
        parts += ["", f"## Gaps to `{REFERENCE_ARM}` in % (gaps.csv: paired by seed)", "",
                  md_table(g.drop(columns=["gap_pct_by_seed"]))]
    parts += [
        "",
        "## Rules",
        "",
        f"- Noise floor of a metric: the root mean square over seeds of 100 (b_s - r_s) / r_s, r = `{REFERENCE_ARM}`, "
        f"b = `{NOISE_ARM}` (the same student from another init and batch order, train.seed + {NOISE_SEED_OFFSET}).",
        "- A gap (100 (arm_s - r_s) / r_s, paired by seed: same init, batches and teacher) is within noise when its "
        "95% Student-t interval contains 0 or |mean gap| is below the noise floor.",
        ("- Every student starts as the teacher's own checkpoint (fine-tuning): a student may end below the "
         "teacher's held-out perplexity, and the study does not refuse; the KL is to the original model, `*_step0` "
         "before the first step in the student's own precision." if study.student_is_teacher else
         "- The study refuses an answer when a KD student ends with a lower held-out perplexity than its teacher."),
        f"- A curve has flattened when its last interval moved its mean by less than {qs.FLAT_THRESHOLD_PCT}%."
        + (f" The learning rate decays to zero at the last step ({_schedule(study)}): a flat curve is where this "
           "step budget ends, not a model trained to convergence." if _schedule(study) else ""),
        "",
        "Figures: `heldout_curves.png`"
        + (", `gap_vs_noise.png`" if gaps is not None else "")
        + "; rows: `study.csv`; curves: `curves.csv`.",
        "",
    ]
    return "\n".join(parts)


def _provenance_and_time(head: dict, arms: pd.DataFrame) -> list[str]:
    """README lines on points that did not all run alike (another teacher, another code version, another GPU model:
    a study resumed elsewhere) and on where the students' time went."""
    parts: list[str] = []
    if len(head.get("teachers") or []) > 1:
        parts += ["", f"**{len(head['teachers'])} teachers**: the points did not all distil the same teacher (a study "
                      "resumed where its trained-here teacher was trained again; task.json's teacher_weights_sha256). "
                      "Each point's arms share one; the noise floor pairs a point with its seed's noise point."]
    if len(head.get("code_versions") or []) > 1:
        parts += ["", f"The points ran at {len(head['code_versions'])} versions of the code (git_sha): "
                      f"{', '.join(head['code_versions'])}."]
    if len(head.get("gpus") or []) > 1:  # quality figures compare across them; step times never do
        parts += ["", f"The points ran on {len(head['gpus'])} GPU models: {', '.join(head['gpus'])} (study.csv's "
                      "gpu_name, per point). KL and perplexity are compared across them; step times and the time "
                      "table below are not."]
    if arms.reindex(columns=["student_wall_s_mean"]).notna().any().iloc[0]:  # rows from before the split lack it
        parts += ["", "## Where a student's time went (seconds, mean over seeds; students.csv's *_wall_s)", "",
                  md_table(arms.reindex(columns=["arm", *(f"{w}_mean" for w in results.WALL_CELLS)])),
                  "", "setup: building, converting, compiling and capturing it; eval: its held-out evaluations (step "
                      "0, the curve's, the last); bench: the timed region. A point also builds its task (teacher, "
                      "top-k targets) before its students: done.json's wall_s is the whole point."]
    return parts


def _schedule(study: Study) -> str:
    """'train.lr_schedule=cosine after 50 warm-up steps' for a study whose rate decays, '' for a constant rate."""
    sched, warm = study.fixed.get("lr_schedule", "constant"), study.fixed.get("lr_warmup_steps", 0)
    if sched == "constant":
        return ""
    return f"train.lr_schedule={sched}" + (f" after {warm} warm-up steps" if warm else "")
