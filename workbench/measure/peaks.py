"""The hardware's ceiling: a matmul peak measured in the same run, and a datasheet table with sources.

MFU-style percentages are only honest against a stated ceiling. Two are reported side by side:
  * measured: `probe_matmul()` times one large square GEMM per precision (bf16, fp16, fp32 and FP8 via
    `torch._scaled_mm`) with workbench.measure.timing, in the same process as the students, so clocks, driver
    and cuBLAS are the ones the students saw;
  * datasheet: `datasheet_peak(gpu_name)` -- dense (no 2:4 sparsity) tensor-core TFLOP/s from NVIDIA's
    product pages / datasheets, one source URL per number. A GPU not in the table, or whose variant
    the device name does not pin down (a bare "NVIDIA H100" could be SXM, PCIe or NVL), is unknown:
    None, never a guessed neighbour. Cross-checked against torchao's `roofline_utils.gpu_name_to_specs`
    and nanochat's / torchtitan's `get_peak_flops`.

    python -m workbench.measure.peaks       # prints the peak probe of this machine as JSON
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch

from workbench.env.probe import native_bf16
from workbench.measure import timing

PRECISIONS = ("bf16", "fp16", "fp32", "fp8")


@dataclass(frozen=True)
class DatasheetPeak:
    gpu: str
    """Product name as NVIDIA writes it."""
    pattern: str
    """Regular expression (case-insensitive) matched against torch.cuda.get_device_name()."""
    tflops: dict[str, float | None]
    """Dense TFLOP/s per precision; None = the hardware has no such tensor-core path."""
    sources: dict[str, str]
    """Precision -> URL of the page or datasheet the number comes from."""
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "pattern": self.pattern, "tflops": dict(self.tflops),
                "sources": dict(self.sources), "note": self.note}


def _entry(gpu: str, pattern: str, bf16, fp16, fp8, fp32, url: str, note: str = "",
           other_sources: dict[str, str] | None = None) -> DatasheetPeak:
    vals = {"bf16": bf16, "fp16": fp16, "fp8": fp8, "fp32": fp32}
    sources = {k: (other_sources or {}).get(k, url) for k, v in vals.items() if v is not None}
    return DatasheetPeak(gpu, pattern, vals, sources, note)


_SPARSE_HALVED = "NVIDIA lists tensor-core figures with 2:4 sparsity; dense = listed / 2"
H100_URL = "https://www.nvidia.com/en-us/data-center/h100/"
H200_URL = "https://www.nvidia.com/en-us/data-center/h200/"

# Most specific patterns first: the first match wins ("H200 NVL" before "H200").
DATASHEET: tuple[DatasheetPeak, ...] = (
    _entry("H200 NVL", r"\bh200\b.*\bnvl\b", 835.5, 835.5, 1670.5, 60.0, H200_URL, _SPARSE_HALVED),
    # The SXM part reports itself as plain "NVIDIA H200" (results/reference/h200/*/env.json).
    _entry("H200 SXM", r"\bh200\b", 989.5, 989.5, 1979.0, 67.0, H200_URL, _SPARSE_HALVED),
    _entry("H100 NVL", r"\bh100\b.*\bnvl\b", 835.5, 835.5, 1670.5, 60.0, H100_URL, _SPARSE_HALVED),
    _entry("H100 PCIe", r"\bh100\b.*\bpcie\b", 756.5, 756.5, 1513.0, 51.0, H100_URL, _SPARSE_HALVED),
    # SXM5 reports "NVIDIA H100 80GB HBM3"; a bare "NVIDIA H100" stays unknown (variant not pinned down).
    _entry("H100 SXM", r"\bh100\b.*(\bsxm|\bhbm3\b)", 989.5, 989.5, 1979.0, 67.0, H100_URL, _SPARSE_HALVED),
    _entry("A100 (SXM4 / PCIe)", r"\ba100\b", 312.0, 312.0, None, 19.5,
           "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
           "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf", "Ampere: no FP8 tensor cores"),
    _entry("B200 (HGX)", r"\bb200\b", 2250.0, 2250.0, 4500.0, 75.0,
           "https://resources.nvidia.com/en-us-blackwell-architecture",
           _SPARSE_HALVED + "; per-GPU HGX B200 figures", {"fp32": "https://www.nvidia.com/en-us/data-center/hgx/"}),
    _entry("L40S", r"\bl40s\b", 362.05, 362.05, 733.0, 91.6,
           "https://www.nvidia.com/en-us/data-center/l40s/", "page lists dense and sparse figures"),
    _entry("L4", r"\bl4\b", 121.0, 121.0, 242.5, 30.3, "https://www.nvidia.com/en-us/data-center/l4/",
           _SPARSE_HALVED),
    _entry("A10", r"\ba10\b", 125.0, 125.0, None, 31.2,
           "https://www.nvidia.com/en-us/data-center/products/a10-gpu/", _SPARSE_HALVED + "; no FP8"),
    _entry("T4", r"\bt4\b", None, 65.0, None, 8.1,
           "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf",
           "Turing: fp16 tensor cores (mixed precision), no bf16, no FP8"),
)


# HBM / GDDR bandwidth in TB/s per DATASHEET entry (the same product pages): the floor of memory-bound work (an
# optimizer step, elementwise kernels) that no tensor-core precision shrinks. The A100 entry is left out: its
# variants differ (1.555 to 2.039 TB/s) and the device name does not say which.
BANDWIDTH_TBS = {"H200 NVL": 4.8, "H200 SXM": 4.8, "H100 NVL": 3.9, "H100 PCIe": 2.0, "H100 SXM": 3.35,
                 "B200 (HGX)": 8.0, "L40S": 0.864, "L4": 0.3, "A10": 0.6, "T4": 0.32}


def datasheet_peak(gpu_name: str | None) -> DatasheetPeak | None:
    """The datasheet entry for a device name as torch reports it, or None where unknown."""
    if not gpu_name:
        return None
    for entry in DATASHEET:
        if re.search(entry.pattern, gpu_name, flags=re.IGNORECASE):
            return entry
    return None


# ---- measured peak -------------------------------------------------------------------------------
@dataclass
class ProbeSettings:
    n: int = 8192
    """Square GEMM size (n x n @ n x n): 8192 is large enough to saturate an H100/H200's tensor cores."""
    warmup: int = 10
    iters: int = 30
    repeats: int = 5
    """Timed blocks; the reported figure is the median of their medians, with the spread (P4)."""
    warmup_s: float = 0.5
    """Untimed GEMMs for this long before the first precision: an idle H200 sits at ~345 MHz."""
    slow_iters: int = 5
    """Iterations per block for fp32 (CUDA cores, ~15x slower than bf16 on Hopper)."""

    @staticmethod
    def for_device(device: torch.device) -> "ProbeSettings":
        if device.type == "cuda":
            return ProbeSettings()
        return ProbeSettings(n=512, warmup=1, iters=3, repeats=2, slow_iters=3, warmup_s=0.0)  # a CPU: seconds


