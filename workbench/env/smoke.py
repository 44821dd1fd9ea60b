"""FP8 forward + backward of one te.Linear: proves a Transformer Engine install, not just its import.

    python -m workbench.env.smoke      # in the interpreter TE was installed for (install-te runs it so)

Prints one JSON line {ok, recipe, shape, weight_grad_norm} (`workbench.env.install.fp8_smoke` reads the
last line of stdout); exits non-zero, with the reason on stderr, when TE does not import.
"""
import json

import torch

from workbench.env import te as _te


def main() -> dict:
    te, recipe, why = _te.load()  # the workbench's own import path (it aligns TE's cuDNN with torch's)
    if te is None:
        raise SystemExit(why)
    torch.manual_seed(0)
    layer = te.Linear(256, 256, bias=True).cuda()
    x = torch.randn(64, 256, device="cuda", requires_grad=True)
    with _te.autocast(te, recipe.DelayedScaling(margin=0, fp8_format=recipe.Format.HYBRID)):
        y = layer(x)
    y.float().pow(2).mean().backward()
    torch.cuda.synchronize()
    finite = bool(torch.isfinite(y).all() and torch.isfinite(x.grad).all() and torch.isfinite(layer.weight.grad).all())
    return {"ok": finite, "recipe": "DelayedScaling(HYBRID)", "shape": list(y.shape),
            "weight_grad_norm": float(layer.weight.grad.norm())}


if __name__ == "__main__":
    print(json.dumps(main()))
