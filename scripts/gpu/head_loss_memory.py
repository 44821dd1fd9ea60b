"""Where the head-fused loss's memory goes at vocab 128256, 8192 tokens, hidden 2048 (one H200):
a memory-history replay of one call at the peak (the largest live blocks, with the workbench line that made
each), and the extra memory of its two pieces alone: the compiled chunk and the fp32-out weight-gradient GEMM.
    python3 scripts/gpu/head_loss_memory.py OUT    -> OUT/head_loss_memory.json (and the same on stdout)
(the `head-loss-memory` run of scripts/gpu_runs.toml)"""
import json
import sys
from pathlib import Path

import torch

from workbench.config import DistillConfig
from workbench.models.lm import HeadFeatures
from workbench.train.objectives import lm_objectives as lo
from workbench.train.objectives.head_loss import head_fused_loss

VOCAB, TOKENS, HIDDEN, CHUNK = 128256, 8192, 2048, 1024
MIB = 2**20


def extra(fn):
    """Peak memory above what was allocated before fn(), in MiB (fn's outputs included)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / MIB, out


def peak_blocks(fn):
    torch.cuda.memory._record_memory_history(max_entries=200000)
    fn()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    live, cur, peak, at_peak = {}, 0, 0, []
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            cur += e["size"]
        elif e["action"] == "free_completed" and e["addr"] in live:
            cur -= live.pop(e["addr"])["size"]
        if cur > peak:
            peak, at_peak = cur, list(live.values())
    rows = []
    for e in sorted(at_peak, key=lambda e: -e["size"])[:10]:
        where = [f"{Path(f['filename']).name}:{f['line']}:{f['name']}" for f in e.get("frames", [])
                 if "workbench" in f["filename"] or "head_loss_memory" in f["filename"]][:3]
        rows.append({"mib": round(e["size"] / MIB, 1), "where": where})
    return {"traced_peak_mib": round(peak / MIB, 1), "largest_at_peak": rows}


def main(out: Path):
    torch.manual_seed(0)
    h = (torch.randn(TOKENS, HIDDEN, device="cuda") / 4).bfloat16().requires_grad_()
    w = (torch.randn(VOCAB, HIDDEN, device="cuda") / 50).requires_grad_()
    t = (torch.randn(TOKENS, VOCAB, device="cuda") * 2).bfloat16()
    y = torch.randint(0, VOCAB, (TOKENS,), device="cuda")

    def call():
        h.grad = w.grad = None
        head_fused_loss(HeadFeatures((h, w)), t, y, DistillConfig(loss="forward_kl", temperature=1.0, ce_weight=0.5,
                                                                  loss_chunk_tokens=CHUNK)).backward()

    for _ in range(2):
        call()
    report = {"chunk_tokens": CHUNK, "whole_call": peak_blocks(call)}
    s = torch.randn(CHUNK, VOCAB, device="cuda").bfloat16()
    sc = [torch.full((), v, device="cuda") for v in (1.0, 0.5, 0.5)]
    fn = lo.compiled_chunk()
    args = (s, t[:CHUNK], y[:CHUNK],
            lo.ChunkScalars(torch.full((), float(TOKENS), device="cuda"), *sc, True, True, torch.bfloat16))
    fn(*args)
    report["compiled_chunk_extra_mib"] = extra(lambda: fn(*args))[0]
    report["chunk_grad_bf16_mib"] = CHUNK * VOCAB * 2 / MIB
    g, hc = s, h.detach()[:CHUNK]
    gw = torch.zeros(VOCAB, HIDDEN, device="cuda")
    report["addmm_gT_out_dtype_extra_mib"] = extra(
        lambda: torch.addmm(gw, g.t(), hc, out_dtype=torch.float32, out=gw))[0]
    gwt = torch.zeros(HIDDEN, VOCAB, device="cuda")
    report["addmm_hT_g_out_dtype_extra_mib"] = extra(
        lambda: torch.addmm(gwt, hc.t(), g, out_dtype=torch.float32, out=gwt))[0]
    wc, gh = w.detach().bfloat16(), torch.empty(CHUNK, HIDDEN, device="cuda", dtype=torch.bfloat16)
    report["mm_g_w_into_view_extra_mib"] = extra(lambda: torch.mm(g, wc, out=gh))[0]
    text = json.dumps(report, indent=1)
    print(text)
    (out / "head_loss_memory.json").write_text(text)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
