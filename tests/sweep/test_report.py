"""workbench.sweep's analysis, figures and report on a synthetic sweep with known answers."""
import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import pandas as pd
import pytest

from workbench import config, results
from workbench.results import plots
from workbench.sweep import analysis, figures, index, plan, report

SIZES = (512, 1024, 2048, 4096)


def _rows():
    """Two token counts x four sizes; te_fp8:delayed wins from 2048 on (8192 tokens) or 4096 (1024
    tokens), te_fp8:current never wins, torchao is skipped everywhere."""
    cfg = {
        f"cfg_{k}": (",".join(v) if isinstance(v, list) else v) for k, v in config.from_preset("seed").flat().items()
    }
    rows = []
    for seq_len in (128, 1024):
        for h in SIZES:
            bf16 = h / 100
            fp8 = {
                "torch_bf16": bf16,
                "te_fp8:delayed": bf16 * (1.25 if h < (2048 if seq_len == 1024 else 4096) else 0.8),
                "te_fp8:current": bf16 * 1.1,
                "torchao_float8:tensorwise": None,
            }
            for student, ms in fp8.items():
                ok = ms is not None
                rows.append(
                    {
                        **cfg,
                        "cfg_hidden": h,
                        "cfg_intermediate": 4 * h,
                        "cfg_seq_len": seq_len,
                        "cfg_batch": 8,
                        "point": f"p{h}-{seq_len}",
                        "student": student,
                        "status": "ok" if ok else "skipped",
                        "gemm_precision": "bf16" if student == "torch_bf16" else "fp8",
                        "reason": "" if ok else "torchao not installed",
                        "gpu_name": "FakeGPU",
                        "compute_capability": "9.0",
                        "torch": "2.11.0",
                        "torch_cuda": "13.0",
                        "te_version": "2.20.2",
                        "git_sha": "abc1234",
                        "step_ms_median": ms,
                        "step_ms_p20": ms and ms * 0.95,
                        "step_ms_p80": ms and ms * 1.05,
                        "initial_loss": 0.7 if ok else None,
                        "final_train_loss": (0.5 if student == "torch_bf16" else 0.55) if ok else None,
                        "eval_mse": 0.5 if ok else None,
                        "peak_mem_allocated_mb": h * (1.0 if student == "torch_bf16" else 1.1) if ok else None,
                    }
                )
    return pd.DataFrame(rows)


@pytest.fixture
def df():
    return analysis.add_derived(_rows())


def test_speedup_is_reference_time_over_student_time(df):
    r = df[(df["student"] == "te_fp8:delayed") & (df["tokens"] == 8192) & (df["cfg_hidden"] == 4096)].iloc[0]
    assert r["speedup_vs_ref"] == pytest.approx(1 / 0.8)
    assert r["final_loss_ratio_vs_ref"] == pytest.approx(1.1) and r["peak_mem_ratio_vs_ref"] == pytest.approx(1.1)
    assert (df[df["student"] == "torch_bf16"]["speedup_vs_ref"] == 1).all()
    assert df[df["status"] == "skipped"]["speedup_vs_ref"].isna().all()  # unknown stays unknown


def test_crossover_is_the_smallest_size_where_fp8_wins(df):
    c = analysis.crossover(df).set_index(["tokens", "student"])
    assert c.loc[(8192, "te_fp8:delayed"), "crossover_hidden"] == 2048
    assert c.loc[(1024, "te_fp8:delayed"), "crossover_hidden"] == 4096
    assert c.loc[(8192, "te_fp8:delayed"), "faster_at_all_larger_sizes"]
    assert c.loc[(8192, "te_fp8:delayed"), "crossover_intermediate"] == 8192
    assert pd.isna(c.loc[(8192, "te_fp8:current"), "crossover_hidden"])
    assert "slower" in c.loc[(8192, "te_fp8:current"), "note"]
    assert "never ran" in c.loc[(8192, "torchao_float8:tensorwise"), "note"]
    assert ("torch_bf16" not in c.index.get_level_values("student"))


