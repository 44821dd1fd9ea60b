"""The notebook driver: what the main notebook's cells call, and papermill execution of it.

`workbench notebook --preset P --set f=v` validates the config first (bad input fails before any
work), then executes the main notebook with papermill into the run folder, so the executed copy sits
beside the run's result files; the runner's per-student lines stream to the terminal as the kernel
prints them.

The notebooks ship inside the package (`NOTEBOOKS`, read with importlib.resources): in the repository
`workbench/notebooks` links to the top-level `notebooks/` that people open in Jupyter or Colab, and
the wheel carries real copies, so an installed workbench runs them from any folder.
"""
from __future__ import annotations

import dataclasses
import html
import importlib.util
import json
import numbers
import os
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd

from workbench import config, results

NOTEBOOKS = resources.files("workbench") / "notebooks"
MAIN_NOTEBOOK = NOTEBOOKS / "distill_benchmark.ipynb"
KERNEL_NAME = "te-workbench"
"""The kernelspec the notebooks name and `make` registers for its venv (Jupyter opens them with that
interpreter). `execute` starts papermill's `python3` kernel instead, with this interpreter first on PATH: a wheel
or a GPU box without the named kernelspec runs the notebooks all the same."""
NO_KERNEL = "no Jupyter kernel (ipykernel) in this environment: pip install 'te-workbench[notebook]'"
STACK = ("papermill", "nbclient", "ipykernel")  # what executing a notebook imports (the first two are core deps,
# yet a checkout on PYTHONPATH, as on a GPU image, has only what that image has)


class MissingStack(ModuleNotFoundError):
    """This Python cannot execute a notebook: papermill, nbclient or ipykernel is not installed."""


def require_stack() -> None:
    """Raise MissingStack, naming what is missing, before anything (a kernel, a study's teacher) starts."""
    missing = [m for m in STACK if importlib.util.find_spec(m) is None]
    if missing == ["ipykernel"]:
        raise MissingStack(NO_KERNEL)
    if missing:
        raise MissingStack(f"{', '.join(missing)} not installed for {sys.executable}: executing a notebook needs "
                           f"{', '.join(STACK)} (pip install 'te-workbench[notebook]')")
RUN_PARAMETERS = {  # the notebook's parameters besides the config fields: name -> (annotation, default, help)
    "preset": ("str", '"auto"', f"Preset to start from: {config.preset_help()}."),
    "out": ("Optional[str]", "None", "Parent folder of the run folder (None: results/ at the repository root in a "
                                     "checkout, else ./results)."),
    "run_id": ("Optional[str]", "None", "Run folder name (None: <timestamp>-<preset>)."),
    "show_panel": ("Optional[bool]", "None", "The widget panel at the end: True shows it, False hides it, None "
                                              "shows it unless papermill runs the notebook."),
}

RUN_ID_TAKEN = ("choose another run_id (this notebook's parameter; papermill -p run_id NAME: an executed notebook "
                "keeps the run_id it ran with), or set it to None for a new one (papermill -p run_id None)")

PARAMETERS_CELL_METADATA = {"jupyter": {"source_hidden": True}}
"""The main notebook's parameters cell opens collapsed (Jupyter shows '…'; a click opens it): some 70 lines of every
config field come before the run otherwise. scripts/sync_notebooks.py writes it; papermill keeps it."""
DETAILS = ["student", "mode", "status", "reason", "initial_loss", "final_train_loss", "eval_mse", "step_ms_median",
           "step_ms_p20", "step_ms_p80", "tflops", "peak_mem_allocated_mb", "teacher_ms_median", "gpu_busy_share",
           "slow_path"]  # the notebook's details table: students.csv's columns a reader asks about first


