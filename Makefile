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
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The official Backend.AI client (needs Python 3.12) in its own virtualenv, for the
# compatibility tests in tests/integration/compat (docs/compatibility.md).  Never a
# dependency of accelshare.  `make test` builds it only when a working python3.12 exists
# (a pyenv shim without that version does not count); without one those tests skip.
# About 80 s the first time (downloads), nothing afterwards (stamp file).
BAI_VENV   ?= .venv-bai
BAI_CLIENT ?= backend.ai-client==25.5.2
BAI_STAMP  := $(BAI_VENV)/.installed-$(subst ==,-,$(BAI_CLIENT))
ifndef PYTHON312
PYTHON312  := $(shell for p in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12; do \
	"$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 && { echo "$$p"; break; }; done)
endif

.PHONY: bai-client bai-client-if-possible
$(BAI_STAMP):
	@test -n "$(PYTHON312)" || { echo "bai-client: no working python3.12 found" >&2; exit 1; }
	test -x $(BAI_VENV)/bin/python || $(PYTHON312) -m venv $(BAI_VENV)
	$(BAI_VENV)/bin/python -m pip install -q '$(BAI_CLIENT)'
	touch '$(BAI_STAMP)'

bai-client: $(BAI_STAMP)

# A failed install (no package index) is reported, not fatal: those tests then skip.
bai-client-if-possible:
	@if [ -z "$(PYTHON312)" ]; then \
		echo "bai-client: no python3.12, the Backend.AI client compatibility tests will skip"; \
	elif ! $(MAKE) --no-print-directory bai-client; then \
		echo "bai-client: installing $(BAI_CLIENT) failed, the compatibility tests will skip" >&2; \
	fi

# The pure core (common, alloc) must stay at 100 % line coverage.
test: lint typecheck bai-client-if-possible
	$(BIN)/python -m pytest --cov --cov-report=term -q
	$(BIN)/coverage report --include='src/accelshare/common/*,src/accelshare/alloc/*' --fail-under=100

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

# The reliability suite at full length (docs/reliability.md): 100 x 100 concurrent
# creations, longer fuzzing, the fault injections.  Its short version runs in `make test`.
.PHONY: reliability
reliability: $(STAMP)
	ACCELSHARE_RELIABILITY_FULL=1 $(BIN)/python -m pytest -q tests/reliability

# The local cluster in the foreground (Ctrl-C stops it and every process it started, the
# sessions' kernels included); options: make run ARGS="--agents 2".  In another shell,
# `source .accelshare/client.env` sets the keys and puts .venv/bin on PATH.  App pages get
# an origin of their own on APPS_PORT (docs/manager.md, "Web terminal and app services"; APPS_PORT= turns it off).
.PHONY: run demo
APPS_PORT ?= 8082
run: $(STAMP)
	$(BIN)/accelshare dev up $(if $(APPS_PORT),--apps-port $(APPS_PORT)) $(ARGS)

# The README tour on a throwaway cluster; exits non-zero if a check fails.
demo: $(STAMP)
	$(BIN)/accelshare dev demo

bench: $(STAMP)
	$(BIN)/python bench/alloc_bench.py

clean:
	rm -rf $(VENV) $(BAI_VENV) .pytest_cache .mypy_cache .ruff_cache .coverage htmlcov
