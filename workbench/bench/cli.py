"""`workbench bench`: its flags and what each does (run a bench, list the catalogue, rebuild or render files)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workbench import config as config_mod
from workbench import results
from workbench.bench.cells import read
from workbench.bench.run import BenchOptions, run_bench
from workbench.bench.tables import README_BEGIN, README_END, aggregate, markdown, readme, update_readme
from workbench.bench.targets import load_targets
from workbench.bench.variants import DEFAULT_VARIANTS, VARIANTS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="auto", choices=config_mod.PRESET_CHOICES, metavar="PRESET",
                   help=config_mod.preset_help())
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="config override applied to every variant, e.g. --set iters=50")
    p.add_argument("--variants", default=None,
                   help="comma-separated variant names (default: the preset's list; see --list)")
    p.add_argument("--repeats", type=int, default=3, help="timed blocks per region for the noise figure")
    p.add_argument("--targets", metavar="FILE", default=None,
                   help="a JSON file of goals to judge into targets.json and bench.md (the project's own: "
                        "results/reference/bench_targets.json); without it the bench judges no goals. With "
                        "--aggregate: judge them anew (without: a folder's targets.json is kept as it is)")
    p.add_argument("--no-crosscheck", action="store_true", help="skip the profiled block per timed region")
    p.add_argument("--budget-s", type=float, default=None, help="skip variants not started after this many seconds")
    p.add_argument("--out", default="results/bench", help="parent folder of the bench folder")
    p.add_argument("--run-id", default=None, help="bench folder name (default: <timestamp>-bench-<preset>)")
    p.add_argument("--list", action="store_true", help="print the variant catalogue and exit")
    p.add_argument("--markdown", metavar="DIR", default=None,
                   help="print the Markdown tables of every bench.csv in or below DIR and exit")
    p.add_argument("--readme", metavar="PATH", default=None,
                   help="with --markdown: write the tables between the bench markers of PATH (the H200 README)")
    p.add_argument("--write-readme", metavar="DIR", default=None,
                   help="write DIR/README.md: the targets of every bench below DIR in one table, then their rows")
    p.add_argument("--aggregate", metavar="DIR", default=None,
                   help="rebuild bench.csv, crosscheck.json, bench.md and plots of DIR from its files "
                        "(and targets.json with --targets)")


def main(args: argparse.Namespace) -> int:
    """One of: the catalogue (--list), files rebuilt or rendered from a folder, or a bench run."""
    if args.list:
        for v in VARIANTS.values():
            print(f"{v.name:28s} {json.dumps(v.overrides):70s} {','.join(v.backends)}\n{'':28s} {v.doc}")
        for preset, names in DEFAULT_VARIANTS.items():
            print(f"default for {preset}: {','.join(names)}")
        return 0
    if args.targets:
        load_targets(args.targets)  # checked before anything runs or is rewritten: one line naming the field
    if args.aggregate:  # bench.json, not bench.csv: a bench cut short before its aggregate has none yet
        for d in results.folders_with(args.aggregate, "bench.json"):
            aggregate(d, args.targets)
            print(f"aggregated {d}")
        return 0
    if args.write_readme:
        results.write_bytes(Path(args.write_readme) / "README.md", readme(args.write_readme).encode())
        print(f"wrote {Path(args.write_readme) / 'README.md'}")
        return 0
    if args.markdown:
        table = markdown(args.markdown)
        if args.readme:
            if not update_readme(args.readme, table):
                print(f"{args.readme}: no '{README_BEGIN}' ... '{README_END}' markers", file=sys.stderr)
                return 1
            print(f"updated {args.readme}")
        else:
            print(table)
        return 0
    opts = BenchOptions(preset=args.preset, overrides=config_mod.parse_set(args.overrides),
                        variants=[s.strip() for s in args.variants.split(",") if s.strip()] if args.variants else None,
                        repeats=args.repeats, crosscheck=not args.no_crosscheck, budget_s=args.budget_s,
                        targets=args.targets)
    bench_dir = run_bench(opts, out=args.out, run_id=args.run_id)
    judged = {"targets": (read(bench_dir / "targets.json") or {}).get("targets")} if args.targets else {}
    print(json.dumps({"bench_dir": str(bench_dir), **judged}, default=str))
    return 0
