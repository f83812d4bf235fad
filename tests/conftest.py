"""Test configuration: hypothesis profiles (choose with --hypothesis-profile=NAME), and
fixtures shared by test files.

The suite runs as on a machine without an NVIDIA GPU (as CI does): with a GPU, ``"auto"``
would take the cuda backend and the many tests that assume host memory would not hold.
``CUDA_VISIBLE_DEVICES`` is emptied before anything probes (child processes inherit it);
``HOLOGRAM_TEST_GPU=1`` leaves the GPU visible, to run the conformance suite on it
(``HOLOGRAM_TEST_GPU=1 pytest tests/conformance -k cuda``, docs/cuda.md)."""

import os

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
