"""The scaling curve of distributed runs (workbench.results.scaling), from synthetic run folders."""
import pandas as pd
import pytest

from workbench import cli, results
from workbench.results import scaling


def _run(root, run_id, gpus, strategy, step_ms, ref_ms, peak, preset="large", ref_floor=1000.0, status="ok",
         ref_status="ok"):
    """A complete distributed run folder: the merged N-GPU row and its '@1gpu' reference row (both started
    from 1000 MB allocated unless `ref_floor` says the reference started on the distributed student's leftovers)."""
    d = root / run_id
    d.mkdir()
    common = {"run_id": run_id, "cfg_preset": preset, "cfg_strategy": strategy, "cfg_nproc": gpus}
    rows = [
        {"student": "te_fp8:delayed", "status": status, "world_size": gpus, "strategy": strategy,
         "step_ms_median": step_ms, "tokens_per_s": gpus * 8192 / (step_ms / 1e3), "peak_mem_allocated_mb": peak,
         "mem_floor_mb": 1000.0,
         **common},
        {"student": "te_fp8:delayed@1gpu", "status": ref_status, "world_size": 1, "step_ms_median": ref_ms,
         "tokens_per_s": 8192 / (ref_ms / 1e3), "peak_mem_allocated_mb": 5000.0 + ref_floor, "mem_floor_mb": ref_floor,
         **common},
        {"student": "torch_bf16", "status": "error", "reason": "boom", "world_size": gpus, **common},
    ]
    results.write_csv(d / "students.csv", pd.DataFrame(rows))
    results.mark_complete(d, run_id=run_id)
    return d


def test_points_line_up_one_curve_per_strategy_with_its_own_one_gpu_point(tmp_path):
    _run(tmp_path, "ddp-2", 2, "ddp", 22.0, 20.0, 6100.0)
    _run(tmp_path, "ddp-4", 4, "ddp", 25.0, 21.0, 6200.0)
    _run(tmp_path, "fsdp2-2", 2, "fsdp2", 24.0, 20.0, 4000.0)
    t = scaling.points(results.load(tmp_path))
    ddp = t[t["strategy"] == "ddp"].set_index("gpus")
    assert list(ddp.index) == [1, 2, 4] and set(t["student"]) == {"te_fp8:delayed"}  # the error row is no point
    # median of both runs' references
    assert ddp.loc[1, "step_ms_median"] == pytest.approx(20.5) and ddp.loc[1, "runs"] == 2
    assert ddp.loc[2, "scaling_efficiency"] == pytest.approx(20.5 / 22.0)
    assert ddp.loc[4, "tokens_per_s_per_gpu"] == pytest.approx(8192 / 0.025)
    fsdp = t[t["strategy"] == "fsdp2"].set_index("gpus")
    assert (
        fsdp.loc[2, "scaling_efficiency"] == pytest.approx(20.0 / 24.0)
        and fsdp.loc[2, "peak_mem_allocated_mb"] == 4000.0
    )


def test_a_point_that_fell_back_says_so_and_gets_no_efficiency_against_a_point_that_did_not(tmp_path):
    """A TE student that ran as PyTorch autocast on the GPUs (a fallback row) is no TE scaling point: its
    status says fallback, and its step against the TE one-GPU step is no efficiency."""
    _run(tmp_path, "ddp-2", 2, "ddp", 22.0, 20.0, 6100.0, status="fallback")
    _run(tmp_path, "fsdp2-2", 2, "fsdp2", 24.0, 20.0, 4000.0, status="fallback", ref_status="fallback")
    t = scaling.points(results.load(tmp_path)).set_index(["strategy", "gpus"])
    assert t.loc[("ddp", 1), "status"] == "ok" and t.loc[("ddp", 2), "status"] == "fallback"
    assert pd.isna(t.loc[("ddp", 2), "scaling_efficiency"])
    assert t.loc[("fsdp2", 2), "status"] == "fallback"  # both fell back: the same thing ran at 1 and 2 GPUs
    assert t.loc[("fsdp2", 2), "scaling_efficiency"] == pytest.approx(20.0 / 24.0)


