# `make run` and `make test` (or `make test-fast`); both create the environment when it is missing.
# The venv sees system site-packages, so a CUDA torch / Transformer Engine already installed
# (Colab, NGC containers, a GPU box) is reused, never replaced. Where no torch exists:
#   - no CUDA GPU visible (no working nvidia-smi): the CPU build from torch's CPU wheel index (as
#     environments/requirements-cpu.txt does), not the default index's Linux wheel, which is the multi-GB CUDA
#     build; where that index cannot be reached (a PyPI-only mirror or CI), pip's default index after a 10 s timeout;
#   - a CUDA GPU visible: the default index's build of $(TORCH) (install your own CUDA torch first to choose it).
# Every route installs the same extras, EXTRAS (pyproject.toml's `all`; tests/test_packaging.py keeps the
# requirements files, the Dockerfile and environment.yml in agreement), and registers this venv as the Jupyter
# kernel `te-workbench`, the kernel the notebooks name.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
TORCH  ?= torch==2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
EXTRAS ?= all
KERNEL ?= te-workbench
PRESET ?= auto
OUT    ?= results
SET    ?=
# pytest-xdist workers for make test / test-fast: an idle worker takes tests from a busy one (--dist worksteal;
# a module fixture is built at most once per worker); 2 fits a 2-core machine, raise it on a bigger one.
JOBS   ?= 2

.PHONY: setup run lint test test-fast lab bench clean-venv
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || \
	  if nvidia-smi -L >/dev/null 2>&1; then $(BIN)/python -m pip install -q "$(TORCH)"; \
	  else $(BIN)/python -m pip install -q --retries 0 --timeout 10 --index-url $(TORCH_CPU_INDEX) "$(TORCH)" \
	    || $(BIN)/python -m pip install -q "$(TORCH)"; fi
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	$(BIN)/python -m ipykernel install --user --name $(KERNEL) --display-name "Python ($(KERNEL))" >/dev/null
	touch $@

# Executes notebooks/distill_benchmark.ipynb with papermill; results and the executed copy go to
# $(OUT)/<run_id>/; the last line says where both are. Example: make run PRESET=large SET="--set backends=torch_bf16,te_fp8:current"
run: setup
	$(BIN)/python -m workbench notebook --preset $(PRESET) --out $(OUT) $(SET)

# The whole suite, and without the tests marked slow, which execute notebooks and subprocesses; the README gives
# the durations measured from a fresh clone on 2 CPU cores.
# ruff (pinned in the `dev` extra; its settings are pyproject.toml's [tool.ruff]) before either test target.
lint: setup
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest -q -n $(JOBS) --dist worksteal

test-fast: lint
	$(BIN)/python -m pytest -q -n $(JOBS) --dist worksteal -m "not slow"

# JupyterLab on notebooks/, with the te-workbench kernel (this venv).
lab: setup
	$(BIN)/python -m jupyter lab notebooks/

# Every variant (eager / compile / graphs x layout x param dtype) of a preset, the matmul peak probe, the
# profiler cross-check and the noise repeats: $(OUT)/bench/<timestamp>-bench-<preset>/ (workbench/bench/).
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
