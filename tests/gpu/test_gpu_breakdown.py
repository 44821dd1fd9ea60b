"""The profiler's record on a real GPU is what the step breakdown (workbench/verdict/breakdown.py) needs: every
kernel (their sum is the kernel time), the gap, and one step's kernel order, in which the LM head is found by its
place next to the loss -- eager and inside a CUDA graph replay, where no NVTX / record_function range reaches the
GPU. A toy step: two Linear layers, RMSNorm, a wide head (94% of the GEMM FLOPs) and cross-entropy. Run on the H200
by scripts/gpu_tests.sh."""
import pytest
import torch
import torch.nn.functional as F

from workbench.measure import profiler, timing
from workbench.verdict import breakdown as bd

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
TOKENS, HIDDEN, VOCAB = 4096, 1024, 32768


def _step(device):
    torch.manual_seed(0)
    layers = torch.nn.Sequential(*[torch.nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(2)])
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    params = [*layers.to(device, torch.bfloat16).parameters(), *head.to(device, torch.bfloat16).parameters()]
    x = torch.randn(TOKENS, HIDDEN, device=device, dtype=torch.bfloat16)
    y = torch.randint(0, VOCAB, (TOKENS,), device=device)

    def step():
        for p in params:
            p.grad = None  # no accumulation kernel: every step launches the same kernels
        logits = head(F.rms_norm(layers(x), (HIDDEN,)))
        F.cross_entropy(logits.float(), y).backward()

    return step


def _graphed(step):
    """The step captured in a CUDA graph (warmed up on a side stream first, as torch.cuda.graphs asks)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


@pytest.mark.parametrize("graphed", [False, True])
def test_the_profile_keeps_every_kernel_and_finds_the_head_by_its_place(graphed):
    device = torch.device("cuda")
    step = _step(device)
    step = _graphed(step) if graphed else step
    t = timing.measure(step, warmup=3, iters=6, clock=timing.clock_for(device), profile=True)
    rec = t.profile
    assert rec["profiler_reason"] == ""
    assert sum(k["ms_per_step"] for k in rec["kernels"]) == pytest.approx(rec["kernel_ms_per_step"], rel=0.01)
    assert rec["gap_ms_per_step"] >= 0.0 and "data" in rec["step_timeline"], rec.get("step_timeline")
    assert len(profiler.timeline(rec)) == round(sum(k["launches_per_step"] for k in rec["kernels"]))  # one step
    found = bd.head_by_position(rec, compiled=False)
    assert found is not None, [k["name"][:60] for k in profiler.timeline(rec)]
    head_ms, how = found
    gemm_ms = rec["kernel_categories_ms_per_step"]["gemm"]
    # the head holds VOCAB / (VOCAB + 2 x HIDDEN) = 94% of the GEMM FLOPs; a wrong pick (a layer GEMM) is ~3%
    gemms = [(k["name"][:50], k["us"]) for k in profiler.timeline(rec) if k["category"] == "gemm"]
    assert 0.8 < head_ms / gemm_ms <= 1.0 and how.startswith("measured"), (head_ms, gemm_ms, gemms)
