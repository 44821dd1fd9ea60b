"""The notebook driver: what the main notebook's cells call, and papermill execution of it.

`workbench notebook --preset P --set f=v` validates the config first (bad input fails before any
work), then executes notebooks/distill_benchmark.ipynb with papermill into the run folder, so the
executed copy sits beside the run's result files.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from workbench import config

ROOT = Path(__file__).resolve().parent.parent
MAIN_NOTEBOOK = ROOT / "notebooks" / "distill_benchmark.ipynb"
RUN_PARAMETERS = ("preset", "out", "run_id", "show_panel")  # the notebook's parameters besides the config fields


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
    from workbench import runner

    overrides = overrides_from(namespace)
    cfg = config.from_preset(namespace.get("preset") or "auto", **overrides)
    print(cfg.to_json())
    return runner.run(cfg, out=namespace.get("out") or "results", run_id=namespace.get("run_id"),
                      requested={"preset": namespace.get("preset"), **overrides})


def execute(preset: str = "auto", overrides: dict[str, Any] | None = None, out: str | Path = "results",
            run_id: str | None = None, notebook: Path = MAIN_NOTEBOOK, progress: bool = False,
            cell_timeout: int | None = None) -> Path:
    """Execute the notebook with papermill into <out>/<run_id>/; returns the run folder.

    The folder is created here, exclusively, to hold the executed notebook; the kernel's run takes it
    over (results.HANDOVER_ENV). `cell_timeout`: seconds any one cell may run (None: no limit).
    Raises papermill.PapermillExecutionError if a cell fails (the executed notebook is still written),
    nbclient's CellTimeoutError when a cell runs past `cell_timeout`.
    """
    import papermill as pm
    from workbench import results, runner

    overrides = overrides or {}
    cfg = config.from_preset(preset, **overrides)  # validate before starting a kernel
    names = {config.locate(k)[1] for k in overrides}
    typed = {k: v for k, v in cfg.flat().items() if k in names}  # coerced values, papermill writes them as literals
    run_dir = results.create_run_dir(out, run_id, runner.new_run_id(cfg))
    kernel_uses_this_python()
    os.environ[results.HANDOVER_ENV] = str(run_dir)  # the kernel inherits the environment at its start
    try:
        pm.execute_notebook(
            str(notebook), str(run_dir / notebook.name),
            parameters={"preset": cfg.preset, "out": str(run_dir.parent), "run_id": run_dir.name, **typed},
            kernel_name="python3", language="python", progress_bar=progress, cwd=str(ROOT),
            execution_timeout=cell_timeout,
        )
    finally:
        os.environ.pop(results.HANDOVER_ENV, None)
    return run_dir


def add_arguments(p) -> None:
    from workbench.cli import add_run_arguments

    add_run_arguments(p)


def main(args) -> int:
    import json

    from workbench import results

    overrides = config.parse_set(args.overrides)
    run_dir = execute(args.preset, overrides, out=args.out, run_id=args.run_id, progress=True)
    summary = results.load_summary(run_dir)
    summary["run_dir"] = str(run_dir)
    print(json.dumps(summary, default=str))
    return 0
