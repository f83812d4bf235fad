"""The ``backend`` fixture: one run of the suite per available backend."""

from __future__ import annotations

import pytest

from hologram import backends


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/K",
                     help="run only the I-th of K shares of the selected cases (0 <= I < K), "
                          "dealt in collection order so the parameters of one test spread")


@pytest.hookimpl(trylast=True)  # after -k and -m have selected
def pytest_collection_modifyitems(config, items):
    shard = config.getoption("--shard")
    if shard is None:
        return
    index, count = (int(part) for part in shard.split("/"))
    if not 0 <= index < count:
        raise pytest.UsageError(f"--shard {shard}: I must lie in [0, K)")
    config.hook.pytest_deselected(items=[item for n, item in enumerate(items)
                                         if n % count != index])
    items[:] = items[index::count]


@pytest.fixture(scope="package", autouse=True)
def _private_cache(tmp_path_factory):
    """Keep the suite's artifacts out of the user's cache, compile from scratch, and
    test the backends' full builds. Package scope: the settings end with the suite's
    tests (a session-scoped one kept HOLOGRAM_QUICK_COMPILE=0 for every later test of
    the pytest worker, which failed the tests of the quick tier and its promotion once
    the worker's order put them after a conformance test)."""
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
