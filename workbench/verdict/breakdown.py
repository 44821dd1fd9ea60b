"""Every millisecond of a profiled training step, by what it does, beside its floor.

    python -m workbench verdict-breakdown PROFILE.json [PROFILE.json ...] --shape llama-3.2-1b \\
        --preset hf-llama-1b --out DIR

PROFILE is a run's `profile-<student>.json` (workbench.measure.profiler). Its kernels are sorted into the rows of
ROWS; each row's floor is the work it must do at the bench's ceilings: FLOPs at the measured GEMM peak of the
precision the GEMMs ran in (the bench's peak.json, found above the profile), bytes at the datasheet bandwidth (no
bandwidth is measured here). What the profile cannot tell apart is split by a stated rule and marked `attributed`:
  * layer GEMMs vs LM head GEMMs share kernel names (one nvjet kernel runs 48 layer GEMMs and one head GEMM). A
    profile with a step timeline (workbench.measure.profiler.step_timeline) measures the head by position: its
    forward is the GEMM right before the loss's kernels, its two backward GEMMs the two right after the loss's
    backward (no NVTX / record_function range reaches the GPU inside a CUDA graph replay, so the order is the
    record that works there). Without one, the GEMM time is split in proportion to each part's FLOPs / the peak
    of its precision, i.e. at equal efficiency: both get the same ratio by construction.
  * Triton kernels in a step that is not torch.compile'd come from the fused loss (the only compiled code there:
    train.objectives.lm_objectives.compiled_chunk), and its backward is the one bf16 elementwise Mul launched once a
    step (`grad.mul_(grad_out)`); both are counted as loss.
  * A profile written before the profiler kept every kernel lists only its top kernels: the rest of each profiler
    category is a row "(rest of <category>)", sorted by that category.
Writes DIR/breakdown.csv, breakdown.md and breakdown.png / .svg (measured beside floor, stacked by row).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from workbench import config, results
from workbench.measure import profiler
from workbench.verdict import predict as pr
from workbench.verdict import shapes

GEMMS, LAYER, HEAD = "GEMMs", "layer GEMMs", "LM head GEMMs"
ATTENTION, LOSS, CASTS = "attention fwd + bwd", "loss", "casts / amax / transposes"
ELEMENTWISE, OPTIMIZER = "norms and other elementwise", "optimizer"
COPIES, GAPS, OTHER = "copies (memcpy / memset)", "gaps between kernels", "other (unidentified kernels)"
ROWS = (LAYER, HEAD, ATTENTION, LOSS, CASTS, ELEMENTWISE, OPTIMIZER, COPIES, GAPS, OTHER)
COVERED = tuple(r for r in ROWS if r != OTHER)  # the categories: the step's share they explain
BY_CATEGORY = {"gemm": GEMMS, "attention": ATTENTION, "logit loss": LOSS, "loss/reduce": LOSS,
               "cast/amax/transpose": CASTS, "norm": ELEMENTWISE, "activation": ELEMENTWISE,
               "elementwise": ELEMENTWISE, "optimizer": OPTIMIZER, "memcpy/memset": COPIES, "other": OTHER}
LOSS_NAMES = ("logsumexp", "log_softmax", "softmax", "cross_entropy", "nll")  # a compiled step's loss kernels
# an uncompiled step's Triton is the fused loss (train.objectives.lm_objectives.compiled_chunk) where its name has
# these parts; other Triton there (a family's fused add) is elementwise
LOSS_TOKENS = {"exp", "logsumexp", "softmax"}
BF16_BINARY = "BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16"
WEIGHT_CAST_BYTES = 6  # per parameter a bf16 GEMM reads from an fp32 master weight: read fp32 (4), write bf16 (2)


# ---- which row a kernel belongs to ------------------------------------------------------------------
def kernel_list(profile: dict) -> list[dict]:
    """Every kernel of the profile; from a profile with only `top_kernels`, those plus one '(rest of <category>)'
    row per profiler category for the time the top kernels do not cover."""
    if profile.get("kernels"):
        return list(profile["kernels"])
    top = list(profile.get("top_kernels") or [])
    out = [dict(k) for k in top]
    for cat, ms in (profile.get("kernel_categories_ms_per_step") or {}).items():
        rest = ms - sum(k["ms_per_step"] for k in top if k["category"] == cat)
        if rest > 5e-4:
            out.append({"name": f"(rest of {cat!r}: not listed in this profile)", "category": cat,
                        "launches_per_step": None, "ms_per_step": round(rest, 4)})
    return out


def row_of(kernel: dict, compiled: bool, loss_mul: frozenset[str] = frozenset()) -> tuple[str, str]:
    """(the row of ROWS, or GEMMS before the layer/head split; 'measured' or the rule that attributed it).
    loss_mul: names of the kernels the timeline places as the fused loss's backward Mul (loss_backward_mul)."""
    cat, name = kernel["category"], kernel["name"].lower()
    if cat == "triton (compiled)":
        if any(p in name for p in LOSS_NAMES) or (not compiled and LOSS_TOKENS & set(name.split("_"))):
            return LOSS, "measured" if compiled else "attributed: Triton with exp/logsumexp in an uncompiled step"
        return ELEMENTWISE, "measured: Triton outside the loss"
    if kernel["name"] in loss_mul:
        return LOSS, "measured: the bf16 Mul right after the fused loss's backward (grad.mul_), from the timeline"
    if (cat == "elementwise" and "mulfunctor" in name and "bfloat16" in name
            and kernel.get("launches_per_step") == 1):
        return LOSS, "attributed: the fused loss's backward, grad.mul_ once a step"
    return BY_CATEGORY.get(cat, OTHER), "measured"


