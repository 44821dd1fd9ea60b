"""The verdict's prediction, on any machine: from a model's config.json and the run's tokens per step, the FP8
eligibility of each GEMM, the FLOPs split of a training step, the ideal bf16 and FP8 step times at the GPU's peaks,
the memory-bound floors FP8 does not shrink, and a predicted speed-up range per recipe. Every assumption the
numbers rest on is written into the result (`assumptions`).

    from workbench.verdict.predict import predict
    predict("llama-3.2-1b", batch=4, seq_len=2048)["flops"]    # an hf-init shape name, or a model folder

The model of a step's time, per recipe r (both sides at the same GPU's peaks and bandwidth):
  best case   compute only: each GEMM's FLOPs at the bf16 peak, or at the FP8 peak where r runs it in FP8
              (the 2x GEMM ratio on eligible GEMMs); attention at the bf16 peak unless r runs it in FP8;
  worst case  best case + the floors (optimizer, logits / loss, elementwise), the same on both sides, + on the
              FP8 side the casts of every FP8 GEMM's operands at the bandwidth.
  speed-up    bf16 time / FP8 time: best case over best case, worst over worst -> the range [worst, best].
The bf16 side is the fastest bf16 path idealised (its GEMMs at the peak): the denominator the issue asks for.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.measure import peaks
from workbench.verdict import shapes
from workbench.verdict.shapes import Gemm, ModelShape

SCHEMA = 1
DEFAULT_GPU = "NVIDIA H200"  # the project's GPU (torch's name for the SXM part)
OPTIMIZER_BYTES_PER_PARAM = 28  # AdamW, fp32: read master, grad, m, v (16 bytes of state), write master, m, v (12)
LOGIT_BYTES = 18  # per logit: bf16 write (2), the fp32 loss reads it (2) and passes an fp32 softmax (write 4, read 4),
# writes bf16 grad logits (2), the head's backward reads them twice, dgrad and wgrad (4)
CAST_BYTES = 4  # per FP8 operand element: read bf16 (2), write FP8 and its transposed copy (1 + 1)
ACT_BYTES = 2  # bf16 activations


@dataclass(frozen=True)
class Recipe:
    name: str
    what: str
    rule: str  # shapes.RULES key
    head: bool  # the LM head's GEMM in FP8 too
    attention: bool = False  # attention's two matmuls in FP8 (TE fp8_dpa)
    head_where_aligned: bool = False  # torchao: a head that is not aligned stays bf16 instead of refusing


RECIPES = (
    Recipe("te_fp8_layers", "TE FP8 delayed / current scaling, decoder-layer GEMMs (LM head bf16)", "tensor", False),
    Recipe("te_fp8_layers_head", "TE FP8 delayed / current, layer GEMMs + FP8 LM head (options.te_head_precision=fp8)",
           "tensor", True),
    Recipe("te_fp8_layers_head_attention", "TE FP8 delayed, layer GEMMs + FP8 head + FP8 attention "
                                           "(options.te_fp8_dpa)", "tensor", True, attention=True),
    Recipe("te_fp8_block", "TE Float8BlockScaling, decoder-layer GEMMs (LM head bf16)", "block", False),
    Recipe("torchao_float8", "torchao float8 tensorwise, every aligned Linear (the LM head too where aligned)",
           "tensor", True, head_where_aligned=True),
)


# ---- FLOPs ------------------------------------------------------------------------------------
def gemm_flops(g: Gemm, tokens: int) -> int:
    """A training step's FLOPs of one GEMM over all layers holding it: forward 2MKN, grad of input 2MKN, grad of
    weight 2MKN."""
    return 6 * tokens * g.k * g.n * g.count


def mean_keys(seq_len: int, window: int | None) -> float:
    """Keys a query attends on average under a causal mask, within a sliding window where one is set: query i
    (0-based) sees min(i + 1, window) keys. Full causal: (seq + 1) / 2, the half of the square a fused kernel does."""
    w = min(window or seq_len, seq_len)
    return (w * (w + 1) / 2 + (seq_len - w) * w) / seq_len


def attention_flops(shape: ModelShape, batch: int, seq_len: int) -> float:
    """A training step's attention FLOPs: per layer and query, q@k^T and att@v are 2 x keys x heads x head_dim
    each forward, x3 for forward + backward: 12 x keys x attn_width, summed over the batch's tokens."""
    tokens = batch * seq_len
    return sum(12 * tokens * mean_keys(seq_len, w) * shape.attn_width for w in shape.windows)


