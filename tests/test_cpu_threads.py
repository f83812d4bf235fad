"""The CPU worker pool: deterministic chunking, real parallelism, errors, configuration,
concurrent callers, interpreter exit and fork."""

from __future__ import annotations

import ctypes
import itertools
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from util import in_forked_child

from hologram.backends.cpu import threads
from hologram.errors import HologramError

pytestmark = pytest.mark.usefixtures("default_threads")


class Recorder:
    """A chunk function that records (start, stop, thread id) and can sleep or raise.
    ``sleep`` applies to every chunk, ``sleep_late`` to all but the first."""

    def __init__(self, sleep: float = 0.0, fail: set[int] | None = None,
                 sleep_late: float = 0.0):
        self.calls: list[tuple[int, int, int]] = []
        self.sleep = sleep
        self.sleep_late = sleep_late
        self.fail = fail or set()
        self._lock = threading.Lock()

    def __call__(self, start: int, stop: int) -> None:
        delay = self.sleep + (self.sleep_late if start else 0.0)
        if delay:
            time.sleep(delay)  # releases the GIL, like a ctypes call
        with self._lock:
            self.calls.append((start, stop, threading.get_ident()))
        if start in self.fail:
            raise ValueError(f"chunk at {start}")

    def ranges(self) -> list[tuple[int, int]]:
        return sorted((a, b) for a, b, _ in self.calls)


# --- chunks ---------------------------------------------------------------------------


