"""distill.teacher_mode=precomputed: the teacher's full logits for every training batch, computed once before
any student trains, on the GPU or in pinned host memory (logits_placement.place_teacher_logits, as
distill.teacher_logits says). steps x tokens x vocab: 2.1 GB a step at vocab 128256, 8192 tokens."""
from __future__ import annotations

from workbench.train.teacher_targets import TeacherMode, register
from workbench.train.teacher_targets.logits_placement import HostBatches


class Precomputed(TeacherMode):
    name = "precomputed"
    full_train_logits = True

    def train_batches(self, task, windows, shard):
        on_host = task.info.get("teacher_logits") == "host"
        train = [task.targets(w, host=on_host) for w in windows]
        return HostBatches(train, task.device) if on_host else train


register(Precomputed())
