"""workbench.results.plots: one colour per student everywhere, readable axes, and runs with nothing to plot."""
import json
import os
import subprocess
import sys
from pathlib import Path

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import pandas as pd
import pytest

from workbench import backends, results
from workbench.results import plots

ROOT = Path(__file__).resolve().parents[2]


def test_every_known_student_has_its_own_fixed_colour():
    """Every spec the registry knows draws in a colour no other spec has: the chosen palette's, or, for a spec
    the palette does not name (a backend added as one file), the checksum default, which the palette never uses."""
    specs = backends.all_specs()
    assert len({plots.student_color(s) for s in specs}) == len(specs)
    assert not set(plots._OTHER_COLORS) & set(plots.STUDENT_COLORS.values())
    assert plots.student_color("te_fp8:delayed") == plots.STUDENT_COLORS["te_fp8:delayed"]


def test_an_unknown_student_gets_the_same_colour_in_every_process():
    code = "from workbench.results import plots; print(plots.student_color('my_backend:recipe'))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    seen = {subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONHASHSEED": seed}, capture_output=True,
                           text=True, check=True).stdout.strip() for seed in ("1", "2")}
    assert seen == {plots.student_color("my_backend:recipe")}


def _run_dir(tmp_path, rows):
    """A fake GPU run's result files (the numbers of the H200 runs that made the plots unreadable)."""
    base = {"cfg_loss": "mse", "cfg_preset": "seed", "cfg_hidden": 1024, "cfg_batch": 8, "cfg_seq_len": 1024,
            "gpu_name": "FakeGPU", "status": "ok"}
    df = results.students_frame([{**base, **r} for r in rows])
    results.write_csv(tmp_path / "students.csv", df)
    losses = [{"step": i, "student": r["student"], "loss": 1.0 / i} for r in rows for i in (1, 2, 3)]
    results.write_csv(tmp_path / "losses.csv", pd.DataFrame(losses))
    return tmp_path


def _tick_texts(axis):
    plt.gcf().canvas.draw()
    return [t.get_text() for t in axis.get_ticklabels() if t.get_text()]


def test_run_plots_colour_by_student_read_log_and_memory_axes_plainly(tmp_path):
    rows = [
        {
            "student": "torch_fp32",
            "step_ms_median": 416.0,
            "peak_mem_allocated_mb": 19_300.0,
            "peak_mem_reserved_mb": 20_000.0,
        },
        {
            "student": "torch_bf16",
            "step_ms_median": 46.0,
            "peak_mem_allocated_mb": 18_000.0,
            "peak_mem_reserved_mb": 19_000.0,
        },
        {
            "student": "torchao_float8:tensorwise",
            "step_ms_median": 31.0,
            "peak_mem_allocated_mb": 17_700.0,
            "peak_mem_reserved_mb": 18_500.0,
        },
    ]
    for r in rows:
        r.update(step_ms_p20=r["step_ms_median"] * 0.9, step_ms_p80=r["step_ms_median"] * 1.1)
    run = _run_dir(tmp_path, rows)
    want = {r["student"]: mcolors.to_rgba(plots.student_color(r["student"])) for r in rows}

    loss = plots.loss_curves(run).axes[0]
    assert {ln.get_label(): mcolors.to_rgba(ln.get_color()) for ln in loss.get_lines()} == want

    step = plots.step_time(run).axes[0]
    assert [mcolors.to_rgba(b.get_facecolor()) for b in step.patches] == list(want.values())
    assert step.get_yscale() == "log"  # 416 ms must not flatten 31-46 ms
    labels = _tick_texts(step.yaxis)
    assert labels and not any("$" in t or "e+" in t for t in labels), labels  # plain numbers, no 10^x
    assert [t.get_text() for t in step.texts] == ["416 ms", "46 ms", "31 ms"]  # value on every bar

    mem = plots.peak_memory(run).axes[0]
    assert "GiB" in mem.get_ylabel() and mem.get_ylim()[0] > 0  # 17.3 vs 18.8 GiB do not look equal
    assert [t.get_text() for t in mem.texts] == ["18.8 GiB", "17.6 GiB", "17.3 GiB"]
    assert not any("e+" in t for t in _tick_texts(mem.yaxis))
    plt.close("all")


def test_bench_bars_take_the_student_colour(tmp_path):
    pd.DataFrame([{"variant": v, "student": s, "precision": "bf16", "status": "ok", "step_ms_median": ms,
                   "step_ms_p20": ms, "step_ms_p80": ms, "pct_of_measured_peak": 50.0, "pct_of_datasheet_peak": 40.0}
                  for v, s, ms in (("eager", "torch_bf16", 10.0), ("eager", "te_fp8:delayed", 8.0))]
                 ).to_csv(tmp_path / "bench.csv", index=False)
    for fig in plots.plot_bench(tmp_path, close=False).values():
        colors = [mcolors.to_rgba(b.get_facecolor()) for b in fig.axes[0].patches][:2]
        assert colors == [mcolors.to_rgba(plots.student_color(s)) for s in ("torch_bf16", "te_fp8:delayed")]
    plt.close("all")


