# loglake: `make run` starts it, `make test` checks it. Both set up .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two installs, each re-done whenever pyproject.toml changes: `make run` needs only what a broker
# needs (the package and its s3 extra), `make test` everything (test tools, Spark, cluster mode).
# The full install is a superset, so it stamps both: `make test` then `make run` installs nothing.
HASH := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
RUN_STAMP := $(VENV)/.installed-run-$(HASH)
TEST_STAMP := $(VENV)/.installed-test-$(HASH)
RUN_EXTRAS := s3
TEST_EXTRAS := test,s3,spark,cluster,registry
DATA_DIR ?= ./loglake-data

.PHONY: venv run test test-long lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[$(RUN_EXTRAS)]'
	rm -f $(VENV)/.installed-run-*
	touch $@

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[$(TEST_EXTRAS)]'
	rm -f $(VENV)/.installed-*
	touch $@ $(RUN_STAMP)

venv: $(TEST_STAMP)

LISTEN ?= 127.0.0.1:9092
# e.g. SERVE_FLAGS=--allow-unauthenticated-public-listener for LISTEN=0.0.0.0:9092 (docs/SECURITY.md)
SERVE_FLAGS ?=

run: $(RUN_STAMP)
	$(BIN)/loglake serve --data-dir $(DATA_DIR) --listen $(LISTEN) $(SERVE_FLAGS)

lint: $(TEST_STAMP)
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/mypy

# The suite mostly waits (on brokers, clients, subprocesses): one worker keeps 0.65 of a core busy,
# so three pytest-xdist workers share the two cores (15.6 min against 23 with two, quiet machine);
# tests/conftest.py hands each a module at a time, the longest first (its GROUP_SECONDS, refreshed
# with scripts/test_groups.py), and all Spark tests to one. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 3

test: lint
	$(BIN)/pytest -q -m "not long" -n $(TEST_WORKERS) --dist loadgroup --durations=20

LONG_RUN := build/long-run

# The long runs write their figures to $(LONG_RUN); docs/RELIABILITY.md's table is regenerated
# from them (scripts/reliability_report.py) only when every long test passed.
test-long: $(TEST_STAMP)
	rm -rf $(LONG_RUN) && mkdir -p $(LONG_RUN)
	LOGLAKE_LONG_REPORT=$(LONG_RUN)/soak.json LOGLAKE_FUZZ_REPORT=$(LONG_RUN)/fuzz.json \
	LOGLAKE_CANARY_REPORT=$(LONG_RUN)/canaries.json LOGLAKE_OVERLOAD_REPORT=$(LONG_RUN)/overload.json \
	$(BIN)/pytest -q -m long
	$(BIN)/python scripts/reliability_report.py $(LONG_RUN) --write docs/RELIABILITY.md

bench: $(RUN_STAMP)
	$(BIN)/python benchmarks/engine.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