def checkout_root() -> Path | None:
    """The repository root when this workbench is imported from a checkout (editable install or
    PYTHONPATH), None when it is an installed wheel."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "notebooks").is_dir() else None


def default_out() -> Path:
    """Where runs go when no folder is given: results/ at the repository root in a checkout (Jupyter runs
    the notebook from notebooks/, which must not collect results), else results/ in the working folder."""
    return (checkout_root() or Path.cwd()) / "results"


def parameters_cell() -> str:
    """The main notebook's papermill parameters cell, generated from the config dataclasses (the one source
    of names, types and help; scripts/sync_notebooks.py writes it into the notebook). Every parameter is
    `name: Optional[type] = None  # help`: papermill reads the type from the annotation (not from
    `int | None`) and the help from the comment, and a help text may not contain '=' (papermill then
    skips the line)."""
    docs = config.field_docs()
    types = {f.name: config.type_name(f) for cls in (*config.SECTIONS.values(), config.Config)
             for f in dataclasses.fields(cls)}

    def line(name: str, annotation: str, default: str, help_: str) -> str:
        if not help_ or "=" in help_:
            raise ValueError(f"{name}: papermill needs a non-empty help text without '=', got {help_!r}")
        return f"{name}: {annotation} = {default}  # {help_}"

    *run, panel = RUN_PARAMETERS
    return "\n".join([
        "# Papermill parameters (`papermill --help-notebook` lists them), generated from workbench/config.py:",
        "# edit the dataclasses there and run scripts/sync_notebooks.py, not this cell.",
        "from typing import Optional",
        "",
        *(line(n, *RUN_PARAMETERS[n]) for n in run),
        "# Config overrides; None keeps the preset's value",
        *(line(n, f"Optional[{types[n]}]", "None", docs[n]) for n in config.flat_field_names() if n != "preset"),
        line(panel, *RUN_PARAMETERS[panel]),
    ])


def kernel_uses_this_python() -> None:
    """Put this interpreter's folder first on PATH (once): the `python3` kernel papermill starts must be
    the one with workbench installed, whatever `python3` is otherwise on PATH."""
    here = os.path.dirname(sys.executable)
    if os.environ.get("PATH", "").split(os.pathsep)[0] != here:
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")


def overrides_from(namespace: dict[str, Any]) -> dict[str, Any]:
    """Config overrides from the notebook's parameter variables (None = keep the preset's value)."""
    return {k: namespace[k] for k in config.flat_field_names() if k != "preset" and namespace.get(k) is not None}


def run_cell(namespace: dict[str, Any]) -> Path:
    """The notebook's one call: build the config from its parameters and run it. Returns the run folder."""
    from workbench.run import runner

    overrides = overrides_from(namespace)
    cfg = config.from_preset(namespace.get("preset") or "auto", **overrides)
    try:
        return runner.run(cfg, out=namespace.get("out") or default_out(), run_id=namespace.get("run_id"),
                          requested={"preset": namespace.get("preset"), **overrides})
    except results.OutputError as e:  # said for the notebook's parameter, not the command line's --run-id
        if results.RUN_ID_TAKEN not in str(e):
            raise
        raise results.OutputError(str(e).replace(results.RUN_ID_TAKEN, RUN_ID_TAKEN)) from None


def _sig(x: Any, digits: int = 3) -> float | None:
    """`x` rounded to `digits` significant digits (None for a missing value)."""
    return None if x is None or pd.isna(x) else float(f"{x:.{digits}g}")


def _cell(x: Any, digits: int) -> str:
    """One table cell as text: '' for a missing value, a number to `digits` significant digits (no exponent from
    10**digits up to 10**15: 12345 ms, not 1.234e+04), anything else as it is."""
    if x is None or (not isinstance(x, str | list | dict) and pd.isna(x)):
        return ""
    if isinstance(x, bool | numbers.Integral) or not isinstance(x, numbers.Real):
        return str(x)
    return f"{x:.0f}" if 10 ** digits <= abs(x) < 1e15 else f"{x:.{digits}g}"


def readable(table: pd.DataFrame, digits: int = 4) -> pd.DataFrame:
    """`table` as a person reads it: every number to `digits` significant digits, an empty cell where a value is
    missing (not NaN / None), text as it is. For showing only: the cells are strings."""
    return pd.DataFrame({c: table[c].map(lambda x: _cell(x, digits)) for c in table.columns}, index=table.index)


