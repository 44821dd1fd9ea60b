import pytest


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """One real cpu-smoke run (teacher, three students, every result file), shared by the tests."""
    from workbench import config, runner

    cfg = config.from_preset("cpu-smoke")
    run_dir = runner.run(cfg, out=tmp_path_factory.mktemp("runs"), run_id="smoke", progress=False)
    return cfg, run_dir
