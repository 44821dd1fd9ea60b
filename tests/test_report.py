"""workbench.report on a synthetic sweep with known answers, and the main notebook's widget panel."""
import pandas as pd
import pytest

from workbench import config, report, results, sweep

SIZES = (512, 1024, 2048, 4096)


def _rows():
    """Two token counts x four sizes; te_fp8:delayed wins from 2048 on (8192 tokens) or 4096 (1024
    tokens), te_fp8:current never wins, torchao is skipped everywhere."""
    cfg = {f"cfg_{k}": (",".join(v) if isinstance(v, list) else v) for k, v in config.from_preset("seed").flat().items()}
    rows = []
    for seq_len in (128, 1024):
        for h in SIZES:
            bf16 = h / 100
            fp8 = {"torch_bf16": bf16, "te_fp8:delayed": bf16 * (1.25 if h < (2048 if seq_len == 1024 else 4096) else 0.8),
                   "te_fp8:current": bf16 * 1.1, "torchao_float8:tensorwise": None}
            for student, ms in fp8.items():
                ok = ms is not None
                rows.append({**cfg, "cfg_hidden": h, "cfg_intermediate": 4 * h, "cfg_seq_len": seq_len, "cfg_batch": 8,
                             "point": f"p{h}-{seq_len}", "student": student, "status": "ok" if ok else "skipped",
                             "gemm_precision": "bf16" if student == "torch_bf16" else "fp8",
                             "reason": "" if ok else "torchao not installed", "gpu_name": "FakeGPU",
                             "step_ms_median": ms, "step_ms_p20": ms and ms * 0.95, "step_ms_p80": ms and ms * 1.05,
                             "initial_loss": 0.7 if ok else None,
                             "final_train_loss": (0.5 if student == "torch_bf16" else 0.55) if ok else None,
                             "eval_mse": 0.5 if ok else None, "peak_mem_allocated_mb": h * (1.0 if student == "torch_bf16" else 1.1) if ok else None})
    return pd.DataFrame(rows)


@pytest.fixture
def df():
    return report.add_derived(_rows())


def test_speedup_is_reference_time_over_student_time(df):
    r = df[(df["student"] == "te_fp8:delayed") & (df["tokens"] == 8192) & (df["cfg_hidden"] == 4096)].iloc[0]
    assert r["speedup_vs_ref"] == pytest.approx(1 / 0.8)
    assert r["final_loss_ratio_vs_ref"] == pytest.approx(1.1) and r["peak_mem_ratio_vs_ref"] == pytest.approx(1.1)
    assert (df[df["student"] == "torch_bf16"]["speedup_vs_ref"] == 1).all()
    assert df[df["status"] == "skipped"]["speedup_vs_ref"].isna().all()  # unknown stays unknown


def test_crossover_is_the_smallest_size_where_fp8_wins(df):
    c = report.crossover(df).set_index(["tokens", "student"])
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
    assert "te_fp8:current" not in set(report.crossover(report.add_derived(rows))["student"])
    old = report.crossover(report.add_derived(rows.drop(columns="gemm_precision")))
    assert "te_fp8:current" in set(old["student"])


def test_loss_band_spans_the_fp8_students(df):
    band = report.loss_band(df)
    assert band["loss_ratio_min"].tolist() == pytest.approx([1.1] * len(band)) and (band["students"] == 2).all()


def test_another_swept_axis_gets_its_own_crossover():
    """Two layer counts in one sweep: each has its own crossover row, never one merged over both."""
    two = _rows()
    three = two.assign(cfg_layers=2)  # with 2 blocks te_fp8:current wins everywhere
    three.loc[three["student"] == "te_fp8:current", "step_ms_median"] *= 0.5
    cross = report.crossover(report.add_derived(pd.concat([two, three], ignore_index=True)))
    cur = cross[(cross["student"] == "te_fp8:current") & (cross["tokens"] == 1024)].set_index("cfg_layers")
    assert pd.isna(cur.loc[3, "crossover_hidden"]) and cur.loc[2, "crossover_hidden"] == min(SIZES)


