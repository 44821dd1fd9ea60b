import os

import pytest

# Under pytest-xdist every worker, and every notebook kernel, Dask worker or torchrun rank a test starts, would
# take all cores for torch's intra-op threads: on CI's 2 cores with 2 workers that oversubscribes the machine
# and OpenMP's spinning threads make the tiny CPU models several times slower
# (results/reference/cpu/test_threads/). Each worker gets its share of the cores, set here, before any test
# module imports torch, and inherited by what it starts; an explicit OMP_NUM_THREADS wins.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """One real cpu-smoke run (teacher, three students, every result file), shared by the tests."""
    from workbench import config
    from workbench.run import runner
    cfg = config.from_preset("cpu-smoke")
    run_dir = runner.run(cfg, out=tmp_path_factory.mktemp("runs"), run_id="smoke", progress=False)
    return cfg, run_dir


def pytest_collection_modifyitems(config, items):
    """GPU tests (marker `gpu`) run on a CUDA machine (scripts/gpu_tests.sh on the H200), skip elsewhere."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