def _mm_fn(precision: str, n: int, device: torch.device) -> tuple[Callable[[], Any] | None, str, str]:
    """(function running one GEMM, what it calls, reason it cannot run) for one precision."""
    if precision in ("bf16", "fp16", "fp32"):
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
        if device.type == "cpu" and precision == "fp16":
            return None, "torch.mm", "fp16 GEMMs on a CPU are not a tensor-core ceiling; not measured"
        if precision == "bf16" and not native_bf16(device):  # not emulation: a T4 has no bf16 peak
            return None, "torch.mm", "this GPU has no bf16 support"
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        what = "torch.mm" + (f" (float32_matmul_precision={torch.get_float32_matmul_precision()})"
                             if precision == "fp32" else "")
        return (lambda: torch.mm(a, b)), what, ""
    # FP8: e4m3 x e4m3 -> bf16 with per-tensor (tensorwise) scales, as TE's / torchao's tensorwise GEMMs
    what = "torch._scaled_mm(e4m3, e4m3 col-major, scale_a, scale_b, out_dtype=bf16, use_fast_accum=True)"
    if device.type != "cuda":
        return None, what, "FP8 GEMMs (torch._scaled_mm) need a CUDA GPU with compute capability >= 8.9"
    if torch.cuda.get_device_capability(device) < (8, 9):
        cc = ".".join(map(str, torch.cuda.get_device_capability(device)))
        return None, what, f"FP8 tensor cores need compute capability >= 8.9; this GPU is {cc}"
    if not hasattr(torch, "_scaled_mm"):
        return None, what, f"torch {torch.__version__} has no torch._scaled_mm"
    a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # cuBLASLt wants mat2 column-major
    one = torch.ones((), device=device)

    def fp8_mm():
        out = torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True)
        return out[0] if isinstance(out, tuple) else out  # torch < 2.5 returned (out, amax)

    return fp8_mm, what, ""


