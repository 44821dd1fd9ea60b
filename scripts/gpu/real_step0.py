"""What FP8 does to a real pretrained model before any training, on the GPU: SmolLM2-135M-Instruct's real weights
(a folder `workbench hf-import` wrote from the registry's GGUF) and a random-weight model of the same shape, each
converted by every student of the workbench (torch bf16, TE bf16 layers, TE FP8 delayed / current / block layers,
torchao float8), evaluated on held-out real text (the standard library's pydoc topics, which the model was not tuned
on) against the fp32 model and against the bf16 forward: KL per token, top-1 agreement, perplexity.

    python scripts/gpu/real_step0.py MODEL_DIR OUT_DIR [--windows 16] [--seq 512]

Writes OUT_DIR/step0.csv (one row per model x student), step0.json (the same with the text and settings) after
every row, and step0.png (KL to the fp32 model per student, real vs random weights)."""
import argparse
import json
import math
import sys
import time
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from workbench import backends, config, results
from workbench.models.hf import load_causal_lm

STUDENTS = ("torch_bf16", "te_bf16", "te_fp8:delayed", "te_fp8:current", "te_fp8:block", "torchao_float8:tensorwise")


def heldout_tokens(folder: Path, windows: int, seq: int) -> torch.Tensor:
    import pydoc_data.topics as topics

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    text = "\n\n".join(topics.topics.values())
    ids = tok(text, add_special_tokens=False)["input_ids"]
    n = min(windows, len(ids) // seq)
    return torch.tensor(ids[: n * seq]).view(n, seq)


def metrics(logits: torch.Tensor, ref: torch.Tensor, tokens: torch.Tensor) -> dict:
    """KL(ref || logits) nats per token, top-1 agreement, and this model's perplexity on the next tokens."""
    lp, rp = F.log_softmax(logits.float(), -1), F.log_softmax(ref.float(), -1)
    kl = float((rp.exp() * (rp - lp)).sum(-1).mean())
    top1 = float((logits.argmax(-1) == ref.argmax(-1)).float().mean())
    ce = float(F.cross_entropy(logits[:, :-1].float().flatten(0, 1), tokens[:, 1:].flatten()))
    return {"kl_nats": kl, "top1_agreement": top1, "ppl": math.exp(ce)}


def forward_all(model, ctx, tokens, batch=4):
    outs = []
    with torch.no_grad(), ctx():
        for i in range(0, len(tokens), batch):
            outs.append(model(tokens[i:i + batch].cuda()).float().cpu())
    return torch.cat(outs)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("out")
    p.add_argument("--windows", type=int, default=16)
    p.add_argument("--seq", type=int, default=512)
    a = p.parse_args()
    out, folder = Path(a.out), Path(a.model)
    out.mkdir(parents=True, exist_ok=True)
    tokens = heldout_tokens(folder, a.windows, a.seq)
    cfg = config.from_preset("gpt-cpu", seq_len=a.seq, te_conversion="layer")
    rows = []
    for weights in ("real", "random"):
        if weights == "real":
            ref = load_causal_lm(folder, seq_len=a.seq)
        else:
            torch.manual_seed(0)
            ref = load_causal_lm(ref.model.config, seq_len=a.seq)  # the same shape, HF's own initialisation
        ref.eval()
        fp32 = forward_all(ref.cuda(), torch.no_grad, tokens)
        ref.cpu()
        bf16 = None
        for spec in STUDENTS:
            row = {"weights": weights, "student": spec}
            t0 = time.monotonic()
            try:
                b = backends.make(spec)
                ok, why = b.availability(backends.Context(torch.device("cuda"), cfg))
                if not ok:
                    raise RuntimeError(why)
                student = b.prepare(ref, cfg, torch.device("cuda"))
                model = student.model.eval()
                logits = forward_all(model, student.forward_context, tokens)
                row.update(status="ok", te_conversion=student.describe().get("te_conversion"),
                           **{f"{k}_vs_fp32": v for k, v in metrics(logits, fp32, tokens).items()})
                if spec == "torch_bf16":
                    bf16 = logits
                elif bf16 is not None:
                    m = metrics(logits, bf16, tokens)
                    row.update(kl_nats_vs_bf16=m["kl_nats"], top1_agreement_vs_bf16=m["top1_agreement"])
                del model, student
            except Exception as e:  # one student's failure is its row, never the others' end
                row.update(status="error", reason=f"{type(e).__name__}: {str(e)[:300]}")
            row["fp32_ppl"] = metrics(fp32, fp32, tokens)["ppl"]
            row["seconds"] = round(time.monotonic() - t0, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
            pd.DataFrame(rows).to_csv(out / "step0.csv", index=False)
            results.write_json(out / "step0.json", {"model": str(folder), "text": "pydoc_data.topics (stdlib)",
                                                    "windows": int(tokens.shape[0]), "seq_len": a.seq,
                                                    "tokens": int(tokens.numel()), "rows": rows})
            torch.cuda.empty_cache()
    plot(pd.DataFrame(rows), out / "step0.png")
    return 0


def plot(df: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = df[df["status"] == "ok"]
    piv = ok.pivot(index="student", columns="weights", values="kl_nats_vs_fp32").reindex(
        [s for s in STUDENTS if s in set(ok["student"])])
    ax = piv.plot.bar(figsize=(8, 4.5), logy=True, rot=20)
    ax.set_ylabel("KL(fp32 model || student), nats per token (log)")
    ax.set_title("Step 0: what each precision does to the model before training\n"
                 "SmolLM2-135M real weights vs random weights of the same shape, held-out text")
    plt.tight_layout()
    plt.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
