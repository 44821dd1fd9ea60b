"""Diagnostic for an open defect: TE FusedAdam inside the whole-step CUDA graph diverges in the workbench
(results/reference/h200x2/README.md, probes/). Runs the `seed` student with TE FusedAdam through the workbench's
own make_optimizer / make_step / capture_step: the capturable kernel eager and in the graph, the non-capturable
kernel eager, bf16 and fp32 parameters; prints each variant's losses and which tensors (parameter, grad,
optimizer state) are non-finite after the first step. GPU only (nvidia-h200), after `bash .gpu/install.sh`:
    PYTHONPATH=$PWD python3 scripts/probe_fused_adam_graph.py
"""
import json, torch
from workbench import backends, config, runner
from workbench.train import loop, tasks

dev = torch.device("cuda")


def run(label, param_dtype="bf16", capturable=True, graph=False, moments="fp32"):
    cfg = config.from_preset("seed", backends="torch_bf16", baseline="torch_bf16", steps=4, param_dtype=param_dtype,
                             optimizer="te_fused_adam", moments_dtype=moments)
    task = tasks.for_config(cfg, dev, runner.teacher_dtype(cfg, dev), cache_dir="/tmp/abis")
    data = task.make_data(shard=0)
    backend = backends.make("torch_bf16")
    model = backend.build(task.reference, cfg, dev)
    model.train()
    opt, note = loop.make_optimizer(model, cfg, dev, capturable=capturable)
    step = (loop.capture_step(model, model, opt, backend, task, data.train[0]) if graph
            else loop.make_step(model, opt, backend, task))
    out = {"label": label, "opt": type(opt).__name__, "note": note, "losses": [], "bad_after_step1": []}
    for i, (tok, tgt) in enumerate(data.train[:4]):
        out["losses"].append(round(float(step(tok, tgt)), 5))
        if i == 0:
            for n, p in model.named_parameters():
                st = opt.state.get(p, {})
                for k, t in [("p", p), ("grad", p.grad)] + [(k, v) for k, v in st.items() if torch.is_tensor(v)]:
                    if t is not None and not torch.isfinite(t.float()).all():
                        out["bad_after_step1"].append(f"{n}.{k}")
            g = opt.param_groups[0]
            out["step_after1"] = g["step"].tolist() if torch.is_tensor(g.get("step")) else g.get("step")
            out["grad_dtypes"] = sorted({f"{p.dtype}/{p.grad.dtype}/{tuple(p.grad.stride()) == tuple(p.stride())}"
                                         for p in model.parameters() if p.grad is not None})
    print(json.dumps(out), flush=True)


for args in [dict(label="capturable-eager-bf16"), dict(label="capturable-graph-bf16", graph=True),
             dict(label="capturable-graph-bf16-moments", graph=True, moments="bf16"),
             dict(label="noncapturable-eager-bf16", capturable=False),
             dict(label="capturable-eager-fp32", param_dtype="fp32"), dict(label="capturable-graph-fp32", param_dtype="fp32", graph=True)]:
    try:
        run(**args)
    except Exception as e:
        print(json.dumps({"label": args["label"], "error": f"{type(e).__name__}: {e}"[:400]}), flush=True)
