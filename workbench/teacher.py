"""`workbench teacher`: train (or find) the language-model teacher of a config, before any run needs it.

    python -m workbench teacher                      # gpt-cpu's teacher, the default
    python -m workbench teacher --preset gpt-cpu --set teacher_steps=600
    python -m workbench teacher --preset lm-distill --set seed=2

The teacher is the one a `run` with the same config uses (model.kind gpt/llama with lm.teacher=train): it
is trained on the corpus's train split and cached under <out>/cache/teacher-<key>/ (its weights, and
meta.json last), keyed by its shape, the text, the steps, the learning rate and the seed. Prints where it
is and its held-out perplexity; a second call finds it instead of training again.
"""
from __future__ import annotations

import json
from pathlib import Path

from workbench import config
from workbench.config import ConfigError

DEFAULT_PRESET = "gpt-cpu"  # trains its teacher in about a minute on a CPU


def teacher_presets() -> list[str]:
    """The presets whose config trains a language-model teacher here: the ones this command takes as they are."""
    from workbench.models import kinds

    made = {name: make() for name, make in config.PRESETS.items()}
    return [name for name, c in made.items() if kinds.is_lm(c.model.kind) and c.lm.teacher == "train"]


def add_arguments(p) -> None:
    from workbench.run.arguments import add_run_arguments

    add_run_arguments(p, preset=DEFAULT_PRESET, preset_help=f"a preset that trains a teacher: "
                      f"{' | '.join(teacher_presets())} (default {DEFAULT_PRESET}); another with "
                      "--set kind=gpt --set teacher=train")


def main(args) -> int:
    from workbench.models import kinds
    from workbench.run import runner
    from workbench.train import lm_task, task_setup
    from workbench.train.objectives import lm_metrics

    cfg = config.from_preset(args.preset, **config.parse_set(args.overrides))
    if not kinds.is_lm(cfg.model.kind) or cfg.lm.teacher != "train":
        raise ConfigError(f"workbench teacher trains a language-model teacher: take --preset "
                          f"{' or '.join(teacher_presets())}, or set model.kind to gpt or llama and lm.teacher to "
                          f"'train' (got preset {cfg.preset!r}, kind {cfg.model.kind!r}, teacher {cfg.lm.teacher!r})")
    device = runner.resolve_device(cfg)
    tdtype = runner.teacher_dtype(cfg, device)
    task = lm_task.LMTask(cfg, device, tdtype, Path(args.out) / "cache", with_batches=False)
    acc = lm_metrics.LMMetrics(cfg.distill.loss_chunk_tokens)
    for window in task.text.batches("heldout", cfg.model.batch, cfg.model.seq_len, cfg.train.eval_batches,
                                    task_setup.teacher_seed(cfg) + 3):
        w = window.to(device)
        with task.teacher_precision.forward():
            acc.add(task.teacher(w[:, :-1]), None, w[:, 1:])
    print(json.dumps({**task.info, "teacher_heldout_ppl": acc.result()["heldout_ppl"]}, default=str))
    return 0
