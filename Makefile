# accelshare developer entry points.  `make test` is what CI runs (through .ci/run).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv lint typecheck unit test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "accelshare needs Python 3.11+"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

# The pure core (common, alloc) must stay at 100 % line coverage.
test: lint typecheck
	$(BIN)/python -m pytest --cov --cov-report=term -q
	$(BIN)/coverage report --include='src/accelshare/common/*,src/accelshare/alloc/*' --fail-under=100

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

# The local cluster in the foreground (Ctrl-C stops it); options: make run ARGS="--agents 2".
.PHONY: run demo
run: $(STAMP)
	$(BIN)/accelshare dev up $(ARGS)

# The README tour on a throwaway cluster; exits non-zero if a check fails.
demo: $(STAMP)
	$(BIN)/accelshare dev demo

bench: $(STAMP)
	$(BIN)/python bench/alloc_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .coverage htmlcov
