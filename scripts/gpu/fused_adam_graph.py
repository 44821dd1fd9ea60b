"""Diagnostic of a defect found and fixed (results/reference/h200/probes/fused_adam/README.md): TE FusedAdam inside the
whole-step CUDA graph gave loss inf at step 2 in the workbench but not when the graph was captured by hand.
Each variant runs in a fresh process, through more of the workbench's own path each time (capture_step by
hand, loop.prepare_step, loop.run_student, the `workbench run` command), then what changes between capture
and replay, and finally which allocations are freed after the capture ended (torch's memory history).
The cause: prepare_step's caller kept only the step, so the optimizer was collected and its state's memory
reused while the graph still pointed at it. GPU only (nvidia-h200), after `bash .gpu/install.sh`:
    scripts/gpu.sh fused-adam [VARIANT ...]          (the `fused-adam` run of scripts/gpu_runs.toml)
"""
import json
import subprocess
import sys

import torch

VARIANTS = ["graph-first", "eager-then-graph", "prepare", "prepare-initial-loss", "run-student", "cli",
            "initial-loss-diff", "empty-cache", "nan-fill", "prepare-nan-fill", "prepare-history"]


def setup(steps=4, **kw):
    from workbench import backends, config
    from workbench.run import runner
    from workbench.train import tasks
    dev = torch.device("cuda")
    cfg = config.from_preset("seed", backends="torch_bf16", baseline="torch_bf16", steps=steps, param_dtype="bf16",
                             optimizer="te_fused_adam", graphs=True, te_graph="step", **kw)
    task = tasks.for_config(cfg, dev, runner.teacher_dtype(cfg, dev), cache_dir="/tmp/abis")
    data = task.make_data(shard=0)
    backend = backends.make("torch_bf16")
    return cfg, dev, task, data, backend


def losses_of(step, model, opt, data, out):
    for i, (tok, tgt) in enumerate(data.train[:4]):
        out["losses"].append(round(float(step(tok, tgt)), 5))
        if i == 0 and opt is not None:
            bad = []
            for n, p in model.named_parameters():
                st = opt.state.get(p, {})
                for k, t in [("p", p), ("grad", p.grad)] + [(k, v) for k, v in st.items() if torch.is_tensor(v)]:
                    if t is not None and not torch.isfinite(t.float()).all():
                        bad.append(f"{n}.{k}")
            out["bad_after_step1"] = bad
            g = opt.param_groups[0]
            out["step_after1"] = g["step"].tolist() if torch.is_tensor(g.get("step")) else g.get("step")


