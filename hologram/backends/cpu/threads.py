"""Running compiled kernels on several cores.

:func:`run_kernel` runs a compiled kernel over the chunks of its first grid dimension: on
the native worker pool (:mod:`.workers`) where the host has one, else through
:func:`parallel_for`.

:func:`parallel_for` is the portable pool: compiled kernels are called through ctypes,
which releases the GIL, so plain Python threads run them in parallel. It splits
``range(total)`` into contiguous chunks (:func:`chunks`), runs the first chunk on the
calling thread and hands the others to persistent daemon workers.

What is promised:

- Chunk boundaries depend only on ``(total, grain, num_threads())``, never on timing or
  on whether the pool was busy, so reductions that combine per-chunk partials are
  reproducible bit for bit.
- Work smaller than two grains runs inline on the calling thread: no lock, no handoff.
- ``parallel_for`` never returns or raises while a chunk is still running. When chunks
  raise, it re-raises the exception of the lowest-numbered failing chunk once all started
  chunks have finished (chunks run inline stop at the first failure). The pool keeps
  working afterwards.
- Concurrent callers: one caller at a time owns the pool. A caller that finds it busy
  (another Python thread, or a nested call from inside a chunk) runs the same chunks in
  order on its own thread instead of waiting, which cannot deadlock and keeps results
  identical.
- Workers are daemon threads, so they never hold up interpreter exit. After ``os.fork()``
  the child starts with an empty pool and creates workers on first use.

Handoff uses a pair of raw locks per worker as binary semaphores: a round trip measured
about 9 µs, against 12-17 µs for ``Event``, ``Semaphore`` or ``Condition``, which add
Python-level bookkeeping on every signal.
"""

from __future__ import annotations

import _thread
import ctypes
import os
import threading
from collections.abc import Callable

from hologram import config
from hologram._native import chunk_count as _chunk_count
from hologram._native import forget_pieces, set_parallel
from hologram.backends.cpu import workers
from hologram.config import available_cores as _available_cores
from hologram.errors import HologramError

__all__ = ["chunk_count", "chunks", "min_chunk_work", "num_threads", "parallel_for", "run_kernel",
           "set_num_threads"]

_override: int | None = None  # set_num_threads value; None follows the environment


def num_threads() -> int:
    """Threads :func:`parallel_for` uses, the calling thread included: the value given to
    :func:`set_num_threads`, else ``HOLOGRAM_NUM_THREADS`` when it is not 0, else every core
    available to this process."""
    if _override is not None:
        return _override
    configured = config.num_threads()
    return configured if configured > 0 else _available_cores()


def set_num_threads(n: int | None) -> None:
    """Use ``n`` threads (``n >= 1``) from now on; ``None`` goes back to the environment
    default. The pool grows or shrinks on the next :func:`parallel_for`, not here."""
    global _override
    forget_pieces()  # native launchers split by the thread count they last learnt
    if n is None:
        _override = None
        return
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise HologramError(
            f"set_num_threads({n!r}): expected an integer >= 1 (1 runs everything on the "
            f"calling thread; None returns to HOLOGRAM_NUM_THREADS or all cores)"
        )
    _override = n


def chunks(total: int, grain: int, threads: int, per_thread: int = 1) -> list[tuple[int, int]]:
    """Split ``range(total)`` into contiguous ``(start, stop)`` pieces, in order.

    There are :func:`chunk_count` pieces; their sizes differ by at most one, the larger ones
    first, so each has at least ``grain`` items unless ``total < grain``. A pure function
    of its arguments. ``grain < 1`` counts as 1 and ``threads < 1`` as 1.
    """
    count = chunk_count(total, grain, threads, per_thread)
    base, extra = divmod(total, max(count, 1))
    out = []
    start = 0
    for i in range(count):
        stop = start + base + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def chunk_count(total: int, grain: int, threads: int, per_thread: int = 1) -> int:
    """How many pieces :func:`chunks` makes: ``total // grain`` when that is fewer than
    ``threads`` (at least one when ``total > 0``, none when it is 0), else a multiple of
    ``threads``, up to ``per_thread`` pieces each, so that threads that run equally fast
    finish together."""
    if total < 0:
        raise HologramError(f"chunks: total={total} must be >= 0")
    # The rule is native code's (hologram/csrc/launcher.c), which launches split kernels
    # by it without asking Python.
    return _chunk_count(total, grain, threads, per_thread)


class _Worker:
    """One daemon thread waiting on ``_start``; the caller waits on ``_done``.

    Both locks are created held and used as binary semaphores: ``release`` signals, the
    other side's ``acquire`` waits. ``job`` is written only while the worker is idle.
    """

    def __init__(self, index: int):
        self.job: tuple[Callable[[int, int], None], int, int] | None = None
        self.error: BaseException | None = None
        self._start = _thread.allocate_lock()
        self._start.acquire()
        self._done = _thread.allocate_lock()
        self._done.acquire()
        self.thread = threading.Thread(
            target=self._loop, name=f"hologram-cpu-{index}", daemon=True
        )
        self.thread.start()

    def _loop(self) -> None:
        while True:
            self._start.acquire()
            job = self.job
            if job is None:  # stop request
                return
            fn, start, stop = job
            try:
                fn(start, stop)
            except BaseException as exc:  # handed to the caller, who re-raises it
                self.error = exc
            # Drop references before signalling so the caller may free what fn used.
            job = fn = None
            self.job = None
            self._done.release()

    def submit(self, fn: Callable[[int, int], None], start: int, stop: int) -> None:
        self.job = (fn, start, stop)
        self._start.release()

    def wait(self) -> BaseException | None:
        """Block until the submitted job finished; return what it raised, if anything."""
        self._done.acquire()
        error, self.error = self.error, None
        return error

    def stop(self) -> None:
        self.job = None
        self._start.release()


