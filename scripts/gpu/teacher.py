"""The teacher-mode and head-fused-loss measurements of the `teacher` run (scripts/gpu_runs.toml; one part per
invocation, so each length run gets its own process and its own peak memory):

  python3 scripts/gpu/teacher.py length MODE STEPS OUT   a gpt student at vocab 128256 (8192 tokens a step),
        one run with teacher_mode MODE for STEPS steps: OUT/length-MODE-STEPS.json (the row, peak GPU memory
        over the whole process, peak host RSS)
  python3 scripts/gpu/teacher.py quality OUT            lm-distill's student with full logits and with top-k
        k in TOPK_KS: OUT/topk_quality.csv
  python3 scripts/gpu/teacher.py loss OUT               the logit losses at vocab 128256, 8192 tokens:
        OUT/loss_compare.csv
  python3 scripts/gpu/teacher.py readme OUT             OUT/length.csv and OUT/README.md from the files above
"""
from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from workbench import config, results
from workbench.run import runner

VOCAB, TOKENS = 128256, 8192
TOPK_KS = (8, 64, 256)
QUALITY_STEPS = 150


def length(mode: str, steps: int, out: Path) -> None:
    cfg = config.from_preset("lm-a", vocab=VOCAB, tokenizer="bytes", hidden=512, intermediate=2048, layers=2, heads=8,
                             seq_len=1024, batch=TOKENS // 1024, steps=steps, eval_batches=1, warmup=3, iters=10,
                             backends="torch_bf16", baseline="torch_bf16", no_kd_student=False, teacher_mode=mode,
                             topk=64, corpus_mb=2.0)
    torch.cuda.reset_peak_memory_stats()
    t0 = time.monotonic()
    run_dir = runner.run(cfg, out=out / "runs", run_id=f"length-{mode}-{steps}", progress=False)
    row = results.load(run_dir).iloc[0].to_dict()
    task = results.read_json(run_dir / "task.json")
    keep = ("student", "status", "reason", "teacher_mode", "teacher_mode_reason", "step_ms_median", "teacher_ms_median",
            "teacher_step_ms_median", "distill_step_ms_median", "peak_mem_allocated_mb", "final_train_loss",
            "kl_teacher_student_t1_nats", "loss_impl")
    results.write_json(
        out / f"length-{mode}-{steps}.json",
        {
            "mode": mode,
            "steps": steps,
            "vocab": VOCAB,
            "tokens_per_step": TOKENS,
            "wall_s": round(time.monotonic() - t0, 1),
            "process_peak_gpu_allocated_mb": torch.cuda.max_memory_allocated() / 2**20,
            "process_peak_host_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "topk_store_gib": task.get("teacher_topk_store_gib"),
            "precomputed_logits_would_need_gib": task.get("teacher_logits_train_gib"),
            **{k: (None if pd.isna(row.get(k)) else row.get(k)) for k in keep},
        },
    )


def quality(out: Path) -> None:
    rows = []
    for k in (None, *TOPK_KS):
        over = {"teacher_mode": "precomputed"} if k is None else {"teacher_mode": "topk", "topk": k}
        cfg = config.from_preset("lm-distill", steps=QUALITY_STEPS, backends="torch_bf16", baseline="torch_bf16",
                                 no_kd_student=False, warmup=2, iters=5, **over)
        run_dir = runner.run(cfg, out=out / "runs", run_id=f"quality-{k or 'full'}", progress=False)
        r = results.load(run_dir).iloc[0]
        rows.append({"k": k, "teacher_mode": r["teacher_mode"], "status": r["status"], "steps": QUALITY_STEPS,
                     "vocab": cfg.model.vocab, "kl_teacher_student_t1_nats": r["kl_teacher_student_t1_nats"],
                     "heldout_ppl": r["heldout_ppl"], "top1_agreement": r["top1_agreement"],
                     "step_ms_median": r["step_ms_median"]})
    df = pd.DataFrame(rows)
    full = df.loc[df["k"].isna(), "kl_teacher_student_t1_nats"].iloc[0]
    df["kl_vs_full_pct"] = 100 * (df["kl_teacher_student_t1_nats"] / full - 1)
    results.write_csv(out / "topk_quality.csv", df)


