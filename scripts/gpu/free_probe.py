# Probe: what a distributed student leaves allocated on rank 0 when its one-GPU reference starts (the `free-probe`
# run of scripts/gpu_runs.toml; output and account in results/reference/h200x2/probes/). As run at git 8e87678: it
# patches that commit's workbench.distributed.wrap and workbench.runner._free (today workbench/run/parallel.py and
# workbench/run/runner.py).
import gc
import sys
import time
import weakref

import torch

from workbench import cli, distributed, runner

refs = []
orig_wrap = distributed.wrap
def wrap(model, world, device):
    out = orig_wrap(model, world, device)
    refs.append(weakref.ref(out))
    refs.append(weakref.ref(next(model.parameters())))
    return out
distributed.wrap = wrap
orig_free = runner._free
def free(device):
    def mb():
        return round(torch.cuda.memory_allocated(device) / 2**20, 1)

    log = {"before": mb()}
    gc.collect()
    log["gc"] = mb()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    log["sync+empty"] = mb()
    log["alive"] = [type(r()).__name__ for r in refs if r() is not None]
    for t in (0.2, 0.5, 1.0, 2.0, 4.0):
        time.sleep(t)
        gc.collect()
        torch.cuda.empty_cache()
        log[f"after+{t}s"] = mb()
    print("FREEPROBE", log, flush=True)
runner._free = free
torch.cuda.memory._record_memory_history(max_entries=200000)
calls = [0]
def snapshot_free(device):
    calls[0] += 1
    if calls[0] == 1:  # before the first reference: who holds what
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        snap = torch.cuda.memory._snapshot()
        agg = {}
        for seg in snap["segments"]:
            for b in seg["blocks"]:
                if b["state"] != "active_allocated":
                    continue
                frames = b.get("frames") or []
                key = " | ".join(f"{f['filename'].split('site-packages/')[-1]}:{f['line']}:{f['name']}"
                                 for f in frames if "workbench" in f["filename"] or "torch/nn" in f["filename"]
                                 or "torch/distributed" in f["filename"] or "torch/optim" in f["filename"])[:700]
                agg[key] = agg.get(key, 0) + b["size"]
        for k, v in sorted(agg.items(), key=lambda kv: -kv[1])[:10]:
            print(f"HOLD {v/2**20:.1f} MB :: {k}", flush=True)
    free(device)
runner._free = snapshot_free
sys.exit(cli.main(sys.argv[1:]))
