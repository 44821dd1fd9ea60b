"""What transformers' mask costs a Hugging Face bf16 student (issue 37's denominator): the Llama-3.2-1B layer shape
(hidden 2048, 32 heads, 8 KV heads, vocab 128256), LAYERS decoder layers, 8 x 1024 tokens, one training step
(forward, loss, backward) timed eager and torch.compile'd, with transformers' 'sdpa' (its mask code: a host sync
every eager step, a full [b, 1, s, s] mask under compile) against the workbench's 'workbench_causal_sdpa'
(is_causal, no mask; workbench/models/hf.py). One profiled block each names the attention kernels that ran.
    python3 scripts/gpu/hf_attention_ab.py OUT [LAYERS]   -> OUT/hf_attention_ab.json, rewritten after every cell
(the `hf-attention` run of scripts/gpu_runs.toml)"""
import sys
import time
from pathlib import Path

import torch

from workbench.measure import timing
from workbench.models import hf, hf_init
from workbench.results import write_json

out = Path(sys.argv[1]) / "hf_attention_ab.json"
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 4
dev = torch.device("cuda")
torch.manual_seed(0)
cfg = hf_init.hf_config("llama-3.2-1b")  # the shape hf-init writes, cut to LAYERS decoder layers
cfg.num_hidden_layers = layers
base = hf.load_causal_lm(cfg, seq_len=1024).model.to(dev, torch.bfloat16).train()
tokens = torch.randint(0, cfg.vocab_size, (8, 1024), device=dev)
record = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "layers": layers,
          "tokens": list(tokens.shape), "cells": []}

for impl in ("sdpa", hf.CAUSAL_SDPA):
    base.set_attn_implementation(impl)
    for mode in ("eager", "compiled"):
        fwd = torch.compile(base) if mode == "compiled" else base

        def step():
            base.zero_grad(set_to_none=True)
            logits = fwd(input_ids=tokens, use_cache=False).logits
            torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten()).backward()

        cell = {"attn_implementation": impl, "mode": mode}
        try:
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            cell["first_step_s"] = round(time.perf_counter() - t0, 2)  # compile included
            t = timing.measure(step, warmup=3, iters=10, clock=timing.clock_for(dev), repeats=2, profile=True)
            kernels = (t.profile or {}).get("kernels") or []
            cell.update(median_ms=t.median, p20_ms=t.p20, p80_ms=t.stat(80), repeat_medians_ms=t.repeats.medians_ms,
                        attention_kernels=[k for k in kernels if k.get("category") == "attention"][:8],
                        categories_ms=(t.profile or {}).get("kernel_categories_ms_per_step"),
                        gpu_busy_ms=t.gpu_busy_ms)
        except Exception as e:  # one cell's failure is a result, not the end of the others
            cell["error"] = f"{type(e).__name__}: {e}"[:400]
        record["cells"].append(cell)
        write_json(out, record)
        print(impl, mode, cell.get("median_ms"), cell.get("error", ""), flush=True)
        torch._dynamo.reset()