def test_fp8_students_are_told_by_the_precision_they_ran():
    """A TE FP8 student that fell back ran bf16: no FP8 crossover for it. Sweeps written before the
    gemm_precision column existed are read by student name."""
    rows = _rows()
    cur = rows["student"] == "te_fp8:current"
    rows.loc[cur, ["status", "gemm_precision"]] = ["fallback", "bf16"]
    assert "te_fp8:current" not in set(analysis.crossover(analysis.add_derived(rows))["student"])
    old = analysis.crossover(analysis.add_derived(rows.drop(columns="gemm_precision")))
    assert "te_fp8:current" in set(old["student"])


def test_loss_band_spans_the_fp8_students(df):
    band = analysis.loss_band(df)
    assert band["loss_ratio_min"].tolist() == pytest.approx([1.1] * len(band)) and (band["students"] == 2).all()


def test_another_swept_axis_gets_its_own_crossover():
    """Two layer counts in one sweep: each has its own crossover row, never one merged over both."""
    two = _rows()
    three = two.assign(cfg_layers=2)  # with 2 blocks te_fp8:current wins everywhere
    three.loc[three["student"] == "te_fp8:current", "step_ms_median"] *= 0.5
    cross = analysis.crossover(analysis.add_derived(pd.concat([two, three], ignore_index=True)))
    cur = cross[(cross["student"] == "te_fp8:current") & (cross["tokens"] == 1024)].set_index("cfg_layers")
    assert pd.isna(cur.loc[3, "crossover_hidden"]) and cur.loc[2, "crossover_hidden"] == min(SIZES)


def test_write_files_and_load_sweep_reads_only_complete_points(tmp_path):
    rows = _rows()
    sweep_dir = tmp_path / "s"
    for point, g in rows.groupby("point"):
        results.write_csv(sweep_dir / point / "students.csv", g.drop(columns="point"))
        results.write_json(sweep_dir / point / index.DONE_FILE, {"point": point, "finished_at": "2026-01-02T03:04:05"})
    (sweep_dir / "p4096-128" / index.DONE_FILE).unlink()  # a point killed before it finished
    points = sorted(rows["point"].unique())
    results.write_csv(
        sweep_dir / index.INDEX_FILE,
        pd.DataFrame({"point": points, "status": "done", "error_kind": None, "error": None}),
    )
    # a spike (5 x the initial loss) that the student recovers from is only in losses.csv
    results.write_csv(sweep_dir / "p512-128" / "losses.csv", pd.DataFrame(
        {"step": [1, 2, 3], "student": "te_fp8:current", "loss": [0.7, 3.5, 0.55]}))
    df = analysis.load_sweep(sweep_dir)
    spiked = df[(df["point"] == "p512-128") & (df["student"] == "te_fp8:current")].iloc[0]
    assert spiked["unstable"] and spiked["max_train_loss"] == 3.5
    assert not df[df["point"] != "p512-128"]["unstable"].any()
    assert "p4096-128" not in set(df["point"]) and df["point"].nunique() == 7
    written = report.write_files(df, tmp_path / "out", sweep_dir=sweep_dir)
    for name in ("sweep.csv", "crossover.csv", "loss_band.csv", "failed_points.csv",
                 *(f"{f}.{e}" for f in figures.FIGURES for e in ("png", "svg"))):
        assert written[name].stat().st_size > 0, name
    assert "scaling.csv" not in written and analysis.multi_gpu(df).empty  # no point ran over several GPUs
    assert "| date | 2026-01-02 03:04:05 – 2026-01-02 03:04:05 |" in report.intro(df)
    # the environment as each point's run says it (workbench.notebook.versions_line), every distinct line once
    assert "| measured on | GPU FakeGPU (CC 9.0) · torch 2.11.0 · CUDA 13.0 · TE 2.20.2 · git abc1234 |" in \
        report.intro(df, sweep_dir)
    assert pd.read_csv(written["sweep.csv"])["unstable"].sum() == 1
    cross = pd.read_csv(written["crossover.csv"]).set_index(["tokens", "student"])
    assert pd.isna(cross.loc[(1024, "te_fp8:delayed"), "crossover_hidden"])  # its winning size was not complete
    assert cross.loc[(8192, "te_fp8:delayed"), "crossover_hidden"] == 2048


