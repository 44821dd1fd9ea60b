# `make run` and `make test` (or `make test-fast`); both create the environment when it is missing.
# The venv sees system site-packages, so a CUDA torch / Transformer Engine already installed
# (Colab, NGC containers, a GPU box) is reused, never replaced. Where no torch exists:
#   - no CUDA GPU visible (no working nvidia-smi): the CPU build from torch's CPU wheel index (as
#     environments/requirements-cpu.txt does), not the default index's Linux wheel, which is the multi-GB CUDA
#     build; where that index cannot be reached (a PyPI-only mirror or CI), pip's default index after a 10 s timeout;
#   - a CUDA GPU visible: the default index's build of $(TORCH) (install your own CUDA torch first to choose it).
# Each target installs the extras it needs (pyproject.toml): `make run` / `make bench` RUN_EXTRAS, `make test` /
# `make lint` add the dev tools and Dask (TEST_EXTRAS), `make lab` JupyterLab (LAB_EXTRAS), `make sweep` Dask.
# Together they are pyproject.toml's `all`, the set the other routes install (tests/repo/test_install_routes.py keeps
# the requirements files, the Dockerfile and environment.yml in agreement). Every target registers this venv as
# the Jupyter kernel `te-workbench`, the kernel the notebooks name, inside the venv (--sys-prefix): each clone's
# `make lab` runs its own code.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
TORCH  ?= torch==2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
RUN_EXTRAS   ?= notebook,lm
TEST_EXTRAS  ?= $(RUN_EXTRAS),dev,sweep
LAB_EXTRAS   ?= $(RUN_EXTRAS),lab
SWEEP_EXTRAS ?= $(RUN_EXTRAS),sweep
KERNEL ?= te-workbench
PRESET ?= auto
OUT    ?= results
SET    ?=
# Extra arguments for `jupyter lab`, e.g. make lab LAB_ARGS="--no-browser --port 8899"; as root (containers, the
# NGC image, many cloud boxes) --allow-root is added, without which Jupyter refuses to start.
LAB_ARGS ?=
LAB_UID  ?= $(shell id -u)
# pytest-xdist workers for make test / test-fast: an idle worker takes tests from a busy one (--dist worksteal;
# a module fixture is built at most once per worker); 2 fits a 2-core machine, raise it on a bigger one.
JOBS   ?= 2

.PHONY: setup run lint test test-fast lab git-filter bench clean-venv
setup: $(VENV)/.installed-$(RUN_EXTRAS)

# The venv and torch, once; then one stamp per set of extras (named by the set, so changing a set reinstalls).
$(VENV)/.torch:
	test -x $(BIN)/python || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || \
	  if nvidia-smi -L >/dev/null 2>&1; then $(BIN)/python -m pip install -q "$(TORCH)"; \
	  else $(BIN)/python -m pip install -q --retries 0 --timeout 10 --index-url $(TORCH_CPU_INDEX) "$(TORCH)" \
	    || $(BIN)/python -m pip install -q "$(TORCH)"; fi
	touch $@

$(VENV)/.installed-%: pyproject.toml $(VENV)/.torch
	$(BIN)/python -m pip install -q -e ".[$*]"
	$(BIN)/python -m ipykernel install --sys-prefix --name $(KERNEL) --display-name "Python ($(KERNEL))" >/dev/null
	touch $@

# Executes notebooks/distill_benchmark.ipynb with papermill; results and the executed copy go to
# $(OUT)/<run_id>/; the last line says where both are. Example: make run PRESET=large SET="--set backends=torch_bf16,te_fp8:current"
run: $(VENV)/.installed-$(RUN_EXTRAS)
	$(BIN)/python -m workbench notebook --preset $(PRESET) --out $(OUT) $(SET)

# The whole suite, and without the tests marked slow, which execute notebooks and subprocesses; the README gives
# the durations measured from a fresh clone on 2 CPU cores.
# ruff (pinned in the `dev` extra; its settings are pyproject.toml's [tool.ruff]) before either test target.
# The venv sees the system's site-packages, and pytest would load every plugin installed there (pytest-benchmark,
# anyio, ...): plugin autoloading is off, and the one plugin the suite uses, pytest-xdist, is loaded by name.
PYTEST = PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(BIN)/python -m pytest -p xdist.plugin
lint: $(VENV)/.installed-$(TEST_EXTRAS)
	$(BIN)/ruff check .

test: lint
	$(PYTEST) -q -n $(JOBS) --dist worksteal

test-fast: lint
	$(PYTEST) -q -n $(JOBS) --dist worksteal -m "not slow"

# JupyterLab on notebooks/, with the te-workbench kernel (this venv's, found before a user-wide one of that name);
# after each save, workbench/lab.py keeps git's index in step with a notebook whose only change is its outputs.
LAB_HOOK = --ContentsManager.post_save_hook=workbench.lab.git_post_save
lab: $(VENV)/.installed-$(LAB_EXTRAS) git-filter
	JUPYTER_PREFER_ENV_PATH=1 $(BIN)/python -m jupyter lab $(if $(filter 0,$(LAB_UID)),--allow-root) $(LAB_HOOK) $(LAB_ARGS) notebooks/

# Run All in Lab writes outputs into the tracked notebooks, and the next `git pull` would conflict: .gitattributes
# sends notebooks/*.ipynb through nbstripout's git filter, defined here in this clone's .git/config (a filter lives
# in git config, never in the repository). These are nbstripout's manual set-up lines: its --install would filter
# every .ipynb, the executed evidence under results/ among them. Lab keeps its outputs on disk; `git status`,
# `git diff` and commits see the notebook without them. --keep-id keeps the committed cell ids (nbstripout would
# renumber them), and the kernel's language_info (its Python version) goes with the outputs. Outside a git
# checkout, or without nbstripout (the lab and dev extras), it does nothing. Not `required`: after `make clean-venv`
# (the filter's python gone) git passes notebooks through unfiltered instead of refusing every status and add.
git-filter:
	@if git rev-parse --git-dir >/dev/null 2>&1 && $(BIN)/python -c "import nbstripout" 2>/dev/null; then \
	  git config filter.nbstripout.clean '"$(abspath $(BIN))/python" -m nbstripout --keep-id' && \
	  git config filter.nbstripout.smudge cat && git config --unset filter.nbstripout.required; \
	  git config filter.nbstripout.extrakeys metadata.language_info && \
	  git config diff.ipynb.textconv '"$(abspath $(BIN))/python" -m nbstripout -t'; fi

# Every variant (eager / compile / graphs x layout x param dtype) of a preset, the matmul peak probe, the
# profiler cross-check and the noise repeats: $(OUT)/bench/<timestamp>-bench-<preset>/ (workbench/bench/).
# Example: make bench PRESET=large SET="--variants eager,graphs-fused-bf16"
bench: $(VENV)/.installed-$(RUN_EXTRAS)
	$(BIN)/python -m workbench bench --preset $(PRESET) --out $(OUT)/bench $(SET)

# A papermill sweep over config fields into $(OUT)/sweeps/<NAME>/, resumable (rerun = resume), then
# the crossover report. Example: make sweep NAME=sizes GRID="hidden=512,1024 seq_len=128,1024" SET="--set steps=10"
.PHONY: sweep
sweep: $(VENV)/.installed-$(SWEEP_EXTRAS)
	$(BIN)/python -m workbench sweep --name $(or $(NAME),sweep) --preset $(PRESET) --out $(OUT)/sweeps \
		$(foreach g,$(GRID),--grid $(g)) $(foreach l,$(LINK),--link $(l)) $(SET)

clean-venv:
	rm -rf $(VENV)
