"""Training a student: the distillation objectives (objectives) and the loop that trains, evaluates and
times one student (loop). The runner uses the names below."""
from workbench.train.loop import Data, Diverged, run_student  # noqa: F401 - the package's face