def test_points_of_an_earlier_spec_are_not_mixed_into_the_report(tmp_path):
    spec = plan.Spec(name="s", preset="cpu-smoke", grid={"hidden": [64, 128]})
    planned = [p.id for p in plan.plan(spec)]
    sweep_dir = tmp_path / "s"
    for pid in planned[:1] + ["stale00000"]:  # one current point, one left by a changed spec
        results.write_csv(sweep_dir / pid / "students.csv", pd.DataFrame({"student": ["torch_bf16"], "status": "ok"}))
        results.write_json(sweep_dir / pid / index.DONE_FILE, {"point": pid})
    results.write_json(sweep_dir / plan.SPEC_FILE, spec.to_dict())
    assert [d.name for d in index.complete_points(sweep_dir)] == planned[:1]
    # index rows: the current spec's second point failed; an earlier spec's point was left 'running'
    results.write_csv(sweep_dir / index.INDEX_FILE, pd.DataFrame(
        [{"point": planned[0], "status": "done"}, {"point": planned[1], "status": "failed", "error": "boom"},
         {"point": "stale11111", "status": "running"}]))
    assert analysis.failed_points(sweep_dir)["point"].tolist() == [planned[1]]


def _unstable_reference_rows():
    """At 1024 tokens te_fp8:delayed wins only at hidden 4096, where the bf16 reference's loss rose 0.7 -> 2.0."""
    rows = _rows()
    bad = (rows["student"] == "torch_bf16") & (rows["cfg_seq_len"] == 128) & (rows["cfg_hidden"] == 4096)
    rows.loc[bad, "final_train_loss"] = 2.0
    return analysis.add_derived(rows)


def test_a_reference_whose_loss_rose_is_unstable_and_no_fp8_win_counts_against_it():
    df = _unstable_reference_rows()
    ref = df[(df["student"] == "torch_bf16") & df["unstable"]]
    assert len(ref) == 1 and "final loss 2.00 > initial 0.700" in ref["unstable_reason"].iloc[0]
    fake_win = df[(df["student"] == "te_fp8:delayed") & (df["tokens"] == 1024) & (df["cfg_hidden"] == 4096)].iloc[0]
    assert fake_win["ref_unstable"] and not fake_win["comparable"] and fake_win["speedup_vs_ref"] > 1
    c = analysis.crossover(df).set_index(["tokens", "student"])
    assert pd.isna(c.loc[(1024, "te_fp8:delayed"), "crossover_hidden"])  # the only "win" is not counted
    assert c.loc[(1024, "te_fp8:delayed"), "not_counted_hidden"] == "4096"
    assert "reference rose" in c.loc[(1024, "te_fp8:delayed"), "note"]
    assert c.loc[(8192, "te_fp8:delayed"), "crossover_hidden"] == 2048  # a stable reference still counts
    band = analysis.loss_band(df)
    assert 4096 not in set(band[band["tokens"] == 1024]["cfg_hidden"])


def test_a_loss_spike_makes_a_student_unstable_even_if_it_ends_lower():
    rows = _rows().assign(max_train_loss=0.9)
    rows.loc[rows["student"] == "te_fp8:current", "max_train_loss"] = 1.5  # > 2 x 0.7
    df = analysis.add_derived(rows)
    cur = df[df["student"] == "te_fp8:current"]
    assert cur["unstable"].all() and cur["unstable_reason"].str.contains("step loss 1.50 > 2x initial").all()
    assert not df[df["student"] == "torch_bf16"]["unstable"].any()


def test_plots_draw_unstable_points_hollow_and_each_student_in_its_colour():
    df = _unstable_reference_rows()
    for name, fn in figures.FIGURES.items():
        fig = fn(df)
        for ax in fig.axes:
            for line in ax.get_lines():
                if line.get_label() in set(df["student"]):
                    assert mcolors.to_rgba(line.get_color()) == mcolors.to_rgba(
                        plots.student_color(line.get_label())
                    ), name
        hollow = [
            ln
            for ax in fig.axes
            for ln in ax.get_lines()
            if ln.get_markerfacecolor() == "white" and len(ln.get_xdata())
        ]
        assert hollow, f"{name}: the unstable size is not drawn hollow"
        assert any(
            "unstable" in t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()
        ), name
        plt.close(fig)
    mem = figures.peak_memory_vs_size(df).axes[0]
    fig = mem.figure
    fig.canvas.draw()
    assert "GiB" in mem.get_ylabel() and not any("$" in t.get_text() for t in mem.get_yticklabels())
    plt.close(fig)


