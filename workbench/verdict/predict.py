"""The verdict's prediction, on any machine: from a model's config.json and the run's tokens per step, the FP8
eligibility of each GEMM, the FLOPs split of a training step, the ideal bf16 and FP8 step times at the GPU's peaks,
the memory-bound floors FP8 does not shrink, and a predicted speed-up range per recipe. Every assumption the
numbers rest on is written into the result (`assumptions`).

    from workbench.verdict.predict import predict
    predict("llama-3.2-1b", batch=4, seq_len=2048)["flops"]    # an hf-init shape name, or a model folder

Two step times per recipe r (bf16: the fastest bf16 path, TE's layers, as the denominator):
  ideal     compute only: each GEMM's FLOPs at the peak of its precision (an FP8 GEMM 2x faster), attention at the
            bf16 peak unless r runs it in FP8: an upper bound on the speed-up;
  expected  workbench.verdict.calibration: each GEMM a roofline with a fixed cost, attention, the memory-bound floors
            and FP8's casts and scale kernels at the efficiencies the H200's profiler measured in whole-step graphs.
  speed-up  bf16 time / FP8 time; the range quoted is the expected one +- calibration.TOLERANCE.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.measure import peaks
from workbench.verdict import calibration as cal
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
    scaling: str = "delayed"  # delayed | current (an extra amax pass) | block | torchao
    calibrated: bool = True  # False: no profile of it on the H200 yet, its expected time is the model's guess


RECIPES = (
    Recipe("te_fp8_delayed", "TE FP8 delayed scaling, decoder-layer GEMMs (LM head bf16)", "tensor", False),
    Recipe("te_fp8_current", "TE FP8 current scaling, decoder-layer GEMMs (LM head bf16)", "tensor", False,
           scaling="current"),
    Recipe("te_fp8_delayed_head", "TE FP8 delayed, layer GEMMs + FP8 LM head (options.te_head_precision=fp8)",
           "tensor", True),
    Recipe("te_fp8_current_head", "TE FP8 current, layer GEMMs + FP8 LM head", "tensor", True, scaling="current"),
    Recipe("te_fp8_delayed_head_attention", "TE FP8 delayed, layer GEMMs + FP8 head + FP8 attention "
                                            "(options.te_fp8_dpa)", "tensor", True, attention=True,
           calibrated=False),
    Recipe("te_fp8_block", "TE Float8BlockScaling, decoder-layer GEMMs (LM head bf16)", "block", False,
           scaling="block", calibrated=False),
    Recipe("torchao_float8", "torchao float8 tensorwise, every aligned Linear (the LM head too where aligned)",
           "tensor", True, head_where_aligned=True, scaling="torchao", calibrated=False),
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
           "datasheet_tflops": {p: (sheet.tflops.get(p) if sheet else None) for p in ("bf16", "fp8")},
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


def fused_gemms(shape: ModelShape) -> list[Gemm]:
    """The GEMMs as TE's decoder layers run them: q, k, v one GEMM, gate and up one (calibration.FUSED)."""
    out: list[Gemm] = []
    for g in shape.gemms:
        prefix, _, short = g.name.rpartition(".")
        group = next((name for name, members in cal.FUSED.items() if short in members), None)
        if group is None:
            out.append(g)
            continue
        fused_name = f"{prefix}.{group}"
        if any(o.name == fused_name and o.k == g.k and o.count == g.count for o in out):
            continue
        members = [h for h in shape.gemms if h.name.rpartition(".")[0] == prefix and h.k == g.k
                   and h.count == g.count and h.name.rpartition(".")[2] in cal.FUSED[group]]
        out.append(Gemm(fused_name, g.k, sum(h.n for h in members), g.count, g.where))
    return out


def matmul_ms(m: int, k: int, n: int, precision: str, sheet: dict, bw: float) -> float:
    """One matmul (m x k) @ (k x n): a roofline at the calibrated efficiencies, plus a kernel's fixed cost."""
    flops, nbytes = 2 * m * k * n, (1 if precision == "fp8" else 2) * (m * k + k * n) + 2 * m * n
    compute = flops / (sheet[precision] * 1e12 * cal.GEMM_EFFICIENCY[precision])
    return (max(compute, nbytes / bw) + cal.GEMM_KERNEL_US * 1e-6) * 1e3


def gemm_step_ms(g: Gemm, tokens: int, precision: str, sheet: dict, bw: float) -> float:
    """A GEMM's forward, grad of input and grad of weight, in every layer holding it."""
    return g.count * sum(matmul_ms(m, k, n, precision, sheet, bw)
                         for m, k, n in ((tokens, g.k, g.n), (tokens, g.n, g.k), (g.k, tokens, g.n)))


