"""Where precomputed teacher logits live (distill.teacher_logits): on the GPU, or in pinned host memory,
copied to the device a step ahead; the run is refused up front when neither can hold them."""
from __future__ import annotations

import collections.abc
import dataclasses

import torch

from workbench.config import ConfigError

GPU_LOGITS_SHARE = 0.6  # of the GPU's free memory, for teacher logits: the rest is the students'
HOST_LOGITS_SHARE = 0.8  # of the host's available memory (pinned pages cannot be swapped out)


def place_teacher_logits(choice: str, train_bytes: int, kept_bytes: int, gpu_free: int | None,
                         host_available: int | None, host_ranks: int = 1) -> str:
    """Where the training batches' teacher logits live: 'gpu' or 'host' (pinned memory, copied to the GPU
    per step). `kept_bytes` (the bench and held-out batches' logits) are always on the GPU. `choice` is
    distill.teacher_logits; `gpu_free` is None on a CPU run (there 'gpu' is the run's device, no limit is
    checked), `host_available` None where unknown; `host_ranks` ranks on this host each pin their own
    `train_bytes` in that memory. Raises ConfigError, with the GiB needed and available,
    when the placement cannot hold them."""
    gib = 2**30
    if gpu_free is not None:
        budget = GPU_LOGITS_SHARE * gpu_free
        if kept_bytes > budget:
            raise ConfigError(f"the teacher's logits of the timed and held-out batches need "
                              f"{kept_bytes / gib:.1f} GiB on the GPU, {gpu_free / gib:.1f} GiB are free; "
                              "lower train.eval_batches, model.batch or model.seq_len")
        fits_gpu = train_bytes + kept_bytes <= budget
        if choice == "gpu" and not fits_gpu:
            raise ConfigError(f"distill.teacher_logits='gpu': the teacher's logits need "
                              f"{(train_bytes + kept_bytes) / gib:.1f} GiB on the GPU, {gpu_free / gib:.1f} GiB "
                              f"are free ({GPU_LOGITS_SHARE:.0%} of it is their budget); set "
                              "distill.teacher_logits=host or auto, or lower train.steps, model.batch or "
                              "model.seq_len")
        if choice == "auto":
            choice = "gpu" if fits_gpu else "host"
    elif choice == "auto":
        choice = "gpu"
    if (choice == "host" and host_available is not None
            and host_ranks * train_bytes > HOST_LOGITS_SHARE * host_available):
        gpu = "" if gpu_free is None else f"the GPU has {gpu_free / gib:.1f} GiB free, "
        each = f" on each of this host's {host_ranks} ranks" if host_ranks > 1 else ""
        raise ConfigError(f"the teacher's logits of the training batches ({train_bytes / gib:.1f} GiB{each}) "
                          f"fit neither place: {gpu}the host {host_available / gib:.1f} GiB available "
                          f"({HOST_LOGITS_SHARE:.0%} of it is their budget); lower train.steps, model.batch or "
                          "model.seq_len")
    return choice


class HostBatches(collections.abc.Sequence):
    """Training batches whose teacher logits live in pinned host memory: each is copied to the device when it
    is used. Iterating (the training loop) copies batch i+1 on a side stream while step i runs, non-blocking,
    so the steps wait for no copy; indexing (a sample batch for capture or the initial loss) copies at once.
    On a CPU run the copies are the tensors themselves."""

    def __init__(self, batches: list, device: torch.device):
        self.batches, self.device = batches, device

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int):
        tokens, t = self.batches[i]
        return tokens, dataclasses.replace(t, out=t.out.to(self.device))

    def shared_tensors(self) -> list[torch.Tensor]:
        """What every student is handed itself (tokens, next tokens): the logits only as fresh device copies."""
        return [x for tokens, t in self.batches for x in (tokens, *(v for v in t.tensors() if v is not t.out))]

    def __iter__(self):
        if self.device.type != "cuda" or not self.batches:
            yield from (self[i] for i in range(len(self)))
            return
        main, side = torch.cuda.current_stream(self.device), torch.cuda.Stream(self.device)

        def fetch(i: int):
            tokens, t = self.batches[i]
            with torch.cuda.stream(side):
                return tokens, dataclasses.replace(t, out=t.out.to(self.device, non_blocking=True))

        ahead = fetch(0)
        for i in range(len(self)):
            batch = ahead
            main.wait_stream(side)  # its copy is done before the step reads it
            batch[1].out.record_stream(main)  # allocated on the side stream, used (and freed) on this one
            if i + 1 < len(self):
                ahead = fetch(i + 1)  # overlaps the step the caller runs on `batch`
            yield batch