def details_table(run_dir: str | Path) -> pd.DataFrame:
    """Every student's row with the columns of DETAILS that the run has (`reason`: why a student fell back or was
    skipped), readable: four significant digits, empty where there is no value."""
    df = results.load(run_dir)
    return readable(df[[c for c in DETAILS if c in df]].set_index("student"))


class Folded:
    """Text shown folded: Jupyter draws an HTML <details> block whose title opens it; as plain text (a terminal,
    papermill's log) only the title."""

    def __init__(self, title: str, text: str):
        self.title, self.text = title, text

    def _repr_html_(self) -> str:
        return (f"<details><summary>{html.escape(self.title)}</summary>"
                f"<pre>{html.escape(self.text)}</pre></details>")

    def __repr__(self) -> str:
        return self.title


def summary_json(run_dir: str | Path) -> Folded:
    """The run's summary.json, indented, in a block that opens on a click instead of a 40-line dict."""
    summary = results.load_summary(run_dir)
    return Folded(f"summary.json: {len(summary)} keys (click to open; the file is {Path(run_dir) / 'summary.json'})",
                  json.dumps(summary, indent=1, default=str))


def summary_table(run_dir: str | Path) -> pd.DataFrame:
    """The run at a glance, one row per student from students.csv: status, median step time, speedup over
    the baseline student (its step time / this one's; none for a fallback row, which ran PyTorch in place
    of its backend), final train loss, eval MSE and peak allocated memory in GiB (empty on a CPU: memory is
    measured on GPUs only), and `slow path`: why a slower path ran than this machine offers
    (workbench.run.slow_path), with the GPU's busy share of the step where it was measured; a distributed run
    adds the ranks and the scaling efficiency against the student's one-process row. Three significant digits."""
    df = results.load(run_dir)
    baseline = results.load_config(run_dir).baseline
    base = df.loc[df["student"] == baseline, "step_ms_median"]
    base_ms = base.iloc[0] if len(base) and pd.notna(base.iloc[0]) else None
    table = pd.DataFrame({
        "student": df["student"],
        "status": df["status"],
        "step ms": df["step_ms_median"].map(_sig),
        f"× vs {baseline}": (base_ms / df["step_ms_median"]).where(df["status"] == "ok").map(_sig) if base_ms else None,
        "final loss": df["final_train_loss"].map(_sig),
        "eval MSE": df["eval_mse"].map(_sig),
        "peak GiB": (df["peak_mem_allocated_mb"] / 1024).map(_sig),
    })
    if "gpu_busy_share" in df and df["gpu_busy_share"].notna().any():
        table["GPU busy %"] = (df["gpu_busy_share"] * 100).map(lambda v: _sig(v, 2))
    table["slow path"] = df["slow_path"].fillna("") if "slow_path" in df else ""
    if "world_size" in df and (df["world_size"] > 1).any():  # a distributed run: ranks and weak-scaling efficiency
        table = table.assign(ranks=df["world_size"], **{"scaling eff.": df["scaling_efficiency"].map(_sig)})
    if "heldout_ppl" in df:  # a language model: held-out quality instead of the output MSE
        table = table.drop(columns="eval MSE").assign(**{
            "held-out ppl": df["heldout_ppl"].map(_sig), "KL to teacher": df["kl_teacher_student_t1_nats"].map(_sig),
            "top-1 agree": df["top1_agreement"].map(_sig)})
    return table.set_index("student")


def language_model_plots(run_dir: str | Path) -> list | None:
    """Language-model runs: each student's held-out perplexity and KL to the teacher, and their curves
    during training (with train.eval_every); nothing for the MLP task. Returns the figures."""
    from workbench.results import plots  # matplotlib in the kernel only, not in the `workbench notebook` driver

    if "heldout_ppl" not in results.load(run_dir):
        return None
    figs = [plots.heldout_quality(run_dir)]
    if (Path(run_dir) / "eval_curve.csv").exists():
        figs.append(plots.heldout_curves(run_dir))
    return figs