def ideal_ms(r: Recipe | None, shape: ModelShape, batch: int, seq_len: int, ceil: dict) -> float | None:
    """Compute only, at the ceilings' peaks (measured or datasheet): the upper bound."""
    bf16, fp8 = ceil["bf16_tflops"], ceil["fp8_tflops"]
    if not (bf16 and (r is None or fp8)):
        return None
    tokens = batch * seq_len
    chosen = fp8_gemms(r, shape, tokens)[0] if r else []
    gemm = sum(gemm_flops(g, tokens) / ((fp8 if g in chosen else bf16) * 1e12) for g in shape.gemms)
    attention = attention_flops(shape, batch, seq_len) / ((fp8 if r and r.attention else bf16) * 1e12)
    return (gemm + attention) * 1e3


def expected_ms(r: Recipe | None, shape: ModelShape, batch: int, seq_len: int, ceil: dict) -> dict | None:
    """The calibrated step time (ms) and its parts for recipe r (None: bf16), or None where the GPU is unknown."""
    sheet, bw = ceil["datasheet_tflops"], ceil["bandwidth_tb_s"]
    if not (sheet.get("bf16") and bw and (r is None or sheet.get("fp8"))):
        return None
    tokens, eff_bw = batch * seq_len, bw * 1e12 * cal.BANDWIDTH_EFFICIENCY
    where = {g.where for g in fp8_gemms(r, shape, tokens)[0]} if r else set()
    fp8 = [g for g in fused_gemms(shape) if g.where in where]
    parts = {"layer_gemms": 0.0, "lm_head": 0.0}
    for g in fused_gemms(shape):
        key = "layer_gemms" if g.where == "layer" else "lm_head"
        parts[key] += gemm_step_ms(g, tokens, "fp8" if g in fp8 else "bf16", sheet, eff_bw)
    attn_peak = sheet["fp8" if r and r.attention else "bf16"] * 1e12 * cal.attention_efficiency(shape.head_dim)
    parts["attention"] = attention_flops(shape, batch, seq_len) / attn_peak * 1e3
    floor = floors(shape, tokens, bw)["ms"]
    parts.update({k: v * cal.FLOOR_FACTOR[k] for k, v in floor.items()})
    if r and "layer" in where:  # TE's norm and activation kernels write FP8 for the next GEMM: less bf16 traffic
        parts["elementwise"] *= 1 - cal.FP8_ELEMENTWISE_SAVING.get(r.scaling, 0.0)
    casts = cast_bytes(fp8, tokens)
    modules = sum(g.count for g in fp8)
    if r and r.scaling == "current":  # one more read of every FP8 operand for its amax, and its kernels
        casts += casts * cal.CURRENT_AMAX_BYTES / CAST_BYTES
        modules_us = modules * (cal.FP8_MODULE_US + cal.CURRENT_MODULE_US)
    else:
        modules_us = modules * cal.FP8_MODULE_US
    if r and r.attention:  # q, k, v, out and their grads cast for FP8 attention, every layer
        casts += CAST_BYTES * tokens * 2 * (2 * shape.attn_width + 2 * shape.kv_width) * shape.layers
    parts["fp8_casts"] = casts / eff_bw * 1e3 + modules_us * 1e-3
    return {"expected_ms": sum(parts.values()), "parts_ms": parts}


def recipe_rows(shape: ModelShape, batch: int, seq_len: int, ceil: dict, attention_ok: bool | None,
                te_layers: bool = True) -> list[dict]:
    base = expected_ms(None, shape, batch, seq_len, ceil)
    base_ideal = ideal_ms(None, shape, batch, seq_len, ceil)
    rows = [{"recipe": "bf16", "what": "the fastest bf16 path (TE's bf16 layers, the whole step graphed)",
             "eligible": True, "reason": "", "fp8_gemms": [], "calibrated": True, "ideal_ms": base_ideal,
             **(base or {})}]
    for r in RECIPES:
        chosen, refused = fp8_gemms(r, shape, batch * seq_len)
        if r.attention and attention_ok is not True:
            refused.append("attention: " + ("unknown here" if attention_ok is None else "not eligible (above)"))
        # the calibration is TE's decoder layers': a family they cannot hold runs TE per Linear, uncalibrated
        calibrated = r.calibrated and (te_layers or not r.name.startswith("te_"))
        row = {"recipe": r.name, "what": r.what, "eligible": not refused, "reason": "; ".join(refused),
               "fp8_gemms": [g.name for g in chosen], "calibrated": calibrated}
        if not refused:
            t, ideal = expected_ms(r, shape, batch, seq_len, ceil), ideal_ms(r, shape, batch, seq_len, ceil)
            row["ideal_ms"] = ideal
            if ideal and base_ideal:
                row["speedup_ideal"] = base_ideal / ideal
            if t and base:
                x = base["expected_ms"] / t["expected_ms"]
                row.update(t, speedup_expected=x, speedup_low=x * (1 - cal.TOLERANCE),
                           speedup_high=x * (1 + cal.TOLERANCE))
        rows.append(row)
    return rows


