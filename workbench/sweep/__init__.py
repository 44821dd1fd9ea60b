"""Sweeps: one papermill execution of the main notebook per grid point, resumable, then the report.

    python -m workbench sweep --name sizes --preset large --set steps=10 \\
        --grid hidden=1024,2048,4096 --grid intermediate=4096,8192,16384 --link hidden,intermediate \\
        --grid seq_len=128,1024
    python -m workbench sweep sizes.yaml          # the same sweep from a file (YAML or JSON, below)
    python -m workbench sweep --name sizes        # restart: resumes from results/sweeps/sizes/sweep.json
    make sweep NAME=sizes GRID="hidden=512,1024 seq_len=128,1024"

A spec file (sweep.json, written at the start, is one too):

    name: sizes
    preset: large
    set: {steps: 10, backends: [torch_bf16, "te_fp8:current"]}   # fixed overrides, every point
    grid:                              # the points are the product of the axes
      seq_len: [128, 1024]             # an axis over one config field
      size:                            # a linked axis: each entry sets several fields together
        - {hidden: 512, intermediate: 2048}
        - {hidden: 1024, intermediate: 4096}

    cell_timeout: 3600                 # optional: seconds one notebook cell may run (--cell-timeout)

results/sweeps/<name>/
  sweep.json   the spec a bare restart resumes
  index.csv    one row per point: id, grid values, status (running/done/failed/interrupted), error, wall time
  <point>/     a run folder (workbench.results files, done.json last, + the executed notebook)
  report/      the report's CSVs, plots and report.html (workbench.sweep.report, written at the end)

A point's id is a short hash of its spec: the preset, the point's overrides and an id version
(plan.point_id), so a field the config gains later renames no point; folders of earlier ids (a hash
of the whole resolved config) are found by the overrides their config.json records. A point is complete
when its run is (students.csv and done.json, written last by the run; a point whose notebook fails after
that loses its done.json) and its result files still match what done.json recorded, so a sweep killed at
any moment and restarted skips exactly the complete points and reruns the others (a damaged one too)
from an empty folder: nothing lost, nothing duplicated. A point whose notebook fails (cell error, cell
timeout, out of memory, dead kernel) is recorded in index.csv with its error and the sweep goes on; a
restart retries it. Points running when the driver is stopped (Ctrl-C, SIGTERM) become `interrupted`.
`--budget-s S` (also `study --budget-s`) starts no point that would not end within S seconds, judged on
the worker when its turn comes by the median wall time of the done points that differ from it in their
seed alone (index.budget_skip; one of unknown length starts): a point cut by a hard limit loses all its
work, and the time left may still fit a smaller point. Those not started are `interrupted` (`budget`).
Students that error or diverge inside a finished point are rows of its students.csv (status/reason)
and are summarised in the index's `problems` column. index.csv can always be rebuilt from the points'
folders, and is, with a line saying so, when it is found damaged.

Where the points run: a Dask cluster, one task per point (the `sweep` extra: dask, distributed). By
default the driver starts one on this machine and closes it at the end (no running cluster needed):
with GPUs, one worker per GPU pinned by CUDA_VISIBLE_DEVICES (dask-cuda's LocalCUDACluster when it is
installed), the point's kernel inheriting its worker's devices; on a CPU one worker (parallel CPU runs
would time each other), `--workers N` for more; `--workers K/gpu` puts K workers on every GPU (points
whose figures do not depend on speed, as a quality study's). A point whose config asks for k GPUs (parallel.nproc)
takes a Dask resource GPU=k; when any point does, every embedded worker gets k GPUs (cluster_plan says
what that costs), and a point asking for more than any worker has fails alone, before it starts.
`--scheduler ADDRESS` sends the points to a running cluster instead (a node, several, a Slurm
allocation); the sweep folder must then be at the same path on every worker (a shared filesystem), and
each worker runs one thread with `--resources GPU=<its GPUs>`:

    dask scheduler --port 8786                                         # on a host the workers reach
    CUDA_VISIBLE_DEVICES=0 dask worker tcp://HOST:8786 --nthreads 1 --resources GPU=1   # one per GPU
    dask cuda worker tcp://HOST:8786 --resources GPU=1               # or dask-cuda: all GPUs of a host
    python -m workbench sweep sizes.yaml --scheduler tcp://HOST:8786

On Slurm, dask-jobqueue (not a dependency) starts the workers as jobs, from a process that stays alive:

    cluster = dask_jobqueue.SLURMCluster(cores=8, processes=1, memory="64GB", walltime="02:00:00",
        job_extra_directives=["--gres=gpu:1"], worker_extra_args=["--nthreads", "1", "--resources", "GPU=1"])
    cluster.scale(jobs=4); print(cluster.scheduler_address)           # the ADDRESS for --scheduler

(docs/sweeps.md has more). The address is probed first (a raw socket waits for the Dask handshake), so
an HTTP server or the dashboard port is one line, not a hang; a scheduler without workers is waited for
`--wait-workers` seconds. LM points share the text, tokenizer and teacher caches under `--cache`
(results/cache by default, as `workbench run`). The driver holds the sweep lock (sweep.lock) and writes
index.csv; a point's row says which worker ran it (address and GPUs) and when it really started there (the task
reports it).
Stopping the driver cancels the pending points; its embedded cluster closes (a worker's kernel exits
with it), and on a running cluster the workers still running its points are restarted.

The modules, bottom-up: plan (the spec, its points and their ids), index (index.csv and which point
folders are complete), point (one point on a worker: its notebook, its outcome), cluster (the Dask
cluster: embedded or --scheduler, probed under a deadline), run (the driver: lock, resume, run the
points, the CLI), then the report: analysis (the frames, the joins with the reference, the crossover),
figures (its plots) and report (its words, files and report.html).
"""
