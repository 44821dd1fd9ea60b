"""`workbench bench`: every backend's best path, side by side, against the hardware's ceiling.

    python -m workbench bench --preset large --out results/bench --run-id large
    python -m workbench bench --preset large --targets results/reference/bench_targets.json   # judge goals too
    python -m workbench bench --preset seed --variants eager,graphs-fused-bf16 --out results/bench
    python -m workbench bench --list                                  # the variant catalogue
    python -m workbench bench --markdown results/bench [--readme PATH]   # tables from the files
    python -m workbench bench --write-readme results/reference/h200/bench  # its README.md, from targets.json

The package, in the order a bench runs:
  variants    the catalogue (VARIANTS, DEFAULT_VARIANTS): config overrides and the students run under each
  run         the peak probe and one `runner.run` per variant (repeats and the profiled block set from the
              options); a rejected student or a failed run becomes an 'error' row with its reason
  rows        bench.csv's rows from the run folders: peaks, teacher share, repeats, '× tutorial' ratios
  crosscheck  event-timed median vs the profiler's GPU time per row, and a row's kernel-time split
  targets     the goals of a --targets file (load_targets), judged per preset by named measures (MEASURES)
  tables      aggregate() (files in, files out) and the Markdown / README written from the files
  cli         the flags

OUT/<run_id>/ holds
  peak.json        matmul peaks measured in this run (bf16/fp16/fp32/FP8) + datasheet entry with sources
  runs/<variant>/  what `run` writes (with profile-*.json), plus observations.json: per timed region (teacher,
                   each student) the repeat medians and the profiled block, gathered from those files
  bench.csv        one row per (variant, student), units in the column names (see rows.COLUMNS)
  crosscheck.json  event-timed median vs torch.profiler GPU time per row; headline = the fastest FP8 row
  targets.json     only with --targets FILE: each goal of FILE, the best achieved, by which row, met (null =
                   not judged here), and where missed the profiler's kernel categories of that row
  bench.json       what was asked, variant status and wall time, environment
  bench.md         the Markdown tables (`--markdown` renders the same from any folder of benches)
  step_time_by_backend.png/.svg, pct_of_peak.png/.svg
bench.csv, crosscheck.json and the tables are rebuilt from the other files by `tables.aggregate()` (`--aggregate
DIR`); targets.json is judged anew only when a targets file is given, else a folder's own is kept as it is.
"""