def assumptions(ceil: dict, tokens: int) -> list[str]:
    return [
        f"Tokens a step: {tokens} (batch x seq_len of the preset and --set); the model's shape comes from its "
        "config.json alone (built on the meta device), not from the preset's model fields.",
        f"Peaks: {ceil['peak_source']}; bf16 {ceil['bf16_tflops']} and FP8 {ceil['fp8_tflops']} TFLOP/s for "
        f"{ceil['gpu']}. Bandwidth {ceil['bandwidth_tb_s']} TB/s, {ceil['bandwidth_source']}: a datasheet peak is "
        "an upper bound, the measured GEMM peak is ~80% of it on the H200 (790 of 989.5 bf16).",
        "Ideal: compute only, every GEMM at the peak of its precision (an eligible GEMM 2x faster in FP8), "
        "attention at the bf16 peak unless the recipe runs it in FP8: an upper bound no real step reaches.",
        f"Expected: workbench.verdict.calibration, fitted to the H200's profiler splits of whole-step CUDA graphs "
        f"(TE layers; Qwen3-0.6B x4, SmolLM2-135M) and checked on Llama-3.2-1B x4 / x16 and Qwen2.5-0.5B (not "
        f"fitted): each GEMM a "
        f"roofline at {cal.GEMM_EFFICIENCY} of the datasheet peaks and {cal.BANDWIDTH_EFFICIENCY} of its bandwidth "
        f"+ {cal.GEMM_KERNEL_US} us a kernel; attention at {cal.ATTENTION_EFFICIENCY} (head_dim: share of the bf16 "
        f"peak); the floors (optimizer {OPTIMIZER_BYTES_PER_PARAM} bytes/param, logits and loss {LOGIT_BYTES} "
        f"bytes/logit, elementwise bf16 traffic) at the bandwidth x {cal.FLOOR_FACTOR}; FP8 casts "
        f"({CAST_BYTES} bytes/operand element) + {cal.FP8_MODULE_US} us per FP8 module (current scaling: an amax "
        f"read, {cal.CURRENT_AMAX_BYTES} bytes/element, + {cal.CURRENT_MODULE_US} us); an FP8 step's elementwise "
        f"time less the share {cal.FP8_ELEMENTWISE_SAVING} (by scaling: TE's norms and activations write FP8). "
        "Its range: +-"
        f"{cal.TOLERANCE:.0%} (scripts/verdict_calibration.py: every calibrated row within "
        f"{cal.LARGEST_MISS:.1%} on those shapes).",
        f"The calibration is the {cal.CALIBRATED_ON}'s (TE 2.20): on another GPU only its datasheet scales it. "
        "Rows marked not calibrated (FP8 attention, block scaling, torchao) have no H200 profile yet: their "
        "expected time is the same model's guess.",
        "Not counted: host time (a graphed step has none; eager steps at small shapes are host-bound and "
        "slower, see the measured part), the embedding lookup, communication.",
        "Eligibility: tensor scaling needs M, K, N multiples of 16; block scaling multiples of 128; a TE recipe "
        "with one FP8 GEMM out of its rule is refused (the backend's size check), torchao keeps a misaligned head "
        "in bf16. FP8 attention: head_dim 128 on Hopper with TE's decoder layers (head_dim 64 measured to have "
        "no FP8 attention backend on the H200).",
        "The bf16 denominator is TE's bf16 layers with the whole step graphed (the fastest bf16 row measured at "
        "every calibration shape); the measured one (compiled HF bf16 or TE bf16 layers, graphed or not: "
        "whichever is fastest) comes from the GPU part.",
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
        "recipes": recipe_rows(shape, batch, seq_len, ceil, elig["attention"]["fp8"]["eligible"],
                               elig["te_layers"]["supported"]),
        "calibration": {"on": cal.CALIBRATED_ON, "tolerance": cal.TOLERANCE,
                        "outside": cal.outside(shape.hidden, tokens)},
        "assumptions": assumptions(ceil, tokens),
    }
