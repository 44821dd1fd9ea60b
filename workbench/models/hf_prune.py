"""A student initialised from its teacher: `workbench hf-prune` keeps a chosen subset of a Hugging Face model's
decoder layers, copies them, the embeddings, the final norm and the head bit for bit, and shares the tokenizer:
the depth-pruned students of DistilBERT, Minitron and Sheared-LLaMA. `--init random` writes the same pruned shape
with Hugging Face's random initialisation instead (seeded): the other arm of the question "does starting from the
teacher matter?".

    python -m workbench hf-prune models/smollm2-135m --layers every:3 --out models/smollm2-pruned-every3
    python -m workbench hf-prune models/smollm2-135m --layers first:10 --init random --seed 1 --out models/rand10
    then: workbench run ... --set lm.teacher=models/smollm2-135m --set lm.student=models/smollm2-pruned-every3

--layers: `every:N` (layers 0, N, 2N, ...), `first:K`, `last:K`, or the indices `0,3,6` (sorted, no repeats).
The folder's hf_prune.json records the teacher folder, its weights' sha256, the layers kept and the init; a run
with the folder as lm.student copies it into task.json (`student_source`). Per-layer config lists (Gemma's
`layer_types`, SmolLM3's `no_rope_layers`) keep the kept layers' entries. The folder is written beside its
destination and renamed into place; every transformers call is offline and runs no code from the folder.
"""
from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from workbench.config import ConfigError

INITS = ("teacher", "random")
PER_LAYER_FIELDS = ("layer_types", "no_rope_layers")  # config lists with one entry per decoder layer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "chat_template.jinja", "generation_config.json")
SOURCE_FILES = ("hf_import.json", "hf_init.json")  # where the teacher folder came from, carried into hf_prune.json


def parse_layers(spec: str, n: int) -> list[int]:
    """The kept layer indices of a model with n layers; ConfigError naming the allowed forms."""
    allowed = "every:N, first:K, last:K or indices such as 0,3,6"
    kind, _, arg = spec.partition(":")
    try:
        if kind == "every":
            keep = list(range(0, n, int(arg)))
        elif kind in ("first", "last"):
            k = int(arg)
            keep = list(range(k)) if kind == "first" else list(range(n - k, n))
            if not 0 < k <= n:
                raise ValueError
        else:
            keep = [int(i) for i in spec.replace(" ", "").split(",")]
    except ValueError:
        raise ConfigError(f"hf-prune --layers {spec!r}: not one of {allowed} (the teacher has {n} layers)") from None
    if not keep or keep != sorted(set(keep)) or keep[0] < 0 or keep[-1] >= n:
        raise ConfigError(f"hf-prune --layers {spec!r} gives {keep}: the indices must be sorted, distinct and in "
                          f"0..{n - 1} (the teacher has {n} layers)")
    return keep


def _pruned(teacher, keep: list[int]):
    """The teacher model with only the kept decoder layers, renumbered, its config updated."""
    from torch import nn

    layers = teacher.model.layers  # every family the workbench converts keeps its decoder layers here
    kept = nn.ModuleList([layers[i] for i in keep])
    for new, layer in enumerate(kept):  # the KV-cache index each attention module carries
        for module in layer.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = new
    teacher.model.layers = kept
    cfg = teacher.config
    for field in PER_LAYER_FIELDS:
        value = getattr(cfg, field, None)
        if isinstance(value, list) and len(value) == len(layers):
            setattr(cfg, field, [value[i] for i in keep])
    cfg.num_hidden_layers = len(keep)
    return teacher


def write(teacher: str | Path, layers: str, out: str | Path, init: str = "teacher", seed: int = 0) -> Path:
    """Write the pruned student of `teacher` (module doc) to the new folder `out`; return it."""
    import torch
    from transformers import AutoModelForCausalLM

    from workbench.data.cache import sha256
    from workbench.models.hf import OFFLINE, read_config, refuse_remote_code
    from workbench.results import check_new_folder, read_json, staged_folder, write_json

    if init not in INITS:
        raise ConfigError(f"hf-prune --init {init!r} is not one of {', '.join(INITS)}")
    teacher, out = Path(teacher), check_new_folder(out, "hf-prune --out")
    refuse_remote_code(teacher)
    n = read_config(teacher).num_hidden_layers
    keep = parse_layers(layers, n)  # before loading: a bad spec fails at once
    t0 = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(teacher, dtype="auto", **OFFLINE)  # as stored: copies stay exact
    model = _pruned(model, keep)
    if init == "random":
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(model.config, dtype=model.dtype, trust_remote_code=False)
    weights = sorted(teacher.glob("*.safetensors"))
    with staged_folder(out) as tmp:
        model.save_pretrained(tmp)
        for name in TOKENIZER_FILES:  # the tokenizer is the teacher's, byte for byte
            if (teacher / name).exists():
                shutil.copy2(teacher / name, tmp / name)
        write_json(tmp / "hf_prune.json", {
            "teacher": str(teacher.resolve()), "teacher_layers": n, "layers": keep, "layers_spec": layers,
            "init": init, "seed": seed if init == "random" else None,
            "teacher_weights_sha256": {w.name: sha256(w) for w in weights},
            "teacher_source": {s: read_json(teacher / s) for s in SOURCE_FILES if (teacher / s).exists()},
            "parameters": sum(p.numel() for p in model.parameters()), "dtype": str(model.dtype).removeprefix("torch."),
            "write_s": round(time.monotonic() - t0, 2)})
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("teacher", help="the teacher's Hugging Face folder")
    p.add_argument("--layers", required=True, help="the layers kept: every:N, first:K, last:K or indices 0,3,6")
    p.add_argument("--out", required=True, help="the new folder of the student")
    p.add_argument("--init", default="teacher", choices=INITS,
                   help="teacher: the kept layers' weights (default); random: the pruned shape, randomly initialised")
    p.add_argument("--seed", type=int, default=0, help="the seed of --init random")


def main(args: argparse.Namespace) -> int:
    import json

    out = write(args.teacher, args.layers, args.out, args.init, args.seed)
    info = json.loads((out / "hf_prune.json").read_text())
    print(json.dumps({"folder": str(out), **{k: info[k] for k in ("layers", "init", "parameters")}}))
    return 0