def _loss_anchors(timeline: list[dict], rows: list[str]) -> list[int]:
    """The positions of the loss's own kernels: generic reductions ('loss/reduce') also run in norms, so they do
    not anchor."""
    return [i for i, (r, k) in enumerate(zip(rows, timeline)) if r == LOSS and k["category"] != "loss/reduce"]


def loss_backward_mul(profile: dict, compiled: bool) -> frozenset[str]:
    """The kernels of the fused loss's backward grad.mul_(grad_out): the bf16 binary elementwise kernels that come
    first after the loss's last Triton kernel, past copies and sub-5 us kernels. By position, because the
    profiler keeps 160 characters of a name, which cut 'MulFunctor' off (and it may run once per chunk)."""
    tl = profiler.timeline(profile)
    anchors = _loss_anchors(tl, [row_of(k, compiled)[0] for k in tl])
    if not anchors:
        return frozenset()
    found = set()
    for k in tl[anchors[-1] + 1:]:
        if k["category"] == "elementwise" and BF16_BINARY in k["name"] and k["us"] >= 5:
            found.add(k["name"])
        elif found or not (k["category"] == "memcpy/memset" or k["us"] < 5):
            break
    return frozenset(found)


# ---- floors -------------------------------------------------------------------------------------------
def floors_ms(model: str, batch: int, seq_len: int, peak: dict | None, layers: str, head: str) -> dict:
    """Per row: (floor ms or None, what it rests on). layers / head: 'bf16' or 'fp8', the GEMMs' precision."""
    p = pr.predict(model, batch, seq_len, peak=peak)
    shape, ceil, fl = shapes.read(model, seq_len), p["ceilings"], p["flops"]
    tokens, bw = batch * seq_len, ceil["bandwidth_tb_s"]
    fp8 = [g for g in shape.gemms if (layers if g.where == "layer" else head) == "fp8"]
    fp8_weights = sum(g.k * g.n * g.count for g in fp8)
    cast_bytes = pr.cast_bytes(fp8, tokens) + WEIGHT_CAST_BYTES * (shape.parameters - fp8_weights)
    floor = p["floors"]

    def tflop_ms(tflop: float, precision: str) -> float | None:
        peak_tflops = ceil[f"{precision}_tflops"]
        return tflop / peak_tflops * 1e3 if peak_tflops else None

    mem = "bytes at the datasheet bandwidth"
    return {
        LAYER: (tflop_ms(fl["layer_gemms_tflop"], layers), f"{fl['layer_gemms_tflop']:.2f} TFLOP at the {layers} peak"),
        HEAD: (tflop_ms(fl["lm_head_tflop"], head), f"{fl['lm_head_tflop']:.2f} TFLOP at the {head} peak"),
        ATTENTION: (tflop_ms(fl["attention_tflop"], "bf16"),
                    f"{fl['attention_tflop']:.2f} TFLOP (causal half, no recompute) at the bf16 GEMM peak"),
        LOSS: (floor["ms"]["logits_loss"], f"{floor['gb']['logits_loss']:.1f} GB ({pr.LOGIT_BYTES} B/logit), {mem}"),
        CASTS: (cast_bytes / (bw * 1e12) * 1e3 if bw else None,
                f"{cast_bytes / 1e9:.1f} GB: FP8 operands ({pr.CAST_BYTES} B/element) + fp32->bf16 weights "
                f"({WEIGHT_CAST_BYTES} B/param not in an FP8 GEMM), {mem}"),
        ELEMENTWISE: (floor["ms"]["elementwise"], f"{floor['gb']['elementwise']:.1f} GB of bf16 activations, {mem}"),
        OPTIMIZER: (floor["ms"]["optimizer"],
                    f"{floor['gb']['optimizer']:.1f} GB ({pr.OPTIMIZER_BYTES_PER_PARAM} B/param, fp32 AdamW), {mem}"),
        COPIES: (None, "no byte count in the model"),
        GAPS: (0.0, "a graphed step launches nothing from the host"),
        OTHER: (None, "unidentified"),
        "_ceilings": ceil, "_flops": fl,
    }


