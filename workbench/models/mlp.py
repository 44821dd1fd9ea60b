"""Teacher and students: embedding -> residual pre-LayerNorm MLP blocks -> linear head (the tutorial's).

The student takes its Linear / LayerNorm classes as arguments, so the TE student is the same
module tree built from `te.Linear` / `te.LayerNorm`: the parameter names match the torch student's
and the TE student loads the baseline's initial state unchanged (matched init:
every student starts from the same weights).
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


class LayerNormMLP(nn.Module):
    """LayerNorm -> Linear -> tanh-GELU -> Linear as one module, with te.LayerNormMLP's parameter
    names: the torch counterpart of the fused layout (torch.compile fuses its pointwise work)."""

    def __init__(self, hidden: int, ffn: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.layer_norm_weight = nn.Parameter(torch.ones(hidden))
        self.layer_norm_bias = nn.Parameter(torch.zeros(hidden))
        self.fc1_weight = nn.Parameter(torch.empty(ffn, hidden))
        self.fc1_bias = nn.Parameter(torch.zeros(ffn))
        self.fc2_weight = nn.Parameter(torch.empty(hidden, ffn))
        self.fc2_bias = nn.Parameter(torch.zeros(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x, x.shape[-1:], self.layer_norm_weight, self.layer_norm_bias, self.eps)
        return F.linear(F.gelu(F.linear(y, self.fc1_weight, self.fc1_bias), approximate="tanh"),
                        self.fc2_weight, self.fc2_bias)


# fused parameter name -> separate-layout name (block index filled in)
FUSED_TO_SEPARATE = {
    "layer_norm_weight": "norms.{i}.weight", "layer_norm_bias": "norms.{i}.bias",
    "fc1_weight": "fc1.{i}.weight", "fc1_bias": "fc1.{i}.bias",
    "fc2_weight": "fc2.{i}.weight", "fc2_bias": "fc2.{i}.bias",
}


class Student(nn.Module):
    """The tutorial's BaselineStudent (tanh GELU); `linear`/`norm` pick torch or TE layers.

    With `mlp` (LayerNormMLP above, or te.LayerNormMLP) each block is one fused module instead
    (layout 'fused'); `from_reference_state` / `to_reference_state` translate the weights so every
    layout loads the same shared initial state.
    """

    def __init__(self, m: ModelConfig, linear=nn.Linear, norm=nn.LayerNorm, mlp=None, **layer_kw):
        super().__init__()
        self.embed = nn.Embedding(m.vocab, m.hidden)
        if mlp is None:
            self.norms = nn.ModuleList(norm(m.hidden, **layer_kw) for _ in range(m.layers))
            self.fc1 = nn.ModuleList(linear(m.hidden, m.intermediate, **layer_kw) for _ in range(m.layers))
            self.fc2 = nn.ModuleList(linear(m.intermediate, m.hidden, **layer_kw) for _ in range(m.layers))
            self.blocks = None
        else:
            self.blocks = nn.ModuleList(mlp(m.hidden, m.intermediate, **layer_kw) for _ in range(m.layers))
        self.head = linear(m.hidden, m.hidden, **layer_kw)

    def forward(self, tokens: torch.Tensor, return_hidden: bool = False):
        x = self.embed(tokens)
        hidden = []
        if self.blocks is not None:
            for blk in self.blocks:
                x = x + blk(x)
                hidden.append(x)
        else:
            for ln, fc1, fc2 in zip(self.norms, self.fc1, self.fc2):
                x = x + fc2(F.gelu(fc1(ln(x)), approximate="tanh"))
                hidden.append(x)
        out = self.head(x)
        return (out, hidden) if return_hidden else out

    def _renamed(self, state: dict[str, torch.Tensor], to_fused: bool) -> dict[str, torch.Tensor]:
        """`state` with the block weights renamed between the fused and the reference layout."""
        out = {k: v for k, v in state.items() if k.startswith(("embed.", "head."))}
        for i in range(len(self.blocks)):
            for fused, sep in FUSED_TO_SEPARATE.items():
                f, r = f"blocks.{i}.{fused}", sep.format(i=i)
                if to_fused:
                    out[f] = state[r]
                else:
                    out[r] = state[f]
        return out

    def train_flops_per_token(self) -> int:
        """GEMM FLOPs of one training step per token: every weight matrix outside the embedding (a lookup,
        no GEMM) does 2 FLOPs per element forward, and backward twice that (grad wrt input and wrt weight).
        Norms, activations and the optimizer are not counted: TFLOP/s is "useful GEMM work per second"."""
        matmul = sum(p.numel() for n, p in self.named_parameters() if p.dim() == 2 and not n.startswith("embed."))
        return 6 * matmul

    def from_reference_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return state if self.blocks is None else self._renamed(state, to_fused=True)

    def to_reference_state(self, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """`state` (under this model's names; default its own) under the separate layout's names."""
        own = {k: v for k, v in (self.state_dict() if state is None else state).items()
               if not k.endswith("_extra_state")}
        return own if self.blocks is None else self._renamed(own, to_fused=False)


def reference_student(m: ModelConfig, init_state: dict[str, torch.Tensor] | None = None) -> Student:
    """The torch student every backend converts a copy of: the configured layout, fp32, CPU, loaded with
    the shared initial weights (named as the separate layout names them)."""
    model = Student(m, mlp=LayerNormMLP if m.layout == "fused" else None)
    return model if init_state is None else load_matched(model, init_state)


def load_matched(module: nn.Module, init_state: dict[str, torch.Tensor]) -> nn.Module:
    """Load the shared initial weights (named as the separate layout names them); every parameter must be
    covered (only TE's FP8 `_extra_state` may be missing), so students provably start identical."""
    init_state = module.from_reference_state(init_state)  # fused layout: the module's own keys
    missing, unexpected = module.load_state_dict(init_state, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise RuntimeError(f"student does not match the shared init: missing={missing} unexpected={unexpected}")
    return module
