# Developer entry points. `make test` is what CI runs (see .ci/run).

PYTHON ?= python3

VENV := .venv
VENV_PY := $(VENV)/bin/python
# Reinstall only when the dependency spec or the native extension's source changes: each
# stamp is older than those exactly when the venv may be out of date.
STAMP_TEST := $(VENV)/.stamp-test
STAMP_BENCH := $(VENV)/.stamp-bench
# torch is always pinned through constraints.txt; an unpinned resolve downloads gigabytes.
PIP_INSTALL := $(VENV_PY) -m pip install -c constraints.txt
# ruff errors on paths that do not exist, and some of these arrive later.
LINT_PATHS := $(wildcard hologram hologram_torch tests examples tools setup.py .ci/*.py)
# --durations: the slowest tests in every log, so that a CI run growing slower shows where.
# --dist worksteal: a worker that runs out of tests takes some of the other's (the long
# OpInfo pooling cases otherwise left one worker busy for minutes at the end of a run).
PYTEST_ARGS ?= -n 2 --dist worksteal --durations=15
BENCH_DIR := bench-results

.PHONY: venv test test-webgpu-device bench bench-dev lint clean system-packages package docs

venv: $(STAMP_TEST)

# Order-only: the interpreter's mtime (a symlink to the system python) must not
# trigger reinstalls.
$(VENV_PY):
	$(PYTHON) -m venv $(VENV)

# After installing, build the torch device's native hooks (hologram_torch/native.py) so
# that the first import does not; this needs g++ and ninja, hence system-packages first.
# Without them it prints why, and the device runs on its Python hooks.
BUILD_NATIVE_HOOKS := $(VENV_PY) -c "import hologram_torch.native as n; n.report()"

# setup.py and the C sources: pip compiles hologram/csrc/*.c into hologram/_native*.so.
NATIVE_SOURCES := setup.py $(wildcard hologram/csrc/*.c hologram/csrc/*.h)

# The distribution was named "hologram" before 0.2.0 (on the package index that name is
# an unrelated project's): a venv made then has it beside hologram-tensor; remove it first.
DROP_OLD_NAME := if $(VENV_PY) -m pip show -q hologram 2>/dev/null; then \
	$(VENV_PY) -m pip uninstall -y -q hologram; fi

$(STAMP_TEST): pyproject.toml constraints.txt $(NATIVE_SOURCES) | $(VENV_PY) system-packages
	$(DROP_OLD_NAME)
	$(PIP_INSTALL) -e ".[test]"
	$(BUILD_NATIVE_HOOKS)
	touch $@

$(STAMP_BENCH): pyproject.toml constraints.txt $(NATIVE_SOURCES) | $(VENV_PY) system-packages
	$(DROP_OLD_NAME)
	$(PIP_INSTALL) -e ".[test,bench]"
	$(BUILD_NATIVE_HOOKS)
	touch $@

lint: $(STAMP_TEST)
	$(VENV)/bin/ruff check $(LINT_PATHS)

# Debian packages the tests need: Mesa's lavapipe, a Vulkan driver running on the CPU, on
# which the webgpu backend's tests run for real; g++ (with gcc, which compiles hologram's
# native extension when pip installs the package) and ninja, which build the torch
# device's native hooks (without them DDP's find_unused_parameters and static_graph are
# refused). Installed when missing and this is root (CI); otherwise a note, and the webgpu
# tests skip (CI sets HOLOGRAM_REQUIRE_WEBGPU=1: there they fail instead).
SYSTEM_PACKAGES := mesa-vulkan-drivers libvulkan1 g++ ninja-build

system-packages:
	@if command -v dpkg >/dev/null && ! dpkg -s $(SYSTEM_PACKAGES) >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update && apt-get install -y --no-install-recommends $(SYSTEM_PACKAGES); \
		else \
			echo "note: some of $(SYSTEM_PACKAGES) are missing (sudo apt-get install them): the webgpu tests will skip, and the torch device has no native hooks"; \
		fi; \
	fi

test: lint docs system-packages
	$(VENV_PY) -m pytest $(PYTEST_ARGS)
	$(MAKE) test-webgpu-device
	$(MAKE) package

# The torch device's suites again with its memory and kernels on the webgpu backend (on
# lavapipe in CI: correctness only); the tests tests/webgpu_device_expected.txt lists are
# strict expected failures, each for the reason it gives. The suites are files of
# tests/torch_device/ (topic/name for topic/test_name.py). WEBGPU_DEVICE_SUITES=all runs
# every one but the multi-process distributed tests (~20 minutes more on 2 cores).
WEBGPU_DEVICE_SUITES ?= device/autocast device/custom_op device/device device/devices \
	device/errors device/streams memory/layouts memory/tied ops/attention ops/complex \
	ops/conv ops/elementwise ops/functional ops/generate ops/indexing ops/linalg_shape \
	ops/lowering ops/pool_norm ops/reduction_nn ops/rnn lazy/lazy lazy/lazy_programs \
	models/models models/training distributed/sync_batch_norm compile/compile
test-webgpu-device: $(STAMP_TEST)
	@if [ "$(WEBGPU_DEVICE_SUITES)" = all ]; then \
		files="tests/torch_device --ignore=tests/torch_device/distributed/test_distributed.py"; \
	else files="$(foreach s,$(WEBGPU_DEVICE_SUITES),tests/torch_device/$(dir $(s))test_$(notdir $(s)).py)"; fi; \
	if $(VENV_PY) -c "import sys; from hologram.backends.webgpu.backend import WebGpuBackend as B; sys.exit(not B.is_available())" 2>/dev/null \
		|| [ -n "$$HOLOGRAM_REQUIRE_WEBGPU" ]; then \
		HOLOGRAM_TORCH_BACKEND=webgpu $(VENV_PY) -m pytest $(PYTEST_ARGS) $$files; \
	else echo "note: no WebGPU adapter: the torch device's webgpu run is skipped"; fi

# The documentation site (mkdocs.yml) into site/; --strict: any warning, a broken link or
# anchor included, fails. (Not -q: it hides the warnings from the strict count.)
docs: $(STAMP_TEST)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The sdist and a manylinux wheel (the native parts built in), installed into a fresh venv
# with no compiler on PATH and smoke-tested from outside the tree (.ci/package; DIST=dir
# keeps the files).
package: $(STAMP_TEST)
	bash .ci/package

# Hologram against PyTorch: tables, plots and a report (`hologram bench --help`).
bench: $(STAMP_BENCH)
	$(VENV)/bin/hologram bench --out $(BENCH_DIR)
	@echo "Benchmark report: $(CURDIR)/$(BENCH_DIR)/report.md and $(CURDIR)/$(BENCH_DIR)/report.html"

# The developer suite: compiler, cache, interpreter vs NumPy, cpu backend vs PyTorch.
bench-dev: $(STAMP_BENCH)
	$(VENV_PY) -m hologram.bench.dev.run

clean:
	rm -rf $(VENV) build dist site *.egg-info .pytest_cache .ruff_cache .hypothesis hologram/_native*.so
	find . -path ./.git -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +
