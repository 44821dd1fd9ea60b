"""Training a student, by concern:
  loop, tasks, task_setup, lm_task   the loop that trains, evaluates and times one student, and the tasks it runs
  objectives/                        the distillation losses (MLP, LM: fused, top-k, head-fused) and LM metrics
  teacher_targets/                   where the training batches' teacher targets come from: one file per mode
  teacher/                           the LM teacher (trained or cached) and the precision its forward runs in
The runner uses the names below."""
from workbench.train.loop import Data, Diverged, run_student  # noqa: F401 - the package's face