def versions_line(run_dir: str | Path) -> str:
    """Where the numbers come from, in one line: GPU (or CPU), torch, CUDA, TE and the git sha of the run."""
    stamp = results.load(run_dir).iloc[0]

    def known(key: str) -> str | None:
        v = stamp.get(key)
        return None if v is None or pd.isna(v) else str(v)

    device = f"GPU {known('gpu_name')} (CC {known('compute_capability')})" if known("gpu_name") else "CPU"
    return " · ".join([device, f"torch {known('torch')}", f"CUDA {known('torch_cuda') or 'none'}",
                       f"TE {known('te_version') or 'not installed'}", f"git {known('git_sha') or 'unknown'}"])


def timings_note(run_dir: str | Path) -> str:
    """One line above the table: on a CPU that its timings are a smoke test; where a student ran a slower
    path than this machine offers, that the table's `slow path` column says why. '' otherwise."""
    summary = results.load_summary(run_dir)
    slow = summary.get("slow_path") or {}
    parts = [summary.get("timings_note") or ""]
    if slow:
        parts.append(f"⚠ {len(slow)} student(s) ran a slower path than this machine offers: see `slow path` below")
    return "\n".join(p for p in parts if p)


def plot(run_dir: str | Path, name: str):
    """The run's plot `name` (workbench.results.plots.PLOTS) where it has something to draw, else one line saying
    so instead of empty axes. Returns the figure, or None."""
    from workbench.results import plots  # matplotlib in the kernel only, not in the `workbench notebook` driver

    if plots.has_data(run_dir, name):
        return plots.PLOTS[name](run_dir)
    print(f"{name}: nothing to plot: no student that ran produced {plots.NEEDS[name]}")
    return None


def peak_memory(run_dir: str | Path):
    """The peak-memory plot where memory was measured (a GPU run); on a CPU one line saying so instead of
    empty axes. Returns the figure, or None."""
    from workbench.results import plots  # matplotlib in the kernel only, not in the `workbench notebook` driver

    if results.load(run_dir)["peak_mem_allocated_mb"].notna().any():
        return plots.peak_memory(run_dir)
    print("Peak memory is measured on GPUs only (torch.cuda memory statistics); this run had none.")
    return None


# A kernel's own log stays out of the terminal: its "Kernel is running over TCP without encryption" warning at
# start and the "KeyboardInterrupt caught in kernel" that jupyter_client's shutdown (an interrupt first) makes it
# log at the end. A failing cell still fails the run (papermill raises). Every notebook the workbench runs.
QUIET_KERNEL = ["--IPKernelApp.log_level=CRITICAL"]
KERNEL_START_TRIES = 3
"""A kernel that dies or hangs before its first reply is started again, up to this many times in all: jupyter_client
picks free TCP ports and the kernel binds them a moment later, so two kernels starting at once (a sweep's workers,
pytest's) can pick the same port, and the loser exits with 'Address already in use' before any cell ran, or stays
up without answering until jupyter_client's start timeout (seen once in a fresh-clone CI run at dc2ff12)."""
KERNEL_NOT_STARTED = ("before replying to kernel_info", "Kernel didn't respond in")  # jupyter_client's words


def papermill_execute(source: str, executed: str, **kwargs: Any) -> None:
    """papermill.execute_notebook with the workbench's kernel (python3, quiet), started again when it died or hung
    before running anything (`KERNEL_START_TRIES`); any other failure is raised at once."""
    import papermill as pm

    for attempt in range(1, KERNEL_START_TRIES + 1):
        try:
            pm.execute_notebook(source, executed, kernel_name="python3", language="python",
                                extra_arguments=QUIET_KERNEL, **kwargs)
            return
        except RuntimeError as e:  # jupyter_client's wait_for_ready: the kernel exited or hung during start-up
            if not any(words in str(e) for words in KERNEL_NOT_STARTED) or attempt == KERNEL_START_TRIES:
                raise
            print(f"workbench: the notebook kernel failed to start ({e}); starting it again "
                  f"({attempt + 1}/{KERNEL_START_TRIES})", file=sys.stderr)


