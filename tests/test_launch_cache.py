"""The one launch cache (hologram/runtime/launch.py: LaunchCache, launch_cache()): hits and
misses, LRU eviction under its bound, and keys that keep executors apart; the SDK's ops,
hg.jit and the torch device keep their launches in it."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import hologram as hg
from hologram.errors import InvalidBufferError
from hologram.runtime.launch import LaunchCache, launch_cache


def test_hit_and_miss():
    cache = LaunchCache(8)
    made = []

    def make():
        made.append(1)
        return object()

    first = cache.get_or_make(("k", 1), make)
    assert cache.get_or_make(("k", 1), make) is first and len(made) == 1  # a hit
    assert cache.get(("k", 2)) is None and ("k", 1) in cache and ("k", 2) not in cache
    cache.get_or_make(("k", 2), make)
    assert len(made) == 2 and len(cache) == 2
    assert cache.info() == {"entries": 2, "max_entries": 8, "misses": 2, "evictions": 0}


def test_least_recently_used_is_evicted():
    cache = LaunchCache(4)  # generations of 2
    cache.put("a", "A")
    cache.put("b", "B")  # a full generation: a and b become the old one
    assert cache.recent("a") is None  # the hot lookup sees only the young generation
    assert cache.get("a") == "A"  # used: back in the young generation
    assert cache.recent("a") == "A"
    cache.put("c", "C")  # b, unused since, is evicted; a and c survive
    assert cache.get("b") is None and cache.info()["evictions"] == 1
    assert cache.get("a") == "A" and cache.get("c") == "C" and len(cache) <= 4
    for i in range(100):  # never more than the bound; the most recent always kept
        cache.put(i, i)
        assert len(cache) <= 4 and cache.get(i) == i
    assert cache.get("a") is None  # unused for many insertions: evicted
    cache.set_max_entries(2)
    assert len(cache) <= 2
    with pytest.raises(ValueError):
        cache.set_max_entries(1)
    cache.put("e", 1)
    assert len(cache) <= 2 and "e" in cache
    assert cache.discard(lambda k: k == "e") == 1 and "e" not in cache
    cache.clear()
    assert len(cache) == 0 and cache.recent("e") is None


def test_concurrent_use_stays_bounded():
    cache = LaunchCache(64)

    def work(seed):
        for i in range(2000):
            key = (seed, i % 97)
            if cache.get(key) is None:
                cache.put(key, i)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) <= 64


def test_sdk_launches_are_keyed_by_executor():
    cache = launch_cache()
    x, y = np.arange(5, dtype=np.float32), np.ones(5, np.float32)
    with hg.Executor("cpu") as one, hg.Executor("cpu") as two:
        bufs = {ex: (ex.from_numpy(x), ex.from_numpy(y), ex.empty(5)) for ex in (one, two)}
        for ex, (a, b, c) in bufs.items():
            for _ in range(2):
                hg.ops.vector_add(ex, a, b, c)
                np.testing.assert_array_equal(c.to_numpy(), x + y)
        op = hg.ops.vector_add.op
        tokens = {k[-1] for k, _ in cache.items() if k[0] is op and len(k) == 5
                  and k[-1] in (one.token, two.token)}
        assert tokens == {one.token, two.token}  # one validated launch per executor
        # Buffers of one executor never take the other's launch, not even the fast one.
        a1, b1, c1 = bufs[one]
        with pytest.raises(InvalidBufferError, match="another executor"):
            hg.ops.vector_add(two, a1, b1, c1)
        a2, b2, _ = bufs[two]
        with pytest.raises(InvalidBufferError, match="another executor"):
            hg.ops.vector_add(one, a2, b2, c1)
        # A freed buffer's launch key is gone: it misses and the general path refuses it.
        c1.free()
        with pytest.raises(InvalidBufferError):
            hg.ops.vector_add(one, a1, b1, c1)


def test_bounded_under_many_shapes():
    cache = launch_cache()
    bound = cache.max_entries
    cache.set_max_entries(8)
    try:
        with hg.Executor("cpu") as ex:
            for n in range(1, 30):
                a = ex.from_numpy(np.arange(n, dtype=np.float32))
                np.testing.assert_array_equal(hg.ops.vector_mul(a, a).to_numpy(),
                                              np.arange(n) ** 2)
                assert len(cache) <= 8
            a = ex.from_numpy(np.arange(1, dtype=np.float32))  # evicted long ago: rebuilt
            np.testing.assert_array_equal((a + a).to_numpy(), [0.0])
            assert cache.info()["evictions"] > 0
    finally:
        cache.set_max_entries(bound)


def test_jit_and_torch_launches_share_the_cache():
    cache = launch_cache()
    fused = hg.jit(lambda a: a * 2 + 1)
    with hg.Executor("cpu") as ex:
        a = ex.from_numpy(np.arange(4, dtype=np.float32))
        fused(a)
        fused(a)
        assert fused.compiled_signatures == 1
    torch = pytest.importorskip("torch")
    import hologram_torch  # noqa: F401  (registers the device)
    from hologram_torch.aten import runner

    t = torch.arange(7, dtype=torch.float32).to("hologram")
    np.testing.assert_array_equal((t + t).cpu().numpy(), np.arange(7) * 2)
    assert any(k[0] == "add" and (torch.float32, torch.Size([7]), (1,)) in k
               for k, _ in cache.items() if isinstance(k[0], str))
    assert runner.shortcuts.get(("no such kernel",)) is None
