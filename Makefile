# The two commands of the README: `make demo` and `make test`. Both set up everything.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.vitkit-installed

.PHONY: demo test setup bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements-dev.txt scripts/setup-system.sh
	bash scripts/setup-system.sh
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q -e .
	touch $(STAMP)

demo: $(STAMP)
	$(PY) scripts/demo.py

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/bench_inference.py

clean:
	rm -rf $(VENV) demo_out .pytest_cache