def flops_split(shape: ModelShape, batch: int, seq_len: int) -> dict[str, Any]:
    tokens = batch * seq_len
    layer = sum(gemm_flops(g, tokens) for g in shape.gemms if g.where == "layer")
    head = sum(gemm_flops(g, tokens) for g in shape.gemms if g.where == "head")
    attn = attention_flops(shape, batch, seq_len)
    total = layer + head + attn
    project = shape.project_flops_per_token * tokens
    return {
        "layer_gemms_tflop": layer / 1e12, "lm_head_tflop": head / 1e12, "attention_tflop": attn / 1e12,
        "total_tflop": total / 1e12,
        "share": {"layer_gemms": layer / total, "lm_head": head / total, "attention": attn / total},
        "project_count_tflop": project / 1e12,
        "formulas": {
            "gemm": "6 x M x K x N per GEMM (forward, grad of input, grad of weight), M = tokens a step, summed "
                    "over the decoder layers holding it",
            "attention": "12 x tokens x mean_keys x heads x head_dim per layer; mean_keys = (seq+1)/2 under the "
                         "causal mask (within a sliding window: min(i+1, window) keys for query i)",
            "project_count": "workbench.models.lm.lm_train_flops_per_token (nanochat's): 6 x every 2-D weight "
                             "outside embeddings (head included) + 12 x layers x attn_width x seq, the full seq x "
                             "seq square: its attention term is 2x this one's (sliding windows not taken off)",
        },
    }


# ---- ceilings ---------------------------------------------------------------------------------
def ceilings(gpu: str | None, peak: dict | None) -> dict[str, Any]:
    """TFLOP/s (bf16, FP8) and bandwidth: a bench's measured peak.json where given, else the datasheet
    (workbench.measure.peaks), labelled; None where unknown (then no time is predicted)."""
    gpu = (peak or {}).get("gpu_name") or gpu
    sheet = peaks.datasheet_peak(gpu)
    bw = peaks.BANDWIDTH_TBS.get(sheet.gpu) if sheet else None
    out = {"gpu": gpu, "datasheet_entry": sheet.gpu if sheet else None, "bandwidth_tb_s": bw,
           "bandwidth_source": "datasheet (workbench.measure.peaks.BANDWIDTH_TBS)" if bw else "unknown GPU"}
    measured = {p: peaks.measured_tflops(peak, p) for p in ("bf16", "fp8")} if peak else {}
    if measured and all(measured.values()):
        return {**out, **{f"{p}_tflops": v for p, v in measured.items()},
                "peak_source": "measured (peak.json: the best block of an 8192^3 GEMM per precision)"}
    tf = sheet.tflops if sheet else {}
    return {**out, "bf16_tflops": tf.get("bf16"), "fp8_tflops": tf.get("fp8"),
            "peak_source": (f"datasheet ({sheet.gpu}: dense tensor-core TFLOP/s, {sheet.sources.get('bf16')})"
                            if sheet else f"unknown: {gpu!r} is not in workbench.measure.peaks.DATASHEET")}


# ---- memory-bound floors --------------------------------------------------------------------
def elementwise_bytes(shape: ModelShape, tokens: int) -> float:
    """Bytes of the elementwise work per step (bf16 activations), per layer and token: two RMSNorms (forward read +
    write, backward read grad and input, write grad: 5 x hidden each), two residual adds (3 x hidden each), the
    gated activation (forward read gate and up, write: 3 x ffn; backward 5 x ffn), RoPE on q and k (forward and
    backward read + write: 4 x (q + k widths)); plus the final norm."""
    per_layer = 16 * shape.hidden + 8 * shape.intermediate + 4 * (shape.attn_width + shape.kv_width)
    return ACT_BYTES * tokens * (shape.layers * per_layer + 5 * shape.hidden)


def floors(shape: ModelShape, tokens: int, bandwidth_tb_s: float | None) -> dict[str, Any]:
    """The step's memory-bound work FP8 does not shrink, in bytes and in ms at the bandwidth."""
    parts = {"optimizer": OPTIMIZER_BYTES_PER_PARAM * shape.parameters,
             "logits_loss": LOGIT_BYTES * tokens * shape.vocab,
             "elementwise": elementwise_bytes(shape, tokens)}
    ms = {k: (b / (bandwidth_tb_s * 1e12) * 1e3 if bandwidth_tb_s else None) for k, b in parts.items()}
    return {"gb": {k: b / 1e9 for k, b in parts.items()}, "ms": ms,
            "total_ms": sum(ms.values()) if bandwidth_tb_s else None}


