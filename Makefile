# The two commands of the README: `make demo` and `make test`. Both set up everything.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.vitkit-installed

.PHONY: demo tour test test-full lint docs setup bench figures clean gpu-check gpu-check-dry

setup: $(STAMP)

$(STAMP): pyproject.toml requirements-dev.txt scripts/setup-system.sh
	bash scripts/setup-system.sh
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q -e .
	touch $(STAMP)

# The main job: train the default ViT on Fashion-MNIST (3 to 5 minutes on 2 CPU cores: its recipe
# follows the precision the CPU trains in, bf16 or fp32), in
# its own lighter environment: torch and vitkit's `train` extra, not the test suite's references.
DEMO_VENV  ?= .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.vitkit-installed

$(DEMO_STAMP): pyproject.toml requirements-demo.txt scripts/setup-system.sh
	bash scripts/setup-system.sh
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install -q --upgrade pip
	$(DEMO_VENV)/bin/python -m pip install -q -r requirements-demo.txt
	$(DEMO_VENV)/bin/python -m pip install -q -e '.[train]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/vitkit train

# A walk through models, costs, conversion and prediction (untrained weights).
tour: $(STAMP)
	$(PY) scripts/tour.py

# Two pytest-xdist workers (one torch thread each; tests/conftest.py keeps a module's shared
# fixture on one worker and starts the slow modules first). OpenVINO's tests run in a second
# pytest: after 1,400 tests in one process, OpenVINO's and torch's CPU runtimes together ended
# it with a segfault (CI, stop 47); never in a fresh one.
# `make test` (what CI runs) leaves out the tests marked `full`: end-to-end repeats of what the
# others prove piece by piece (every page of docs/ run as written, the benchmark smokes, int8 of
# the trained later ViTs, Ray's replicas, every study end to end, the site in Chromium, inductor).
# `make test-full` runs them too; run it before you stop.
TEST_MARKS := -m "not full"
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=20 $(TEST_MARKS) --ignore=tests/test_deploy_openvino.py
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=5 $(TEST_MARKS) tests/test_deploy_openvino.py

test-full: $(STAMP)
	$(MAKE) test TEST_MARKS=

# On a machine lent a GPU, first thing (its python3 has torch, timm and transformers; vitkit runs
# from this source): tests/gpu, inference and training against timm, the default run; JSON into
# benchmarks/results/gpu_<device>_<date>/, under 8 minutes on one H100 or H200.
gpu-check:
	PYTHONPATH=src python3 benchmarks/gpu_check.py

# The same script on this CPU at smoke size (the CUDA-only tests skip): proves it before a GPU session.
gpu-check-dry: $(STAMP)
	$(PY) benchmarks/gpu_check.py --dry

# ruff: pycodestyle, pyflakes (unused and undefined names), import order; pyproject.toml [tool.ruff]
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks scripts hubconf.py

# The documentation site (docs/ and the API reference from the docstrings) into site/; --strict:
# a broken link or a missing name is an error. Open site/index.html.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench: $(STAMP)
	$(PY) benchmarks/bench_inference.py

# The README's inspection figures (docs/figures/) from one named run, never from whatever is newest:
#   make figures MODEL=runs/NAME
# (MODEL is checked before anything is set up or installed)
ifneq ($(filter figures,$(MAKECMDGOALS)),)
ifeq ($(MODEL),)
$(error make figures: say which run: make figures MODEL=runs/NAME (e.g. the folder make demo printed))
endif
endif
figures: $(STAMP)
	$(PY) scripts/readme_figures.py --weights "$(MODEL)"

clean:
	rm -rf $(VENV) $(DEMO_VENV) demo_out inspect_out site .pytest_cache
