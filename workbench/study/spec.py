"""A distillation-quality study's design: its arms (one student each), seeds and presets, and the study as
a sweep (one point per seed: every arm of that seed, paired by construction). See `workbench.study`."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench import results
from workbench.config import ConfigError

DEFAULT_ROOT = Path("results") / "studies"
STUDY_FILE, TEACHER_FILE = "study.json", "teacher.json"
NOISE_SEED_OFFSET = 1000  # the noise arm's points: train.seed + this (another init and batch order)
REFERENCE_ARM, NOISE_ARM = "torch_bf16", "torch_bf16_b"
METRICS = ("heldout_ppl", "kl_teacher_student_t1_nats", "top1_agreement", "final_train_loss")
STEP0 = tuple(f"{m}_step0" for m in METRICS[:3])  # students.csv: the held-out metrics before the first step
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
    student_is_teacher: bool = False
    """True: every student starts as the teacher's own checkpoint (finetune-fp8), so the question is drift from
    the model, not distillation from a better one: no refusal when a student ends below the teacher's held-out
    perplexity (fine-tuning on text like the held-out text should), and the report leads with step 0 -> end."""
    point_groups: list[list[str]] = field(default_factory=list)
    """The arms (by name) that train together in one point at each seed; empty: every arm of a seed in one
    point. The noise arms keep their own point. A point is what a GPU call's time limit loses whole and what the
    budget check times: on a real teacher a six-student point outlasted a call (its torchao student, compiled as
    one graph, took minutes), so the real presets run the bf16 arms and the FP8 arms apart."""
    points_per_gpu: int = 1
    """The most points that shared one GPU while the study ran (`--workers K/gpu`, over every resume): above 1,
    its step times timed each other and are no speed evidence (the quality figures do not depend on them)."""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "arms": [asdict(a) for a in self.arms]}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Study":
        d = dict(d)
        d.pop("arms_per_point", None)  # a study.json of one commit (528e816), before point_groups
        if "student_is_teacher" not in d:  # a study.json from before the field: its preset says
            d["student_is_teacher"] = bool(PRESETS.get(d.get("study_preset"), {}).get("student_is_teacher"))
        return Study(**{**d, "arms": [Arm(**a) for a in d["arms"]]})

    def arm(self, name: str) -> Arm | None:
        return next((a for a in self.arms if a.name == name), None)


GPU_ARMS = [Arm("torch_bf16", "torch_bf16"), Arm("te_bf16", "te_bf16"), Arm("te_fp8_delayed", "te_fp8:delayed"),
            Arm("te_fp8_current", "te_fp8:current"), Arm("torchao_float8", "torchao_float8:tensorwise"),
            Arm("no_kd_bf16", "torch_bf16", kd=False), Arm(NOISE_ARM, "torch_bf16", noise=True)]

# The real presets' points at each seed: the bf16 arms, and the FP8 arms (TE's two recipes and torchao). torchao's
# student was a point of its own while it compiled as one 30-layer graph (it had not logged a step when an H100
# call's limit cut its point: results/reference/h100/quality/528e816/); compiled one decoder layer at a time
# (compile_scope) it compiles in seconds (a 4-layer HF Llama on an H100: 14.4 s, 3 graphs, against 34.9 s whole:
# results/reference/h100/gpu_tests/d8ec880_hf/), so it joins the TE FP8 point and a seed starts one process fewer
# (each point pays its own start; at 528e816 a seed's first point spent ~77 s before its first student).
REAL_GROUPS = [["torch_bf16", "te_bf16", "no_kd_bf16"], ["te_fp8_delayed", "te_fp8_current", "torchao_float8"]]

# distill-quality: one H200, ~16 minutes in two calls (`scripts/gpu.sh quality` resumes). The teacher is 3x wider
# and 1.5x deeper than the student and trains 1.25x the students' steps. Measured on the H200
# (results/reference/h200/quality/): at 800 steps (teacher 1,200) the held-out curves still fell 3-7% per 100
# steps; at 3200 steps (eval every 200; teacher 4,000) every arm had flattened (< 1% over the last 200 steps) but
# the KD students passed the teacher (10.5-10.7 against 11.32; the no-KD students 12.28), which on the 12 MB of the
# standard library had learnt its text by heart (training loss 0.99 against 2.43 nats held out): so 64 MB of
# text (the built-in corpus goes on into the installed packages' sources), which keeps its 4,000 steps under
# two passes over the text. With a constant rate no step budget flattens a curve that falls as a power law (it
# falls by the same fraction over every last eighth), so the students' rate now decays (cosine to zero after a
# warm-up, train.lr_schedule; workbench/train/optim.py) and 1,600 steps end where the curves have stopped. The
# teacher keeps its constant rate (and its cache). Fastest correct path: torch and torchao students compiled with
# their whole step in one CUDA graph, TE students' whole step in one graph (options.te_graph=step).
PRESETS: dict[str, dict[str, Any]] = {
    "distill-quality": {
        "preset": "lm-distill", "arms": GPU_ARMS, "seeds": [1, 2, 3],
        "set": {"vocab": 4096, "hidden": 256, "intermediate": 1024, "layers": 4, "heads": 4, "seq_len": 256,
                "batch": 32, "steps": 1600, "lr": 1e-3, "lr_schedule": "cosine", "lr_warmup_steps": 80,
                "eval_every": 200, "eval_batches": 8,
                "warmup": 3, "iters": 10, "compile": True, "graphs": True, "te_graph": "step",
                "corpus_mb": 64.0, "teacher_hidden": 768, "teacher_layers": 6, "teacher_steps": 4000,
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
    # A real pretrained teacher (issue 36): --set lm.teacher=DIR (e.g. SmolLM2-135M from `workbench hf-import`) and
    # lm.student=DIR (`workbench hf-prune` of it: its layers copied, or --init random at the same shape; run the
    # study once per student). Held-out text: the built-in corpus (the Python standard library's sources and
    # docs, then the installed packages'), which no chat model was tuned on. A pretrained model moves with a
    # smaller learning rate than a student trained from scratch.
    # Teacher targets: top-k (k=64), built once per point and read by all six of its students. Measured on the H200
    # (results/reference/h200/quality/real/, online teacher, compile off): one point of SmolLM2-135M into its
    # every:3 student took over 7 minutes for six students whose 800 steps are 12-20 s each (steps 15-25 ms), so
    # most of a student's ~75 s is outside its own steps; the online teacher's 30-layer forward, once per step
    # per student, is the one cost top-k pays once per point instead. The full logits (600 GiB) fit nowhere.
    # compile off: a quality study compares numerics, not speed (torchao's float8 compiles regardless, one decoder
    # layer at a time: compile_scope, since its whole 30-layer model took minutes).
    # The rate: cosine to zero after 40 warm-up steps (a constant rate never lets the curves flatten, see above); a
    # pruned student heals at 4e-4, a random one learns from scratch at a higher rate (`scripts/gpu.sh quality-real`
    # gives it --set lr=1e-3: study.json keeps what ran).
    "distill-quality-real": {
        "preset": "lm-distill", "arms": GPU_ARMS, "seeds": [1, 2, 3], "needs": ("lm.teacher", "lm.student"),
        "point_groups": REAL_GROUPS,
        "set": {"kind": "llama", "seq_len": 512, "batch": 16, "steps": 800, "lr": 4e-4, "lr_schedule": "cosine",
                "lr_warmup_steps": 40, "eval_every": 100,
                "eval_batches": 8, "warmup": 3, "iters": 10, "compile": False, "compile_scope": "layers",
                "graphs": True, "te_graph": "step",
                "corpus_mb": 64.0, "teacher_seed": 0, "temperature": 1.0, "teacher_mode": "topk"},
    },
    # "Can I fine-tune my model in FP8 without drifting from it?": the student is the teacher's own checkpoint
    # (lm.student defaults to lm.teacher), trained on its KD loss in bf16 and in each FP8 recipe; the KL to the
    # original model and held-out perplexity at step 0 (students.csv *_step0) and at the end, against the noise.
    "finetune-fp8": {
        "preset": "lm-distill", "arms": GPU_ARMS, "seeds": [1, 2, 3], "needs": ("lm.teacher",),
        "point_groups": REAL_GROUPS, "student_is_teacher": True,
        "set": {"kind": "llama", "seq_len": 512, "batch": 16, "steps": 320, "lr": 1e-5, "lr_schedule": "cosine",
                "lr_warmup_steps": 20, "eval_every": 40,
                "eval_batches": 8, "warmup": 3, "iters": 10, "compile": False, "compile_scope": "layers",
                "graphs": True, "te_graph": "step",
                "corpus_mb": 64.0, "teacher_seed": 0, "temperature": 1.0, "teacher_mode": "topk"},
    },
}


def given(overrides: dict[str, Any], field: str) -> Any:
    """An override by its dotted or its flat name (--set lm.teacher=DIR or --set teacher=DIR)."""
    return overrides.get(field) or overrides.get(field.split(".")[-1])


def _folders(name: str, p: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The Hugging Face folders a preset needs, from --set (dotted or flat names); ConfigError naming them."""
    missing = [f for f in p.get("needs", ()) if not given(overrides, f)]
    if missing:
        raise ConfigError(f"study preset {name!r} needs " + " ".join(f"--set {f}=DIR" for f in missing) +
                          " (a Hugging Face folder: `workbench hf-import` a real model, `workbench hf-prune` a "
                          "student from it; docs/usage.md)")
    if p.get("student_is_teacher") and not given(overrides, "lm.student"):
        return {**overrides, "lm.student": given(overrides, "lm.teacher")}
    return overrides


