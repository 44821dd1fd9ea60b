"""Distillation-quality studies: does FP8 change what a student learns from its teacher, beyond the noise?

    python -m workbench study --preset distill-quality                 # every arm x 3 seeds (a GPU)
    python -m workbench study --preset distill-quality-cpu             # 2 arms x 3 seeds, a CPU, a minute
    python -m workbench study --preset distill-quality --set lm.student=DIR --set lm.teacher=DIR
    python -m workbench study --name distill-quality                   # resume (or re-report) a study

A study is a sweep (workbench.sweep: resumable, one papermill run per point, a Dask worker per GPU) whose
points are seeds, then the quality report over them. Each arm is one student (a backend spec, or the
no-KD student); each seed is one point (or a few: `point_groups`), runs of its arms from the same initial
weights on the same batches, so the arms of one seed are paired by construction. The teacher is trained once, before the
first point, with its own seed (lm.teacher_seed) and cached: every seed distils the same teacher and is
measured on the same held-out tokens; the seed varies only the students' init and batch order.

The noise floor: a second torch bf16 arm (`torch_bf16_b`) trains the same student as the reference arm
from another init and batch order (its points run at train.seed + NOISE_SEED_OFFSET). The floor of a
metric is the root mean square over seeds of the paired relative differences between the two bf16 arms
(stats.noise_floor_pct): how far apart two bf16 students land when only their seed differs. An
arm's gap to the reference (paired by seed, in %) is "within noise" when its 95% Student-t interval
contains 0 or |mean gap| is below that floor (stats.within_noise).

spec.py: the arms, seeds and presets, the study as a sweep;  run.py: the `workbench study` command (the
teacher once, then the points, resumable);  report.py: the tables, headline and the report
notebook;  readme.py: README.md;  figures.py: the held-out curves and the gaps beside the noise;
stats.py: the statistics;  compare.py: several studies side by side (`--compare`).

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
<out>/comparison/  (`--compare A B ...`)  comparison.csv (per study, arm and metric: the gap, its interval, that
  study's own noise floor, step 0 -> end), comparison.png / .svg, README.md
"""
