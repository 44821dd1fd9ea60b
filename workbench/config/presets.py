"""The preset table: each preset a function returning a changed copy of the defaults, and `from_preset`,
the one way a run's config is resolved (preset, overrides, validation)."""
from __future__ import annotations

from typing import Any

from workbench.config.errors import ConfigError
from workbench.config.fields import (
    BenchConfig,
    DistillConfig,
    LMConfig,
    ModelConfig,
    TrainConfig,
)
from workbench.config.root import Config


def _seed() -> Config:
    """The tutorial exactly (its sizes, optimiser, seed and measurement counts)."""
    return Config(preset="seed")


def _cpu_smoke() -> Config:
    """Finishes in seconds on a CPU: tiny dims (multiples of 16, so FP8 rows are not skipped for size)."""
    c = Config(preset="cpu-smoke")
    c.model = ModelConfig(vocab=256, hidden=64, intermediate=256, layers=2, seq_len=32, batch=4)
    c.train = TrainConfig(steps=8, eval_batches=2)
    c.bench = BenchConfig(warmup=2, iters=5)
    c.backends = ["torch_fp32", "torch_bf16", "te_fp8:delayed"]
    return c


def _large() -> Config:
    """Where GEMMs dominate: hidden 4096, intermediate 16384, 8192 tokens per step."""
    c = Config(preset="large")
    c.model = ModelConfig(hidden=4096, intermediate=16384, layers=3, seq_len=512, batch=16)
    return c


def _gpt_cpu() -> Config:
    """A GPT student distilled from a deeper, wider GPT teacher on the offline corpus, on a CPU in well
    under a minute (the teacher is trained once and cached)."""
    c = Config(preset="gpt-cpu")
    c.model = ModelConfig(kind="gpt", vocab=512, hidden=64, intermediate=256, layers=2, heads=4, seq_len=64, batch=8)
    c.train = TrainConfig(steps=80, lr=2e-3, eval_batches=4)
    c.bench = BenchConfig(warmup=2, iters=5)
    # T=1: over a few dozen steps a softened target (T=2, DistillKit's default for long runs) teaches
    # slower than the text itself; at T=1 the KD student ends closer to the teacher than the no-KD one
    c.distill = DistillConfig(loss="forward_kl", temperature=1.0)
    c.lm = LMConfig(corpus_mb=0.5, teacher_hidden=128, teacher_layers=3, teacher_steps=200)
    c.backends = ["torch_fp32", "torch_bf16", "te_fp8:delayed"]
    c.baseline = "torch_fp32"
    return c


def _lm_shape(name: str, **model: Any) -> Config:
    """A decoder stack at a shape where FP8 has work to do (vocab 32768, KL on the logits at T=2);
    the teacher is the student's shape and untrained: these presets measure speed and memory."""
    c = Config(preset=name)
    c.model = ModelConfig(**{"kind": "gpt", "vocab": 32768, **model})
    c.train = TrainConfig(steps=10, eval_batches=2, fused_optimizer=True)
    c.bench = BenchConfig(warmup=5, iters=20)
    c.distill = DistillConfig(loss="forward_kl")
    c.lm = LMConfig(teacher="random")
    c.backends = ["torch_bf16", "te_bf16", "te_fp8:delayed", "te_fp8:current", "torchao_float8:tensorwise"]
    return c


def _lm_a() -> Config:
    """Shape A: hidden 2048, 16 heads, ffn 8192, 4 layers, seq 2048 x batch 4, vocab 32768."""
    return _lm_shape("lm-a", hidden=2048, heads=16, intermediate=8192, layers=4, seq_len=2048, batch=4)


def _lm_b() -> Config:
    """Shape B: hidden 4096, 32 heads, ffn 16384, 2 layers, seq 4096 x batch 2, vocab 32768."""
    return _lm_shape("lm-b", hidden=4096, heads=32, intermediate=16384, layers=2, seq_len=4096, batch=2)


