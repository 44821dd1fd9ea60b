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


WRAP = {"flex_flow": "row wrap", "align_items": "flex-start"}  # rows that wrap: nothing off-screen at 1280 px
CANNOT = "cannot run here"


def availability(preset: str) -> dict[str, str]:
    """{student spec: why it cannot run on this machine} for the specs that cannot (the backends' own
    `availability` on the device the preset's run would use: FP8 / MXFP8 / NVFP4 on a CPU, torchao missing)."""
    from workbench import backends  # torch: only once a panel is built
    from workbench.run import runner

    base = config.from_preset(preset)
    ctx = backends.Context(device=runner.resolve_device(base), cfg=base)
    out = {}
    for spec in backends.all_specs():
        ok, why = backends.make(spec).availability(ctx)
        if not ok:
            out[spec] = why
    return out


class Panel:
    """The widgets and the Run handler; `widget` is what the notebook displays. The inputs validate what is
    typed (sizes are whole numbers, one tag each; the ratio and GPUs bounded), the backends are a checkbox
    list that marks those that cannot run here (the reason as the tooltip), and the rows wrap."""

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
        self.sizes = w.IntsInput(value=[base.model.hidden], min=1, description="hidden", allow_duplicates=False,
                                 tooltip="hidden sizes, one run each: type a whole number and press Enter")
        self.ratio = w.BoundedIntText(value=max(1, base.model.intermediate // base.model.hidden), min=1, max=64,
                                      description="MLP ×", tooltip="intermediate = this × hidden")
        self.cannot = availability(preset)
        self.backends = {spec: w.Checkbox(value=spec in base.backends, indent=False, layout=w.Layout(width="auto"),
                                          description=f"{spec} ({CANNOT})" if spec in self.cannot else spec,
                                          tooltip=self.cannot.get(spec, ""))
                         for spec in backends.all_specs()}
        self.nproc = w.BoundedIntText(value=base.parallel.nproc, min=1, max=64, description="GPUs",
                                      tooltip="processes (GPUs) per run: above 1 the run goes through torchrun")
        self.run_button = w.Button(description="Run", button_style="primary", icon="play")
        self.output = w.Output()
        self.run_button.on_click(lambda _: self.run())
        notes = "".join(f"<li><code>{s}</code>: {why}</li>" for s, why in self.cannot.items())
        self.widget = w.VBox([
            w.Box([self.preset, self.sizes, self.ratio, self.nproc], layout=w.Layout(**WRAP)),
            w.HTML("<b>backends</b>"), w.Box(list(self.backends.values()), layout=w.Layout(**WRAP)),
            w.HTML(f"<details><summary>{len(self.cannot)} {CANNOT}: why</summary><ul>{notes}</ul></details>"
                   if self.cannot else ""),
            self.run_button, self.output])
        self.last_runs: list[Path] = []

    def chosen(self) -> list[str]:
        """The checked backends, in the registry's order."""
        return [spec for spec, box in self.backends.items() if box.value]

    def namespaces(self) -> list[dict[str, Any]]:
        """One notebook-parameter namespace per size (what run_cell reads), validated up front."""
        sizes = [int(s) for s in self.sizes.value]
        if not sizes:
            raise config.ConfigError("hidden: give at least one size, e.g. 512 and 1024")
        folder = self.out / _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = []
        for h in sizes:
            ns = {"preset": self.preset.value, "hidden": h, "intermediate": self.ratio.value * h,
                  "backends": self.chosen(), "nproc": self.nproc.value, "out": str(folder),
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
                for note in dict.fromkeys(notebook.timings_note(d) for d in self.last_runs):  # the run's caveat
                    if note:
                        print(note)
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
            df = analysis.load_sweep(run_dirs[0].parent)  # as the sweep report: only the figures with data
            shown = ("speedup_vs_size", "step_time_vs_size", "peak_memory_vs_size")
            figs = [fn(df) for name, fn in figures.drawable(df).items() if name in shown]
        for fig in figs:
            plt.close(fig)  # displayed once, explicitly; not again by the inline backend
        return figs