def variant(name):
    from workbench.train import loop
    out = {"label": name, "losses": []}
    if name == "cli":
        cmd = [
            sys.executable,
            "-m",
            "workbench",
            "run",
            "--preset",
            "seed",
            "--out",
            "/tmp/aw",
            "--run-id",
            "cli",
            "--set",
            "backends=torch_bf16",
            "--set",
            "baseline=torch_bf16",
            "--set",
            "steps=4",
            "--set",
            "param_dtype=bf16",
            "--set",
            "optimizer=te_fused_adam",
            "--set",
            "graphs=true",
            "--set",
            "te_graph=step",
            "--set",
            "iters=5",
        ]
        subprocess.run(cmd, capture_output=True)
        import pandas as pd
        out["losses"] = pd.read_csv("/tmp/aw/cli/losses.csv")["loss"].round(5).tolist()
        out["status"] = pd.read_csv("/tmp/aw/cli/students.csv")["status"].tolist()
        return out
    cfg, dev, task, data, backend = setup()
    if name == "run-student":
        try:
            m, losses = loop.run_student(loop.prepare(backend, cfg, task, dev), cfg, task, data, dev)
            out["losses"] = [round(x, 5) for x in losses]
        except loop.Diverged as e:
            out["losses"], out["diverged"] = e.losses, str(e)
        return out
    student = loop.prepare(backend, cfg, task, dev)  # the backend's student: its model and step settings
    model = student.model
    model.train()
    if name == "prepare-nan-fill":  # nothing kept between capture and the NaN writes (no clones)
        step, metrics = loop.prepare_step(student, cfg, task, data, dev)
        free = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
        junk = [
            torch.full((n,), float("nan"), device=dev)
            for n in (free // 16, free // 16, free // 8, 1 << 16, 1 << 12, 1 << 10)
        ]
        del junk
        losses_of(step, model, None, data, out)
        return out
    if name == "prepare-history":  # what is freed between the capture's end and prepare_step's return
        torch.cuda.memory._record_memory_history(max_entries=200000)
        orig = torch.cuda.CUDAGraph.capture_end
        marks = []

        def capture_end(self):
            orig(self)
            marks.append(torch.empty(1234567, dtype=torch.uint8, device=dev))
        torch.cuda.CUDAGraph.capture_end = capture_end
        step, metrics = loop.prepare_step(student, cfg, task, data, dev)
        marks.append(torch.empty(7654321, dtype=torch.uint8, device=dev))
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        big = [i for i, e in enumerate(trace) if e["action"] == "alloc" and e["size"] in
               {m.untyped_storage().nbytes() for m in marks} | {((m.numel() + 511) // 512) * 512 for m in marks}]
        out["marks"] = big[:2]
        alloc_at = {}
        freed = []
        for i, e in enumerate(trace):
            if e["action"] == "alloc":
                alloc_at[e["addr"]] = (i, e)
            elif e["action"] == "free_requested" and len(big) >= 2 and big[0] < i < big[1]:
                j, a = alloc_at.get(e["addr"], (None, None))
                frames = [f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}" for f in (a or e).get("frames", [])
                          if "site-packages/torch" not in f["filename"] and f["filename"].endswith(".py")][:6]
                freed.append({"size": e["size"], "stream": e.get("stream"), "alloc_index": j,
                              "alloc_before_capture_end": j is not None and j < big[0], "frames": frames})
        out["freed_after_capture"] = freed
        out["n_events"] = len(trace)
        torch.cuda.memory._record_memory_history(enabled=None)
        out["initial_loss"] = loop.initial_loss(model, task, data.eval[0])
        losses_of(step, model, None, data, out)
        return out
    if name.startswith("prepare"):
        step, metrics = loop.prepare_step(student, cfg, task, data, dev)
        out["opt"] = metrics["optimizer"]
        if name == "prepare-initial-loss":
            out["initial_loss"] = loop.initial_loss(model, task, data.eval[0])
        losses_of(step, model, None, data, out)
        return out
    if name in ("initial-loss-diff", "empty-cache", "nan-fill"):  # what changes between capture and replay
        opt, _ = loop.make_optimizer(model, cfg, dev, capturable=True)
        step = loop.capture_step(model, model, opt, student, task, data.train[0])
        live = {f"{n}.p": p for n, p in model.named_parameters()}
        live.update({f"{n}.grad": p.grad for n, p in model.named_parameters() if p.grad is not None})
        for n, p in model.named_parameters():
            live.update({f"{n}.{k}": v for k, v in opt.state[p].items() if torch.is_tensor(v)})
        live.update(lr=opt.param_groups[0]["lr"], step=opt.param_groups[0]["step"], noop=opt._dummy_overflow_buf)
        before = {k: v.detach().clone() for k, v in live.items()}
        if name == "initial-loss-diff":
            out["initial_loss"] = loop.initial_loss(model, task, data.eval[0])
        elif name == "empty-cache":
            torch.cuda.empty_cache()
        else:  # every free block of the general pool written with NaN, then freed again
            free = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
            junk = [
                torch.full((n,), float("nan"), device=dev)
                for n in (free // 16, free // 16, free // 8, 1 << 16, 1 << 12, 1 << 10)
            ]
            out["nan_bytes"] = sum(j.numel() * 4 for j in junk)
            del junk
        torch.cuda.synchronize()
        out["changed"] = [k for k, v in live.items() if not torch.equal(v, before[k])]
        out["small"] = {k: live[k].float().tolist() for k in ("lr", "step", "noop")}
        losses_of(step, model, opt, data, out)
        return out
    if name == "eager-then-graph":  # the first version's order: an eager FusedAdam step in this process first
        opt, _ = loop.make_optimizer(model, cfg, dev, capturable=True)
        loop.make_step(model, opt, student, task)(*data.train[0])
        student = loop.prepare(backend, cfg, task, dev)
        model = student.model
        model.train()
    opt, _ = loop.make_optimizer(model, cfg, dev, capturable=True)
    step = loop.capture_step(model, model, opt, student, task, data.train[0])
    losses_of(step, model, opt, data, out)
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        try:
            print(json.dumps(variant(sys.argv[2])), flush=True)
        except Exception as e:
            print(json.dumps({"label": sys.argv[2], "error": f"{type(e).__name__}: {e}"[:400]}), flush=True)
    else:
        for v in sys.argv[1:] or VARIANTS:
            r = subprocess.run([sys.executable, __file__, "--one", v], capture_output=True, text=True, timeout=170)
            print(
                (r.stdout.strip().splitlines() or [json.dumps({"label": v, "stderr": r.stderr[-600:]})])[-1], flush=True
            )