HEAD_GEMMS = (1, 2)  # a Linear's step is three GEMMs: its forward before the loss, grads of input and weight after
PLAUSIBLE = 1.5  # a head found by position faster than this x its precision's peak was not the head: attribute


def _nearest_gemms(timeline: list[dict], rows: list[str], order: range, n: int) -> list[int] | None:
    """The first n GEMM launches along `order`, or None where a norm, attention or the optimizer comes first
    (then the walk has left the head's neighbourhood)."""
    got = []
    for i in order:
        if rows[i] == GEMMS:
            got.append(i)
            if len(got) == n:
                return got
        elif rows[i] in (ATTENTION, OPTIMIZER) or timeline[i]["category"] == "norm":
            return None
    return None


def head_by_position(profile: dict, compiled: bool, mul: frozenset[str] | None = None) -> tuple[float, str] | None:
    """(the LM head's GEMM ms in the profiled step, how) from the step's timeline: the head is the GEMM right
    before the loss's kernels and the two right after its backward; with a head-fused loss, the GEMMs inside
    the loss's span. None without a timeline or where the neighbourhood does not look like that."""
    tl = profiler.timeline(profile)
    mul = loss_backward_mul(profile, compiled) if mul is None else mul  # (mul: the caller's, found once)
    rows = [row_of(k, compiled, mul)[0] for k in tl]
    anchors = _loss_anchors(tl, rows)
    if not anchors:
        return None
    first, last = anchors[0], anchors[-1]
    inside = [i for i in range(first, last) if rows[i] == GEMMS]
    if inside:
        picked, how = inside, "measured: the GEMMs inside the loss's span (a head-fused loss), from the timeline"
    else:
        before = _nearest_gemms(tl, rows, range(first - 1, -1, -1), HEAD_GEMMS[0])
        after = _nearest_gemms(tl, rows, range(last + 1, len(tl)), HEAD_GEMMS[1])
        if before is None or after is None:
            return None
        picked, how = before + after, "measured: the GEMM before the loss and the two after it, from the timeline"
    return sum(tl[i]["us"] for i in picked) / 1e3, how


