"""The scaling curve of distributed runs: tokens/s, weak-scaling efficiency, step time and memory per GPU
(the student's peak above the memory allocated when it started) against the number of GPUs, read from
run folders only.

    python -m workbench scaling results/reference/h200x2/multi --out results/reference/h200x2/scaling

Every distributed run (workbench.run.parallel) carries its own one-GPU point: the rows '<student>@1gpu',
the same student trained and timed by rank 0 alone, in the same run and by the same code. Runs of the same
preset and strategy at 2, 4, 8 GPUs therefore line up as one curve per (preset, strategy, student), its
1-GPU point the median of the runs' reference rows. Writes scaling.csv, then scaling.png / .svg.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from workbench import results

COLUMNS = ["preset", "strategy", "student", "gpus", "status", "step_ms_median", "tokens_per_s",
           "tokens_per_s_per_gpu", "scaling_efficiency", "peak_mem_allocated_mb", "student_mem_mb", "runs"]


def points(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (preset, strategy, student, GPUs) from students.csv rows of distributed runs."""
    if "world_size" not in df or "cfg_strategy" not in df:  # runs older than the distributed ones
        return pd.DataFrame(columns=COLUMNS)
    ran = df[df["status"].isin(results.RAN)].copy()
    for col in (
        "step_ms_median",
        "tokens_per_s",
        "peak_mem_allocated_mb",
        "mem_floor_mb",
        "run_id",
    ):  # a row may lack a cell
        if col not in ran:
            ran[col] = None if col == "run_id" else float("nan")
    ran["base"] = ran["student"].str.removesuffix(results.REFERENCE_SUFFIX)
    # a reference row has no strategy of its own: it belongs to the strategy of the run it was timed in
    ran["strategy"] = ran["cfg_strategy"]
    ran["gpus"] = ran["world_size"].fillna(1).astype(int)
    ran["preset"] = ran["cfg_preset"]
    # What the student itself adds per GPU: its peak above what was allocated when it started (teacher,
    # data). The peak alone is not comparable: on two H200s a DDP student's gradient buckets sometimes
    # outlived it into its one-GPU reference's floor (1.7 GB at `large`), whose peak then read 1.7 GB high.
    ran["student_mem_mb"] = ran["peak_mem_allocated_mb"] - ran["mem_floor_mb"]
    keys = ["preset", "strategy", "base", "gpus"]
    out = ran.groupby(keys, dropna=False).agg(
        step_ms_median=("step_ms_median", "median"), tokens_per_s=("tokens_per_s", "median"),
        peak_mem_allocated_mb=("peak_mem_allocated_mb", "max"), student_mem_mb=("student_mem_mb", "max"),
        runs=("run_id", "nunique"),
        # a point with a fallback row in it ran PyTorch autocast, not the student it is named after
        status=("status", lambda s: "fallback" if (s == "fallback").any() else "ok")).reset_index()
    curve = ["preset", "strategy", "base"]
    one = out.loc[out["gpus"] == 1, curve + ["step_ms_median", "status"]]
    out = out.merge(one, on=curve, how="left", suffixes=("", "_1gpu"))
    # weak scaling: every GPU steps its own batch; 1.0 when N GPUs take the one-GPU step time. Only between
    # points that ran the same thing: a TE student against its autocast fallback would be no scaling figure.
    out["scaling_efficiency"] = (out["step_ms_median_1gpu"] / out["step_ms_median"]).where(
        out["status_1gpu"] == out["status"])
    out["tokens_per_s_per_gpu"] = out["tokens_per_s"] / out["gpus"]
    out = out.rename(columns={"base": "student"})
    return out.sort_values(["preset", "strategy", "student", "gpus"])[COLUMNS].reset_index(drop=True)


