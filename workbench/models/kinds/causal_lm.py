"""The decoder-only causal LMs workbench.models.lm builds: GPT-style and Llama-style."""
from workbench.models.kinds import Kind, register

register(Kind("gpt", task="lm", arch="gpt"))
register(Kind("llama", task="lm", arch="llama"))
