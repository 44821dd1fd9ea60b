"""The LM teacher trained here (lm.teacher=train): next-token training on the corpus's train split, cached
under <cache>/teacher-<key>/ by its recipe and reused by every later run with the same text, shape and
recipe. Only weights are cached, never outputs."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from workbench import backends
from workbench.config import ConfigError, DistillConfig
from workbench.data import cache
from workbench.train.objectives import lm_objectives
from workbench.train.task_setup import teacher_seed
from workbench.train.teacher import teacher_precision

# The teacher's next-token loss: cross-entropy alone, checkpointed whatever the run's distill.loss_impl (a cached
# teacher's recipe, its key, does not name the loss)
TEACHER_LOSS = DistillConfig(loss="forward_kl", ce_weight=1.0, loss_impl="checkpointed")


def trained_teacher(cfg, shape, text, cache_dir: Path, device: torch.device, tdtype,
                    info: dict[str, Any]) -> torch.nn.Module:
    """The teacher of `shape` trained on `text`'s train split: found in the cache or trained and cached
    now (its weights, and meta.json last); `info` (the task's task.json) gets where it is cached and how it
    came to be. The recipe names the autocast it trains in: teacher_precision=fp8 trains in bf16 (fp32 on a
    CPU) and so finds the bf16 (fp32) teacher's weights, which it then runs in FP8."""
    from workbench.models import CausalLM

    recipe = {"shape": dataclasses.asdict(shape), "text": text.folder.name, "steps": cfg.lm.teacher_steps,
              "lr": cfg.lm.teacher_lr, "seed": teacher_seed(cfg), "batch": cfg.model.batch,
              "train_precision": teacher_precision.NAMES[tdtype]}
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    entry = cache.Entry(Path(cache_dir) / f"teacher-{key}")
    model = CausalLM(shape)
    info["teacher_checkpoint"] = str(entry.folder)
    if entry.read() is None:
        with entry.building() as meta:  # checks the cache writable before training; waits for another builder
            if meta is None:
                losses, train_s = _train(model, cfg, text, device, tdtype, info)
                return _cache(model, entry, {**recipe, "final_loss": losses[-1], "train_s": train_s}, info)
    model.load_state_dict(torch.load(entry.folder / "teacher.pt", map_location="cpu", weights_only=True))
    info["teacher_cached"] = True
    return model


def _train(model: torch.nn.Module, cfg, text, device: torch.device, tdtype,
           info: dict[str, Any]) -> tuple[list[float], float]:
    """(training losses, seconds): the teacher trained on `text`'s train split, refused when its loss is not
    finite; `info` gets how it went."""
    t0 = time.monotonic()
    losses = train_lm(model, text.batches("train", cfg.model.batch, cfg.model.seq_len, cfg.lm.teacher_steps,
                                          teacher_seed(cfg) + 7), cfg.lm.teacher_lr, device, tdtype)
    bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    if bad is not None:
        raise ConfigError(f"the teacher trained here diverged: its training loss is {losses[bad]} at step {bad + 1} "
                          f"of lm.teacher_steps={cfg.lm.teacher_steps} (lm.teacher_lr={cfg.lm.teacher_lr}); lower "
                          "lm.teacher_lr. It was not cached")
    train_s = time.monotonic() - t0
    info.update(teacher_cached=False, teacher_train_s=round(train_s, 2), teacher_final_loss=losses[-1])
    return losses, train_s


def _cache(model: torch.nn.Module, entry, meta: dict, info: dict[str, Any]) -> torch.nn.Module:
    """The trained teacher cached at `entry` with `meta` (its recipe and how its training went); a teacher that
    cannot be cached (a full disk) is still used, and task.json (`info`) says why it was not kept."""
    try:
        entry.write_file("teacher.pt", lambda f: torch.save(model.state_dict(), f))
        entry.commit(meta)
    # PyTorch's zip writer reports a full disk as a RuntimeError, not an OSError; either way the temporary file
    # is gone (results.write_with) and the teacher is still good
    except (OSError, RuntimeError) as e:
        info["teacher_cache_error"] = f"not cached: {type(e).__name__}: {e}"
        print(f"[teacher] trained, but {entry.folder} could not be written ({e}); using it without caching",
              flush=True)
    return model


def fingerprint(model: torch.nn.Module) -> str:
    """sha256 of what the teacher computes with: its architecture (a Hugging Face model's config less its path,
    or the LMShape) and every tensor of its state (name, dtype, shape, bytes). It keys the top-k store, so a
    teacher of another seed, or a model folder whose weights were replaced in place, is another teacher whatever
    its path; hashing the loaded weights costs about a second per GB, once per top-k run."""
    h = hashlib.sha256()
    config = getattr(getattr(model, "model", None), "config", None)
    if config is not None:  # the path and library version do not change the logits
        arch = {k: v for k, v in config.to_dict().items() if k not in ("_name_or_path", "transformers_version")}
    else:
        arch = dataclasses.asdict(model.shape) if dataclasses.is_dataclass(getattr(model, "shape", None)) else {}
    h.update(json.dumps(arch, sort_keys=True, default=str).encode())
    for name, t in model.state_dict().items():
        if torch.is_tensor(t):
            t = t.detach().to("cpu").contiguous()
            h.update(f"\n{name} {t.dtype} {tuple(t.shape)}\n".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def progress_every(steps: int) -> int:
    """Steps between progress lines of a training loop: about four lines, never more often than every 10 steps."""
    return max(10, math.ceil(steps / 4))


def train_lm(model: torch.nn.Module, windows: list[torch.Tensor], lr: float, device: torch.device, dtype,
             say=print) -> list[float]:
    """Next-token training (cross-entropy) of a teacher on token windows [batch, seq+1]; returns the losses.
    `say` gets a progress line every `progress_every` steps (a teacher trains for minutes at some presets)."""
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    losses = []
    for w in windows:
        w = w.to(device)
        with backends.autocast(device, dtype):
            logits = model(w[:, :-1])
        loss = lm_objectives.lm_loss(logits, None, w[:, 1:], TEACHER_LOSS)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        every = progress_every(len(windows))
        if say and len(losses) % every == 0 and len(losses) < len(windows):
            say(f"[teacher] training step {len(losses)}/{len(windows)}, loss {losses[-1]:.4g}")
    return losses
