"""Running a bench: the matmul peak probe, then each variant as one `runner.run` into OUT/<run_id>/runs/<variant>/
with the config's `repeats` (the noise figure) and `profile` (one profiled block per timed region, the
cross-check) set from the bench's options, then `tables.aggregate`. A student the config rejects (e.g. a
backend file not in this checkout) or a variant whose run fails becomes an 'error' row with the reason in
runs/<variant>/not_run.csv; the bench goes on."""
from __future__ import annotations

import datetime as _dt
import gc
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from workbench import config as config_mod
from workbench import results
from workbench.bench.rows import observations
from workbench.bench.tables import aggregate
from workbench.bench.targets import load_targets
from workbench.bench.variants import Variant, resolve_variants, variant_config
from workbench.config import ConfigError
from workbench.measure import peaks


@dataclass
class BenchOptions:
    """What `workbench bench` was asked: the preset, --set overrides, variants and how to measure them."""
    preset: str = "auto"
    overrides: dict[str, Any] = field(default_factory=dict)
    variants: list[str] | None = None
    repeats: int = 3
    """Timed blocks per region for the noise figure; the first is the run's own measurement."""
    crosscheck: bool = True
    """One more block per region under torch.profiler (the config's `profile`)."""
    budget_s: float | None = None
    """Skip the variants not yet started once this many seconds have passed (rows say so)."""
    targets: str | None = None
    """A targets file (`--targets`): its goals are judged into targets.json; None: the bench judges no goals."""


def run_bench(opts: BenchOptions, out: str | Path = "results/bench", run_id: str | None = None,
              progress: bool = True) -> Path:
    """Peak probe, every variant, then aggregate(); returns OUT/<run_id>."""
    from workbench.run import runner

    _refuse_measured_overrides(opts.overrides)
    if opts.targets is not None:
        load_targets(opts.targets)  # a malformed file is one line now, not after the bench
    preset = config_mod.default_preset_name() if opts.preset == "auto" else opts.preset
    base_cfg = config_mod.from_preset(preset, **opts.overrides, repeats=opts.repeats, profile=opts.crosscheck)
    runner.check_registered(base_cfg)  # before the peak probe: a mistyped kind or backend is one line, not N rows
    variants = resolve_variants(preset, opts.variants)
    device = runner.resolve_device(base_cfg)
    bench_dir = results.create_run_dir(out, run_id, f"{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-bench-{preset}")
    run_id = bench_dir.name
    t0 = time.perf_counter()
    # rewritten whole at the end; written now so that a bench cut short (a time limit) still aggregates at its preset
    results.write_json(bench_dir / "bench.json", {"schema_version": results.SCHEMA_VERSION, "bench_id": run_id,
                                                   "preset": preset, "status": "running"})

    _say(progress, f"[bench] peak probe on {device}")
    results.write_json(bench_dir / "peak.json", peaks.probe_matmul(device))
    status = {v.name: _variant_in_budget(v, preset, opts, bench_dir, device, t0, progress) for v in variants}
    results.write_json(bench_dir / "bench.json", {
        "schema_version": results.SCHEMA_VERSION, "bench_id": run_id, "preset": preset,
        "requested": {"preset": opts.preset, "overrides": opts.overrides, "variants": opts.variants,
                      "repeats": opts.repeats, "crosscheck": opts.crosscheck, "budget_s": opts.budget_s,
                      "targets": opts.targets},
        "variants": {v.name: {"overrides": v.overrides, "backends": list(v.backends), "doc": v.doc,
                              **status.get(v.name, {})} for v in variants},
        "wall_s": time.perf_counter() - t0, "torchao_version": _version("torchao"),
    })
    aggregate(bench_dir, opts.targets)
    _say(progress, f"[bench] wrote {bench_dir} in {time.perf_counter() - t0:.0f} s")
    return bench_dir


def _refuse_measured_overrides(overrides: dict[str, Any]) -> None:
    """The variants name the students and the bench's own flags say how they are measured."""
    for key in overrides:
        if config_mod.locate(key)[1] in ("backends", "baseline"):
            raise ConfigError("bench takes its students from the variants (--variants); drop --set backends/baseline")
        if config_mod.locate(key)[1] in ("repeats", "profile"):
            raise ConfigError(
                "bench sets repeats and profile from --repeats and --no-crosscheck; drop --set repeats/profile"
            )


def _variant_in_budget(v: Variant, preset: str, opts: BenchOptions, bench_dir: Path, device, t0: float,
                       progress: bool) -> dict[str, Any]:
    """Run variant `v` unless the time budget is spent (its students are then 'skipped' rows), and free
    what it held before the next one."""
    import torch

    elapsed = time.perf_counter() - t0
    if opts.budget_s is not None and elapsed > opts.budget_s:
        status = {"status": "skipped", "reason": f"time budget {opts.budget_s:.0f} s spent ({elapsed:.0f} s)"}
        _write_rejected(bench_dir, v, [{"student": s, "status": "skipped", "reason": status["reason"]}
                                       for s in v.backends])
        return status
    _say(progress, f"[bench] variant {v.name} ({elapsed:.0f} s so far): {v.doc}")
    status = _run_variant(v, preset, opts, bench_dir, progress)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if hasattr(torch, "_dynamo"):
        torch._dynamo.reset()  # compiled students of earlier variants must not eat the recompile limit
    return status


def _run_variant(v: Variant, preset: str, opts: BenchOptions, bench_dir: Path, progress: bool) -> dict[str, Any]:
    """One `runner.run` of the variant's accepted students; its observations.json and not_run.csv beside it."""
    from workbench.run import runner  # torch-heavy: imported when a bench really runs

    t = time.perf_counter()
    measured = {"repeats": opts.repeats, "profile": opts.crosscheck}
    try:
        cfg, rejected = variant_config(preset, {**opts.overrides, **measured}, v)
    except ConfigError as e:  # the variant's own overrides are not allowed here
        rejected, cfg = [{"student": s, "status": "error", "reason": f"config rejected: {e}"} for s in v.backends], None
    if cfg is None:
        _write_rejected(bench_dir, v, rejected)
        return {"status": "error", "reason": "no student of this variant passed config validation", "wall_s": 0.0}
    try:
        run_dir = runner.run(cfg, out=bench_dir / "runs", run_id=v.name, progress=progress,
                             requested={"bench_variant": v.name, "preset": preset, **opts.overrides, **measured,
                                        **v.overrides})
        results.write_json(run_dir / "observations.json", observations(run_dir))
        _write_rejected(bench_dir, v, rejected)  # after the run: runner.run creates its folder itself, new
        return {"status": "ok", "reason": "", "wall_s": time.perf_counter() - t}
    except Exception as e:  # a failing variant is rows that say why, never the end of the bench
        reason = f"{type(e).__name__}: {e}".strip()[:2000]
        _say(progress, traceback.format_exc())
        _write_rejected(bench_dir, v, rejected + [{"student": s, "status": "error", "reason": f"run failed: {reason}"}
                                                  for s in cfg.backends])
        return {"status": "error", "reason": reason, "wall_s": time.perf_counter() - t}


def _write_rejected(bench_dir: Path, v: Variant, rows: list[dict]) -> None:
    """Students that never ran (rejected, skipped, failed run) as rows of runs/<variant>/not_run.csv."""
    path = bench_dir / "runs" / v.name / "not_run.csv"
    if rows:
        results.write_csv(path, pd.DataFrame(rows, columns=["student", "status", "reason"]))


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(msg, flush=True)