def cast_bytes(gemms: list[Gemm], tokens: int) -> float:
    """The FP8 side's extra traffic: each FP8 GEMM's input (M x K), output grad (M x N) and weight (K x N) cast
    from bf16 to FP8 with a transposed copy, once a step, in every layer holding it."""
    return sum(CAST_BYTES * (tokens * g.k + tokens * g.n + g.k * g.n) * g.count for g in gemms)


# ---- recipes ----------------------------------------------------------------------------------
def eligibility(shape: ModelShape, tokens: int, gpu: str | None) -> dict[str, Any]:
    """Per GEMM (one decoder layer's and the head) its shape and FLOPs and each rule's verdict; attention's FP8
    verdict; TE decoder-layer conversion."""
    rows = []
    for g in shape.gemms:
        row = {"name": g.name, "where": g.where, "layers": g.count, "m": tokens, "k": g.k, "n": g.n,
               "tflop_per_step": gemm_flops(g, tokens) / 1e12}
        for rule in shapes.RULES:
            ok, why = shapes.gemm_eligible(tokens, g.k, g.n, rule)
            row[rule] = {"eligible": ok, "reason": why}
        rows.append(row)
    ok, why = shapes.fp8_attention(shape.head_dim, shape.te_layers_refusal, gpu)
    return {"gemms": rows, "attention": {"head_dim": shape.head_dim, "heads": shape.heads,
                                         "kv_heads": shape.kv_heads, "fp8": {"eligible": ok, "reason": why}},
            "te_layers": shapes.te_layers(shape)}


def fp8_gemms(r: Recipe, shape: ModelShape, tokens: int) -> tuple[list[Gemm], list[str]]:
    """(the GEMMs recipe r runs in FP8, why it is refused): a TE recipe refuses a model with any FP8 GEMM out of
    its rule (the backend's own size check); torchao leaves a misaligned head in bf16."""
    chosen, refused = [], []
    for g in shape.gemms:
        if g.where == "head" and not r.head:
            continue
        ok, why = shapes.gemm_eligible(tokens, g.k, g.n, r.rule)
        if ok:
            chosen.append(g)
        elif not (g.where == "head" and r.head_where_aligned):
            refused.append(f"{g.name}: {why}")
    return chosen, refused


def step_ms(r: Recipe | None, shape: ModelShape, batch: int, seq_len: int, ceil: dict) -> dict[str, Any] | None:
    """Best- and worst-case step time (ms) and its parts for recipe r (None: bf16), or None where a peak is
    unknown."""
    bf16, fp8, bw = ceil["bf16_tflops"], ceil["fp8_tflops"], ceil["bandwidth_tb_s"]
    if not (bf16 and bw and (r is None or fp8)):
        return None
    tokens = batch * seq_len
    chosen = fp8_gemms(r, shape, tokens)[0] if r else []
    ms = {"layer_gemms": 0.0, "lm_head": 0.0}
    for g in shape.gemms:
        peak = fp8 if g in chosen else bf16
        ms["layer_gemms" if g.where == "layer" else "lm_head"] += gemm_flops(g, tokens) / (peak * 1e12) * 1e3
    ms["attention"] = attention_flops(shape, batch, seq_len) / ((fp8 if r and r.attention else bf16) * 1e12) * 1e3
    floor = floors(shape, tokens, bw)["ms"]
    extra = cast_bytes(chosen, tokens)
    if r and r.attention:  # q, k, v, out and their grads cast for FP8 attention, every layer
        extra += CAST_BYTES * tokens * 2 * (2 * shape.attn_width + 2 * shape.kv_width) * shape.layers
    casts = extra / (bw * 1e12) * 1e3
    best = sum(ms.values())
    return {"best_ms": best, "worst_ms": best + sum(floor.values()) + casts,
            "parts_ms": {**ms, **floor, "fp8_casts": casts}}


