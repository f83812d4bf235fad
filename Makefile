# Developer entry points. `make test` is what CI runs (see .ci/run).

PYTHON ?= python3

VENV := .venv
VENV_PY := $(VENV)/bin/python
# Reinstall only when the dependency spec changes: each stamp is older than
# pyproject.toml/constraints.txt exactly when the venv may be out of date.
STAMP_TEST := $(VENV)/.stamp-test
STAMP_BENCH := $(VENV)/.stamp-bench
# torch is always pinned through constraints.txt; an unpinned resolve downloads gigabytes.
PIP_INSTALL := $(VENV_PY) -m pip install -c constraints.txt
# ruff errors on paths that do not exist, and some of these arrive later.
LINT_PATHS := $(wildcard hologram hologram_torch tests examples)
PYTEST_ARGS ?= -n 2
BENCH_DIR := bench-results

.PHONY: venv test bench bench-dev lint clean

venv: $(STAMP_TEST)

# Order-only: the interpreter's mtime (a symlink to the system python) must not
# trigger reinstalls.
$(VENV_PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP_TEST): pyproject.toml constraints.txt | $(VENV_PY)
	$(PIP_INSTALL) -e ".[test]"
	touch $@

$(STAMP_BENCH): pyproject.toml constraints.txt | $(VENV_PY)
	$(PIP_INSTALL) -e ".[test,bench]"
	touch $@

lint: $(STAMP_TEST)
	$(VENV)/bin/ruff check $(LINT_PATHS)

test: lint
	$(VENV_PY) -m pytest $(PYTEST_ARGS)

# Hologram against PyTorch: tables, plots and a report (`hologram bench --help`).
bench: $(STAMP_BENCH)
	$(VENV)/bin/hologram bench --out $(BENCH_DIR)
	@echo "Benchmark report: $(CURDIR)/$(BENCH_DIR)/report.md and $(CURDIR)/$(BENCH_DIR)/report.html"

# The developer suite: compiler, cache, interpreter vs NumPy, cpu backend vs PyTorch.
bench-dev: $(STAMP_BENCH)
	$(VENV_PY) -m hologram.bench.dev.run

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache .hypothesis
	find . -path ./.git -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +
