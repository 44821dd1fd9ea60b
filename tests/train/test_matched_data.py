"""Students share one set of batches and one initial state: nothing a student does may change them, and
bf16 is decided by the peaks, not by emulation."""
import pytest
import torch

from workbench import backends, config, results
from workbench.backends._te_run import TERun
from workbench.env import probe
from workbench.env import te as _te
from workbench.run import runner
from workbench.train import tasks


def _cfg(**kw):
    return config.from_preset("cpu-smoke", backends="torch_fp32,torch_bf16", steps=3, warmup=1, iters=2,
                              eval_batches=1, **kw)


def test_a_student_that_writes_into_the_shared_batches_is_flagged_and_the_next_one_is_unharmed(tmp_path, monkeypatch):
    """The way a graph that keeps a batch as its static input corrupts the next student's batch 0."""
    clean = results.load(runner.run(_cfg(), out=tmp_path, run_id="clean", progress=False)).set_index("student")
    real = runner.run_student

    def writes_into_batch0(student, cfg, task, data, device, **kw):
        out = real(student, cfg, task, data, device, **kw)
        if student.gemm_precision == "fp32":  # torch_fp32's
            tokens = data.train[0][0]
            tokens.copy_((tokens + 1) % cfg.model.vocab)
        return out

    monkeypatch.setattr(runner, "run_student", writes_into_batch0)
    df = results.load(runner.run(_cfg(), out=tmp_path, run_id="dirty", progress=False)).set_index("student")
    assert df.loc["torch_fp32", "status"] == "error"
    assert "wrote into the batches" in df.loc["torch_fp32", "reason"]
    # the next student trained and was measured on the original batches
    assert df.loc["torch_bf16", "status"] == "ok"
    assert df.loc["torch_bf16", "initial_loss"] == clean.loc["torch_bf16", "initial_loss"]
    assert df.loc["torch_bf16", "final_train_loss"] == pytest.approx(
        clean.loc["torch_bf16", "final_train_loss"], rel=1e-6
    )


def test_data_fingerprint_sees_a_changed_token_and_a_changed_target():
    cfg = _cfg()
    data = tasks.MLPTask(cfg, torch.device("cpu"), None).make_data()
    before = data.fingerprint()
    data.bench[-1][0][0, 0] += 1
    assert not torch.equal(before, data.fingerprint())
    data.bench[-1][0][0, 0] -= 1
    assert torch.equal(before, data.fingerprint())
    data.eval[0][1].out[0, 0, 0] += 1e-3
    assert not torch.equal(before, data.fingerprint())


class FakeGraphingTE:
    """Stands in for transformer_engine.pytorch.make_graphed_callables, which keeps the sample arguments
    as the graph's static inputs (and copies every later batch into them)."""

    def __init__(self):
        self.sample_args = None

    def make_graphed_callables(self, module, sample_args, num_warmup_iters=3, enabled=False, recipe=None):
        self.sample_args = sample_args
        return module


def test_te_graph_capture_gets_its_own_copy_of_the_sample_batch(monkeypatch):
    fake = FakeGraphingTE()
    monkeypatch.setattr(_te, "load", lambda: (fake, object(), ""))
    shared = torch.randint(0, 100, (2, 8))
    TERun(torch.device("cpu"), torch.bfloat16).make_graphed(torch.nn.Identity(), shared)
    (sample,) = fake.sample_args
    assert torch.equal(sample, shared) and sample.data_ptr() != shared.data_ptr()


@pytest.fixture
def t4(monkeypatch):
    """A Colab T4 as torch sees it: CC 7.5, and is_bf16_supported() True because it counts emulation."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")


def test_a_t4_takes_the_fp16_path_everywhere(t4):
    cuda = torch.device("cuda")
    assert not probe.native_bf16(cuda)
    assert backends.amp_dtype(cuda) is torch.float16
    assert runner.teacher_dtype(config.from_preset("seed"), cuda) is None  # fp32 teacher, not emulated bf16
    ok, why = backends.make("torch_bf16").availability(backends.Context(cuda, config.from_preset("seed")))
    assert not ok and "no bf16" in why and "torch_fp16" in why
    from workbench.measure import peaks

    fn, _, reason = peaks._mm_fn("bf16", 64, cuda)  # no bf16 peak is measured on emulation
    assert fn is None and "no bf16" in reason


def test_an_ampere_or_newer_gpu_keeps_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    cuda = torch.device("cuda")
    assert probe.native_bf16(cuda) and backends.amp_dtype(cuda) is torch.bfloat16
    assert runner.teacher_dtype(config.from_preset("seed"), cuda) is torch.bfloat16


def test_the_checksum_copies_no_host_held_teacher_logits(monkeypatch):
    """Host-placed teacher logits (logits_placement.HostBatches) reach students only as fresh device copies:
    the shared batches' checksum sums their tokens and token targets and copies none of the logits over."""
    from workbench.train import objectives
    from workbench.train.loop import Data
    from workbench.train.teacher_targets.logits_placement import HostBatches

    tokens, nxt = torch.arange(6).view(2, 3), torch.arange(1, 7).view(2, 3)
    batch = (tokens, objectives.Targets(torch.ones(2, 3, 5), next_tokens=nxt))
    data = Data(train=HostBatches([batch], torch.device("cpu")), bench=[batch], eval=[])
    monkeypatch.setattr(HostBatches, "__getitem__", lambda self, i: pytest.fail("copied a host batch"))
    monkeypatch.setattr(HostBatches, "__iter__", lambda self: pytest.fail("copied a host batch"))
    sums = data.fingerprint()
    one = torch.tensor(1.0).view(torch.int32).item()  # the logits are summed as bit patterns (a NaN stays visible)
    assert sums.tolist() == [15, 21, 15, 30 * one, 21]  # train: tokens, next tokens; bench: tokens, logits, next
    nxt[0, 0] += 1  # a student writing into the shared token targets is still caught
    assert not torch.equal(data.fingerprint(), sums)