@pytest.mark.parametrize("overrides, status", [
    (["lr=1e12"], "diverged"),  # every student's loss goes non-finite
    (["device=cpu", "backends=torch_fp16", "baseline=torch_fp16"], "skipped"),  # fp16 + grad scaler is GPU-only
])
def test_a_run_where_no_student_produced_metrics_is_complete(tmp_path, overrides, status):
    cmd = [sys.executable, "-m", "workbench", "run", "--preset", "cpu-smoke", "--out", str(tmp_path), "--run-id", "r"]
    for o in overrides:
        cmd += ["--set", o]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    run = tmp_path / "r"
    df = results.load(run)
    assert set(df["status"]) == {status} and "step_ms_median" in df and df["step_ms_median"].isna().all()
    summary = results.load_summary(run)
    assert summary["students_with_metrics"] == 0 and summary["baseline_median_step_ms"] is None
    assert json.loads(p.stdout.strip().splitlines()[-1])["run_dir"] == str(run)
    drawn = {"diverged": {"loss_curves"}, "skipped": set()}[status]  # a diverged student's losses are a curve
    assert {name for name in plots.PLOTS if (run / f"{name}.png").exists()} == drawn  # no empty figures


def test_figures_are_written_as_palette_pngs_beside_their_svg(tmp_path):
    """The PNG is re-encoded with a 256-colour palette (a third of the bytes: the tree that travels to the
    GPU machine stays small); the SVG is matplotlib's own."""
    import io

    from PIL import Image

    fig, ax = plt.subplots()
    for k in range(6):
        ax.plot(range(50), [(i * (k + 1)) % 17 for i in range(50)], label=str(k))
    ax.legend()
    png, svg = results.write_figure(fig, tmp_path, "plot")
    plt.close(fig)
    assert Image.open(png).mode == "P" and svg.read_text().lstrip().startswith("<?xml")
    plain = io.BytesIO()
    Image.open(png).convert("RGB").save(plain, "PNG")
    assert png.stat().st_size < 0.7 * len(plain.getvalue())


def _slow_run(tmp_path, gpu_name):
    rows = [
        {"student": "torch_bf16", "step_ms_median": 3.0, "gpu_busy_share": 0.9, "slow_path": None},
        {
            "student": "te_fp8:delayed",
            "step_ms_median": 7.9,
            "gpu_busy_share": 0.09,
            "slow_path": "host-bound: GPU busy 9% of the step; set graphs=true te_graph=step (bench measured 0.87 ms)",
        },
    ]
    for r in rows:
        r.update(step_ms_p20=r["step_ms_median"], step_ms_p80=r["step_ms_median"], gpu_name=gpu_name)
    return _run_dir(tmp_path, rows)


def test_step_time_marks_the_slow_student_and_says_why_in_one_line(tmp_path):
    fig = plots.step_time(_slow_run(tmp_path, "FakeGPU"))
    ax = fig.axes[0]
    marks = [t for t in ax.texts if t.get_text() == plots.SLOW_MARK]
    assert len(marks) == 1 and marks[0].xy[0] == pytest.approx(1.0)  # on the second bar only
    lines = [t.get_text() for t in fig.texts]
    assert len(lines) == 1 and "te_fp8:delayed: host-bound: GPU busy 9%" in lines[0] and "te_graph=step" in lines[0]
    assert "smoke test" not in ax.get_title()
    plt.close("all")


def test_cpu_step_times_say_they_are_a_smoke_test_and_no_memory_figure_is_written(tmp_path):
    run = _slow_run(tmp_path, None)
    assert "CPU timings are a smoke test" in plots.step_time(run).axes[0].get_title()
    assert not plots.has_data(run, "peak_memory") and plots.has_data(run, "step_time")
    written = plots.plot_run(run)
    assert set(written) == {"loss_curves", "step_time"} and not (run / "peak_memory.png").exists()


def test_the_reference_figures_are_redrawn_from_their_own_files_png_only(tmp_path):
    """scripts/replot_reference.py: a committed run's figures redrawn by today's plotting code, no SVG added."""
    import importlib.util
    import shutil

    src = ROOT / "results/reference/h200/seed"
    run = tmp_path / "h200" / "seed"
    shutil.copytree(src, run)
    before = {p.name: p.read_bytes() for p in run.glob("*.png")}
    spec = importlib.util.spec_from_file_location("replot", ROOT / "scripts/replot_reference.py")
    replot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replot)
    written = replot.replot(tmp_path)
    assert {p.name for p in written} == set(before) and not list(tmp_path.rglob("*.svg"))
    assert all(p.read_bytes() != before[p.name] or p.stat().st_size > 0 for p in written)
