# loglake: `make run` starts it, `make test` checks it. Both set up .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Re-install whenever pyproject.toml changes.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
DATA_DIR ?= ./loglake-data

.PHONY: venv run test test-long lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,s3,spark]'
	rm -f $(VENV)/.installed-*
	touch $@

venv: $(STAMP)

LISTEN ?= 127.0.0.1:9092

run: venv
	$(BIN)/loglake serve --data-dir $(DATA_DIR) --listen $(LISTEN)

lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

test: lint
	$(BIN)/pytest -q -m "not long"

test-long: venv
	$(BIN)/pytest -q -m long

bench: venv
	$(BIN)/python benchmarks/engine.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
