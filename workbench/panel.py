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
import html
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
# What each text box takes, said with any error about it (the boxes are plain text, read on Run: a number
# box would clamp or cut '1O24' in the browser, before the kernel could say anything).
ALLOWED = {
    "hidden": "whole numbers of 1 or more, separated by commas or spaces, e.g. 512, 1024",
    "MLP ×": "one whole number from 1 to 64 (intermediate = this × hidden)",
    "GPUs": "one whole number of 1 or more (processes per run; above 1 the run goes through torchrun)",
}


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


def short(why: str, limit: int = 48) -> str:
    """A reason's first clause, for a checkbox's label ('transformer_engine.pytorch does not import');
    the whole reason is in the panel's 'why' list."""
    head = why.split(": ")[0].split("; ")[0].strip()
    return head if len(head) <= limit else head[: limit - 1] + "…"


def read_ints(label: str, text: str, key: str, hi: int | None = None, one: bool = False) -> list[int]:
    """The whole numbers typed into the panel's `label` box, each read as the config reads field `key` from
    the CLI or papermill (`Config.replace`'s coercion: '1O24' is no int); each at least 1, at most `hi`.
    Anything else raises ConfigError naming the box, what was typed and `ALLOWED[label]`. The run's
    config is validated whole after this (`config.from_preset`), so the config's own rules still apply."""
    tokens = text.replace(",", " ").split()
    if not tokens or (one and len(tokens) > 1):
        raise config.ConfigError(f"{label}: {repr(text.strip()) if tokens else 'empty'} is not allowed. "
                                 f"Allowed: {ALLOWED[label]}.")
    values = []
    for tok in tokens:
        try:
            value = config.Config().replace(**{key: tok}).flat()[key]
        except config.ConfigError:
            value = None
        if value is None or value < 1 or (hi is not None and value > hi):
            raise config.ConfigError(f"{label}: {tok!r} is not allowed. Allowed: {ALLOWED[label]}.")
        values.append(value)
    return list(dict.fromkeys(values))  # a size typed twice runs once (its folder is hidden<h>)


class Panel:
    """The widgets and the Run handler; `widget` is what the notebook displays. Sizes, the MLP ratio and
    GPUs are text boxes with visible labels, read on Run (and when a box loses focus): a value that is not
    allowed is named, with what is allowed, in red under the Run button, it stays in its box, and nothing
    runs. The backends are a checkbox list; those that cannot run here say so, with the reason's first
    clause, in their label (ipywidgets 8 shows a checkbox's label, not its tooltip, on hover) and whole in
    the 'why' list, listed after those that can run; the default ticks the preset's backends that can run
    here. The rows wrap."""

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
        text = {"continuous_update": False, "layout": w.Layout(width="16em")}  # read on Enter / leaving the box
        self.sizes = w.Text(value=str(base.model.hidden), description="hidden", placeholder="e.g. 512, 1024", **text)
        self.ratio = w.Text(value=str(max(1, base.model.intermediate // base.model.hidden)), description="MLP ×",
                            **text)
        self.nproc = w.Text(value=str(base.parallel.nproc), description="GPUs", **text)
        self.cannot = availability(preset)
        runnable = [s for s in base.backends if s not in self.cannot]
        ticked = runnable or list(base.backends)  # none runs here: the preset's own, as fallback rows
        self.specs = backends.all_specs()
        shown = sorted(self.specs, key=lambda s: s in self.cannot)  # what runs here first, each in registry order
        self.backends = {spec: w.Checkbox(value=spec in ticked, indent=False, layout=w.Layout(width="auto"),
                                          description=f"{spec} ({CANNOT}: {short(self.cannot[spec])})"
                                          if spec in self.cannot else spec)
                         for spec in shown}
        self.run_button = w.Button(description="Run", button_style="primary", icon="play")
        self.message = w.HTML("")  # why nothing ran: the box, what was typed, what is allowed
        self.output = w.Output()
        self.run_button.on_click(lambda _: self.run())
        for box in (self.sizes, self.ratio, self.nproc):
            box.observe(lambda _: self.check(), names="value")
        notes = "".join(f"<li><code>{s}</code>: {why}</li>" for s, why in self.cannot.items())
        self.widget = w.VBox([
            w.Box([self.preset, self.sizes, self.ratio, self.nproc], layout=w.Layout(**WRAP)),
            w.HTML("<b>backends</b>"), w.Box(list(self.backends.values()), layout=w.Layout(**WRAP)),
            w.HTML(f"<details><summary>{len(self.cannot)} {CANNOT}: why</summary><ul>{notes}</ul></details>"
                   if self.cannot else ""),
            self.run_button, self.message, self.output])
        self.last_runs: list[Path] = []

    def chosen(self) -> list[str]:
        """The checked backends, in the registry's order."""
        return [spec for spec in self.specs if self.backends[spec].value]

    def namespaces(self) -> list[dict[str, Any]]:
        """One notebook-parameter namespace per size (what run_cell reads), validated up front."""
        sizes = read_ints("hidden", self.sizes.value, "hidden")
        ratio = read_ints("MLP ×", self.ratio.value, "intermediate", hi=64, one=True)[0]
        nproc = read_ints("GPUs", self.nproc.value, "nproc", one=True)[0]
        folder = self.out / _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = []
        for h in sizes:
            ns = {"preset": self.preset.value, "hidden": h, "intermediate": ratio * h,
                  "backends": self.chosen(), "nproc": nproc, "out": str(folder), "run_id": f"hidden{h}"}
            config.from_preset(ns["preset"], **{k: ns[k] for k in ("hidden", "intermediate", "backends", "nproc")})
            out.append(ns)
        return out

    def check(self) -> list[dict[str, Any]]:
        """The namespaces, or [] with the reason shown in red under the Run button (cleared once it is fixed)."""
        try:
            runs = self.namespaces()
        except config.ConfigError as e:
            self.message.value = f'<b style="color:#c62828">Not run: {html.escape(str(e))}</b>'
            return []
        self.message.value = ""
        return runs

    def run(self) -> list[Path]:
        from IPython.display import display
        from tqdm.auto import tqdm

        self.output.clear_output()
        runs = self.check()
        if not runs:
            return []
        self.run_button.disabled = True
        try:
            with self.output:
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