@given(st.integers(0, 10**7), st.integers(1, 10**6), st.integers(1, 64))
def test_chunks_cover_range_once(total, grain, count):
    pieces = threads.chunks(total, grain, count)
    assert pieces == threads.chunks(total, grain, count)  # deterministic
    if total == 0:
        assert pieces == []
        return
    assert 1 <= len(pieces) <= count
    assert pieces[0][0] == 0 and pieces[-1][1] == total
    assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))  # contiguous, in order
    sizes = [stop - start for start, stop in pieces]
    assert max(sizes) - min(sizes) <= 1
    assert len(pieces) == 1 or min(sizes) >= grain
    assert len(pieces) == max(1, min(count, total // grain))


def test_chunks_examples():
    assert threads.chunks(10, 3, 4) == [(0, 4), (4, 7), (7, 10)]
    assert threads.chunks(5, 10, 4) == [(0, 5)]
    assert threads.chunks(8, 0, 2) == [(0, 4), (4, 8)]  # grain < 1 counts as 1
    with pytest.raises(HologramError):
        threads.chunks(-1, 1, 2)


# --- parallel_for ---------------------------------------------------------------------


def test_large_work_runs_on_several_threads():
    threads.set_num_threads(2)
    rec = Recorder(sleep=0.01)
    threads.parallel_for(rec, 1000, 100)
    assert rec.ranges() == threads.chunks(1000, 100, 2)
    idents = {ident for _, _, ident in rec.calls}
    assert len(idents) == 2
    first = next(ident for start, _, ident in rec.calls if start == 0)
    assert first == threading.get_ident()  # the first chunk runs on the caller


def test_workers_are_daemons():
    threads.set_num_threads(3)
    threads.parallel_for(Recorder(), 300, 1)
    workers = [t for t in threading.enumerate() if t.name.startswith("hologram-cpu-")]
    assert len(workers) >= 2 and all(t.daemon for t in workers)


def test_small_work_runs_inline():
    threads.set_num_threads(4)
    rec = Recorder()
    threads.parallel_for(rec, 150, 100)  # less than two grains
    assert rec.calls == [(0, 150, threading.get_ident())]
    rec = Recorder()
    threads.parallel_for(rec, 0, 100)
    assert rec.calls == []


def test_one_thread_runs_inline():
    threads.set_num_threads(1)
    rec = Recorder()
    threads.parallel_for(rec, 10**6, 1)
    assert rec.calls == [(0, 10**6, threading.get_ident())]


def test_gil_free_chunks_fill_a_buffer():
    # memset through ctypes releases the GIL, as compiled kernels do.
    threads.set_num_threads(2)
    memset = ctypes.CDLL(None).memset
    memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    buf = np.zeros(1 << 22, dtype=np.uint8)
    base = buf.ctypes.data
    threads.parallel_for(lambda s, e: memset(base + s, 7, e - s), buf.size, 1 << 16)
    assert (buf == 7).all()


@pytest.mark.parametrize("failing", [{0}, {500}, {0, 500}])
def test_exceptions_propagate_after_all_chunks(failing):
    threads.set_num_threads(2)
    rec = Recorder(sleep_late=0.05, fail=failing)
    with pytest.raises(ValueError, match=f"chunk at {min(failing)}"):
        threads.parallel_for(rec, 1000, 100)
    assert rec.ranges() == [(0, 500), (500, 1000)]  # both ran to the end
    rec = Recorder()
    threads.parallel_for(rec, 1000, 100)  # the pool still works
    assert rec.ranges() == [(0, 500), (500, 1000)]


def test_nested_call_runs_inline():
    threads.set_num_threads(2)
    inner: list[list[tuple[int, int]]] = []

    def outer(start, stop):
        rec = Recorder()
        threads.parallel_for(rec, 1000, 100)
        inner.append(rec.ranges())

    threads.parallel_for(outer, 1000, 100)
    assert inner == [[(0, 500), (500, 1000)]] * 2  # same boundaries, no deadlock


def test_resize_up_and_down():
    for n in (3, 1, 2, 4, 2):
        threads.set_num_threads(n)
        rec = Recorder(sleep=0.002)
        threads.parallel_for(rec, 4000, 1)
        assert rec.ranges() == threads.chunks(4000, 1, n)
        assert len({ident for _, _, ident in rec.calls}) == n


def test_concurrent_callers():
    threads.set_num_threads(2)
    n = 200_000
    results: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def caller(tag: int) -> None:
        try:
            out = np.zeros(n, dtype=np.int64)
            for _ in range(20):
                def fill(start, stop, out=out):
                    out[start:stop] = np.arange(start, stop) * tag
                threads.parallel_for(fill, n, 10_000)
            results[tag] = out
        except BaseException as exc:
            errors.append(exc)

    callers = [threading.Thread(target=caller, args=(tag,)) for tag in range(1, 5)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=30)
    assert not errors and not any(t.is_alive() for t in callers)
    for tag in range(1, 5):
        np.testing.assert_array_equal(results[tag], np.arange(n) * tag)


# --- configuration ----------------------------------------------------------------------


def test_set_num_threads_validates():
    for bad in (0, -2, 1.5, "2", True):
        with pytest.raises(HologramError, match="integer >= 1"):
            threads.set_num_threads(bad)
    threads.set_num_threads(5)
    assert threads.num_threads() == 5


def test_environment_variable(monkeypatch):
    monkeypatch.setenv("HOLOGRAM_NUM_THREADS", "3")
    assert threads.num_threads() == 3
    rec = Recorder()
    threads.parallel_for(rec, 999, 1)
    assert rec.ranges() == [(0, 333), (333, 666), (666, 999)]
    threads.set_num_threads(2)  # an explicit setting wins
    assert threads.num_threads() == 2
    threads.set_num_threads(None)
    monkeypatch.setenv("HOLOGRAM_NUM_THREADS", "0")
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    assert threads.num_threads() == (expected or os.cpu_count())
    monkeypatch.setenv("HOLOGRAM_NUM_THREADS", "-1")
    with pytest.raises(HologramError, match="HOLOGRAM_NUM_THREADS"):
        threads.num_threads()


# --- process life cycle -------------------------------------------------------------------


def test_interpreter_exit_does_not_hang():
    code = (
        "import time\n"
        "from hologram.backends.cpu import threads\n"
        "threads.set_num_threads(2)\n"
        "threads.parallel_for(lambda s, e: time.sleep(0.01), 100, 1)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, timeout=30)
    assert proc.returncode == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_child_can_use_the_pool():
    threads.set_num_threads(2)
    threads.parallel_for(Recorder(), 1000, 1)  # parent has live workers

    def child() -> bool:
        rec = Recorder(sleep=0.005)
        threads.parallel_for(rec, 1000, 100)
        return (rec.ranges() == [(0, 500), (500, 1000)]
                and len({ident for _, _, ident in rec.calls}) == 2)

    assert in_forked_child(child, 20, "parallel_for") == 0


def test_the_public_thread_setting_drives_the_pool(monkeypatch):
    import hologram

    monkeypatch.setenv("HOLOGRAM_NUM_THREADS", "1")
    hologram.set_num_threads(None)
    assert hologram.get_num_threads() == 1
    try:
        hologram.set_num_threads(2)
        assert hologram.get_num_threads() == threads.num_threads() == 2
    finally:
        hologram.set_num_threads(None)
