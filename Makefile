# Two commands: `make run` and `make test`. Both create the environment when it is missing.
# The venv sees system site-packages, so a CUDA torch / Transformer Engine already installed
# (Colab, NGC containers, a GPU box) is reused, never replaced. Where no torch exists, the pinned
# CPU build is installed (on a GPU machine, install your CUDA torch first).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
TORCH  ?= torch==2.13.0
PRESET ?= auto
OUT    ?= results
SET    ?=

.PHONY: setup run test bench clean-venv
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev,notebook,lm,sweep]"
	touch $@

# Executes notebooks/distill_benchmark.ipynb with papermill; results and the executed copy go to
# $(OUT)/<run_id>/. Example: make run PRESET=large SET="--set backends=torch_bf16,te_fp8:current"
run: setup
	$(BIN)/python -m workbench notebook --preset $(PRESET) --out $(OUT) $(SET)

test: setup
	$(BIN)/python -m pytest -q

# Every variant (eager / compile / graphs x layout x param dtype) of a preset, the matmul peak probe, the
# profiler cross-check and the noise repeats: $(OUT)/bench/<timestamp>-bench-<preset>/ (workbench/bench.py).
# Example: make bench PRESET=large SET="--variants eager,graphs-fused-bf16"
bench: setup
	$(BIN)/python -m workbench bench --preset $(PRESET) --out $(OUT)/bench $(SET)

# A papermill sweep over config fields into $(OUT)/sweeps/<NAME>/, resumable (rerun = resume), then
# the crossover report. Example: make sweep NAME=sizes GRID="hidden=512,1024 seq_len=128,1024" SET="--set steps=10"
.PHONY: sweep
sweep: setup
	$(BIN)/python -m workbench sweep --name $(or $(NAME),sweep) --preset $(PRESET) --out $(OUT)/sweeps \
		$(foreach g,$(GRID),--grid $(g)) $(foreach l,$(LINK),--link $(l)) $(SET)

clean-venv:
	rm -rf $(VENV)