def probe_one(precision: str, device: torch.device, s: ProbeSettings) -> dict[str, Any]:
    """One row of peak.json: measured TFLOP/s of an n^3 GEMM, or status 'unavailable'/'error' and why."""
    row: dict[str, Any] = {"precision": precision, "n": s.n, "status": "ok", "reason": "", "op": None,
                           "ms_median": None, "ms_best": None, "tflops": None, "tflops_sustained": None,
                           "median_spread_pct": None, "repeat_medians_ms": None}
    try:
        fn, row["op"], why = _mm_fn(precision, s.n, device)
        if fn is None:
            row.update(status="unavailable", reason=why)
            return row
        clock = timing.clock_for(device)
        iters = s.slow_iters if precision == "fp32" else s.iters
        fn()  # first call: cuBLAS heuristics / handle creation, outside any timing
        stats = timing.repeat_medians(lambda: timing.measure(fn, s.warmup, iters, clock), s.repeats)
        # Under sustained GEMMs the H200 boosts, then settles ~10% lower (power/thermal): block medians
        # 1.43 -> 1.60 ms at bf16 8192^3. The ceiling is the best block (a higher ceiling never flatters a
        # student); the median of the blocks is kept as the sustained figure, and the spread.
        flop = 2 * s.n ** 3
        best = min(stats.medians_ms) if stats.medians_ms else None
        row.update(ms_median=stats.median_ms, ms_best=best,
                   tflops=flop / (best * 1e-3) / 1e12 if best else None,
                   tflops_sustained=flop / (stats.median_ms * 1e-3) / 1e12 if stats.median_ms else None,
                   median_spread_pct=stats.spread_pct, repeat_medians_ms=stats.medians_ms)
    except Exception as e:  # a probe that fails is a row that says why, never a crash of the bench
        row.update(status="error", reason=f"{type(e).__name__}: {e}"[:500])
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def _spin(device: torch.device, s: ProbeSettings) -> None:
    """Keep the GPU busy with bf16 GEMMs for `warmup_s` seconds (clock ramp-up), untimed."""
    import time

    fn, _, why = _mm_fn("bf16", s.n, device)
    if fn is None:
        return
    end = time.perf_counter() + s.warmup_s
    while time.perf_counter() < end:
        for _ in range(10):
            fn()
        torch.cuda.synchronize(device)


def probe_matmul(device: torch.device, settings: ProbeSettings | None = None) -> dict[str, Any]:
    """peak.json: measured GEMM peaks per precision and the datasheet entry for this device."""
    s = settings or ProbeSettings.for_device(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    sheet = datasheet_peak(gpu)
    if s.warmup_s > 0:
        _spin(device, s)
    measured = {p: probe_one(p, device, s) for p in PRECISIONS}
    return {
        "device": str(device), "gpu_name": gpu, "torch": torch.__version__,
        "settings": vars(s),
        "measured": measured,
        "datasheet": sheet.to_dict() if sheet else None,
        "datasheet_reason": "" if sheet else (
            "no GPU: datasheet peaks are for GPUs" if gpu is None
            else f"{gpu!r} is not in workbench.measure.peaks.DATASHEET (or its variant is ambiguous): unknown"),
    }


def measured_tflops(peak: dict[str, Any], precision: str | None) -> float | None:
    row = (peak.get("measured") or {}).get(precision or "")
    return row.get("tflops") if row and row.get("status") == "ok" else None


def datasheet_tflops(peak: dict[str, Any], precision: str | None) -> float | None:
    sheet = peak.get("datasheet")
    return (sheet.get("tflops") or {}).get(precision or "") if sheet else None


if __name__ == "__main__":
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(json.dumps(probe_matmul(dev), indent=2))
