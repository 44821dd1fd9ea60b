# Probe: TE FusedAdam (capturable, fp32 master weights over bf16 params) inside one whole-step CUDA graph (the
# `adam-graph` run of scripts/gpu_runs.toml; output and account in results/reference/h200x2/probes/, git 8e87678).
import copy
import json

import torch
import transformer_engine.pytorch as te

from workbench.train import loop

torch.manual_seed(0)
dev = torch.device("cuda")
base = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).to(dev)
X = [torch.randn(1024, 512, device=dev) for _ in range(8)]
Y = [torch.randn(1024, 512, device=dev) * 0.1 for _ in range(8)]

def make(opt_kind, dtype):
    m = copy.deepcopy(base).to(dtype)
    if opt_kind == "te":
        o = te.optimizers.FusedAdam(list(m.parameters()), lr=1e-3, weight_decay=0.01, adam_w_mode=True,
                                    capturable=True, master_weights=dtype != torch.float32)
    else:
        o = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01, capturable=True)
    return m, o

def eager_step(m, o, x, y):
    o.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(m(x.to(next(m.parameters()).dtype)).float(), y)
    loss.backward()
    o.step()
    return loss.detach()

def info(o):
    g = o.param_groups[0]
    st = g.get("step")
    s = {"step": (st.tolist() if torch.is_tensor(st) else st), "lr": float(g["lr"])}
    if hasattr(o, "_dummy_overflow_buf"):
        s["noop"] = o._dummy_overflow_buf.tolist()
    states = list(o.state.values())
    if states:
        s["state_keys"] = sorted(states[0].keys())
        s["m_norm"] = float(states[0]["exp_avg"].float().norm())
        if "master_param" in states[0]:
            s["master_norm"] = float(states[0]["master_param"].float().norm())
        if "step" in states[0]:
            s["pstep"] = float(states[0]["step"])
    return s

for opt_kind in ("torch", "te"):
    for dtype in (torch.float32, torch.bfloat16):
        for mode in ("eager", "graph", "graph-noreset"):
            m, o = make(opt_kind, dtype)
            out = {"opt": opt_kind, "dtype": str(dtype), "mode": mode, "losses": []}
            try:
                if mode == "eager":
                    for i in range(6):
                        out["losses"].append(float(eager_step(m, o, X[i], Y[i])))
                else:
                    sx, sy = X[0].clone(), Y[0].clone()
                    snap = {k: v.detach().clone() for k, v in m.state_dict().items()}
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        for _ in range(3):
                            eager_step(m, o, sx, sy)
                    torch.cuda.current_stream().wait_stream(side)
                    out["after_warmup"] = info(o)
                    g = torch.cuda.CUDAGraph()
                    o.zero_grad(set_to_none=True)
                    with torch.cuda.graph(g):
                        sl = torch.nn.functional.mse_loss(m(sx.to(dtype)).float(), sy)
                        sl.backward()
                        o.step()
                    out["after_capture"] = info(o)
                    if mode == "graph":
                        with torch.no_grad():
                            m.load_state_dict(snap)
                        loop.reset_optimizer(o)
                    out["after_reset"] = info(o)
                    for i in range(6):
                        sx.copy_(X[i])
                        sy.copy_(Y[i])
                        g.replay()
                        out["losses"].append(float(sl))
                        if i < 2:
                            out[f"after_replay{i}"] = info(o)
            except Exception as e:
                out["error"] = f"{type(e).__name__}: {e}"[:300]
            print(json.dumps(out), flush=True)
