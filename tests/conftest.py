import pytest


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
