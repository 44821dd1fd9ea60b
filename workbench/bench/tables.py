"""bench.csv, crosscheck.json, bench.md, the plots (and targets.json, given a targets file) of a bench folder,
rebuilt from its other files (`aggregate`), and the Markdown of any folder of benches: each preset's table of
rows, the targets table, and the README of results/reference/<gpu>/bench/ - all read from the files alone."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from workbench import results
from workbench.bench.cells import num, read, truthy
from workbench.bench.crosscheck import crosscheck_report
from workbench.bench.rows import bench_rows, with_fastest_bf16
from workbench.bench.targets import evaluate_targets, load_targets
from workbench.measure import peaks


def aggregate(bench_dir: str | Path, targets: str | Path | None = None) -> pd.DataFrame:
    """(Re)build bench.csv, crosscheck.json, bench.md and the plots from the files. With a `targets` file
    (`--targets`), targets.json is judged anew from its goals; without one, a targets.json already in the
    folder (an older bench's, or one run with --targets) is kept as it is and shown in bench.md, and a folder
    without one gets none: a bench holds only the goals it was given."""
    from workbench.results import plots

    bench_dir = Path(bench_dir)
    df = bench_rows(bench_dir)
    preset = (read(bench_dir / "bench.json") or {}).get("preset")
    results.write_csv(bench_dir / "bench.csv", df)
    results.write_json(bench_dir / "crosscheck.json", crosscheck_report(df, preset, bench_dir))
    if targets is not None:
        results.write_json(bench_dir / "targets.json", {
            "schema_version": results.SCHEMA_VERSION, "preset": preset, "source": str(targets),
            "targets": evaluate_targets(df, preset, load_targets(targets), bench_dir)})
    results.write_bytes(bench_dir / "bench.md", markdown(bench_dir).encode())
    plots.plot_bench(bench_dir)
    return df


def _fmt(x, spec: str = ".3g", suffix: str = "") -> str:
    v = num(x)
    return "–" if v is None else f"{v:{spec}}{suffix}"


def bench_dirs(path: str | Path) -> list[Path]:
    return results.folders_with(path, "bench.csv")


def markdown(path: str | Path, targets: bool = True) -> str:
    """Markdown tables of every bench.csv in or below `path`: one per preset, each followed by its targets
    unless `targets` is False (the README, whose one table of every preset's targets comes first)."""
    parts = []
    for d in bench_dirs(path):
        df = results.read_csv(d / "bench.csv")
        parts.append(_markdown_one(d, df, targets))
    return "\n\n".join(parts) + "\n" if parts else f"_no bench.csv in or below {path}_\n"


def _markdown_one(d: Path, df: pd.DataFrame, targets: bool = True) -> str:
    """One bench folder's section: its heading, its rows fastest first, what did not run, its targets."""
    if "fastest_bf16_row" not in df or df["fastest_bf16_row"].isna().all():  # a bench.csv from before the column
        records = df.to_dict("records")
        with_fastest_bf16(records)
        df = pd.DataFrame(records)
    ran = results.ran(df).sort_values("step_ms_median")
    head = _heading(d, df)
    lines = ["| variant | student | step ms (median) | TFLOP/s | % measured peak | % datasheet peak "
             "| × fastest bf16 | × tutorial bf16 | spread % | kernel/event | peak MiB | capture ms | compile ms |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in ran.to_dict("records"):
        # not TE: say so
        who = f"`{r['student']}`" + (" (fallback: torch autocast)" if r["status"] == "fallback" else "")
        host = " (host-bound)" if truthy(r.get("host_bound")) else ""
        lines.append(
            f"| {md_cell(r['variant'])} | {md_cell(who)} | {_fmt(r['step_ms_median'])} | {_fmt(r['tflops'], '.3g')} "
            f"| {_fmt(r['pct_of_measured_peak'], '.0f')} | {_fmt(r['pct_of_datasheet_peak'], '.0f')} "
            f"| {_fmt(r.get('speedup_vs_fastest_bf16'), '.2f')} "
            f"| {_fmt(r['speedup_vs_tutorial'], '.2f')} | {_fmt(r['median_spread_pct'], '.1f')}{host} "
            f"| {_fmt(r['kernel_to_event_ratio'], '.2f')} | {_fmt(r.get('peak_mem_allocated_mb'), '.0f')} "
            f"| {_fmt(r['capture_ms'], '.0f')} | {_fmt(r['compile_ms'], '.0f')} |"
        )
    not_ran = df[~df["status"].isin(results.RAN)]
    if len(not_ran):
        lines.append(
            "\nNot run here: "
            + "; ".join(
                f"{r['variant']} / `{r['student']}` ({r['status']}: {str(r['reason'])[:120]})"
                for r in not_ran.to_dict("records")
            )
        )
    tlines = targets_table([d], with_preset=False) if targets else ""
    return head + "\n" + "\n".join(lines) + ("\n\n" + tlines if tlines else "")


def _heading(d: Path, df: pd.DataFrame) -> str:
    """Preset, GPU and versions, the matmul peaks measured in the run and the datasheet's, the tutorial rows."""
    first = df.iloc[0].to_dict() if len(df) else {}
    peak = read(d / "peak.json") or {}
    meas = {p: peaks.measured_tflops(peak, p) for p in peaks.PRECISIONS}
    gpu = first.get("gpu_name") if isinstance(first.get("gpu_name"), str) else "CPU"
    te = first.get("te_version") if isinstance(first.get("te_version"), str) else "not installed"
    head = (f"### `{first.get('preset')}` preset — {gpu}, torch {first.get('torch')}, TE {te}"
            f" ({d.name})\n\nMeasured matmul peak in this run (TFLOP/s): "
            + ", ".join(f"{p} {_fmt(v, '.4g')}" for p, v in meas.items()) + "; datasheet"
            + (f" ({peak['datasheet']['gpu']})" if peak.get("datasheet") else "") + ": "
            + (", ".join(f"{p} {_fmt(v, 'g')}" for p, v in ((peak.get('datasheet') or {}).get('tflops') or {}).items())
               if peak.get("datasheet") else "unknown for this GPU") + ".\n")
    tut = next((r for r in df.get("tutorial_rows", pd.Series(dtype=object)) if isinstance(r, str)), None)
    best = next((r for r in df.get("fastest_bf16_row", pd.Series(dtype=object)) if isinstance(r, str)), None)
    ms = next((v for v in df.get("fastest_bf16_ms", pd.Series(dtype=float)) if pd.notna(v)), None)
    head += (f"\n× fastest bf16: against the fastest bf16 row of this bench, {best} ({_fmt(ms, '.4g')} ms).\n" if best
             else "\n× fastest bf16: no bf16 row ran in this bench, so no ratio.\n")
    return head + (f"\n× tutorial: the tutorial-equivalent student's step measured in this bench ({tut}).\n" if tut
                   else "\n× tutorial: not measured in this bench (no tutorial-equivalent student ran), so no ratio.\n")


def _own_targets(doc: dict) -> list[dict]:
    """A targets.json's targets judged at its bench's preset (another preset's are left out)."""
    return [t for t in doc.get("targets") or []
            if not (t.get("achieved") is None and str(t.get("note", "")).startswith("evaluated on"))]


def _breakdown(cats: dict | None, top: int = 6) -> str:
    """'gemm 15.2, optimizer 4.7, …' (ms per step): the profiler's view of what takes a missed target's time
    (or a split target's, such as H2)."""
    return ", ".join(f"{k} {v:.3g}" for k, v in list((cats or {}).items())[:top]) or "–"


def _split(t: dict, met: bool | None) -> str:
    """The split cell: a missed target's, or a report target's that carries one (H2); never a met one's."""
    return _breakdown(t.get("breakdown")) if met is not True and t.get("breakdown") else ""


def targets_table(dirs: list[Path], with_preset: bool = True) -> str:
    """The Markdown table of the targets.json of every bench folder in `dirs` (each at its own preset):
    goal, best achieved, by which row, met, and where missed (or asked for: H2) the profiler's split of that
    row's step."""
    head = (["preset"] if with_preset else []) + ["target", "what", "goal", "achieved", "by", "met",
                                                  "where the time goes (ms/step), if missed or asked"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for d in dirs:
        doc = read(d / "targets.json") or {}
        preset = doc.get("preset")
        for t in _own_targets(doc):
            met = t.get("met", t.get("pass"))  # benches before 'met' wrote 'pass'
            cells = ([f"`{preset}`"] if with_preset else []) + [
                t["id"], t["what"], t["target"], _fmt(t["achieved"], ".3g"), t["by"] or "–",
                {True: "yes", False: "**no**", None: "–"}[met], _split(t, met)]
            lines.append("| " + " | ".join(map(md_cell, cells)) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def md_cell(x) -> str:
    """A Markdown table cell: a '|' in the text (e.g. '|kernel/event - 1|') would split the row."""
    return str(x).replace("|", "\\|")


def readme(path: str | Path) -> str:
    """The README of a folder of benches (results/reference/h200/bench/), generated from its files: the
    targets of every preset in one table, then each preset's table of rows."""
    dirs = bench_dirs(path)
    return (
        "# Benchmarks\n\nGenerated by `python -m workbench bench --write-readme DIR` from the files below "
        "(targets.json and bench.csv of each preset); do not edit by hand.\n\n## Targets\n\n"
        + (targets_table(dirs) or "_no targets.json here_")
        + "\n\n## Every row\n\n"
        + markdown(path, targets=False)
    )


README_BEGIN, README_END = "<!-- bench:begin -->", "<!-- bench:end -->"


def update_readme(readme: str | Path, table: str) -> bool:
    """Replace the text between the bench markers in `readme`; False when the markers are missing."""
    readme = Path(readme)
    text = readme.read_text()
    a, b = text.find(README_BEGIN), text.find(README_END)
    if a < 0 or b < a:
        return False
    new = text[: a + len(README_BEGIN)] + "\n" + table.strip() + "\n" + text[b:]
    results.write_bytes(readme, new.encode())
    return True
