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

.PHONY: venv test bench bench-dev lint clean system-packages

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

# Debian packages the tests need: Mesa's lavapipe, a Vulkan driver running on the CPU, on
# which the webgpu backend's tests run for real. Installed when missing and this is root
# (CI); otherwise a note, and those tests skip (CI sets HOLOGRAM_REQUIRE_WEBGPU=1: there
# they fail instead).
SYSTEM_PACKAGES := mesa-vulkan-drivers libvulkan1

system-packages:
	@if command -v dpkg >/dev/null && ! dpkg -s $(SYSTEM_PACKAGES) >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update && apt-get install -y --no-install-recommends $(SYSTEM_PACKAGES); \
		else \
			echo "note: $(SYSTEM_PACKAGES) are missing (sudo apt-get install them): the webgpu tests will skip"; \
		fi; \
	fi

test: lint system-packages
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