def _same_folder(overrides: dict[str, Any]) -> bool:
    """Whether the student folder is the teacher's (after `_folders`): a fine-tuning, not a distillation."""
    student, teacher = given(overrides, "lm.student"), given(overrides, "lm.teacher")
    return bool(student and teacher) and Path(str(student)).resolve() == Path(str(teacher)).resolve()


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
    overrides = _folders(name, p, overrides)
    study = Study(name=results.check_name(study_name or name, "study name"), preset=p["preset"],
                  fixed={**p["set"], **overrides}, arms=list(p["arms"]), seeds=list(seeds or p["seeds"]),
                  study_preset=name,
                  # finetune-fp8 given another student folder is a distillation again: its refusal rule holds
                  student_is_teacher=bool(p.get("student_is_teacher")) and _same_folder(overrides),
                  point_groups=[list(g) for g in p.get("point_groups", [])])
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
    if study.point_groups:
        grouped = [n for g in study.point_groups for n in g]
        wanted = [a.name for a in study.arms if not a.noise]
        if sorted(grouped) != sorted(wanted):
            raise ConfigError(f"point_groups: every arm but the noise arms exactly once ({wanted}), got "
                              f"{study.point_groups}")
        for g in study.point_groups:  # the runner trains a no-KD student beside its backend's KD one
            lone = [a.name for a in map(study.arm, g) if not a.kd and
                    not any(b.kd and b.student == a.student for b in map(study.arm, g))]
            if lone:
                raise ConfigError(f"point_groups: {lone[0]} trains beside the KD arm of its backend (the runner's "
                                  f"no_kd_student): put them in one group, got {g}")
    bad = [s for s in study.seeds if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < NOISE_SEED_OFFSET]
    if bad or len(set(study.seeds)) != len(study.seeds) or len(study.seeds) < 2:
        raise ConfigError(f"--seeds: two or more distinct integers in [0, {NOISE_SEED_OFFSET}), got {study.seeds}")


