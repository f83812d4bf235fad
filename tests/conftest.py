"""Test configuration: hypothesis profiles (choose with --hypothesis-profile=NAME), and
fixtures shared by test files.

The suite runs as on a machine without an NVIDIA GPU (as CI does): with a GPU, ``"auto"``
would take the cuda backend and the many tests that assume host memory would not hold.
``CUDA_VISIBLE_DEVICES`` is emptied before anything probes (child processes inherit it);
``HOLOGRAM_TEST_GPU=1`` leaves the GPU visible, to run the conformance suite on it
(``HOLOGRAM_TEST_GPU=1 pytest tests/conformance -k cuda``, docs/cuda.md).

The torch device's tests also run with ``HOLOGRAM_TORCH_BACKEND=webgpu`` (``make test``'s
second run, on lavapipe in CI): there the tests listed in ``webgpu_device_expected.txt``
are strict expected failures, each for the reason the file gives."""

import os
import re
from pathlib import Path

if os.environ.get("HOLOGRAM_TEST_GPU") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

import pytest
from hypothesis import settings

from hologram.backends.cpu import threads

settings.register_profile("default", max_examples=100)
settings.register_profile("thorough", max_examples=2000)
settings.load_profile("default")


@pytest.fixture
def default_threads(monkeypatch):
    """The CPU thread count as on a fresh start (no HOLOGRAM_NUM_THREADS, no override),
    before and after the test. Opt in per file: ``pytest.mark.usefixtures``."""
    monkeypatch.delenv("HOLOGRAM_NUM_THREADS", raising=False)
    threads.set_num_threads(None)
    yield
    threads.set_num_threads(None)


def _expected_on(backend: str) -> list[tuple[str, str]]:
    """``(node id pattern, reason)`` of the tests that fail on the torch device's
    ``backend`` (``<backend>_device_expected.txt``: ``# reason`` lines head the patterns
    they explain; ``*`` in a pattern is any text, everything else is literal)."""
    path = Path(__file__).with_name(f"{backend}_device_expected.txt")
    if not path.exists():
        return []
    entries, reason = [], ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("#"):
            reason = line.lstrip("# ")
        elif line:
            entries.append((re.compile(".*".join(map(re.escape, line.split("*")))), reason))
    return entries


def pytest_collection_modifyitems(config, items):
    backend = os.environ.get("HOLOGRAM_TORCH_BACKEND", "")
    expected = _expected_on(backend) if backend in ("webgpu",) else []
    for item in items:
        for pattern, reason in expected:
            if pattern.fullmatch(item.nodeid):
                item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
                break