def _measure(fn, iters: int = 10, warmup: int = 3) -> tuple[float, float, float]:
    """(median ms, peak MiB above what was allocated before, loss) of fn() = loss; backward inside."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times, loss = [], None
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        loss = fn()
        b.record()
        times.append((a, b))
    torch.cuda.synchronize()
    ms = sorted(x.elapsed_time(y) for x, y in times)[len(times) // 2]
    return ms, (torch.cuda.max_memory_allocated() - base) / 2**20, float(loss)


def loss(out: Path) -> None:
    from workbench.config import DistillConfig
    from workbench.models.lm import HeadFeatures
    from workbench.train.objectives import lm_objectives as lo
    from workbench.train.objectives.head_loss import head_fused_loss

    def settings(chunk: int, impl: str = "fused_head") -> DistillConfig:  # forward_kl at T=1, half CE
        return DistillConfig(loss="forward_kl", temperature=1.0, ce_weight=0.5, loss_chunk_tokens=chunk,
                             loss_impl=impl)

    torch.manual_seed(0)
    hidden = 2048  # Llama-3.2-1B's width
    h = (torch.randn(TOKENS, hidden, device="cuda") / 4).bfloat16().requires_grad_()
    w = (torch.randn(VOCAB, hidden, device="cuda") / 50).requires_grad_()
    t = (torch.randn(TOKENS, VOCAB, device="cuda") * 2).bfloat16()
    y = torch.randint(0, VOCAB, (TOKENS,), device="cuda")

    def materialised(impl: str, chunk: int):
        def fn():
            h.grad = w.grad = None
            logits = h @ w.bfloat16().t()  # the head under bf16 autocast, as a student runs it
            value = lo.lm_loss(logits, t, y, settings(chunk, impl))
            value.backward()
            return value.detach()
        return fn

    def fused_head(chunk: int):
        def fn():
            h.grad = w.grad = None
            value = head_fused_loss(HeadFeatures((h, w)), t, y, settings(chunk))
            value.backward()
            return value.detach()
        return fn

    cases = [("checkpointed", 4096, materialised("checkpointed", 4096)), ("fused", 4096, materialised("fused", 4096)),
             *(("fused_head", c, fused_head(c)) for c in (4096, 2048, 1024, 512))]
    rows = []
    for impl, chunk, fn in cases:
        ms, mem, value = _measure(fn)
        rows.append({"impl": impl, "chunk_tokens": chunk, "vocab": VOCAB, "tokens": TOKENS, "hidden": hidden,
                     "head_and_loss_ms_median": ms, "loss_peak_mem_mb": mem, "loss": value, "note": ""})
    try:  # a comparator, never a dependency: Liger-Kernel's chunked JSD at beta=0 (forward KL), KD term only
        from liger_kernel.transformers import LigerFusedLinearJSDLoss

        liger = LigerFusedLinearJSDLoss(jsd_beta=0.0, temperature=1.0)
        teacher_w = torch.randn(VOCAB, hidden, device="cuda", dtype=torch.bfloat16) / 50
        teacher_h = torch.randn(TOKENS, hidden, device="cuda", dtype=torch.bfloat16) / 4

        def fn():
            h.grad = w.grad = None
            value = liger(h, w.bfloat16(), teacher_h, teacher_w, y)
            value.backward()
            return value.detach()

        ms, mem, value = _measure(fn)
        rows.append({"impl": "liger_fused_linear_jsd_beta0", "chunk_tokens": None, "vocab": VOCAB, "tokens": TOKENS,
                     "hidden": hidden, "head_and_loss_ms_median": ms, "loss_peak_mem_mb": mem, "loss": value,
                     "note": "KD term only, its own teacher head; not the same loss value"})
    except Exception as e:  # not installed (the usual case), or an API of another version
        rows.append({"impl": "liger_fused_linear_jsd_beta0", "chunk_tokens": None, "vocab": VOCAB, "tokens": TOKENS,
                     "hidden": hidden, "head_and_loss_ms_median": None, "loss_peak_mem_mb": None, "loss": None,
                     "note": f"did not run here ({type(e).__name__}: {e})"[:300]})
    df = pd.DataFrame(rows)
    fused = df[df["impl"] == "fused"].iloc[0]
    df["mem_vs_fused"] = df["loss_peak_mem_mb"] / fused["loss_peak_mem_mb"]
    df["ms_vs_fused"] = df["head_and_loss_ms_median"] / fused["head_and_loss_ms_median"]
    results.write_csv(out / "loss_compare.csv", df)


def readme(out: Path) -> None:
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("length-*.json"))]
    length_df = pd.DataFrame(rows)
    if len(length_df):  # growth: each run's peaks over the shortest run's of its mode (1.0 = independent of length)
        for col in ("process_peak_gpu_allocated_mb", "process_peak_host_rss_mb"):
            shortest = length_df.sort_values("steps").groupby("mode")[col].transform("first")
            length_df[col.replace("process_peak_", "growth_").replace("_mb", "")] = length_df[col] / shortest
        results.write_csv(out / "length.csv", length_df.sort_values(["mode", "steps"]))
    parts = ["# Teacher modes and the head-fused loss on one H200", "",
             "Generated by `scripts/gpu.sh teacher` from the files beside it; every number is in them. The length runs",
             "of one mode ran one after another while the other mode's (and the top-k quality runs) shared the GPU:",
             "their memory is per process and exact, their step times are not a speed measurement (the loss",
             "comparison ran alone).", ""]
    cols = [
        "mode",
        "steps",
        "status",
        "process_peak_gpu_allocated_mb",
        "growth_gpu_allocated",
        "process_peak_host_rss_mb",
        "growth_host_rss",
        "wall_s",
        "step_ms_median",
        "teacher_step_ms_median",
        "distill_step_ms_median",
        "topk_store_gib",
        "precomputed_logits_would_need_gib",
    ]
    for title, name, df, keep in (
            (f"## Length independence (vocab {VOCAB}, {TOKENS} tokens a step): length.csv", "length", length_df, cols),
            ("## Top-k quality against full logits (lm-distill): topk_quality.csv", "topk_quality", None,
             ["k", "status", "kl_teacher_student_t1_nats", "kl_vs_full_pct", "heldout_ppl", "top1_agreement"]),
            (f"## Logit loss at vocab {VOCAB}, {TOKENS} tokens: loss_compare.csv", "loss_compare", None,
             ["impl", "chunk_tokens", "head_and_loss_ms_median", "loss_peak_mem_mb", "mem_vs_fused", "ms_vs_fused",
              "loss", "note"])):
        if df is None:
            path = out / f"{name}.csv"
            df = pd.read_csv(path) if path.exists() else pd.DataFrame()
        parts += [title, ""]
        if df.empty:
            parts += ["(no result: that part did not finish)", ""]
            continue
        df = df[[c for c in keep if c in df]]
        parts += ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
        parts += ["| " + " | ".join("" if pd.isna(v) else (f"{v:.4g}" if isinstance(v, float) else str(v)) for v in r)
                  + " |" for r in df.itertuples(index=False)]
        parts.append("")
    results.write_bytes(out / "README.md", "\n".join(parts).encode())


if __name__ == "__main__":
    part, *args = sys.argv[1:]
    if part == "length":
        length(args[0], int(args[1]), Path(args[2]))
    else:
        {"quality": quality, "loss": loss, "readme": readme}[part](Path(args[0]))
