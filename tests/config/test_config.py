import json
from pathlib import Path

import pytest

from workbench import config
from workbench.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_seed_preset_is_the_tutorial():
    c = config.from_preset("seed")
    m, t, b = c.model, c.train, c.bench
    assert (m.vocab, m.hidden, m.intermediate, m.layers, m.seq_len, m.batch) == (4096, 512, 2048, 3, 128, 8)
    assert (t.steps, t.lr, t.weight_decay, t.seed, t.eval_batches) == (25, 2e-4, 1e-2, 42, 8)
    assert (b.warmup, b.iters) == (5, 20)
    assert c.distill.loss == "mse"


def test_large_and_smoke_presets():
    large = config.from_preset("large").model
    assert (large.hidden, large.intermediate, large.layers, large.seq_len, large.batch) == (4096, 16384, 3, 512, 16)
    smoke = config.from_preset("cpu-smoke")
    assert smoke.model.hidden * smoke.model.intermediate < 512 * 2048  # small enough for seconds on a CPU
    assert len(smoke.backends) >= 3


def test_overrides_flat_and_dotted_are_coerced():
    c = config.from_preset("seed", hidden="1024", **{"train.lr": "1e-3"}, backends="torch_bf16,te_fp8:current",
                           baseline="torch_bf16", fused_optimizer="true")
    assert c.model.hidden == 1024 and c.train.lr == 1e-3 and c.train.fused_optimizer is True
    assert c.backends == ["torch_bf16", "te_fp8:current"]


def test_round_trip_through_dict():
    c = config.from_preset("large", steps=3)
    assert config.Config.from_dict(json.loads(c.to_json())) == c


@pytest.mark.parametrize(
    "overrides, needle",
    [
        ({"hidden": 0}, "model.hidden must be a positive integer"),
        ({"layers": -2}, "model.layers must be a positive integer"),
        ({"steps": 0}, "train.steps"),
        ({"iters": 0}, "bench.iters"),
        ({"lr": -1.0}, "train.lr"),
        ({"lr": "inf"}, "train.lr must be a finite number"),
        ({"weight_decay": "nan"}, "train.weight_decay must be a finite number"),
        ({"loss": "kl"}, "distill.loss must be one of ['mse', 'cosine', 'hidden']"),
        ({"baseline": "torch_fp16"}, "baseline 'torch_fp16' must be one of backends"),
        ({"device": "tpu"}, "device must be one of"),
        ({"hidden": "wide"}, "hidden expects a value of type int"),
        ({"layout": "weird"}, "model.layout must be one of"),
        ({"teacher_precision": "int8"}, "distill.teacher_precision"),
    ],
)
def test_bad_values_name_the_field_and_the_allowed(overrides, needle):
    with pytest.raises(ConfigError) as e:
        config.from_preset("seed", **overrides)
    assert needle in str(e.value)


def test_the_config_checks_the_students_shape_not_the_backends():
    """Which backends exist is the registry's knowledge (the run checks it: tests/run/test_runner.py); the
    config checks the list itself."""
    assert config.from_preset("seed", backends="nope", baseline="nope").backends == ["nope"]
    with pytest.raises(ConfigError, match="backends lists a student twice"):
        config.from_preset("seed", backends="torch_bf16,torch_bf16")
    with pytest.raises(ConfigError, match="backends must list at least one student"):
        config.from_preset("seed", backends="")


def _count_checks(monkeypatch) -> list:
    from workbench.config import checks

    calls, real = [], checks.validate
    monkeypatch.setattr(checks, "validate", lambda cfg: calls.append(cfg) or real(cfg))
    return calls


def test_a_config_is_validated_once_per_state(monkeypatch):
    calls = _count_checks(monkeypatch)
    cfg = config.from_preset("cpu-smoke")
    assert len(calls) == 1
    assert cfg.validate() is cfg and len(calls) == 1  # resolved once: handing it on checks nothing again
    cfg.model.hidden = 0  # changed since: checked anew, and the change is caught
    with pytest.raises(ConfigError, match="model.hidden must be a positive integer"):
        cfg.validate()
    assert len(calls) == 2
    assert config.Config.from_dict(config.from_preset("cpu-smoke").to_dict()).validate() and len(calls) == 4


def test_a_run_validates_its_config_once(monkeypatch, tmp_path):
    """The notebook's cell and the CLI resolve the config (from_preset) and hand it to the run, which
    checks the backends' names and does not validate again."""
    from workbench import notebook
    from workbench.run import runner

    calls = _count_checks(monkeypatch)
    monkeypatch.setattr(runner, "_run", lambda cfg, *a, **k: tmp_path)  # the run's work is not what is counted
    assert notebook.run_cell({"preset": "cpu-smoke", "steps": 2, "out": str(tmp_path)}) == tmp_path
    assert len(calls) == 1 and calls[0].train.steps == 2


def test_unknown_preset_and_malformed_set():
    with pytest.raises(ConfigError, match="unknown preset 'huge'.*cpu-smoke"):
        config.from_preset("huge")
    with pytest.raises(ConfigError, match="--set expects field=value"):
        config.parse_set(["hidden1024"])
    with pytest.raises(ConfigError, match="unknown config field 'hiden'"):
        config.parse_set(["hiden=1024"])


def _parameters_cell(nb_path) -> str:
    nb = json.loads(nb_path.read_text())
    cells = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, "the notebook needs exactly one cell tagged 'parameters'"
    return "".join(cells[0]["source"])


def test_notebook_parameters_cell_is_generated_from_the_config():
    """The papermill parameters are exactly the config's fields (+ run location), each typed and documented
    from workbench/config/, and the committed cell is the generated one."""
    import ast

    from workbench.notebook import MAIN_NOTEBOOK, RUN_PARAMETERS, parameters_cell

    src = _parameters_cell(MAIN_NOTEBOOK)
    assert src.strip() == parameters_cell().strip(), "run `python scripts/sync_notebooks.py`"
    assigned = {n.target.id: n for n in ast.parse(src).body if isinstance(n, ast.AnnAssign)}
    assert set(assigned) == set(config.flat_field_names()) | set(RUN_PARAMETERS)
    assert ast.unparse(assigned["hidden"].annotation) == "Optional[int]"
    assert ast.unparse(assigned["backends"].annotation) == "Optional[list[str]]"
    docs = config.field_docs()
    for line in src.splitlines():
        name = line.split(":")[0].strip()
        if name in docs and name != "preset":
            assert docs[name] and line.endswith(f"  # {docs[name]}"), (
                f"parameter {name} should carry its field's docstring"
            )


def test_the_parameters_cell_runs_and_leaves_every_override_unset():
    from workbench.notebook import overrides_from, parameters_cell

    namespace: dict = {}
    exec(parameters_cell(), namespace)  # annotations are evaluated: Optional must be imported by the cell
    assert namespace["preset"] == "auto" and overrides_from(namespace) == {}


def test_every_field_has_a_docstring():
    assert all(config.field_docs().values())