def execute(preset: str = "auto", overrides: dict[str, Any] | None = None, out: str | Path = "results",
            run_id: str | None = None, notebook: Path | resources.abc.Traversable = MAIN_NOTEBOOK,
            progress: bool = False, cell_timeout: int | None = None, log_output: bool = True) -> Path:
    """Execute the notebook with papermill into <out>/<run_id>/; returns the run folder.

    The folder is created here, exclusively, to hold the executed notebook; the kernel's run takes it
    over (results.HANDOVER_ENV). `log_output`: the kernel's output (the runner's per-student lines) is
    copied to this process's stdout / stderr while it runs. `cell_timeout`: seconds one cell may run
    (papermill's execution_timeout; None: no limit). The executed notebook is written beside the results
    under a temporary name and moved into place when papermill returns or raises, so a reader never sees
    a truncated file and a failed run still leaves the notebook that shows the failure.
    Raises papermill.PapermillExecutionError if a cell fails, nbclient's CellTimeoutError when a cell runs
    past `cell_timeout`.
    """
    from workbench import results
    from workbench.run import runner
    require_stack()  # else papermill's "No such kernel named python3", or an ImportError mid-sweep
    overrides = overrides or {}
    cfg = config.from_preset(preset, **overrides)  # validate before starting a kernel
    runner.check_registered(cfg)
    names = {config.locate(k)[1] for k in overrides}
    typed = {k: v for k, v in cfg.flat().items() if k in names}  # coerced values, papermill writes them as literals
    run_dir = results.create_run_dir(out, run_id, runner.new_run_id(cfg))
    kernel_uses_this_python()
    executed = run_dir / notebook.name
    partial = run_dir / f".{notebook.name}.partial.ipynb"  # papermill saves after every cell
    os.environ[results.HANDOVER_ENV] = str(run_dir)  # the kernel inherits the environment at its start
    with resources.as_file(notebook) as source:
        try:
            papermill_execute(
                str(source), str(partial),
                parameters={"preset": cfg.preset, "out": str(run_dir.parent), "run_id": run_dir.name, **typed},
                progress_bar=progress, log_output=log_output, stdout_file=sys.stdout if log_output else None,
                stderr_file=sys.stderr if log_output else None, execution_timeout=cell_timeout,
                cwd=str(checkout_root() or Path.cwd()),
            )
        finally:
            os.environ.pop(results.HANDOVER_ENV, None)
            if partial.exists():
                os.replace(partial, executed)
    return run_dir


def add_arguments(p) -> None:
    from workbench.run.arguments import add_run_arguments

    add_run_arguments(p)
    p.add_argument("--notebook", type=Path, default=None, metavar="PATH",
                   help="the notebook to execute (default: the packaged distill_benchmark.ipynb)")


def main(args) -> int:
    overrides = config.parse_set(args.overrides)
    nb = args.notebook or MAIN_NOTEBOOK
    problem = f"--notebook {nb}: no such file" if not nb.is_file() else None
    try:
        require_stack()
    except MissingStack as e:
        problem = problem or str(e)
    if problem:
        print(f"workbench notebook: {problem}", file=sys.stderr)
        return 2
    # no progress bar: the kernel's per-student lines are the progress
    run_dir = execute(args.preset, overrides, out=args.out, run_id=args.run_id, notebook=nb)
    summary = results.load_summary(run_dir)
    summary["run_dir"] = str(run_dir)
    print(json.dumps(summary, default=str), flush=True)  # the last stdout line: machine-readable
    print(done_line(run_dir, nb.name), file=sys.stderr)  # and the last line a person reads
    return 0


def done_line(run_dir: Path, notebook_name: str = MAIN_NOTEBOOK.name) -> str:
    """One line for a person: the executed notebook to open and the folder of the run's files."""
    return (f"Done: open {run_dir / notebook_name} (the executed notebook); "
            f"the run's result files and plots are in {run_dir}/")
