"""Teacher and students: embedding -> residual pre-LayerNorm MLP blocks -> linear head (the tutorial's).

The student takes its Linear / LayerNorm classes as arguments, so the TE student is the same
module tree built from `te.Linear` / `te.LayerNorm`: the parameter names match the torch student's
and the TE student loads the baseline's initial state unchanged (matched init, REFERENCE §1.3).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import ModelConfig


class Teacher(nn.Module):
    """Frozen target network (exact GELU, nn.Sequential blocks, as in the tutorial)."""

    def __init__(self, m: ModelConfig):
        super().__init__()
        self.embed = nn.Embedding(m.vocab, m.hidden)
        self.layers = nn.ModuleList(
            nn.Sequential(
                nn.LayerNorm(m.hidden),
                nn.Linear(m.hidden, m.intermediate),
                nn.GELU(),
                nn.Linear(m.intermediate, m.hidden),
            )
            for _ in range(m.layers)
        )
        self.head = nn.Linear(m.hidden, m.hidden)

    def forward(self, tokens: torch.Tensor, return_hidden: bool = False):
        x = self.embed(tokens)
        hidden = []
        for layer in self.layers:
            x = x + layer(x)
            hidden.append(x)
        out = self.head(x)
        return (out, hidden) if return_hidden else out


class Student(nn.Module):
    """The tutorial's BaselineStudent (tanh GELU); `linear`/`norm` pick torch or TE layers."""

    def __init__(self, m: ModelConfig, linear=nn.Linear, norm=nn.LayerNorm, **layer_kw):
        super().__init__()
        self.embed = nn.Embedding(m.vocab, m.hidden)
        self.norms = nn.ModuleList(norm(m.hidden, **layer_kw) for _ in range(m.layers))
        self.fc1 = nn.ModuleList(linear(m.hidden, m.intermediate, **layer_kw) for _ in range(m.layers))
        self.fc2 = nn.ModuleList(linear(m.intermediate, m.hidden, **layer_kw) for _ in range(m.layers))
        self.head = linear(m.hidden, m.hidden, **layer_kw)

    def forward(self, tokens: torch.Tensor, return_hidden: bool = False):
        x = self.embed(tokens)
        hidden = []
        for ln, fc1, fc2 in zip(self.norms, self.fc1, self.fc2):
            x = x + fc2(F.gelu(fc1(ln(x)), approximate="tanh"))
            hidden.append(x)
        out = self.head(x)
        return (out, hidden) if return_hidden else out


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
