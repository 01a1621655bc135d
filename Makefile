# Every target bootstraps its own environment: uv (installed with pip when missing), then the venv.
SHELL := /bin/bash
export UV_PYTHON_DOWNLOADS ?= never
UV := $(shell command -v uv 2>/dev/null || echo $(CURDIR)/.uv-bootstrap/bin/uv)
PYTEST_ARGS ?=

.PHONY: help bootstrap up test test-unit test-integration test-e2e lint typecheck fmt bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(CURDIR)/.uv-bootstrap/bin/uv:
	python3 -m venv .uv-bootstrap
	.uv-bootstrap/bin/pip install --quiet uv

.venv/.synced: pyproject.toml uv.lock $(wildcard libs/*/pyproject.toml services/*/pyproject.toml) | $(UV)
	$(UV) sync --frozen
	@touch $@

bootstrap: .venv/.synced  ## create the virtual environment with uv

up: bootstrap  ## run the whole system on the embedded default (NATS, Postgres, six services)
	$(UV) run --frozen tessera up

test: bootstrap  ## the whole suite: unit, integration (real NATS and Postgres), contract and end-to-end
	$(UV) run --frozen pytest $(PYTEST_ARGS)

test-unit: bootstrap  ## unit tests only (no I/O)
	$(UV) run --frozen pytest -m "not integration and not e2e" $(PYTEST_ARGS)

test-integration: bootstrap  ## integration tests on real NATS and Postgres
	$(UV) run --frozen pytest -m "integration" $(PYTEST_ARGS)

test-e2e: bootstrap  ## end-to-end tests of the whole system
	$(UV) run --frozen pytest -m "e2e" $(PYTEST_ARGS)

lint: bootstrap  ## ruff
	$(UV) run --frozen ruff check .
	$(UV) run --frozen ruff format --check .

typecheck: bootstrap  ## mypy, strict
	$(UV) run --frozen mypy libs/*/src services/*/src bench

fmt: bootstrap
	$(UV) run --frozen ruff format .
	$(UV) run --frozen ruff check --fix .

clean:
	rm -rf .venv .uv-bootstrap .tessera .mypy_cache .ruff_cache .pytest_cache