def _lm_distill() -> Config:
    """Long enough to compare held-out perplexity curves of bf16 and FP8 students: a GPT student (hidden
    1024, 4 layers) distilled for 300 steps from a wider, deeper GPT teacher trained here, 8192 tokens per
    step, the held-out metrics every 50 steps. Run it with two seeds for the noise (--set seed=...)."""
    c = Config(preset="lm-distill")
    c.model = ModelConfig(
        kind="gpt", vocab=8192, hidden=1024, intermediate=4096, layers=4, heads=8, seq_len=512, batch=16
    )
    c.train = TrainConfig(steps=300, lr=1e-3, eval_batches=4, eval_every=50, fused_optimizer=True)
    c.bench = BenchConfig(warmup=5, iters=20)
    c.distill = DistillConfig(loss="forward_kl", temperature=1.0)
    c.lm = LMConfig(teacher_hidden=1536, teacher_layers=6, teacher_steps=600, teacher_lr=1e-3)
    c.backends = ["torch_bf16", "te_fp8:delayed", "te_fp8:current"]
    return c


def _hf_shape(name: str, **model: Any) -> Config:
    """lm-a's measurement for a Hugging Face model of a real shape, such as one `workbench hf-init` writes:
    set lm.student=DIR (and lm.teacher=DIR for a Hugging Face teacher; else the teacher is the workbench's
    llama, random, at these fields). The fields mirror the hf-init shape of the same name (a test keeps them
    in agreement), so the teacher and a run without lm.student have its width, depth and heads; the folder
    decides the student's architecture and model.vocab."""
    return _lm_shape(name, kind="llama", **model, seq_len=2048, batch=4)


def _hf_llama_4l() -> Config:
    """Llama-3.2-1B cut to 4 layers (hf-init llama-3.2-1b-4l): hidden 2048, 32 heads, ffn 8192, vocab 32768."""
    return _hf_shape("hf-llama-4l", hidden=2048, heads=32, intermediate=8192, layers=4, vocab=32768)


def _hf_llama_1b() -> Config:
    """Llama-3.2-1B (hf-init llama-3.2-1b): hidden 2048, 32 heads, ffn 8192, 16 layers, vocab 128256."""
    return _hf_shape("hf-llama-1b", hidden=2048, heads=32, intermediate=8192, layers=16, vocab=128256)


def _hf_qwen_05b() -> Config:
    """Qwen2.5-0.5B (hf-init qwen2.5-0.5b): hidden 896, 14 heads, ffn 4864, 24 layers, vocab 151936."""
    return _hf_shape("hf-qwen2.5-0.5b", hidden=896, heads=14, intermediate=4864, layers=24, vocab=151936)


PRESETS = {"seed": _seed, "cpu-smoke": _cpu_smoke, "large": _large, "gpt-cpu": _gpt_cpu, "lm-a": _lm_a, "lm-b": _lm_b,
           "lm-distill": _lm_distill, "hf-llama-4l": _hf_llama_4l, "hf-llama-1b": _hf_llama_1b,
           "hf-qwen2.5-0.5b": _hf_qwen_05b}


PRESET_CHOICES = (*PRESETS, "auto")


def preset_help() -> str:
    """The --preset help of every command, from the preset table."""
    return " | ".join(PRESETS) + " | auto (seed on a GPU, else cpu-smoke)"


def default_preset_name() -> str:
    """'seed' where a CUDA GPU is visible, else 'cpu-smoke' (what `make run` uses)."""
    import torch

    return "seed" if torch.cuda.is_available() else "cpu-smoke"


def from_preset(name: str = "seed", **overrides: Any) -> Config:
    """The named preset with flat or dotted overrides, validated. 'auto' picks `default_preset_name()`."""
    if name == "auto":
        name = default_preset_name()
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; allowed: {sorted(PRESETS)} or 'auto'")
    return PRESETS[name]().replace(**overrides).validate()