def gemm_split(gemm_ms: float, profile: dict, floors: dict, precision: tuple[str, str],
               compiled: bool, mul: frozenset[str] | None = None) -> tuple[dict[str, float], dict[str, str]]:
    """The GEMM time between layer and head GEMMs: the head's measured by its position in the step where the
    profile has a timeline, else attributed in proportion to FLOPs / the peak of each one's precision."""
    fl, ceil = floors["_flops"], floors["_ceilings"]
    layers, head = precision
    found = head_by_position(profile, compiled, mul)
    if found and fl["lm_head_tflop"] / found[0] * 1e3 <= PLAUSIBLE * ceil[f"{head}_tflops"]:
        return ({HEAD: found[0], LAYER: gemm_ms - found[0]},
                {HEAD: found[1], LAYER: "measured: every GEMM kernel less the head's"})
    w = {LAYER: fl["layer_gemms_tflop"] / ceil[f"{layers}_tflops"], HEAD: fl["lm_head_tflop"] / ceil[f"{head}_tflops"]}
    rule = ("attributed: the GEMM kernels' time split by FLOPs / peak (same efficiency); layer and head GEMMs "
            "share kernel names")
    return {k: gemm_ms * v / sum(w.values()) for k, v in w.items()}, {LAYER: rule, HEAD: rule}


# ---- the table ----------------------------------------------------------------------------------------
def table(profile: dict, floors: dict, layers: str, head: str, compiled: bool) -> tuple[pd.DataFrame, dict]:
    """(one row per ROWS entry: measured ms, share of the step, floor ms, ratio, how, notes; the summary)."""
    step = profile["profiled_step_ms_median"]
    ms = dict.fromkeys(ROWS, 0.0) | {GEMMS: 0.0}
    how: dict[str, set[str]] = {r: set() for r in ms}
    other: list[str] = []  # the unidentified kernels, by name: listed, never dropped
    mul = loss_backward_mul(profile, compiled)
    for k in kernel_list(profile):
        row, why = row_of(k, compiled, mul)
        ms[row] += k["ms_per_step"]
        how[row].add(why)
        if row == OTHER:
            other.append(f"{k['name'][:60]} ({k['ms_per_step']:.2f} ms)")
    split, split_how = gemm_split(ms.pop(GEMMS), profile, floors, (layers, head), compiled, mul)
    ms.update(split)
    how.update({k: {v} for k, v in split_how.items()})
    # the profiler's own figure where it wrote one (profiles before it did: the same difference, computed here)
    ms[GAPS] = profile.get("gap_ms_per_step", max(0.0, step - profile["gpu_busy_ms_per_step"]))
    how[GAPS] = {"measured: profiled step - GPU busy"}
    rows = []
    for r in ROWS:
        floor, basis = floors[r]
        rows.append({"category": r, "measured_ms": round(ms[r], 3), "share_of_step": round(ms[r] / step, 4),
                     "floor_ms": None if floor is None else round(floor, 3),
                     "ratio": round(ms[r] / floor, 2) if floor else None, "floor_basis": basis,
                     "how": "; ".join(sorted(how[r])) or "measured",
                     "kernels": "; ".join(other) if r == OTHER else ""})
    df = pd.DataFrame(rows)
    covered = df[df["category"].isin(COVERED)]["measured_ms"].sum() / step
    excess = (df["measured_ms"] - df["floor_ms"]).where(df["floor_ms"].notna())
    worst = df.loc[excess.idxmax()]
    summary = {"profiled_step_ms": round(step, 3), "gpu_busy_ms": round(profile["gpu_busy_ms_per_step"], 3),
               "kernel_ms": round(profile["kernel_ms_per_step"], 3), "covered_share": round(covered, 4),
               "floor_ms": round(df["floor_ms"].sum(), 3), "largest_gap": worst["category"],
               "largest_gap_ms": round(float(excess.max()), 3), "layers": layers, "head": head,
               "every_kernel_listed": bool(profile.get("kernels"))}
    return df, summary