def recipe_rows(shape: ModelShape, batch: int, seq_len: int, ceil: dict, attention_ok: bool | None) -> list[dict]:
    base = step_ms(None, shape, batch, seq_len, ceil)
    rows = [{"recipe": "bf16", "what": "the fastest bf16 path, idealised: every GEMM at the bf16 peak",
             "eligible": True, "reason": "", "fp8_gemms": [], **(base or {})}]
    for r in RECIPES:
        chosen, refused = fp8_gemms(r, shape, batch * seq_len)
        if r.attention and attention_ok is not True:
            refused.append("attention: " + ("unknown here" if attention_ok is None else "not eligible (above)"))
        row = {"recipe": r.name, "what": r.what, "eligible": not refused, "reason": "; ".join(refused),
               "fp8_gemms": [g.name for g in chosen]}
        t = step_ms(r, shape, batch, seq_len, ceil) if not refused else None
        if t and base:
            t["speedup_best"] = base["best_ms"] / t["best_ms"]
            t["speedup_worst"] = base["worst_ms"] / t["worst_ms"]
        rows.append({**row, **(t or {})})
    return rows


def assumptions(ceil: dict, tokens: int) -> list[str]:
    return [
        f"Tokens a step: {tokens} (batch x seq_len of the preset and --set); the model's shape comes from its "
        "config.json alone (built on the meta device), not from the preset's model fields.",
        f"Peaks: {ceil['peak_source']}; bf16 {ceil['bf16_tflops']} and FP8 {ceil['fp8_tflops']} TFLOP/s for "
        f"{ceil['gpu']}. Bandwidth {ceil['bandwidth_tb_s']} TB/s, {ceil['bandwidth_source']}: a datasheet peak is "
        "an upper bound, the measured GEMM peak is ~80% of it on the H200 (790 of 989.5 bf16).",
        "Best case: compute only, every GEMM at the peak of its precision (an eligible GEMM 2x faster in FP8), "
        "attention at the bf16 peak unless the recipe runs it in FP8, the floors hidden: an upper bound.",
        "Worst case: the best case + the memory-bound floors at the bandwidth, the same on both sides "
        f"(optimizer {OPTIMIZER_BYTES_PER_PARAM} bytes/param: AdamW's fp32 master, grad, m, v = 16 bytes/param "
        f"read, master, m, v written; logits and loss {LOGIT_BYTES} bytes/logit; elementwise: norms, residuals, "
        "the gated activation, RoPE in bf16) + on the FP8 side the casts of each FP8 GEMM's input, output grad and "
        f"weight ({CAST_BYTES} bytes/element: read bf16, write FP8 and a transposed copy), none fused into a norm.",
        "GEMMs run at the peak whatever their size: small GEMMs (hidden 576, a few layers) reach a fraction of "
        "it and FP8's fixed costs weigh more there (SmolLM2-135M's shape measured FP8 no faster than bf16), so "
        "at small shapes the GEMM-efficiency term is the one most likely wrong.",
        "Not counted: kernel launch gaps and host time (a CUDA graph removes most), the embedding lookup and its "
        "grad, amax reductions and scale updates, attention's softmax (inside the fused kernel), communication.",
        "Eligibility: tensor scaling needs M, K, N multiples of 16; block scaling multiples of 128; a TE recipe "
        "with one FP8 GEMM out of its rule is refused (the backend's size check), torchao keeps a misaligned head "
        "in bf16. FP8 attention: head_dim 128 on Hopper with TE's decoder layers (head_dim 64 measured to have "
        "no FP8 attention backend on the H200).",
        "The bf16 denominator is the fastest bf16 path idealised; the measured one (compiled HF bf16 or TE bf16 "
        "layers, graphed or not: whichever is fastest) comes from the GPU part.",
    ]


def predict(model: str, batch: int, seq_len: int, gpu: str | None = DEFAULT_GPU,
            peak: dict | None = None) -> dict[str, Any]:
    """The prediction of verdict.json for MODEL (a folder or an hf-init shape) at batch x seq_len tokens a step."""
    shape = shapes.read(model, seq_len)
    tokens = batch * seq_len
    ceil = ceilings(gpu, peak)
    elig = eligibility(shape, tokens, ceil["gpu"])
    return {
        "schema": SCHEMA,
        "model": {k: v for k, v in vars(shape).items() if k not in ("gemms", "project_flops_per_token")},
        "run": {"batch": batch, "seq_len": seq_len, "tokens_per_step": tokens},
        "eligibility": elig, "flops": flops_split(shape, batch, seq_len), "ceilings": ceil,
        "floors": floors(shape, tokens, ceil["bandwidth_tb_s"]),
        "recipes": recipe_rows(shape, batch, seq_len, ceil, elig["attention"]["fp8"]["eligible"]),
        "assumptions": assumptions(ceil, tokens),
    }
