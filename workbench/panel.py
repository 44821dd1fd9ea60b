"""The main notebook's widget panel: pick a preset, hidden sizes, GPUs and backends, press Run, watch it go.

    from workbench import panel
    panel.maybe_show(globals())      # the notebook's last cell

Built only in an interactive session: when the notebook's `show_panel` parameter is True, or when it
is None and the notebook is not being executed by papermill (headless runs skip it). Each size is one
`workbench.notebook.run_cell(...)`, the very call the papermill path makes, into
results/panel/<timestamp>/hidden<h>/; a tqdm.auto bar counts the sizes while the runner's per-student
lines stream below it. On completion: the run's plots (one size), or workbench.sweep.figures' speedup, step
time and memory against size (several sizes).
"""
from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from workbench import config, notebook


def under_papermill(namespace: dict[str, Any]) -> bool:
    """True when papermill injected parameters into this kernel: its cell starts with '# Parameters'
    (papermill's translators write that comment) and shows in IPython's input history `In`."""
    return any(str(src).lstrip().startswith("# Parameters") for src in namespace.get("In", []) or [])


def maybe_show(namespace: dict[str, Any]) -> "Panel | None":
    """Show the panel where a person is looking; return it (None when skipped)."""
    flag = namespace.get("show_panel")
    if flag is False or (flag is None and under_papermill(namespace)):
        return None
    from IPython.display import display

    p = Panel(
        preset=namespace.get("preset") or "auto", out=Path(namespace.get("out") or notebook.default_out()) / "panel"
    )
    display(p.widget)
    return p


class Panel:
    """The widgets and the Run handler; `widget` is what the notebook displays."""

    def __init__(self, preset: str = "auto", out: str | Path = "results/panel"):
        import ipywidgets as w

        from workbench import backends  # torch: only once a panel is built

        self.out = Path(out)
        base = config.from_preset(preset)
        self.preset = w.Dropdown(
            options=["auto", *config.PRESETS],
            value=preset if preset in config.PRESETS else "auto",
            description="preset",
        )
        self.sizes = w.Text(value=str(base.model.hidden), description="hidden",
                            placeholder="comma-separated, e.g. 512,1024,2048")
        self.ratio = w.IntText(value=max(1, base.model.intermediate // base.model.hidden), description="MLP ×",
                               tooltip="intermediate = this × hidden")
        specs = backends.all_specs()
        self.backends = w.SelectMultiple(options=specs, value=tuple(s for s in base.backends if s in specs),
                                         description="backends", rows=min(10, len(specs)))
        self.nproc = w.BoundedIntText(value=base.parallel.nproc, min=1, max=64, description="GPUs",
                                      tooltip="processes (GPUs) per run: above 1 the run goes through torchrun")
        self.run_button = w.Button(description="Run", button_style="primary", icon="play")
        self.output = w.Output()
        self.run_button.on_click(lambda _: self.run())
        self.widget = w.VBox([w.HBox([self.preset, self.sizes, self.ratio, self.nproc]), self.backends, self.run_button,
                              self.output])
        self.last_runs: list[Path] = []

    def namespaces(self) -> list[dict[str, Any]]:
        """One notebook-parameter namespace per size (what run_cell reads), validated up front."""
        sizes = [int(s) for s in self.sizes.value.replace(" ", "").split(",") if s]
        if not sizes:
            raise config.ConfigError("hidden: give at least one size, e.g. 512,1024")
        folder = self.out / _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = []
        for h in sizes:
            ns = {"preset": self.preset.value, "hidden": h, "intermediate": self.ratio.value * h,
                  "backends": list(self.backends.value), "nproc": self.nproc.value, "out": str(folder),
                  "run_id": f"hidden{h}"}
            config.from_preset(ns["preset"], **{k: ns[k] for k in ("hidden", "intermediate", "backends", "nproc")})
            out.append(ns)
        return out

    def run(self) -> list[Path]:
        from IPython.display import display
        from tqdm.auto import tqdm

        self.output.clear_output()
        self.run_button.disabled = True
        try:
            with self.output:
                try:
                    runs = self.namespaces()
                except (config.ConfigError, ValueError) as e:
                    print(f"not run: {e}")
                    return []
                self.last_runs = [notebook.run_cell(ns) for ns in tqdm(runs, desc="sizes", unit="run")]
                for fig in self.figures(self.last_runs):
                    display(fig)
        finally:
            self.run_button.disabled = False
        return self.last_runs

    @staticmethod
    def figures(run_dirs: list[Path]) -> list:
        import matplotlib.pyplot as plt

        from workbench.results import plots
        from workbench.sweep import analysis, figures
        if len(run_dirs) == 1:
            figs = [fn(run_dirs[0]) for fn in plots.run_plots(run_dirs[0]).values()]  # none with nothing to draw
        else:
            df = analysis.load_sweep(run_dirs[0].parent)
            figs = [figures.speedup_vs_size(df), figures.step_time_vs_size(df), figures.peak_memory_vs_size(df)]
        for fig in figs:
            plt.close(fig)  # displayed once, explicitly; not again by the inline backend
        return figs