def figure(table: pd.DataFrame):
    import matplotlib.pyplot as plt

    from workbench.results import plots

    # one row of panels per preset: shapes differ by x in tokens/s, and one legend beside each row
    presets = sorted(table["preset"].dropna().unique()) or ["-"]
    fig, grid = plt.subplots(len(presets), 3, figsize=(16, 4.2 * len(presets)), squeeze=False)
    gpus = sorted(table["gpus"].unique()) if len(table) else [1]
    for axes, preset in zip(grid, presets):
        rows = table[table["preset"] == preset]
        for (strategy, student), g in rows.groupby(["strategy", "student"], dropna=False):
            style = dict(marker="o", color=plots.student_color(student), ls="-" if strategy == "ddp" else "--",
                         label=f"{strategy} {student}")
            axes[0].plot(g["gpus"], g["tokens_per_s"], **style)
            axes[1].plot(g["gpus"], g["scaling_efficiency"], **style)
            axes[2].plot(g["gpus"], g["student_mem_mb"] / 1024, **style)
        for ax, what in zip(axes, ["tokens/s (all GPUs)", "weak-scaling efficiency (1-GPU step / N-GPU step)",
                                   "student's peak memory per GPU above its floor (GiB)"]):
            ax.set_xticks(gpus)
            ax.set_xlabel("GPUs")
            ax.set_title(f"{preset}: {what}", fontsize=10)
            ax.grid(alpha=0.3)
            ax.set_ylim(bottom=0)  # from zero: a 0.91 efficiency must not read like a collapse
        axes[1].axhline(1.0, color="grey", lw=0.8)
        top = float(rows["scaling_efficiency"].max()) + 0.05 if len(rows) else 1.1
        axes[1].set_ylim(top=max(1.1, top))
        if len(rows):
            axes[2].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle("Scaling: solid DDP, dashed FSDP2; each run's 1-GPU point is timed in the same run")
    fig.tight_layout()
    return fig


def run(paths: list[str | Path], out: str | Path) -> Path:
    """Read every complete run below `paths`, write <out>/scaling.csv and the plot; return <out>."""
    table = points(_load(paths))
    if table.empty:
        raise results.DamagedResults(
            f"no distributed run (rows with world_size and strategy) below {', '.join(map(str, paths))}"
        )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results.write_csv(out / "scaling.csv", table)
    import matplotlib.pyplot as plt

    fig = figure(table)
    results.write_figure(fig, out, "scaling")
    plt.close(fig)
    return out


MAX_GPUS = 2 ** 20  # far above any run: a larger world_size is no run's, and would not fit the int column


def _load(paths: list[str | Path]) -> pd.DataFrame:
    """The rows of every complete run below `paths`, each run's world_size checked to be a number of GPUs (a
    run folder may come from anywhere); DamagedResults naming the students.csv otherwise."""
    frames = []
    for p in paths:
        dirs = results.run_dirs(p)
        if not dirs:
            try:
                results.load(p)  # says why: no run there, or only incomplete ones
            except FileNotFoundError as e:  # one line, not a traceback
                raise results.DamagedResults(str(e)) from None
        for d in dirs:
            df = results.read_students(d)
            if "world_size" in df:
                n = pd.to_numeric(df["world_size"], errors="coerce")
                bad = df["world_size"].notna() & ~(n.ge(1) & n.le(MAX_GPUS) & (n % 1 == 0))
                if bad.any():
                    raise results.DamagedResults(
                        f"{Path(d) / 'students.csv'}: world_size {df['world_size'][bad].iloc[0]!r} is no number of "
                        f"GPUs (a whole number from 1 to {MAX_GPUS})")
            frames.append(df)
    return pd.concat(frames, ignore_index=True)


def add_arguments(p) -> None:
    p.add_argument("paths", nargs="+", help="run folders, or folders holding them (distributed runs)")
    p.add_argument("--out", required=True, help="folder for scaling.csv and scaling.png/svg")


def main(args) -> int:
    out = run(args.paths, args.out)
    print(results.read_csv(out / "scaling.csv").to_string(index=False))
    return 0