def test_memory_per_gpu_is_the_students_peak_above_its_floor_so_leftovers_do_not_count(tmp_path):
    """A reference that started on 1.7 GB a DDP student left behind (seen on two H200s) has a peak 1.7 GB
    high; what it adds above its floor is the same as a reference that started clean."""
    _run(tmp_path, "clean", 2, "ddp", 22.0, 20.0, 6100.0)
    _run(tmp_path, "leftover", 2, "fsdp2", 24.0, 20.0, 4000.0, ref_floor=2700.0)
    t = scaling.points(results.load(tmp_path)).set_index(["strategy", "gpus"])
    assert t.loc[("ddp", 1), "student_mem_mb"] == t.loc[("fsdp2", 1), "student_mem_mb"] == 5000.0
    assert t.loc[("fsdp2", 1), "peak_mem_allocated_mb"] == 7700.0  # the raw peak stays in the table
    assert t.loc[("ddp", 2), "student_mem_mb"] == 5100.0


def test_the_command_writes_the_table_and_the_plot(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    _run(tmp_path / "runs", "ddp-2", 2, "ddp", 22.0, 20.0, 6100.0)
    assert cli.main(["scaling", str(tmp_path / "runs"), "--out", str(tmp_path / "s")]) == 0
    assert {"scaling.csv", "scaling.png", "scaling.svg"} <= {p.name for p in (tmp_path / "s").iterdir()}
    assert "te_fp8:delayed" in capsys.readouterr().out


def test_the_plot_has_one_row_of_panels_per_preset_each_with_its_own_curves(tmp_path):
    """Shapes differ by x in tokens/s: one preset's curves must not squash another's onto one axis."""
    import matplotlib.pyplot as plt

    _run(tmp_path, "large-ddp-2", 2, "ddp", 22.0, 20.0, 6100.0)
    _run(tmp_path, "lmb-fsdp2-2", 2, "fsdp2", 60.0, 50.0, 20000.0, preset="lm-b")
    fig = scaling.figure(scaling.points(results.load(tmp_path)))
    titles = [ax.get_title() for ax in fig.axes]
    assert len(fig.axes) == 6 and titles[0].startswith("large:") and titles[3].startswith("lm-b:")
    memory = fig.axes[5].get_lines()
    assert [line.get_label() for line in memory] == ["fsdp2 te_fp8:delayed"]
    assert list(memory[0].get_ydata()) == pytest.approx([5000.0 / 1024, 19000.0 / 1024])  # above the floor
    plt.close(fig)


def test_runs_without_distributed_rows_are_one_clear_error(tmp_path):
    d = tmp_path / "old"
    d.mkdir()
    results.write_csv(
        d / "students.csv", pd.DataFrame([{"student": "torch_bf16", "status": "ok", "step_ms_median": 1.0}])
    )
    results.mark_complete(d, run_id="old")
    assert cli.main(["scaling", str(tmp_path), "--out", str(tmp_path / "s")]) == 1


def test_a_folder_without_complete_runs_is_one_line(tmp_path, capsys):
    assert cli.main(["scaling", str(tmp_path), "--out", str(tmp_path / "s")]) == 1
    assert "no complete run" in capsys.readouterr().err


@pytest.mark.parametrize("world_size", ["eight", "inf", "0", "2.5", "1e30"])
def test_a_crafted_world_size_is_one_line_naming_the_file(tmp_path, capsys, world_size):
    """A run folder whose rows say a world_size that is no number of GPUs (crafted, its done.json rewritten
    to match) is refused with one line naming its students.csv, not a traceback or a made-up point."""
    d = _run(tmp_path, "ddp-2", 2, "ddp", 22.0, 20.0, 6100.0)
    rows = results.read_csv(d / "students.csv")
    rows["world_size"] = rows["world_size"].astype(object)
    rows.loc[0, "world_size"] = world_size
    results.write_csv(d / "students.csv", rows)
    results.mark_complete(d, run_id="ddp-2")
    assert cli.main(["scaling", str(tmp_path), "--out", str(tmp_path / "s")]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(d / "students.csv") in err and "world_size" in err, err