def test_crossover_csv_has_its_header_when_no_fp8_student_ran(tmp_path):
    df = analysis.add_derived(_rows().query("student == 'torch_bf16'"))
    written = report.write_files(df, tmp_path)
    cross = pd.read_csv(written["crossover.csv"])
    assert cross.empty and {"tokens", "student", "crossover_hidden", "note"} <= set(cross.columns)
    assert "no FP8 student ran" in report.headline(analysis.crossover(df), "FakeGPU")


def test_headline_environment_and_definitions_open_the_report(df):
    text = report.intro(df)
    first = text.splitlines()[0]
    assert first == (
        "**On FakeGPU, FP8 beats torch bf16 from hidden 2048 at 8,192 tokens/step (TE FP8 (delayed), 1.25x) "
        "and from hidden 4096 at 1,024 tokens/step (TE FP8 (delayed), 1.25x); "
        "below that FP8 is up to 1.25x slower.**"
    )
    for want in ("| measured on | FakeGPU |", "| date |", "**speedup**", "**crossover**", "**loss band**",
                 "**unstable**"):
        assert want in text, want
    assert "smoke test" not in text  # the CPU caveat is for CPU sweeps only
    never = analysis.crossover(df[~((df["tokens"] == 1024) & (df["cfg_hidden"] == 4096))])
    assert "but at no size measured at 1,024 tokens/step" in report.headline(never, "FakeGPU")


def test_report_tables_show_every_row_to_three_significant_digits():
    big = pd.DataFrame({"point": [f"p{i}" for i in range(300)], "peak_mem_mb": 36_838.1, "ratio": 0.99967,
                        "hidden": 8192})
    html = report.table(big).to_html()
    assert html.count("<tr>") == 301 and "..." not in html and "…" not in html
    assert "36,800" in html and ">1.00<" in html and "8192" in html and "e+" not in html
    assert "none" in report.table(big.iloc[:0]).to_html()



def test_the_same_inputs_give_the_same_report_bytes(tmp_path):
    """report.html, its tables and the SVGs carry no random id or date: a report rewritten from unchanged
    results (`--report-only` on a committed sweep) changes no byte."""
    import nbformat

    df = pd.DataFrame({"student": ["te_fp8:delayed", "torch_bf16"], "speedup": [1.2345, 1.0]})
    assert report.table(df, "a").to_html() == report.table(df, "a").to_html()
    assert report.table(df, "a").to_html() != report.table(df, "b").to_html().replace(">b<", ">a<")  # own ids

    svgs = []
    for run in ("first", "second"):
        fig, ax = plt.subplots()
        ax.plot([1, 2, 3], [3, 1, 2])
        svgs.append(results.write_figure(fig, tmp_path / run, "plot")[1].read_bytes())
        plt.close(fig)
    assert svgs[0] == svgs[1]

    pages = []
    for run in ("first", "second"):  # papermill gives its injected cell a new random id on every run
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Report"),
                                             nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]})])
        nbformat.write(nb, str(tmp_path / f"{run}.ipynb"))
        pages.append(report.to_html(tmp_path / f"{run}.ipynb", tmp_path / f"{run}.html").read_bytes())
    assert pages[0] == pages[1]

def _cpu_sweep(tmp_path):
    """A sweep as a CPU machine writes it: torch students only, no GPU, no memory, no CUDA, no TE."""
    rows = _rows().query("student == 'torch_bf16'")
    fp32 = rows.assign(student="torch_fp32", gemm_precision="fp32",
                       step_ms_median=rows["step_ms_median"].values * ([4.1, 0.47, 1.3, 0.9] * 2))
    rows = pd.concat([rows, fp32]).assign(gpu_name=None, compute_capability=None, torch_cuda=None, te_version=None,
                                          peak_mem_allocated_mb=None)
    sweep_dir = tmp_path / "cpu"
    for point, g in rows.groupby("point"):
        results.write_csv(sweep_dir / point / "students.csv", g.drop(columns="point"))
        results.write_json(sweep_dir / point / index.DONE_FILE, {"point": point, "finished_at": "2026-01-02T03:04:05"})
    return sweep_dir, analysis.load_sweep(sweep_dir)


