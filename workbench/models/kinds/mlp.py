"""The tutorial's MLP teacher and student (workbench.models.mlp), trained by regression on the teacher's outputs."""
from workbench.models.kinds import Kind, register

register(Kind("mlp", task="mlp"))
