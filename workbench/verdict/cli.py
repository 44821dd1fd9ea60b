"""The `workbench verdict` command: predict (any machine), measure (a CUDA GPU: measured.py), write the page.

    python -m workbench verdict llama-3.2-1b --preset hf-llama-1b --out results/verdict/llama-3.2-1b
    python -m workbench verdict models/my-model --preset hf-llama-4l --set model.batch=8 --out DIR --peak peak.json

MODEL is a Hugging Face folder (config.json is all the prediction reads) or an hf-init shape name (the GPU part
writes its random-weight folder first). The preset and --set give the tokens a step (model.batch x model.seq_len);
the model's own fields come from its config. On a CUDA GPU the bench of measured.variants_for() runs into
OUT/bench/ with the model as its own teacher.
"""
from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from workbench import config, results
from workbench.verdict import measured, page, quality
from workbench.verdict.predict import DEFAULT_GPU, predict


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a Hugging Face model folder (its config.json) or an hf-init shape name")
    p.add_argument("--preset", default="hf-llama-1b", choices=config.PRESET_CHOICES, metavar="PRESET",
                   help="the run whose tokens a step (batch x seq_len) the verdict is for (default hf-llama-1b)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a config field, e.g. --set model.batch=8")
    p.add_argument("--out", required=True, help="the folder for verdict.json, verdict.md, verdict.png / .svg")
    p.add_argument("--gpu", default=None, help="the GPU whose datasheet peaks apply (default: this machine's CUDA GPU, "
                                               f"the one measured; {DEFAULT_GPU!r} where there is none)")
    p.add_argument("--budget-s", type=float, default=360.0,
                   help="the GPU part's bench: variants not started after this many seconds become rows saying so "
                        "(default 360: the full Llama-3.2-1B shape's verdict within 8 minutes)")
    p.add_argument("--peak", default=None, help="a bench's peak.json: its measured GEMM peaks (and GPU) "
                                                "replace the datasheet's in the ideal bound; the expected times "
                                                "stay the H200 calibration's")
    p.add_argument("--study", dest="studies", action="append", default=[], metavar="DIR",
                   help="a study folder (`workbench study`; repeatable): what FP8 does to what the student learns "
                        "over training, each arm's gap to torch bf16 against that study's own noise floor")


def this_gpu() -> str:
    """torch's name for this machine's first CUDA GPU (what the measured rows run on), else DEFAULT_GPU."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else DEFAULT_GPU


def command(args: argparse.Namespace) -> str:
    """The command line that reproduces this verdict."""
    parts = ["python -m workbench verdict", args.model, "--preset", args.preset,
             *[f"--set {o}" for o in args.overrides], "--out", args.out]
    if args.gpu:
        parts += ["--gpu", args.gpu]
    if args.peak:
        parts += ["--peak", args.peak]
    if args.budget_s != 360.0:
        parts += ["--budget-s", f"{args.budget_s:g}"]
    for d in args.studies:
        parts += ["--study", d]
    return " ".join(shlex.quote(p) if " " in p and not p.startswith(("python", "--set")) else p for p in parts)


def run(model: str, preset: str = "hf-llama-1b", overrides: dict | None = None, out: str | Path = "results/verdict",
        gpu: str | None = None, peak: str | None = None, budget_s: float = 360.0, command_line: str = "",
        studies: list[str | Path] | str | None = None) -> dict:
    """Predict, measure where a CUDA GPU is, write verdict.json / .md / .png into `out`; returns the verdict.
    What `workbench verdict` and notebooks/verdict.ipynb call. `gpu` None: the GPU the measured part runs on
    (at 05acfd3 an H100's measured rows stood beside a prediction for the default H200), DEFAULT_GPU without one.
    `studies`: study folders whose gaps are the quality part (verdict/quality.py), read before anything runs."""
    studied = quality.read(studies or [], model)  # before any GPU time: a study that cannot be read stops here
    overrides = dict(overrides or {})
    gpu = gpu or this_gpu()
    cfg = config.from_preset(preset, **overrides)
    peak_data = results.read_json(Path(peak)) if peak else None
    prediction = predict(model, cfg.model.batch, cfg.model.seq_len, gpu=gpu, peak=peak_data)
    verdict = {"schema": prediction["schema"], "model": model, "preset": preset, "set": overrides,
               "command": command_line, "prediction": prediction,
               "measured": measured.measure(model, prediction, preset, overrides, Path(out), budget_s),
               "quality": studied}
    verdict["headline"] = page.headline(verdict)
    verdict["files"] = [p.name for p in page.write(verdict, Path(out))]
    return verdict


def main(args: argparse.Namespace) -> int:
    overrides = config.parse_set(args.overrides)
    verdict = run(args.model, args.preset, overrides, args.out, args.gpu, args.peak, args.budget_s, command(args),
                  args.studies)
    print(verdict["headline"])
    print(json.dumps({"out": args.out, "files": verdict["files"]}))
    return 0
