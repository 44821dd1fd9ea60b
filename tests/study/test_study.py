"""The distillation-quality study: its points, its report from point folders (synthetic ones here, real
ones in the slow end-to-end test, which also kills a study and resumes it)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pandas as pd
import pytest

from workbench import config, results
from workbench.config import ConfigError
from workbench.study import spec
from workbench.study.figures import heldout_curves
from workbench.study.report import collect, point_students, report
from workbench.sweep.plan import plan

ROOT = Path(__file__).resolve().parents[2]
TEACHER_PPL = 50.0


def test_points_pair_arms_by_seed_and_shift_the_noise_arm():
    s = spec.from_preset("distill-quality")
    grid = spec.point_overrides(s)
    assert [g["seed"] for g in grid] == [1, 1001, 2, 1002, 3, 1003]
    main = grid[0]
    assert main["backends"] == [
        "torch_bf16",
        "te_bf16",
        "te_fp8:delayed",
        "te_fp8:current",
        "torchao_float8:tensorwise",
    ]
    assert main["no_kd_student"] is True and main["baseline"] == "torch_bf16"
    assert grid[1] == {"seed": 1001, "backends": ["torch_bf16"], "baseline": "torch_bf16", "no_kd_student": False}
    assert spec.arm_of(s, "torch_bf16:no_kd", 2)[0].name == "no_kd_bf16"
    assert spec.arm_of(s, "torch_bf16", 1002) == (s.arm("torch_bf16_b"), 2)
    assert spec.arm_of(s, "torch_bf16", 2) == (s.arm("torch_bf16"), 2)


def test_point_groups_split_a_seed_and_keep_the_no_kd_student_with_its_backend(tmp_path):
    """The real-teacher presets run a seed's arms in two points (bf16, FP8: TE's recipes and torchao), so a GPU
    call's limit never loses six students at once; every arm still runs once per seed, the noise point's grid
    entry is as before."""
    s = spec.from_preset("finetune-fp8", {"lm.teacher": "/models/t"})
    assert s.point_groups == spec.REAL_GROUPS
    grid = spec.point_overrides(s)
    assert [g["seed"] for g in grid] == [1, 1, 1001, 2, 2, 1002, 3, 3, 1003]
    assert grid[0] == {"seed": 1, "backends": ["torch_bf16", "te_bf16"], "baseline": "torch_bf16",
                       "no_kd_student": True}
    assert grid[1] == {"seed": 1, "backends": ["te_fp8:delayed", "te_fp8:current", "torchao_float8:tensorwise"],
                       "baseline": "te_fp8:delayed", "no_kd_student": False}
    whole = spec.point_overrides(spec.from_preset("distill-quality"))
    assert grid[2] == whole[1]  # the noise point's grid entry as before
    assert sorted(b for g in grid[3:5] for b in g["backends"]) == sorted(whole[2]["backends"])
    s.point_groups = [["no_kd_bf16"], ["torch_bf16", "te_bf16", "te_fp8_delayed", "te_fp8_current",
                                       "torchao_float8"]]  # the no-KD arm without its backend's KD arm
    with pytest.raises(ConfigError, match="no_kd_bf16 trains beside the KD arm of its backend"):
        spec.check(s)
    for groups in ([["torch_bf16"]], [g + ["torch_bf16"] for g in spec.REAL_GROUPS], [["nope"]]):
        s.point_groups = groups  # an arm left out, twice, or unknown: refused naming the field
        with pytest.raises(ConfigError, match="point_groups: every arm"):
            spec.check(s)
    s.point_groups = "torchao_float8"  # a hand edit of study.json: refused naming the field
    results.write_json(tmp_path / spec.STUDY_FILE, s.to_dict())
    with pytest.raises(ConfigError, match="point_groups has the wrong type"):
        spec.read_study(tmp_path / spec.STUDY_FILE)
    old = {**spec.from_preset("distill-quality").to_dict(), "arms_per_point": 3}
    assert spec.Study.from_dict(old).point_groups == []  # a study.json of the one commit with arms_per_point


def test_every_point_shares_one_teacher_and_held_out_set():
    """The teacher's cache key and the held-out batches follow lm.teacher_seed, never the students' seed."""
    from workbench.train import task_setup

    s = spec.from_preset("distill-quality")
    cfgs = [config.from_preset(s.preset, **{**s.fixed, **g}) for g in spec.point_overrides(s)]
    assert {task_setup.teacher_seed(c) for c in cfgs} == {0}
    assert len({c.train.seed for c in cfgs}) == 6
    assert task_setup.teacher_seed(config.from_preset("gpt-cpu", seed=7)) == 7  # default: train.seed, as before
    with pytest.raises(ConfigError, match="lm.teacher_seed"):
        config.from_preset("gpt-cpu", teacher_seed=-2)


def test_set_passes_through_to_every_point_and_per_point_fields_are_refused():
    s = spec.from_preset("distill-quality", {"lm.student": "/models/mine", "lm.teacher": "/models/big"})
    for p in plan(spec.sweep_spec(s)):
        assert p.overrides["lm.student"] == "/models/mine" and p.overrides["lm.teacher"] == "/models/big"
    with pytest.raises(ConfigError, match="--seeds"):
        spec.from_preset("distill-quality", {"seed": "4"})
    with pytest.raises(ConfigError, match="allowed"):
        spec.from_preset("no-such-study")
    with pytest.raises(ConfigError, match="--seeds"):
        spec.from_preset("distill-quality", seeds=[1])


def _fake_study(tmp_path, ppl: dict[str, list[float]], status: dict[str, str] | None = None,
                preset: str = "distill-quality", sets: dict | None = None) -> Path:
    """A study folder whose points hold students.csv / eval_curve.csv with the given held-out perplexities
    per arm (one per seed; KL = ppl / 100; before the first step: ppl 50.5, KL 0.01), as a finished run writes
    them."""
    s = spec.from_preset(preset, sets or {}, seeds=[1, 2, 3], study_name="fake")
    folder = tmp_path / "fake"
    folder.mkdir(parents=True)
    results.write_json(folder / spec.STUDY_FILE, s.to_dict())
    for p in plan(spec.sweep_spec(s)):
        point_seed = int(p.grid["seed"])
        seed = point_seed % spec.NOISE_SEED_OFFSET
        rows, curve = [], []
        for a in s.arms:
            name = a.student if a.kd else f"{a.student}:no_kd"
            if a.noise != (point_seed >= spec.NOISE_SEED_OFFSET) or name not in point_students(p.grid):
                continue
            v = ppl[a.name][seed - 1]
            rows.append({"student": name, "status": (status or {}).get(a.name, "ok"), "reason": "",
                         "heldout_ppl": v, "kl_teacher_student_t1_nats": v / 100, "top1_agreement": 0.5,
                         "final_train_loss": 3.0, "teacher_heldout_ppl": TEACHER_PPL, "step_ms_median": 1.0,
                         "heldout_ppl_step0": 50.5, "kl_teacher_student_t1_nats_step0": 0.01,
                         "compiled": True, "graph_scope": "step"})
            curve += [{"student": name, "step": step, "heldout_ppl": v * f, "kl_teacher_student_t1_nats": v * f / 100,
                       "top1_agreement": 0.5} for step, f in ((100, 1.5), (200, 1.001), (300, 1.0))]
        d = folder / p.id
        d.mkdir()
        results.write_csv(d / "students.csv", pd.DataFrame(rows))
        results.write_csv(d / "eval_curve.csv", pd.DataFrame(curve))
        results.mark_complete(d)
    return folder


BASE = {"torch_bf16": [60.0, 62.0, 64.0], "te_bf16": [60.0, 62.0, 64.0], "te_fp8_current": [61.0, 61.0, 65.0],
        "torchao_float8": [60.0, 62.0, 64.0], "no_kd_bf16": [70.0, 70.0, 70.0], "torch_bf16_b": [61.2, 61.38, 64.64],
        "te_fp8_delayed": [66.0, 68.2, 70.4]}  # delayed: +10% at every seed; the b arm: +2, -1, +1%


def test_report_gaps_noise_floor_and_headline(tmp_path):
    folder = _fake_study(tmp_path, BASE)
    head = report(folder)
    gaps = pd.read_csv(folder / "gaps.csv")
    kl = gaps[gaps["metric"] == "kl_teacher_student_t1_nats"].set_index("arm")
    floor = (((2**2 + 1 + 1) / 3) ** 0.5)  # the b arm's gaps 2, -1, 1 %
    assert kl.loc["te_fp8_delayed", "gap_pct_mean"] == pytest.approx(10.0)
    assert kl.loc["te_fp8_delayed", "gap_pct_sd"] == pytest.approx(0.0, abs=1e-9)
    assert kl.loc["te_fp8_delayed", "noise_floor_pct"] == pytest.approx(floor)
    assert kl.loc["te_fp8_delayed", "within_noise"] == False  # noqa: E712 - a numpy bool
    assert kl.loc["te_bf16", "within_noise"] == True  # noqa: E712 - gap 0
    assert kl.loc["torch_bf16_b", "within_noise"] == True  # noqa: E712 - |mean| <= its own RMS
    assert head["refused"] is False and head["gap_pct"] == pytest.approx(10.0)
    assert head["noise_floor_pct"] == pytest.approx(floor)
    # the paired difference in nats: KL 0.66, 0.682, 0.704 against 0.60, 0.62, 0.64 -> 0.060, 0.062, 0.064
    half = 4.302653 * 0.002 / 3 ** 0.5  # t(0.975, 2 df) x sd / sqrt(n)
    assert kl.loc["te_fp8_delayed", "diff_mean"] == pytest.approx(0.062)
    assert kl.loc["te_fp8_delayed", "diff_ci_low"] == pytest.approx(0.062 - half, rel=1e-4)
    floor_abs = ((0.012**2 + 0.0062**2 + 0.0064**2) / 3) ** 0.5  # the b arm's KL differences, nats
    assert kl.loc["torch_bf16_b", "noise_floor_abs"] == pytest.approx(floor_abs)
    assert head["diff_nats"] == pytest.approx(0.062)
    assert head["sentence"] == (f"FP8 delayed changes held-out KL to the teacher by +10.0% (95% interval [+10.0%, "
                                f"+10.0%], 3 seeds; in nats +0.0620 [{0.062 - half:+.4f}, {0.062 + half:+.4f}], "
                                f"noise floor {floor_abs:.4f}); "
                                f"the bf16 noise floor is {floor:.1f}%: outside the noise.")
    assert json.loads((folder / "headline.json").read_text())["sentence"] == head["sentence"]
    assert head["sentence"] in (folder / "README.md").read_text()
    arms = pd.read_csv(folder / "arms.csv").set_index("arm")
    assert arms.loc["torch_bf16", "heldout_ppl_mean"] == pytest.approx(62.0)
    assert "time went" not in (folder / "README.md").read_text()  # rows without the *_wall_s cells: no table
    assert arms.loc["torch_bf16", "heldout_ppl_sd"] == pytest.approx(2.0)
    assert arms.loc["torch_bf16", "flattened"] == True  # noqa: E712 - last interval moved 0.1%
    assert len(pd.read_csv(folder / "study.csv")) == 7 * 3
    for png in ("heldout_curves.png", "gap_vs_noise.png"):
        assert (folder / png).stat().st_size > 1000


def test_report_refuses_when_a_kd_student_beats_its_teacher(tmp_path):
    folder = _fake_study(tmp_path, {**BASE, "te_fp8_current": [40.0, 61.0, 65.0]})  # 40 < the teacher's 50
    (folder / "gaps.csv").write_text("stale answer\n")
    head = report(folder)
    assert head["refused"] is True
    assert head["teacher_beaten_by"] == [{"arm": "te_fp8_current", "seed": 1, "heldout_ppl": 40.0,
                                          "teacher_heldout_ppl": TEACHER_PPL}]
    assert head["sentence"].startswith("Refused: no distillation-quality answer")
    assert not (folder / "gaps.csv").exists() and not (folder / "gap_vs_noise.png").exists()
    assert head["sentence"] in (folder / "README.md").read_text()


@pytest.mark.parametrize("teacher_train_loss, no_kd, why", [
    # the teacher's last training loss far below its held-out loss (ln 50 = 3.91 nats): it learnt its text
    (1.0, 70.0, "The text alone does not (no-KD students 70.00); the teacher learnt its training text by heart "
                "(last training loss 1.00 nats against 3.91 held out)"),
    (3.8, 70.0, "The text alone does not (no-KD students 70.00); train a stronger teacher"),
    # the text alone passes the teacher: a weak teacher, whatever its training loss
    (1.0, 45.0, "The text alone takes a student past it (no-KD students 45.00 < teacher 50.00): train a stronger"),
])
def test_a_refusal_says_why_the_students_passed_their_teacher(tmp_path, teacher_train_loss, no_kd, why):
    folder = _fake_study(tmp_path, {**BASE, "te_fp8_current": [40.0, 61.0, 65.0], "no_kd_bf16": [no_kd] * 3})
    results.write_json(folder / spec.TEACHER_FILE, {"teacher_heldout_ppl": TEACHER_PPL,
                                                    "teacher_final_loss": teacher_train_loss})
    head = report(folder)
    assert head["refused"] is True and why in head["sentence"], head["sentence"]
    assert ("lm.corpus_mb" in head["sentence"]) == (teacher_train_loss == 1.0 and no_kd == 70.0)


def test_the_perplexity_panel_draws_the_teachers_line(tmp_path):
    folder = _fake_study(tmp_path, BASE)
    study = spec.Study.from_dict(results.read_json(folder / spec.STUDY_FILE))
    _, curves = collect(study, folder)
    fig = heldout_curves(study, curves, TEACHER_PPL)
    labels = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert "teacher (50.00)" in labels and "teacher (50.00)" not in [
        t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def test_a_fine_tuning_study_reads_drift_from_the_model_and_does_not_refuse(tmp_path):
    """finetune-fp8: every student starts as the teacher, so one that ends below the teacher's held-out
    perplexity is fine-tuning at work, not a refusal (the same rows refuse a distillation study); the headline
    speaks of the original model and gives step 0 -> end; arms.csv keeps the step-0 means."""
    ppl = {**BASE, "te_fp8_current": [40.0, 61.0, 65.0]}  # 40 < the teacher's 50
    assert report(_fake_study(tmp_path / "distil", ppl))["refused"] is True
    folder = _fake_study(tmp_path / "ft", ppl, preset="finetune-fp8", sets={"lm.teacher": "models/m"})
    head = report(folder)
    assert head["refused"] is False and (folder / "gaps.csv").exists()
    assert head["sentence"].startswith("FP8 delayed changes held-out KL to the original model by +10.0%")
    assert head["sentence"].endswith("Step 0 -> end (means over seeds, each in its own precision): FP8 delayed "
                                     "0.0100 -> 0.6820 nats, torch bf16 0.0100 -> 0.6200 nats.")
    assert head["step0_end"]["te_fp8_delayed"] == {"step0": pytest.approx(0.01), "end": pytest.approx(0.682)}
    arms = pd.read_csv(folder / "arms.csv").set_index("arm")
    assert arms.loc["te_fp8_delayed", "kl_teacher_student_t1_nats_step0_mean"] == pytest.approx(0.01)
    readme = (folder / "README.md").read_text()
    assert "kl_teacher_student_t1_nats_step0_mean" in readme and "does not refuse" in readme
    assert spec.read_study(folder / spec.STUDY_FILE).student_is_teacher is True


def test_a_study_split_in_point_groups_reports_each_arm_once_and_only_a_missing_groups_arms(tmp_path):
    """finetune-fp8 runs two points a seed and its noise point: each arm x seed is one row; an FP8 point not
    finished makes its three arms' rows of that seed `missing`, naming that point, and no other arm's."""
    folder = _fake_study(tmp_path, BASE, preset="finetune-fp8", sets={"lm.teacher": "models/m"})
    report(folder)
    rows = pd.read_csv(folder / "study.csv")
    assert len(rows) == 7 * 3 and not rows.duplicated(["arm", "seed"]).any() and (rows["status"] == "ok").all()
    study = spec.read_study(folder / spec.STUDY_FILE)
    fp8 = next(p for p in plan(spec.sweep_spec(study))
               if p.grid["seed"] == 2 and "torchao_float8:tensorwise" in p.grid["backends"])
    (folder / fp8.id / results.DONE_FILE).unlink()
    report(folder)
    rows = pd.read_csv(folder / "study.csv")
    missing = rows[rows["status"] == "missing"]
    assert sorted(missing[["arm", "seed", "point"]].values.tolist()) == [
        [arm, 2, fp8.id] for arm in ("te_fp8_current", "te_fp8_delayed", "torchao_float8")]
    assert len(rows) == 7 * 3


def test_a_study_whose_points_shared_a_gpu_says_its_step_times_are_no_speed_evidence(tmp_path):
    folder = _fake_study(tmp_path, BASE)
    report(folder)
    assert "no speed evidence" not in (folder / "README.md").read_text()
    study = spec.read_study(folder / spec.STUDY_FILE)
    study.points_per_gpu = 3
    results.write_json(folder / spec.STUDY_FILE, study.to_dict())
    report(folder)
    assert "up to 3 points of this study shared each GPU" in (folder / "README.md").read_text()
    study.points_per_gpu = 0  # a hand edit: refused naming the field
    results.write_json(folder / spec.STUDY_FILE, study.to_dict())
    with pytest.raises(ConfigError, match="points_per_gpu has the wrong type"):
        spec.read_study(folder / spec.STUDY_FILE)


def test_the_points_that_shared_a_gpu_are_counted_over_resumes(tmp_path, monkeypatch):
    from workbench.study import run as study_run

    s = spec.from_preset("distill-quality", seeds=[1, 2])
    stored = tmp_path / spec.STUDY_FILE
    monkeypatch.setattr(study_run, "visible_gpus", lambda: ["0"])
    assert study_run.points_per_gpu(s, stored, "3/gpu") == 3  # no study.json yet
    results.write_json(stored, {**s.to_dict(), "points_per_gpu": 3})
    assert study_run.points_per_gpu(s, stored, "auto") == 3  # a resume without sharing keeps the earlier figure
    stored.write_text("{not json")
    assert study_run.points_per_gpu(s, stored, "2/gpu") == 2  # an unreadable study.json is this run's to rewrite
    monkeypatch.setattr(study_run, "visible_gpus", lambda: [])
    assert study_run.points_per_gpu(s, tmp_path / "none.json", "3/gpu") == 1  # a CPU's one worker shares nothing


def test_fine_tuning_is_read_back_from_an_older_study_json_and_ends_with_another_student():
    old = spec.from_preset("finetune-fp8", {"lm.teacher": "models/m"}).to_dict()
    assert old.pop("student_is_teacher") is True
    assert spec.Study.from_dict(old).student_is_teacher is True  # a study.json from before the field
    other = spec.from_preset("finetune-fp8", {"lm.teacher": "models/m", "lm.student": "models/pruned"})
    assert other.student_is_teacher is False  # another student folder: a distillation, its refusal holds
    assert spec.from_preset("distill-quality-real", {"teacher": "t", "student": "s"}).student_is_teacher is False


def test_no_kd_student_beating_the_teacher_is_no_refusal(tmp_path):
    folder = _fake_study(tmp_path, {**BASE, "no_kd_bf16": [40.0, 40.0, 40.0]})
    assert report(folder)["refused"] is False


def test_an_arm_that_fell_back_is_not_counted(tmp_path):
    folder = _fake_study(tmp_path, BASE, status={"te_fp8_delayed": "fallback"})
    head = report(folder)
    assert head["sentence"].startswith("FP8 delayed did not run here")
    arms = pd.read_csv(folder / "arms.csv").set_index("arm")
    assert arms.loc["te_fp8_delayed", "seeds_run"] == 0


def _run(args, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "workbench", "study", *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, **kw)


@pytest.mark.slow
def test_cpu_study_end_to_end_resumes_after_a_kill_from_its_archive_on_a_fresh_machine(tmp_path):
    """The tiny study through the command and the report notebook; killed after its first point, its small files
    archived (scripts/gpu/study_archive.sh, as `quality-real` returns them), the folder and its caches gone (a GPU
    machine given back), the archive unpacked and the study rerun: the finished points are not run again (their
    done.json untouched), the others are, the teacher is trained again (the same one: a CPU is deterministic) and
    the report is written."""
    pytest.importorskip("distributed")
    # two Dask workers: the six points run two at a time (the suite runs on two cores; a CPU study defaults to one)
    args = ["--preset", "distill-quality-cpu", "--out", str(tmp_path), "--workers", "2"]
    folder = tmp_path / "distill-quality-cpu"
    first = _run(args)
    deadline = time.monotonic() + 600
    done: dict[str, str] = {}
    while time.monotonic() < deadline and not done:
        time.sleep(1)
        done = {d.name: (d / "done.json").read_text() for d in folder.glob("*") if (d / "done.json").exists()}
    assert done, "no point finished in time"
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=120) == 130
    done = {d.name: (d / "done.json").read_text() for d in folder.glob("*") if (d / "done.json").exists()}
    assert 0 < len(done) < 6
    archive = tmp_path / "carry" / "distill-quality-cpu.tar.gz"
    archive.parent.mkdir()
    subprocess.run(["bash", str(ROOT / "scripts" / "gpu" / "study_archive.sh"), str(folder), str(archive)], check=True)
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert not [n for n in names if n.startswith("./cache") or n.startswith("cache")] and "study.json" in names
    assert {f"./{p}/done.json" for p in done} <= set(names)
    shutil.rmtree(folder)
    folder.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")
    second = _run(args)
    out, _ = second.communicate(timeout=1200)
    assert second.returncode == 0, out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["skipped"] == len(done) and summary["complete"] == 6
    for point, text in done.items():
        assert (folder / point / "done.json").read_text() == text  # not rerun
    rows = pd.read_csv(folder / "study.csv")
    assert set(rows["arm"]) == {"torch_bf16", "te_fp8_delayed", "torch_bf16_b"}
    ran = rows[rows["status"] == "ok"]
    assert sorted(ran.groupby("arm")["seed"].apply(sorted).to_dict().items()) == [
        ("torch_bf16", [1, 2, 3]), ("torch_bf16_b", [1, 2, 3])]
    assert (rows[rows["arm"] == "te_fp8_delayed"]["reason"].str.len() > 0).all()  # a CPU cannot run TE: why
    assert (ran["teacher_heldout_ppl"].nunique()) == 1  # one teacher, one held-out set, every seed
    # ... and it is the one the study trained before its first point, not a second one trained by a point
    trained = json.loads((folder / "teacher.json").read_text())["teacher_checkpoint"]
    used = {json.loads((folder / p / "task.json").read_text())["teacher_checkpoint"] for p in rows["point"]}
    assert used == {trained} and trained.startswith(str(folder / "cache"))
    head = json.loads((folder / "headline.json").read_text())
    assert head["sentence"] == summary["headline"] and "noise floor" in head["sentence"]
    assert (folder / "quality_report.ipynb").exists() and (folder / "heldout_curves.png").exists()
    # where the students' time went, per arm, from their rows: the next study's device time is planned from it
    arms = pd.read_csv(folder / "arms.csv").set_index("arm")
    walls = arms.loc[["torch_bf16", "torch_bf16_b"], [f"{w}_mean" for w in results.WALL_CELLS]]
    assert (walls > 0).all().all() and (walls["student_wall_s_mean"] >= walls["train_wall_s_mean"]).all()
    assert pd.isna(arms.loc["te_fp8_delayed", "student_wall_s_mean"])  # it did not run
    assert "## Where a student's time went" in (folder / "README.md").read_text()


@pytest.mark.slow
def test_the_study_runs_on_your_own_hugging_face_model_with_a_top_k_teacher(tmp_path, monkeypatch):
    """`study --set lm.student=DIR --set lm.teacher=DIR --set teacher_mode=topk`: the same points, run as the
    sweep runs them (here in-process, the first seed's main and noise points), on a local Hugging Face model
    with a top-k teacher: every torch student row ok, the TE row saying why it did not run as TE (no TE on a
    CPU), the teacher read from the folder, its top-k store made, one teacher and held-out set for both seeds."""
    from hf_fixtures import tiny_llama

    from workbench.results import plots
    from workbench.run import runner

    monkeypatch.setattr(plots, "plot_run", lambda run_dir: None)  # the figures are not what this test is about
    hf = tiny_llama(tmp_path / "tiny-llama", vocab=256, layers=1)
    overrides = {"lm.student": str(hf), "lm.teacher": str(hf), "kind": "llama", "vocab": 256, "tokenizer": "bytes",
                 "teacher_mode": "topk", "topk": 16, "corpus_mb": 0.1, "steps": 4, "eval_every": 2}
    s = spec.from_preset("distill-quality-cpu", overrides)
    points = plan(spec.sweep_spec(s))
    teacher_ppl, te_rows = set(), []
    for p in points[:2]:  # seed 1: the reference arm (and TE FP8, a row with its reason here); seed 1001: noise
        cfg = config.from_preset(s.preset, **p.overrides)
        run_dir = runner.run(cfg, out=tmp_path / "runs", run_id=p.id, progress=False)
        rows = results.load(run_dir)
        ran = rows[rows["student"].str.startswith("torch_bf16")]
        assert len(ran) and (ran["status"] == "ok").all(), ran["reason"].to_dict()
        assert (ran["teacher_mode"] == "topk").all()
        te_rows.append(rows[rows["student"].str.startswith("te_")])
        task = results.read_json(run_dir / "task.json")
        assert task["teacher_source"] == str(hf) and task["teacher_topk"] == 16
        assert Path(task["teacher_topk_store"]).is_dir()
        teacher_ppl.add(round(float(ran["teacher_heldout_ppl"].iloc[0]), 6))
    te = pd.concat(te_rows)
    assert len(te) and (te["status"] != "ok").all() and te["reason"].fillna("").astype(str).str.len().gt(0).all()
    assert len(teacher_ppl) == 1  # one teacher and one held-out set for every seed: the students' seed is not in it


def test_a_study_refused_beside_a_running_one_changes_nothing_on_disk(tmp_path, monkeypatch, capsys):
    """A second `workbench study` on a folder whose sweep lock is held is refused before it writes: the running
    study's study.json and teacher.json keep their bytes (its report would otherwise miss its finished points)."""
    from filelock import FileLock

    from workbench import cli
    from workbench.study import run as study_run
    from workbench.sweep import run as sweep_run

    folder = tmp_path / "distill-quality-cpu"
    folder.mkdir()
    results.write_json(folder / spec.STUDY_FILE, spec.from_preset("distill-quality-cpu", seeds=[1, 2, 3]).to_dict())
    results.write_json(folder / spec.TEACHER_FILE, {"teacher_checkpoint": "the running study's"})
    # what the real ensure_teacher does (a subprocess that trains): write teacher.json
    monkeypatch.setattr(study_run, "ensure_teacher", lambda study, d: results.write_json(
        d / spec.TEACHER_FILE, {"teacher_checkpoint": "the second study's"}))
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    # the running driver: a lock of its own on the file (a second FileLock refuses even in one process)
    running = FileLock(str(folder / sweep_run.LOCK_FILE), timeout=0)
    with running:
        rc = cli.main(["study", "--preset", "distill-quality-cpu", "--seeds", "7,8", "--out", str(tmp_path)])
    assert rc == 2 and "being run by another process" in capsys.readouterr().err
    after = {p.name: p.read_bytes() for p in folder.iterdir() if p.name != sweep_run.LOCK_FILE}
    assert after == before


@pytest.mark.parametrize("edit", ["{not json", "[1, 2]", '{"name": "s"}', "arms-not-dicts", "unknown-field",
                                  "fixed-a-list", "seeds-a-number", "kd-a-string"])
def test_a_hand_edited_study_json_is_one_line_naming_the_file(tmp_path, capsys, edit):
    """A study.json that is not a study (edited by hand) is refused with one line naming it, no traceback."""
    from workbench import cli

    folder = tmp_path / "s"
    folder.mkdir()
    good = spec.from_preset("distill-quality-cpu", study_name="s").to_dict()
    broken = {"arms-not-dicts": {**good, "arms": ["torch_bf16"]}, "unknown-field": {**good, "colour": "red"},
              "fixed-a-list": {**good, "fixed": ["steps=3"]}, "seeds-a-number": {**good, "seeds": 3},
              "kd-a-string": {**good, "arms": [{**good["arms"][0], "kd": "no"}, *good["arms"][1:]]}}
    (folder / spec.STUDY_FILE).write_text(json.dumps(broken[edit]) if edit in broken else edit)
    rc = cli.main(["study", "--name", "s", "--out", str(tmp_path), "--report-only"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and str(folder / spec.STUDY_FILE) in err, err


def test_the_real_teacher_presets_ask_for_their_folders():
    with pytest.raises(ConfigError, match=r"needs --set lm.teacher=DIR --set lm.student=DIR .*hf-prune"):
        spec.from_preset("distill-quality-real", {})
    with pytest.raises(ConfigError, match=r"needs --set lm.teacher=DIR \("):
        spec.from_preset("finetune-fp8", {"lm.student": "x"})
    s = spec.from_preset("finetune-fp8", {"lm.teacher": "models/m"})  # fine-tuning: the student is the teacher
    assert s.fixed["lm.student"] == "models/m" and s.fixed["lm.teacher"] == "models/m"
    real = spec.from_preset("distill-quality-real", {"teacher": "t", "student": "s"})  # flat names too
    assert [a.name for a in real.arms] == [a.name for a in spec.GPU_ARMS]


@pytest.mark.slow
def test_a_real_teacher_study_with_a_pruned_student_runs_end_to_end(tmp_path, monkeypatch):
    """distill-quality-real on a tiny Hugging Face teacher and its depth-pruned student (workbench hf-prune), the
    points of two seeds run in-process (two points a seed and a noise point, point_groups): every torch arm ok, the TE /
    torchao arms rows with their reasons (no GPU here), the student's provenance in task.json, the report's gaps
    in nats."""
    from workbench.models import hf_init, hf_prune
    from workbench.results import plots
    from workbench.run import runner
    from workbench.study.report import report

    monkeypatch.setattr(plots, "plot_run", lambda run_dir: None)
    teacher = hf_init.write("tiny-smollm3", tmp_path / "teacher", dtype="fp32", corpus_mb=0.2)
    student = hf_prune.write(teacher, "every:2", tmp_path / "student")
    s = spec.from_preset("distill-quality-real", {"lm.teacher": str(teacher), "lm.student": str(student),
                                                  "corpus_mb": 0.2, "steps": 4, "lr_warmup_steps": 1, "eval_every": 2,
                                                  "eval_batches": 1,
                                                  "seq_len": 32, "batch": 2, "compile": False, "graphs": False,
                                                  "warmup": 1, "iters": 1},
                         seeds=[1, 2], study_name="real")
    folder = tmp_path / "studies" / "real"
    folder.mkdir(parents=True)
    results.write_json(folder / spec.STUDY_FILE, s.to_dict())
    for p in plan(spec.sweep_spec(s)):
        cfg = config.from_preset(s.preset, **p.overrides)
        run_dir = runner.run(cfg, out=folder, run_id=p.id, progress=False)
        rows = results.load(run_dir).set_index("student")
        torch_rows = rows[rows.index.str.startswith("torch_bf16")]
        assert (torch_rows["status"] == "ok").all(), torch_rows["reason"].to_dict()
        if "te_fp8:delayed" in rows.index:  # the FP8 point (the noise point trains the second bf16 arm only)
            assert rows.loc["te_fp8:delayed", "reason"]  # says why it is no TE run here
        assert results.read_json(run_dir / "task.json")["student_source"]["hf_prune"]["layers"] == [0, 2]
    head = report(folder)
    # a random tiny teacher is beaten by students that read the text: the report refuses and says why
    if head["refused"]:
        assert head["sentence"].startswith("Refused") and not (folder / "gaps.csv").exists()
    else:
        assert {"diff_mean", "diff_ci_low", "noise_floor_abs"} <= set(pd.read_csv(folder / "gaps.csv").columns)
    assert (folder / "study.csv").exists() and len(pd.read_csv(folder / "study.csv")) == 7 * 2


def test_a_study_resumed_with_another_teacher_code_or_gpu_says_so(tmp_path):
    folder = _fake_study(tmp_path, BASE)
    head = report(folder)
    assert head["teachers"] == [] and head["code_versions"] == []  # rows without either: nothing to tell apart
    assert len(head["gpus"]) <= 1
    readme = (folder / "README.md").read_text()
    assert "teachers**" not in readme and "versions of the code" not in readme and "GPU models" not in readme
    points = sorted(d for d in folder.iterdir() if (d / "done.json").exists())
    for n, d in enumerate(points):  # the last point resumed elsewhere: its teacher trained again, newer code
        results.write_json(d / "task.json", {"teacher_weights_sha256": "b" * 64 if n == len(points) - 1 else "a" * 64})
        last = n == len(points) - 1
        df = pd.read_csv(d / "students.csv").assign(git_sha="def5678" if last else "abc1234",
                                                     gpu_name="NVIDIA H200" if last else "NVIDIA H100 80GB HBM3")
        results.write_csv(d / "students.csv", df)
        results.mark_complete(d)
    head = report(folder)
    assert head["teachers"] == ["a" * 64, "b" * 64] and head["code_versions"] == ["abc1234", "def5678"]
    readme = (folder / "README.md").read_text()
    assert "**2 teachers**" in readme and "2 versions of the code (git_sha): abc1234, def5678" in readme
    assert head["gpus"] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert "2 GPU models: NVIDIA H100 80GB HBM3, NVIDIA H200" in readme
    study_rows = pd.read_csv(folder / "study.csv")
    assert study_rows["teacher_sha"].nunique() == 2


def test_a_point_whose_student_ran_out_of_memory_is_set_aside_and_runs_again(tmp_path):
    """A done point with an OOM'd student (index: done, error_kind oom) is moved under <study>/oom/ and is
    no longer complete where the sweep looks; a clean point and a failed one stay where they are."""
    from workbench.study.run import set_aside_oom_points
    from workbench.sweep.index import INDEX_COLUMNS, point_folders

    rows = [{"point": "aaa", "status": "done", "error_kind": "oom"}, {"point": "bbb", "status": "done"},
            {"point": "ccc", "status": "failed", "error_kind": "oom"}]
    pd.DataFrame(rows, columns=INDEX_COLUMNS).to_csv(tmp_path / "index.csv", index=False)
    for pid in ("aaa", "bbb"):
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "students.csv").write_text("student\nx\n")
        results.write_json(tmp_path / pid / results.DONE_FILE, {"files": {}})
    assert set_aside_oom_points(tmp_path) == ["aaa"]
    assert (tmp_path / "oom" / "aaa-1" / "students.csv").exists() and not (tmp_path / "aaa").exists()
    assert results.is_complete(tmp_path / "bbb")
    found = point_folders(tmp_path, {"aaa", "bbb"})
    assert not results.is_complete(found["aaa"]) and found["bbb"] == tmp_path / "bbb"
    assert set_aside_oom_points(tmp_path) == []  # its folder is gone: nothing moves twice


def test_the_curves_figure_starts_at_each_runs_step0_and_curves_csv_does_not():
    """A fine-tuned FP8 student's KL starts where the cast puts it (0.065 nats for TE delayed on SmolLM2-135M at
    05acfd3, H100), not at the first evaluation: the figure's curves get step 0 from students.csv's *_step0."""
    from workbench.study.report import with_step0

    curves = pd.DataFrame({"arm": ["te_fp8_delayed", "te_fp8_delayed", "torch_bf16", "torch_bf16"], "seed": [1] * 4,
                           "step": [40, 80, 40, 80], "heldout_ppl": [7.6, 7.4, 7.7, 7.4],
                           "kl_teacher_student_t1_nats": [0.05, 0.06, 0.02, 0.03], "top1_agreement": [0.9] * 4})
    df = pd.DataFrame({"arm": ["torch_bf16", "te_fp8_delayed", "no_kd_bf16"], "seed": [1, 1, 1],
                       "status": ["ok", "ok", "ok"], "heldout_ppl_step0": [8.2, 8.6, 8.2],
                       "kl_teacher_student_t1_nats_step0": [0.0, 0.065, 0.0], "top1_agreement_step0": [1.0, 0.9, 1.0]})
    out = with_step0(curves, df)
    assert list(dict.fromkeys(out["arm"])) == ["te_fp8_delayed", "torch_bf16"]  # no curve, no step 0 (no_kd_bf16)
    first = out[out["step"] == 0].set_index("arm")
    assert first.loc["te_fp8_delayed", "kl_teacher_student_t1_nats"] == 0.065 and len(out) == 6
    assert 0 not in curves["step"].values  # the argument is left as it was
    no_step0 = df.drop(columns=[c for c in df if c.endswith("_step0")])  # rows from before step-0 figures
    assert with_step0(curves, no_step0).equals(curves)
    assert with_step0(curves, df.assign(status="fallback")).equals(curves)  # a fallback is not its arm
    # a run of a study resumed across versions, without the step-0 figures (an empty cell): no step-0 point for it
    mixed = df.assign(heldout_ppl_step0=[8.2, float("nan"), 8.2])
    assert list(with_step0(curves, mixed).query("step == 0")["arm"]) == ["torch_bf16"]


def test_studies_side_by_side_each_against_its_own_noise_floor(tmp_path, capsys):
    """Issue 36's 'both studies side by side': a trained-here study and a fine-tuning one in one table, figure and
    page, each arm judged against its own study's floor; a study whose FP8 point did not run shows 'not run'."""
    from workbench import cli
    from workbench.study.compare import compare

    here = _fake_study(tmp_path / "h", BASE)
    ft = _fake_study(tmp_path / "f", {**BASE, "torch_bf16_b": [66.0, 68.2, 70.4]}, preset="finetune-fp8",
                     sets={"lm.teacher": "models/smollm2-135m"}, status={"te_fp8_delayed": "error"})
    here = here.rename(tmp_path / "distill-quality-64mb")
    ft = ft.rename(tmp_path / "real-finetune")
    table = compare([here, ft], tmp_path / "comparison")
    kl = table[table["metric"] == "kl_teacher_student_t1_nats"].set_index(["study", "arm"])
    assert set(kl.index.get_level_values("arm")) == {"te_bf16", "te_fp8_delayed", "te_fp8_current", "torchao_float8",
                                                    "no_kd_bf16"}  # the reference and noise arms are the floor
    assert kl.loc[("distill-quality-64mb", "te_fp8_delayed"), "gap_pct_mean"] == pytest.approx(10.0)
    assert not kl.loc[("distill-quality-64mb", "te_fp8_delayed"), "within_noise"]
    floors = kl.groupby(level="study")["noise_floor_pct"].first()
    assert floors["real-finetune"] > 5 > floors["distill-quality-64mb"]  # its own floor (+10% b arm), not pooled
    assert pd.isna(kl.loc[("real-finetune", "te_fp8_delayed"), "gap_pct_mean"])  # errored at every seed
    assert kl.loc[("real-finetune", "te_bf16"), "student"] == "the teacher itself (fine-tuned)"
    assert kl.loc[("real-finetune", "te_bf16"), "teacher"] == "smollm2-135m"
    assert kl.loc[("distill-quality-64mb", "te_bf16"), "teacher"] == "trained here"
    out = tmp_path / "comparison"
    assert (out / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert pd.read_csv(out / "comparison.csv").shape[0] == len(table) == 2 * 5 * 2
    page = (out / "README.md").read_text()
    assert ("| real-finetune | smollm2-135m | the teacher itself (fine-tuned) | te_fp8_delayed | 0/3 | not run | 10.00 "
            "| unknown |  |  |  |") in page
    assert page.count("`distill-quality-64mb`: FP8 delayed changes held-out KL") == 1
    # the command: names under --out; one study is refused (nothing to compare it with)
    assert cli.main(["study", "--compare", "distill-quality-64mb", "real-finetune", "--out", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"] == 20
    assert cli.main(["study", "--compare", "real-finetune", "--out", str(tmp_path)]) == 2
    assert "two or more" in capsys.readouterr().err


@pytest.mark.parametrize("preset", ["distill-quality", "finetune-fp8"])
def test_only_a_fine_tuning_studys_figure_starts_at_step0(tmp_path, monkeypatch, preset):
    """A distilled student's step 0 (random or pruned weights) would flatten every curve against the axis."""
    from workbench.study import figures

    drawn = []
    real = figures.heldout_curves
    monkeypatch.setattr(figures, "heldout_curves", lambda s, c, t=None: drawn.append(c) or real(s, c, t))
    folder = _fake_study(tmp_path, BASE, preset=preset, sets={"lm.teacher": "models/m"} if preset != "distill-quality"
                         else None)
    report(folder)
    assert (0 in set(drawn[0]["step"])) == (preset == "finetune-fp8")
    assert 0 not in set(pd.read_csv(folder / "curves.csv")["step"])


def test_a_cache_folder_given_to_a_study_is_its_teachers_and_every_points(tmp_path, monkeypatch):
    """`study --cache DIR`: the teacher's process and the sweep's points (results.CACHE_ENV, which both inherit)
    use DIR, created up front; without it each run keeps its own <study>/cache, as before."""
    from workbench import cli, notebook
    from workbench.study import run as study_run
    from workbench.sweep import run as sweep_run

    monkeypatch.setenv(results.CACHE_ENV, "x")  # recorded, so the delenv below is undone after the test: main
    monkeypatch.delenv(results.CACHE_ENV)  # sets the variable for its children, and it must not reach other tests
    seen = []
    monkeypatch.setattr(notebook, "require_stack", lambda: None)
    monkeypatch.setattr(study_run, "ensure_teacher", lambda study, d: seen.append(("teacher", os.environ.get(
        results.CACHE_ENV))))

    def fake_sweep(spec_, root, workers, cache, deadline):  # a fake: the points are not what this test is about
        seen.append(("points", cache))
        return {"sweep_dir": str(Path(root) / spec_.name), "failed": 0}

    monkeypatch.setattr(sweep_run, "run_sweep", fake_sweep)
    args = ["study", "--preset", "distill-quality-cpu", "--seeds", "1,2", "--out", str(tmp_path), "--no-report"]
    assert cli.main([*args, "--name", "own"]) == 0
    assert seen == [("teacher", None), ("points", None)]
    seen.clear()
    assert cli.main([*args, "--name", "shared", "--cache", str(tmp_path / "shared-cache")]) == 0
    shared = str((tmp_path / "shared-cache").resolve())
    assert seen == [("teacher", shared), ("points", shared)] and Path(shared).is_dir()


def test_a_pruned_and_a_random_student_of_one_teacher_read_one_top_k_store(tmp_path, monkeypatch):
    """The pruned and the random study of one teacher train on the same batches at each seed: given one cache
    folder, the second study's point reads the top-k store the first built (one build per seed, not per
    study); another seed builds its own."""
    from workbench.models import hf_init, hf_prune
    from workbench.results import plots
    from workbench.run import runner
    from workbench.train.teacher_targets import topk_store

    monkeypatch.setattr(plots, "plot_run", lambda run_dir: None)
    builds = []
    real_build = topk_store.build_store
    monkeypatch.setattr(topk_store, "build_store", lambda folder, *a, **k: builds.append(folder.name) or real_build(
        folder, *a, **k))
    monkeypatch.setenv(results.CACHE_ENV, str(tmp_path / "shared-cache"))  # what `study --cache` sets
    teacher = hf_init.write("tiny-smollm3", tmp_path / "teacher", dtype="fp32", corpus_mb=0.2)
    students = {"pruned": hf_prune.write(teacher, "every:2", tmp_path / "pruned"),
                "random": hf_prune.write(teacher, "every:2", tmp_path / "random", init="random", seed=0)}
    stores = {}
    for name, seed in (("pruned", 1), ("random", 1), ("random", 2)):
        s = spec.from_preset("distill-quality-real", {"lm.teacher": str(teacher), "lm.student": str(students[name]),
                                                      "corpus_mb": 0.2, "steps": 3, "eval_every": 0, "eval_batches": 1,
                                                      "seq_len": 32, "batch": 2, "graphs": False, "warmup": 1,
                                                      "iters": 1, "lr_warmup_steps": 1}, seeds=[1, 2], study_name=name)
        first = next(p for p in plan(spec.sweep_spec(s)) if p.overrides["seed"] == seed)  # the seed's bf16 point
        cfg = config.from_preset(s.preset, **{**first.overrides, "backends": ["torch_bf16"], "baseline": "torch_bf16",
                                              "no_kd_student": False})
        run_dir = runner.run(cfg, out=tmp_path / "studies" / name, run_id=f"{first.id}-{seed}", progress=False)
        assert (results.load(run_dir)["status"] == "ok").all()
        stores[(name, seed)] = results.read_json(run_dir / "task.json")["teacher_topk_store"]
    assert stores[("pruned", 1)] == stores[("random", 1)] != stores[("random", 2)]
    assert Path(stores[("pruned", 1)]).parent == tmp_path / "shared-cache"
    assert len(builds) == 2  # seed 1 once for both studies, seed 2 once


def test_a_gap_without_a_noise_floor_is_drawn_neither_within_nor_outside():
    """A study of one seed (its noise point not run yet) has gaps but no verdict: the comparison drew them red
    ('outside') while its table said 'unknown' (seen on the pruned + random pair's first seed, 3e25bd0)."""
    import matplotlib.colors as mcolors

    from workbench.study.compare import COMPARED, UNKNOWN_COLOR, figure

    rows = [{"study": "s", "arm": arm, "metric": m, "noise_floor_pct": floor, "gap_pct_mean": 3.0,
             "gap_pct_ci_low": float("nan"), "gap_pct_ci_high": float("nan"), "within_noise": within}
            for m in COMPARED for arm, floor, within in
            (("in", 5.0, True), ("out", 1.0, False), ("unknown", float("nan"), float("nan")))]
    fig = figure(pd.DataFrame(rows))
    dots = [line.get_color() for line in fig.axes[0].lines if line.get_marker() == "o"]
    assert [mcolors.to_hex(c) for c in dots] == ["#4c72b0", "#c44e52", UNKNOWN_COLOR]