def test_write_files_and_load_sweep_reads_only_complete_points(tmp_path):
    rows = _rows()
    sweep_dir = tmp_path / "s"
    for point, g in rows.groupby("point"):
        results.write_csv(sweep_dir / point / "students.csv", g.drop(columns="point"))
        results.write_json(sweep_dir / point / sweep.DONE_FILE, {"point": point})
    (sweep_dir / "p4096-128" / sweep.DONE_FILE).unlink()  # a point killed before it finished
    points = sorted(rows["point"].unique())
    results.write_csv(sweep_dir / sweep.INDEX_FILE, pd.DataFrame({"point": points, "status": "done", "error_kind": None, "error": None}))
    df = report.load_sweep(sweep_dir)
    assert "p4096-128" not in set(df["point"]) and df["point"].nunique() == 7
    written = report.write_files(df, tmp_path / "out", sweep_dir=sweep_dir)
    for name in ("sweep.csv", "crossover.csv", "loss_band.csv", "failed_points.csv",
                 *(f"{f}.{e}" for f in report.FIGURES for e in ("png", "svg"))):
        assert written[name].stat().st_size > 0, name
    cross = pd.read_csv(written["crossover.csv"]).set_index(["tokens", "student"])
    assert pd.isna(cross.loc[(1024, "te_fp8:delayed"), "crossover_hidden"])  # its winning size was not complete
    assert cross.loc[(8192, "te_fp8:delayed"), "crossover_hidden"] == 2048


def test_points_of_an_earlier_spec_are_not_mixed_into_the_report(tmp_path):
    spec = sweep.Spec(name="s", preset="cpu-smoke", grid={"hidden": [64, 128]})
    planned = [p.id for p in sweep.plan(spec)]
    sweep_dir = tmp_path / "s"
    for pid in planned[:1] + ["stale00000"]:  # one current point, one left by a changed spec
        results.write_csv(sweep_dir / pid / "students.csv", pd.DataFrame({"student": ["torch_bf16"]}))
        results.write_json(sweep_dir / pid / sweep.DONE_FILE, {"point": pid})
    results.write_json(sweep_dir / sweep.SPEC_FILE, spec.to_dict())
    assert [d.name for d in sweep.complete_points(sweep_dir)] == planned[:1]
    # index rows: the current spec's second point failed; an earlier spec's point was left 'running'
    results.write_csv(sweep_dir / sweep.INDEX_FILE, pd.DataFrame(
        [{"point": planned[0], "status": "done"}, {"point": planned[1], "status": "failed", "error": "boom"},
         {"point": "stale11111", "status": "running"}]))
    assert report.failed_points(sweep_dir)["point"].tolist() == [planned[1]]


# ---- the widget panel (its several-size view is the report's plots) ------------------------------
def test_panel_is_skipped_under_papermill_and_when_turned_off():
    from workbench import panel

    papermill_ns = {"In": ["", "# Parameters\npreset = \"cpu-smoke\"\n"], "show_panel": None}
    assert panel.under_papermill(papermill_ns) and panel.maybe_show(papermill_ns) is None
    assert panel.maybe_show({"In": [""], "show_panel": False}) is None
    assert not panel.under_papermill({"In": ["", "preset = 'seed'"]})


@pytest.mark.slow
def test_panel_run_button_runs_each_size_with_the_notebook_call(tmp_path):
    from workbench import panel

    p = panel.Panel(preset="cpu-smoke", out=tmp_path)
    assert "te_fp8:current" in p.backends.options and p.ratio.value == 4
    p.sizes.value = "32, 48"
    p.backends.value = ("torch_fp32", "torch_bf16")
    p.run_button.click()
    assert [d.name for d in p.last_runs] == ["hidden32", "hidden48"] and not p.run_button.disabled
    df = results.load(p.last_runs[0].parent)
    assert sorted(df["cfg_intermediate"].unique()) == [128, 192] and set(df["student"]) == {"torch_fp32", "torch_bf16"}
    p.sizes.value = "0"  # invalid: said in the panel, nothing run
    p.run_button.click()
    assert p.last_runs and len(list(tmp_path.iterdir())) == 1