def test_a_cpu_sweep_report_says_its_timings_are_a_smoke_test_and_draws_no_empty_frame(tmp_path, capsys):
    """Issue 33 (ecosystem 5): a CPU sweep's speedups are noise; its report says so with the run's caveat, draws
    no "unknown here" memory or loss-band frame, and its environment reads as the run's (CUDA none, TE not
    installed), not 'unknown'."""
    from workbench.run import slow_path

    sweep_dir, df = _cpu_sweep(tmp_path)
    text = report.intro(df, sweep_dir)
    assert slow_path.CPU_NOTE in text
    assert "CPU · torch 2.11.0 · CUDA none · TE not installed · git abc1234" in text and "unknown |" not in text
    assert set(figures.drawable(df)) == {"speedup_vs_size", "step_time_vs_size"}
    written = report.write_files(df, tmp_path / "out")
    assert "speedup_vs_size.png" in written and "peak_memory_vs_size.png" not in written
    assert "loss_band_vs_size.png" not in written
    for name in ("speedup_vs_size", "step_time_vs_size"):
        fig = figures.show(df, name)
        assert plots.CPU_TIMINGS in fig._suptitle.get_text(), name
        plt.close(fig)
    assert figures.show(df, "peak_memory_vs_size") is None and figures.show(df, "loss_band_vs_size") is None
    out = capsys.readouterr().out
    assert "peak_memory_vs_size: nothing to plot" in out and "loss_band_vs_size: nothing to plot" in out
    gpu = figures.speedup_vs_size(analysis.add_derived(_rows()))  # a GPU sweep: no caveat
    assert plots.CPU_TIMINGS not in gpu._suptitle.get_text()
    plt.close(gpu)


def test_points_over_several_gpus_get_their_scaling_table_and_plot(tmp_path):
    """A sweep whose points ran over 2 GPUs (parallel.nproc): each point's distributed row and its '@1gpu'
    reference row become the report's scaling.csv and plot."""
    two = _rows().query("student != 'torchao_float8:tensorwise'").assign(world_size=2, cfg_nproc=2)
    two = two.assign(run_id=two["point"])
    alone = two.assign(student=two["student"] + "@1gpu", world_size=1, step_ms_median=two["step_ms_median"] * 0.9)
    df = analysis.add_derived(pd.concat([two, alone], ignore_index=True))
    written = report.write_files(df, tmp_path)
    table = pd.read_csv(written["scaling.csv"])
    assert set(table["gpus"]) == {1, 2} and written["scaling.png"].stat().st_size > 0
    assert table[table["gpus"] == 2]["scaling_efficiency"].between(0.85, 0.95).all()
    assert set(table["student"]) == {"torch_bf16", "te_fp8:delayed", "te_fp8:current"}


def _with_jax_rows():
    """_rows plus JAX rows (framework 'jax'): jax:bf16 twice as slow as torch bf16, TE-JAX FP8 current scaling
    faster than jax:bf16 from hidden 1024 on, at both token counts."""
    rows = _rows().assign(framework="torch")
    jax = []
    for r in rows[rows["student"] == "torch_bf16"].to_dict("records"):
        ms = 2 * r["step_ms_median"]
        jax.append({**r, "student": "jax:bf16", "framework": "jax", "step_ms_median": ms})
        fast = r["cfg_hidden"] >= 1024
        jax.append({**r, "student": "jax:fp8_current", "framework": "jax", "gemm_precision": "fp8",
                    "step_ms_median": ms * (0.8 if fast else 1.2)})
    return pd.concat([rows, pd.DataFrame(jax)], ignore_index=True)