# ---- reading a run's files ------------------------------------------------------------------------------
def who(profile_file: Path) -> str:
    return Path(profile_file).stem.removeprefix("profile-")


def precisions(profile_file: Path) -> tuple[str, str, bool]:
    """(layer GEMMs' precision, the head's, whether the step was torch.compile'd) from the run's students.csv beside
    the profile: the row's gemm_precision, and the head in bf16 where the backend kept it a torch Linear."""
    run_dir = Path(profile_file).parent
    df = pd.read_csv(run_dir / "students.csv")
    rows = df[[profiler.profile_path(run_dir, s).name == Path(profile_file).name for s in df["student"]]]
    if rows.empty:  # the teacher's profile, or a file moved away from its run
        raise ValueError(f"{profile_file}: no student of {run_dir / 'students.csv'} wrote this profile")
    row = rows.iloc[0]
    layers = str(row["gemm_precision"])
    kept = str(row.get("kept_torch_modules", ""))
    head = "bf16" if layers != "fp8" or "lm_head" in kept else "fp8"
    return layers, head, str(row.get("cfg_compile")) == "True"  # a bool, or its text read back from the csv


def find_peak(profile_file: Path) -> Path | None:
    """The bench's peak.json: the nearest folder above the profile that holds one."""
    return next((d / "peak.json" for d in Path(profile_file).parents if (d / "peak.json").is_file()), None)


def analyse(profile_file: Path, model: str, batch: int, seq_len: int, peak_file: Path | None = None) -> dict:
    """The breakdown of one profile: {'label', 'table' (DataFrame), 'summary'}."""
    layers, head, compiled = precisions(profile_file)
    peak_file = peak_file or find_peak(profile_file)
    peak = results.read_json(peak_file) if peak_file else None
    fl = floors_ms(model, batch, seq_len, peak, layers, head)
    df, summary = table(results.read_json(profile_file), fl, layers, head, compiled)
    ceil = fl["_ceilings"]
    summary.update(profile=str(profile_file), peak_file=str(peak_file) if peak_file else None,
                   peak_source=ceil["peak_source"], bf16_tflops=round(ceil["bf16_tflops"], 1),
                   fp8_tflops=round(ceil["fp8_tflops"], 1), bandwidth_tb_s=ceil["bandwidth_tb_s"],
                   bandwidth_source=ceil["bandwidth_source"], compiled=compiled)
    label = f"{Path(profile_file).parent.name} / {who(profile_file)}"
    return {"label": label, "table": df, "summary": summary}


# ---- writing --------------------------------------------------------------------------------------------
def _cell(v) -> str:
    return "—" if v is None or pd.isna(v) else f"{v:g}"  # no floor (or no ratio) is a dash, never a 0


def markdown(parts: list[dict], command: str) -> str:
    lines = ["# Step breakdown: every millisecond beside its floor", "", f"`{command}`", ""]
    for p in parts:
        s, df = p["summary"], p["table"]
        lines += [f"## {p['label']}", "",
                  f"Profiled step {s['profiled_step_ms']} ms (GPU busy {s['gpu_busy_ms']}, kernel sum "
                  f"{s['kernel_ms']}); "
                  f"layer GEMMs {s['layers']}, LM head {s['head']}; covered share {s['covered_share']:.1%}; "
                  f"the floors sum to {s['floor_ms']} ms; largest gap to its floor: {s['largest_gap']} "
                  f"(+{s['largest_gap_ms']} ms).", "",
                  f"Peaks: {s['peak_source']} ({s['peak_file']}): bf16 {s['bf16_tflops']}, FP8 {s['fp8_tflops']} "
                  f"TFLOP/s; bandwidth {s['bandwidth_tb_s']} TB/s, {s['bandwidth_source']}.", "",
                  "| category | measured ms | share | floor ms | ratio | floor rests on | how |",
                  "|---|---:|---:|---:|---:|---|---|"]
        for r in df.to_dict("records"):
            lines.append(f"| {r['category']} | {r['measured_ms']:.2f} | {r['share_of_step']:.1%} | "
                         f"{_cell(r['floor_ms'])} | {_cell(r['ratio'])} | {r['floor_basis']} | {r['how']} |")
        other = df.loc[df["category"] == OTHER, "kernels"].iloc[0]
        lines += ["", f"Other kernels: {other or 'none'}.", ""]
    return "\n".join(lines)