class _Pool:
    def __init__(self) -> None:
        self.lock = _thread.allocate_lock()  # held by the caller that owns the workers
        self.workers: list[_Worker] = []

    def resize(self, count: int) -> None:
        """Keep exactly ``count`` workers (caller holds ``lock``)."""
        while len(self.workers) > count:
            self.workers.pop().stop()
        while len(self.workers) < count:
            self.workers.append(_Worker(len(self.workers) + 1))

    def run(self, fn: Callable[[int, int], None], pieces: list[tuple[int, int]]) -> None:
        """Run ``pieces[0]`` here and the rest on workers (caller holds ``lock`` and has
        made sure there are at least ``len(pieces) - 1`` workers)."""
        submitted: list[_Worker] = []
        errors: list[BaseException | None] = [None] * len(pieces)
        try:
            for worker, (start, stop) in zip(self.workers, pieces[1:]):
                worker.submit(fn, start, stop)
                submitted.append(worker)
            fn(*pieces[0])
        except BaseException as exc:  # from fn, or an interrupt while submitting
            errors[0] = exc
        interrupt: BaseException | None = None
        for i, worker in enumerate(submitted, start=1):
            # Never leave while a worker may still touch the caller's buffers: an
            # interrupt (Ctrl-C) while waiting is kept and raised after all are done.
            while True:
                try:
                    errors[i] = worker.wait()
                    break
                except BaseException as exc:
                    interrupt = interrupt or exc
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        if interrupt is not None:
            raise interrupt


_pool = _Pool()


def _after_fork_in_child() -> None:
    # The child has only the forking thread: the parent's workers do not exist here and
    # the pool lock may have been held by another thread. Start over; workers come back
    # on first use.
    global _pool
    _pool = _Pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def parallel_for(fn: Callable[[int, int], None], total: int, grain: int) -> None:
    """Call ``fn(start, stop)`` once for each piece of ``chunks(total, grain,
    num_threads())``, the first on this thread and the others on pool workers, and return
    when all are done. Re-raises the exception of the lowest-numbered failing piece after
    every started piece finished. If the pool is busy (another thread's call, or a call
    nested in ``fn``), the pieces run one after another on this thread, with the same
    boundaries, stopping at the first failure.
    """
    if total < 2 * grain:  # one piece: no need to even read the thread count
        if total > 0:
            fn(0, total)
        elif total < 0:
            raise HologramError(f"parallel_for: total={total} must be >= 0")
        return
    threads = num_threads()
    pieces = chunks(total, grain, threads)
    pool = _pool
    if len(pieces) == 1 or not pool.lock.acquire(blocking=False):
        for start, stop in pieces:  # stops at the first failure, which is the lowest
            fn(start, stop)
        return
    try:
        if len(pool.workers) != threads - 1:
            pool.resize(threads - 1)
        pool.run(fn, pieces)
    finally:
        pool.lock.release()


# Pieces per thread on native workers: a thread that finishes its own pieces takes the
# others' that are left, so one that loses its core (a loaded machine) delays the call by
# one piece, not by its share.
CHUNKS_PER_THREAD = 8

_NATIVE = workers.available()  # tests switch the native pool off here
_KERNEL = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
_functions: dict[int, ctypes._CFuncPtr] = {}  # kernel address -> ctypes function


def min_chunk_work() -> int:
    """Work (grid points x loop iterations) below which a piece is not worth another
    thread: ~33k element operations with native workers (a hand-off costs ~1 µs), ~131k
    with Python ones (10-30 µs)."""
    return 1 << 15 if _NATIVE else 1 << 17


def _pieces(total: int, grain: int, n: int) -> tuple[int, int]:
    """(chunk count, helper workers) of a call on native workers: ``CHUNKS_PER_THREAD``
    pieces per thread where the work allows (:func:`chunk_count`; one for no rows)."""
    return (_chunk_count(total, grain, n, CHUNKS_PER_THREAD) if total > 0 else 1), n - 1


def native_pieces(total: int, grain: int) -> tuple[int, int, int] | None:
    """How native code runs :func:`run_kernel`'s call itself: ``(hg_parallel's address,
    chunk count, helper workers)``, the pool sized for it; None without native workers
    (then the call goes through :func:`run_kernel`)."""
    if not _NATIVE:
        return None
    count, helpers = _pieces(total, grain, num_threads())
    workers.prepare(helpers)
    return workers.parallel_address(), count, helpers


set_parallel(native_pieces, *config.num_threads_source(), CHUNKS_PER_THREAD)


def use_native_workers(use: bool) -> None:
    """Run split kernels on the native worker pool (the default where it is
    :func:`workers.available`) or, ``False``, on Python threads (tests)."""
    global _NATIVE
    _NATIVE = use and workers.available()
    forget_pieces()


def run_kernel(kernel: int, pointers: ctypes.Array, total: int, grain: int) -> None:
    """Call the compiled kernel at address ``kernel`` as ``kernel(pointers, start, stop)``
    on the pieces of ``range(total)`` (``grain >= 1``) and return when all are done: on
    native workers, ``CHUNKS_PER_THREAD`` pieces per thread (see :mod:`.workers`), where
    :func:`workers.available`; else the pieces of ``chunks(total, grain, num_threads())``
    through :func:`parallel_for`. Which thread runs a piece never changes its result."""
    if _NATIVE:
        if total > 0:
            workers.run(kernel, pointers, total, *_pieces(total, grain, num_threads()))
        return
    fn = _functions.get(kernel)
    if fn is None:
        fn = _functions[kernel] = _KERNEL(kernel)
    parallel_for(lambda start, stop: fn(pointers, start, stop), total, grain)
