"""Layouts, the compile/graph switches on the CPU-safe parts, and matched init across all of them."""
import functools
import re

import pandas as pd
import pytest
import torch

from workbench import config, results
from workbench.config import ConfigError
from workbench.models import LayerNormMLP, Student, load_matched
from workbench.run import runner


def test_fused_layout_is_the_same_function_from_the_same_weights():
    m = config.from_preset("cpu-smoke").model
    torch.manual_seed(0)
    separate = Student(m)
    fused = load_matched(Student(m, mlp=LayerNormMLP), separate.state_dict())
    tokens = torch.randint(0, m.vocab, (2, 16))
    torch.testing.assert_close(fused(tokens), separate(tokens))
    back = fused.to_reference_state()
    assert set(back) == set(separate.state_dict())
    assert all(torch.equal(back[k], v) for k, v in separate.state_dict().items())


def test_load_matched_refuses_a_partial_state():
    m = config.from_preset("cpu-smoke").model
    state = Student(m).state_dict()
    state.pop("head.weight")
    with pytest.raises(RuntimeError, match="head.weight"):
        load_matched(Student(m), state)


def test_switches_on_cpu_compile_applies_graphs_say_why_not(tmp_path, monkeypatch):
    # dynamo with the eager backend: exercises the compile path without minutes of C++ codegen on CI
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    cfg = config.from_preset("cpu-smoke", steps=3, iters=2, warmup=1, compile=True, graphs=True, layout="fused",
                             backends="torch_fp32,torch_bf16", baseline="torch_bf16", device="cpu")
    df = results.load(runner.run(cfg, out=tmp_path, run_id="r", progress=False)).set_index("student")
    assert (df["status"] == "ok").all()
    assert df["compiled"].all() and (df["compile_ms"] > 0).all()
    assert (~df["graphed"]).all() and df["notes"].str.contains("CUDA graphs need a GPU").all()
    # the compiled students' own first forward (not the fp32 reference's initial_loss): same start,
    # bf16 rounding aside
    first = df["first_step_loss"]
    assert (first.max() - first.min()) / first.mean() <= 1e-3
    cfg = config.from_preset("cpu-smoke", steps=3, iters=2, warmup=1, compile=True, compile_scope="layers",
                             backends="torch_fp32", baseline="torch_fp32", device="cpu")
    row = results.load(runner.run(cfg, out=tmp_path, run_id="layers", progress=False)).iloc[0]
    assert row["status"] == "ok" and row["compiled"] and "compiled per layer" in row["notes"]
    assert row["first_step_loss"] == pytest.approx(df.loc["torch_fp32", "first_step_loss"], rel=1e-4)


def test_bf16_params_and_layout_keep_students_matched(tmp_path):
    rows = []
    for layout in ("separate", "fused"):
        cfg = config.from_preset("cpu-smoke", steps=2, iters=1, warmup=0, layout=layout, backends="torch_bf16")
        rows.append(results.load(runner.run(cfg, out=tmp_path, run_id=layout, progress=False)).iloc[0])
    # each layout's own forward and its training path (initial_loss is the fp32 reference's, equal by construction)
    assert rows[0]["first_step_loss"] == pytest.approx(rows[1]["first_step_loss"], rel=1e-4)
    assert rows[0]["final_train_loss"] == pytest.approx(rows[1]["final_train_loss"], rel=1e-3)
    cfg = config.from_preset("cpu-smoke", steps=2, iters=1, warmup=0, param_dtype="bf16", backends="torch_bf16")
    row = results.load(runner.run(cfg, out=tmp_path, run_id="bf16", progress=False)).iloc[0]
    assert row["status"] == "ok"
    assert row["initial_loss"] == pytest.approx(rows[0]["initial_loss"], rel=1e-2)  # bf16-rounded weights


def test_torchao_and_te_rows_on_cpu_say_why(tmp_path):
    cfg = config.from_preset("cpu-smoke", steps=2, iters=1, warmup=0, backends="torch_bf16,torchao_float8:rowwise",
                             device="cpu")
    row = (results.load(runner.run(cfg, out=tmp_path, run_id="r", progress=False))
           .set_index("student").loc["torchao_float8:rowwise"])
    assert row["status"] == "skipped" and ("torchao" in row["reason"])


NEW_KIND = '''
"""A model kind that exists only in this test: a Llama-style causal LM under another name."""
from workbench.models.kinds import Kind, register
from workbench.models.kinds.causal_lm import LLAMA

register(Kind("tiny_llama", task="lm", arch=LLAMA))
'''