def test_jax_rows_are_compared_with_their_own_bf16_student_beside_the_pytorch_crossover():
    df = analysis.add_derived(_with_jax_rows())
    jax_fp8 = df[df["student"] == "jax:fp8_current"]
    assert set(jax_fp8["reference"]) == {"jax:bf16"} and set(df[df["student"] == "te_fp8:delayed"]["reference"]) == {
        "torch_bf16"}
    assert jax_fp8.set_index(["tokens", "cfg_hidden"])["speedup_vs_ref"].round(3).tolist() == [0.833, 1.25, 1.25,
                                                                                                1.25] * 2
    cross = analysis.crossover(df).set_index(["tokens", "student"])
    assert cross.loc[(8192, "jax:fp8_current"), "crossover_hidden"] == 1024
    assert cross.loc[(8192, "jax:fp8_current"), "reference"] == "jax:bf16"
    assert cross.loc[(8192, "te_fp8:delayed"), "crossover_hidden"] == 2048  # the PyTorch answer is unchanged
    text = report.headline(analysis.crossover(df), "FakeGPU")
    torch_part, jax_part = text.split(". On FakeGPU, ")
    assert torch_part.startswith("On FakeGPU, FP8 beats torch bf16 from hidden 2048 at 8,192 tokens/step")
    assert jax_part.startswith("FP8 beats JAX (bf16) from hidden 1024 at 8,192 tokens/step (JAX (fp8_current), 1.25x)")
    fig = figures.speedup_vs_size(df)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "jax:fp8_current (vs jax:bf16)" in labels and "te_fp8:delayed" in labels and "jax:bf16" not in labels
    assert "torch_bf16 / jax:bf16" in fig._suptitle.get_text()
    plt.close(fig)


def test_the_pytorch_reference_opens_the_report_and_a_missing_jax_reference_is_named():
    """Rows sort by student name ('jax:bf16' first): the opening still leads with torch bf16, and an unstable
    reference of either framework is listed. Without jax:bf16 in the backends, the JAX FP8 rows say what is
    missing instead of 'never ran as itself'; a JAX-only sweep's headline is its own."""
    rows = _with_jax_rows()
    rows.loc[(rows["student"] == "jax:bf16") & (rows["cfg_hidden"] == 512), "final_train_loss"] = 0.9  # rose
    text = report.intro(analysis.add_derived(rows))
    assert text.startswith("**On FakeGPU, FP8 beats torch bf16 from hidden 2048")
    assert "the JAX (bf16) reference is unstable" in text
    no_ref = analysis.add_derived(_with_jax_rows().query("student != 'jax:bf16'"))
    cross = analysis.crossover(no_ref).set_index(["tokens", "student"])
    assert cross.loc[(8192, "jax:fp8_current"), "note"] == (
        "no jax:bf16 row at its sizes to compare with: add it to the backends")
    jax_only = analysis.add_derived(_with_jax_rows().query("framework == 'jax'"))
    assert report.headline(analysis.crossover(jax_only), "FakeGPU").startswith("On FakeGPU, FP8 beats JAX (bf16) from")
    alone = analysis.add_derived(_with_jax_rows().query("student == 'jax:fp8_current'"))
    assert report.headline(analysis.crossover(alone), "FakeGPU") == (
        "On FakeGPU, no JAX (bf16) row ran beside its FP8 students, so there is no crossover with it to report.")



def test_a_long_title_stays_inside_a_one_panel_figure():
    """Seen on an H100 sweep: two references and the GPU's full name ran past a one-panel figure's edge."""
    rows = _with_jax_rows()
    rows = rows[rows["cfg_seq_len"] == 1024].assign(gpu_name="NVIDIA H100 80GB HBM3")
    fig = figures.speedup_vs_size(analysis.add_derived(rows))
    fig.canvas.draw()
    box, edge = fig._suptitle.get_window_extent(), fig.bbox
    assert edge.x0 <= box.x0 and box.x1 <= edge.x1, (box, edge)
    assert "NVIDIA H100 80GB HBM3" in fig._suptitle.get_text()
    plt.close(fig)


def test_a_sweep_resumed_on_another_gpu_names_both_in_its_figures():
    rows = _rows()
    rows.loc[rows["cfg_hidden"] == 4096, "gpu_name"] = "OtherGPU"
    fig = figures.step_time_vs_size(analysis.add_derived(rows))
    assert "FakeGPU + OtherGPU" in fig._suptitle.get_text()
    plt.close(fig)
