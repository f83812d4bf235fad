"""Test configuration: hypothesis profiles (choose with --hypothesis-profile=NAME), and
fixtures shared by test files."""

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