@pytest.mark.parametrize("kind", [dict(name="regression2", task="mlp"), dict(name="mlp", task="lm", arch="gpt")])
def test_the_regression_task_is_the_kind_named_mlp_alone(kind):
    """The config validates every kind but 'mlp' as a causal LM; the registry refuses a kind that would
    disagree (a second regression kind, or an LM under the name 'mlp')."""
    from workbench.models.kinds import Kind

    with pytest.raises(ConfigError, match="task 'mlp' is the kind named 'mlp' alone"):
        Kind(**kind)


def test_adding_a_model_kind_is_adding_one_file(tmp_path):
    """Copy the package, drop one kind file into models/kinds/: the registry lists it as a causal LM, the
    FP8 dimension check treats it as one (its vocabulary is a GEMM), it builds and runs a forward, and the
    run's task builds it as a Llama-style LM."""
    import pathlib
    import shutil
    import subprocess
    import sys

    import workbench

    pkg = tmp_path / "src" / "workbench"
    shutil.copytree(pathlib.Path(workbench.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "models" / "kinds" / "tiny_llama.py").write_text(NEW_KIND)
    code = """
import dataclasses, torch
from workbench import config
from workbench.backends._gemm import misaligned
from workbench.models import kinds
assert "tiny_llama" in kinds.names() and kinds.is_lm("tiny_llama") and not kinds.is_lm("mlp")
from workbench.models import CausalLM
m = CausalLM(kinds.get("tiny_llama").lm_shape(vocab=100, hidden=32, intermediate=64, layers=1, heads=2, seq_len=16))
assert m(torch.randint(0, 100, (2, 16))).shape == (2, 16, 100)
cfg = config.from_preset("gpt-cpu")
print(misaligned(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, kind="tiny_llama", vocab=100)), 16))
# the run's task trains it as a causal LM of its architecture (a random teacher: nothing to train first)
from workbench.train import tasks
cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, kind="tiny_llama"),
                          lm=dataclasses.replace(cfg.lm, teacher="random", corpus_mb=0.05))
task = tasks.for_config(cfg, torch.device("cpu"), None, "cache")  # tdtype None: the teacher in fp32
shape = task.shape()
assert type(task).__name__ == "LMTask" and shape.arch == kinds.get("llama").arch, (type(task), shape)
assert any(isinstance(m, torch.nn.RMSNorm) for m in task.reference.modules())
print("task built")
"""
    env = {"PYTHONPATH": str(tmp_path / "src"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "model.vocab=100" in p.stdout and "task built" in p.stdout
    # and a whole run of it, with no other edit: the configuration accepts the name, the run's registry knows it
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "workbench", "run", "--preset", "gpt-cpu", "--out", str(out),
                          "--run-id", "k", "--set", "kind=tiny_llama", "--set", "teacher=random",
                          "--set", "corpus_mb=0.05", "--set", "steps=2", "--set", "iters=1", "--set", "warmup=0",
                          "--set", "eval_batches=1", "--set", "backends=torch_fp32", "--set", "baseline=torch_fp32",
                          "--set", "no_kd_student=false"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    row = pd.read_csv(out / "k" / "students.csv").iloc[0]
    assert row["status"] == "ok" and row["cfg_kind"] == "tiny_llama" and row["heldout_ppl"] > 0


def test_an_unknown_model_kind_names_the_field_and_the_kinds(tmp_path):
    from workbench.models import kinds

    with pytest.raises(config.ConfigError, match=re.escape(f"model.kind must be one of {kinds.names()}, got 'rnn'")):
        kinds.get("rnn")
    # the configuration takes any name (a kind file may add it); the run refuses an unknown one before any work
    cfg = config.from_preset("gpt-cpu", kind="rnn", device="cpu")
    with pytest.raises(config.ConfigError, match=r"model.kind must be one of .*got 'rnn'"):
        runner.run(cfg, out=tmp_path, run_id="r", progress=False)
    assert not (tmp_path / "r").exists()


def test_a_mistyped_kind_on_an_mlp_preset_names_the_kind_too():
    """Every kind but 'mlp' is checked as a language model, so a typo on an MLP preset trips an LM check
    first: the error names that field and says the kind was checked as a causal LM."""
    with pytest.raises(config.ConfigError, match=r"distill.loss.*model.kind='mpl' is checked as a causal LM"):
        config.from_preset("cpu-smoke", kind="mpl")
    with pytest.raises(config.ConfigError, match=r"model.kind must be a kind's name") as e:
        config.from_preset("cpu-smoke", kind="Not A Name")
    assert "checked as a causal LM" not in str(e.value)  # the name's own error, not an LM check's


def test_a_sweep_refuses_an_unknown_kind_or_backend_before_any_point_runs():
    """The configuration, a leaf, takes any kind name; the plan asks the registries for every point, so a
    typo in a grid is one error naming the point, not a failed point among good ones."""
    from workbench.sweep.plan import Spec, plan

    assert len(plan(Spec("s", preset="gpt-cpu", grid={"kind": ["gpt", "llama"]}))) == 2
    with pytest.raises(config.ConfigError, match=r"sweep point \{'kind': 'lama'\}: model.kind must be one of"):
        plan(Spec("s", preset="gpt-cpu", grid={"kind": ["gpt", "lama"]}))
    with pytest.raises(config.ConfigError, match=r"sweep point .*torch_bf17"):
        plan(Spec("s", preset="gpt-cpu", grid={"backends": [["torch_fp32", "torch_bf16"],
                                                            ["torch_fp32", "torch_bf17"]]}))


def test_compile_scope_layers_compiles_each_repeated_layer_once_and_keeps_the_numbers(monkeypatch):
    """bench.compile_scope='layers' (regional compilation): every decoder layer of a Hugging Face model and of the
    workbench LM is compiled in place, the rest stays eager, the forward matches eager; a model without a stack of
    repeated layers falls back to one compile of the whole and says so."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from workbench.train import loop

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=5,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True))
    tokens = torch.randint(0, 128, (2, 16))
    eager = hf(input_ids=tokens).logits
    fwd, note = loop.compiled(hf, "layers")
    assert fwd is hf and note == "compiled per layer (5 LlamaDecoderLayer; the rest eager)"
    assert all(layer._compiled_call_impl is not None for layer in hf.model.layers)
    assert hf.model.embed_tokens._compiled_call_impl is None and hf._compiled_call_impl is None
    torch.testing.assert_close(fwd(input_ids=tokens).logits, eager)
    from workbench.models import CausalLM, LMShape

    lm = CausalLM(LMShape(kind="gpt", vocab=64, hidden=16, intermediate=32, layers=3, heads=2, seq_len=8))
    assert loop.repeated_layers(lm) is lm.blocks
    whole, note = loop.compiled(torch.nn.Linear(4, 4), "layers")
    assert whole is not None and "not applied: no stack of repeated layers" in note
    assert loop.compiled(torch.nn.Linear(4, 4), "model")[1] == ""
    with pytest.raises(ConfigError, match="compile_scope"):
        config.from_preset("gpt-cpu", compile_scope="blocks")


def test_held_out_runs_layers_compiled_in_place_eager(monkeypatch):
    """compile_scope='layers' compiles the student's own layers, which the held-out evaluation calls too: it runs
    them eager (as with the whole model compiled, whose wrapper it never calls), so no eval-mode graph is compiled
    inside eval_wall_s. The student, task and data are minimal stand-ins of their interfaces (fakes)."""
    import contextlib
    import types

    from torch._dynamo.utils import counters

    from workbench.models import CausalLM, LMShape
    from workbench.train import loop

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    lm = CausalLM(LMShape(kind="gpt", vocab=64, hidden=16, intermediate=32, layers=3, heads=2, seq_len=8))
    loop.compiled(lm, "layers")
    tokens = torch.randint(0, 64, (2, 8))
    counters.clear()
    lm(tokens).float().sum().backward()  # the training step's graph
    assert counters["stats"]["unique_graphs"] == 1

    def evaluate(model, student, batches):
        with torch.no_grad():  # eval mode and no grad: another graph, were the layers not run eager
            return {"loss": float(sum(model(b).float().mean() for b in batches))}

    fake_student = types.SimpleNamespace(model=lm, outside_training=contextlib.nullcontext)
    out = loop.held_out(fake_student, types.SimpleNamespace(evaluate=evaluate), types.SimpleNamespace(eval=[tokens]))
    assert set(out) == {"loss"} and lm.training
    assert counters["stats"]["unique_graphs"] == 1


def test_layers_compiled_in_place_are_captured_like_the_whole_model(monkeypatch):
    """compile_scope does not decide the CUDA graph: a student compiled per layer is captured in the whole-step
    graph its policy asks for, as one compiled whole is (at 7634e2f an HF student's capture was invalidated by a
    recompile inside it; its cause, transformers' mask under capture, is answered in workbench.models.hf and tested
    in tests/models/test_hf.py)."""
    from step_fakes import prepare

    from workbench.models import CausalLM, LMShape

    for scope in ("layers", "model"):
        lm = CausalLM(LMShape(kind="gpt", vocab=64, hidden=16, intermediate=32, layers=3, heads=2, seq_len=8))
        _, metrics, captures = prepare(monkeypatch, lm, scope, torch.randint(0, 64, (2, 8)))
        assert metrics["graphed"] and metrics["graph_scope"] == "step" and len(captures) == 1