def read_study(path: Path) -> Study:
    """study.json as a Study, checked as a preset's is; ConfigError naming the file otherwise (a hand edit)."""
    try:
        d = results.read_json(path)
        study = Study.from_dict(d)  # a field missing or unknown, arms that are no objects: TypeError / KeyError
    except (OSError, ValueError, TypeError, KeyError) as e:  # JSONDecodeError is a ValueError
        why = f"no field {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
        raise ConfigError(f"{path}: not a study ({why})") from None
    fields = {"name": isinstance(study.name, str), "preset": isinstance(study.preset, str),
              "fixed": isinstance(study.fixed, dict), "seeds": isinstance(study.seeds, list),
              "student_is_teacher": isinstance(study.student_is_teacher, bool),
              "points_per_gpu": type(study.points_per_gpu) is int and study.points_per_gpu >= 1,
              "point_groups": isinstance(study.point_groups, list) and all(
                  isinstance(g, list) and all(isinstance(n, str) for n in g) for g in study.point_groups),
              "arms": all(isinstance(a.name, str) and isinstance(a.student, str) and isinstance(a.kd, bool)
                          and isinstance(a.noise, bool) for a in study.arms)}
    wrong = [k for k, ok in fields.items() if not ok]
    try:
        if wrong:
            raise ConfigError(f"{wrong[0]} has the wrong type")
        check(study)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return study


def parse_seeds(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds expects integers separated by commas, e.g. 1,2,3; got {text!r}") from None


# ---- the study as a sweep ------------------------------------------------------------------------
def point_overrides(study: Study) -> list[dict[str, Any]]:
    """The grid: per seed, the points of its arms (one, or one per `point_groups` group), then one with the
    noise arms. A no-KD arm trains beside its backend's KD student (the runner's no_kd_student)."""
    out = []
    for seed in study.seeds:
        for noise in (False, True):
            arms = [a for a in study.arms if a.noise == noise]
            groups = [[study.arm(n) for n in g] for g in study.point_groups] if study.point_groups and not noise \
                else [arms]
            for group in groups:
                students = list(dict.fromkeys(a.student for a in group if a.kd))
                no_kd = [a for a in group if not a.kd]
                if not students and not no_kd:
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
