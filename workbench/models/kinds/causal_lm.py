"""The decoder-only causal LMs workbench.models.lm builds: GPT-2-style and Llama-style. A variant is its own
kind file, e.g. `Kind("llama_ln", task="lm", arch=dataclasses.replace(LLAMA, norm="layernorm"))`."""
from workbench.models.kinds import Arch, Kind, register

GPT = Arch(norm="layernorm", mlp="gelu", positions="learned", bias=True)
LLAMA = Arch(norm="rmsnorm", mlp="swiglu", positions="rope", bias=False, rope_theta=10000.0)

register(Kind("gpt", task="lm", arch=GPT))
register(Kind("llama", task="lm", arch=LLAMA))
