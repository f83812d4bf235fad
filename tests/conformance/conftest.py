"""The ``backend`` fixture: one run of the suite per available backend."""

from __future__ import annotations

import pytest

from hologram import backends


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Keep the suite's artifacts out of the user's cache, compile from scratch, and
    test the backends' full builds."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path_factory.mktemp("conformance-cache")))
        mp.delenv("HOLOGRAM_DISABLE_DISK_CACHE", raising=False)
        mp.delenv("HOLOGRAM_FAST_MATH", raising=False)
        # The full builds: each program here runs a few times, so the quick first build
        # (bit-identical, tests/test_cpu_targets.py) would be all the suite ever saw.
        mp.setenv("HOLOGRAM_QUICK_COMPILE", "0")
        yield


@pytest.fixture(scope="session", params=backends.available())
def backend(request) -> str:
    """The name of a registered backend that runs here."""
    return request.param