def figure(parts: list[dict]):
    """Per profile two bars, measured and floor, stacked by row in one colour per row."""
    import matplotlib.pyplot as plt  # drivers only: the analysis above needs no matplotlib

    fig, ax = plt.subplots(figsize=(11, 5.5))
    colors = dict(zip(ROWS, plt.get_cmap("tab10").colors))
    ticks, top = [], 0.0
    for i, p in enumerate(parts):
        df = p["table"].set_index("category")
        for j, col in enumerate(("measured_ms", "floor_ms")):
            x, bottom = 2.6 * i + j, 0.0
            for r in ROWS:
                v = df.loc[r, col]
                if v is not None and not pd.isna(v) and v > 0:
                    ax.bar(x, v, bottom=bottom, color=colors[r], label=r if (i, j) == (0, 0) else None, width=0.9)
                    bottom += v
            ax.text(x, bottom + 1, f"{bottom:.1f}", ha="center", fontsize=8)
            ticks.append((x, "measured" if j == 0 else "floor"))
            top = max(top, bottom)
        # the pair's name under its two bars (axes-fraction y, data x)
        ax.text(2.6 * i + 0.5, -0.09, p["label"], ha="center", va="top", fontsize=8,
                transform=ax.get_xaxis_transform())
    ax.set_xticks([x for x, _ in ticks], [t for _, t in ticks], fontsize=8)
    ax.set_ylim(0, top * 1.08)
    ax.set_ylabel("ms per step")
    ax.set_title("Profiled step by category: measured (H200 profiler) vs floor (FLOPs at peak, bytes at bandwidth)",
                 fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def write(parts: list[dict], out: Path, command: str) -> list[Path]:
    import matplotlib.pyplot as plt

    keys = ("profiled_step_ms", "covered_share", "layers", "head")
    frame = pd.concat([p["table"].assign(row=p["label"], **{k: p["summary"][k] for k in keys}) for p in parts])
    frame = frame[["row", *keys, *parts[0]["table"].columns]]
    paths = [results.write_csv(out / "breakdown.csv", frame),
             results.write_with(out / "breakdown.md", lambda f: f.write(markdown(parts, command)))]
    fig = figure(parts)
    paths += results.write_figure(fig, out, "breakdown")
    plt.close(fig)
    return paths


# ---- the command ----------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("profiles", nargs="+", help="profile-<student>.json files of bench runs")
    p.add_argument("--shape", required=True, help="the model: an hf-init shape name or a folder with config.json")
    p.add_argument("--preset", default="hf-llama-1b", choices=config.PRESET_CHOICES, metavar="PRESET",
                   help="the run's preset: its tokens a step (batch x seq_len)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--peak", default=None, help="peak.json (default: the nearest one above each profile)")
    p.add_argument("--out", required=True, help="folder for breakdown.csv, breakdown.md, breakdown.png / .svg")


def main(args: argparse.Namespace) -> int:
    cfg = config.from_preset(args.preset, **config.parse_set(args.overrides))
    peak = Path(args.peak) if args.peak else None
    parts = [analyse(Path(f), args.shape, cfg.model.batch, cfg.model.seq_len, peak) for f in args.profiles]
    command = " ".join(["python -m workbench verdict-breakdown", *args.profiles, "--shape", args.shape,
                        "--preset", args.preset, *[f"--set {o}" for o in args.overrides], "--out", args.out])
    for p in write(parts, Path(args.out), command):
        print(p)
    for p in parts:
        print(p["label"], p["summary"]["covered_share"], p["summary"]["largest_gap"])
    return 0
