"""The command-line arguments of a run (--preset, --set, --out, --run-id): every command that starts one
(`run`, `notebook`, `teacher`) takes the same, so they live with the run rather than in the CLI above it."""
from __future__ import annotations

import argparse


def add_run_arguments(p: argparse.ArgumentParser, preset: str = "auto", preset_help: str | None = None) -> None:
    """The run's arguments on `p`; `preset` is --preset's default and `preset_help` its help (a command that takes
    only some presets, as `teacher`, names its own default)."""
    from workbench import config

    p.add_argument("--preset", default=preset, choices=config.PRESET_CHOICES, metavar="PRESET",
                   help=preset_help or config.preset_help())
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a config field, e.g. --set hidden=1024 --set backends=torch_bf16,te_fp8:current")
    p.add_argument("--out", default="results", help="parent folder of the run folder")
    p.add_argument("--run-id", default=None,
                   help="run folder name, new (letters, digits, . _ -; default: <timestamp>-<preset>)")
