"""Native worker threads for compiled kernels: a thread pool written in LLVM IR.

Handing a chunk to a Python thread costs tens of microseconds: the worker wakes up
through a lock, takes the GIL, runs bytecode with cold caches, and only then makes its
ctypes call. At 1e6 elements (a ~150 µs kernel on two cores) that is a third of the time.
Here the workers are pthreads created by native code that never touch Python: one ctypes
call (:func:`run`) releases the GIL once, publishes the job, takes chunks itself and spins
until the workers' chunks are done. A hand-off measured ~1 µs.

Protocol:

- A job (kernel, pointer array, ``total``, ``count``, participants, direction) is a set
  of global words under a ``sequence`` number, published like a seqlock: the caller makes
  ``sequence`` odd, writes the words, makes it even (the next job's number); a thread reads
  ``sequence``, the words, ``sequence`` again, and takes the job only if both reads agree
  and are even. Chunk ``i`` is claimed by a compare-and-swap raising ``claims[i]`` from
  below the job's number to it. The caller writes a new job only after every chunk of
  the last one finished (counted in ``finished``), so a thread that read a job and lost
  its core until after the job ended claims nothing: each of that job's chunks already
  holds its number or a later one.
- Who runs which chunk: participant ``p`` (the caller is 0, worker ``w`` is ``w + 1``)
  first takes its *home* run, the ``p``-th of equal runs of chunks, then any chunk left,
  walking each run from the far end. Home runs make a thread touch the same part of a
  same-sized tensor from one call to the next, and calls alternate the direction of the
  walk (ascending, descending), so each call starts on what its thread touched last and
  what is still in that core's L2: a 1e6-element add on 2 cores runs ~20 % faster than
  with chunks taken in one order by whoever is free. Taking what is left keeps the old
  guarantee: a worker that has no core (a loaded machine, more threads than cores)
  delays the call by at most the chunk it is running, and a caller whose workers are
  slow to wake runs their chunks itself.
- Waking: each worker has a cache line with ``gen``, the number of wake-ups posted to it.
  It spins for :data:`SPIN_CYCLES` time-stamp-counter ticks after its last job
  (back-to-back kernels start at once; not at all when there are more threads than
  cores), then sleeps on a futex on ``gen``. Before
  sleeping it sets ``sleeping`` and re-reads ``gen``; the caller increments ``gen`` and
  then reads ``sleeping``. Both sides use sequentially consistent accesses, so at least
  one sees the other: either the worker sees the new job, or the caller wakes it, and
  ``FUTEX_WAIT`` re-checks ``gen`` in the kernel, so a wake-up is never lost.
- In a process that has an OpenMP runtime loaded (PyTorch brings GNU OpenMP's libgomp), a
  job of the main thread runs on that runtime's threads instead: ``GOMP_parallel`` runs
  ``hg_take`` on a team of ``helpers + 1`` threads, each as participant
  ``omp_get_thread_num()`` (the caller is the team's master, 0). Two pools on the same
  cores take turns: after its work each one's threads spin for a while (ours
  :data:`SPIN_CYCLES`, GNU OpenMP's ``GOMP_SPINCOUNT``) on the core the other's thread
  needs. On a 2-core host, a 2-thread 64 x 512 x 256 product took 111 µs right after a
  PyTorch parallel op and 57 right after one of ours, and ``torch.mm`` 127 µs right after
  ours against 53; on OpenMP's threads, 58 and 54. Only the main thread's jobs go there:
  GNU OpenMP gives every thread that starts a parallel region a team of its own, and a
  second team (the autograd engine's device thread runs the hologram device's backward)
  spins beside PyTorch's own just as our workers did (PyTorch's CPU training steps in the
  same process ran 2-2.4x slower); other threads' jobs run on the own workers. The
  runtime is looked up by symbol in the process's global scope when the pool loads and
  when :mod:`hologram_torch` is imported (:func:`share_openmp`); ``HOLOGRAM_SHARE_OPENMP=0``
  keeps every job on the own workers, and so does a ``fork()`` child (GNU OpenMP's
  threads are not in it).
- One caller at a time owns the workers (``busy``, taken with a compare-and-swap). A
  caller that finds them busy runs the same chunks one after another on its own thread:
  same boundaries, same results.
- Chunk boundaries are those of :func:`threads.chunks` (sizes differ by at most one, the
  larger first), computed natively from ``(total, count)``.

Workers only ever run compiled kernels, which cannot raise. At interpreter exit they are
stopped and waited for (their code lives in JIT memory that is freed at shutdown); after
``fork()`` the child forgets them and starts new ones on first use.

Linux on x86-64 only (futex, the time-stamp counter, ``pause``); elsewhere
:func:`available` is False and :mod:`.threads` uses its Python pool.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import platform
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

import llvmlite.binding as binding
from llvmlite import ir

from hologram import config
from hologram._native import forget_pieces
from hologram.backends.cpu import llvm
from hologram.backends.cpu import target as targets
from hologram.backends.cpu.llvm import PROCESS_SYMBOLS
from hologram.config import available_cores as _available_cores
from hologram.errors import DeviceError

__all__ = ["available", "run", "share_openmp", "sharing_openmp", "started"]

MAX_WORKERS = 1024
# Chunks a job shared with the workers may have (threads x CHUNKS_PER_THREAD up to 1024
# threads); a job with more runs on the calling thread alone.
MAX_CHUNKS = 8192
# Ticks a worker keeps spinning after its last chunk before it sleeps (~50-100 µs at the
# usual 2-4 GHz): long enough for back-to-back kernels, short enough that an idle pool
# leaves the cores to other libraries' threads.
SPIN_CYCLES = 200_000

_SYS_FUTEX = 202  # x86-64
_FUTEX_WAIT_PRIVATE = 128
_FUTEX_WAKE_PRIVATE = 129

_I32, _I64 = ir.IntType(32), ir.IntType(64)
_I8P = ir.IntType(8).as_pointer()
_KERNEL_TYPE = ir.FunctionType(ir.VoidType(), [_I8P.as_pointer(), _I64, _I64])
# gen, sleeping, quit, thread id, padding to 64 bytes
_SLOT = ir.LiteralStructType([_I32, _I32, _I32, _I32, _I64, ir.ArrayType(_I64, 6)])
_GEN, _SLEEPING, _QUIT, _, _TID = range(5)
# hg_parallel's arguments, the participants' count and the direction, as globals
_JOB = ("kernel", "pointers", "total", "count", "parts", "reverse")


def _const(ty: ir.IntType, value: int) -> ir.Constant:
    return ir.Constant(ty, value)


class _Module:
    """Builds the pool's LLVM module: globals, the worker loop and the entry points."""

    def __init__(self) -> None:
        m = self.m = ir.Module("hologram_workers")
        m.triple = targets.host().triple
        self.slots = self._global("slots", ir.ArrayType(_SLOT, MAX_WORKERS))
        self.job = {name: self._global(f"job_{name}", _I64) for name in _JOB}
        self.sequence = self._global("sequence", _I64)
        self.claims = self._global("claims", ir.ArrayType(_I64, MAX_CHUNKS))
        self.calls = self._global("calls", _I64)
        self.finished = self._global("finished", _I64)
        self.busy = self._global("busy", _I32)
        self.started = self._global("started", _I32)
        self.spin = self._global("spin", _I64, SPIN_CYCLES)
        # The process's OpenMP runtime, when jobs run on its threads (hg_set_openmp):
        # GOMP_parallel's and omp_get_thread_num's addresses, 0 for the pool's own workers,
        # and the one thread whose jobs go there (its pthread_self()).
        self.omp_parallel = self._global("omp_parallel", _I64)
        self.omp_thread_num = self._global("omp_thread_num", _I64)
        self.omp_master = self._global("omp_master", _I64)
        self.syscall = ir.Function(m, ir.FunctionType(_I64, [_I64], var_arg=True), "syscall")
        thread_fn = ir.FunctionType(_I8P, [_I8P])
        self.pthread_create = ir.Function(m, ir.FunctionType(
            _I32, [_I64.as_pointer(), _I8P, thread_fn.as_pointer(), _I8P]), "pthread_create")
        self.pthread_join = ir.Function(m, ir.FunctionType(_I32, [_I64, _I8P.as_pointer()]),
                                        "pthread_join")
        self.sched_yield = ir.Function(m, ir.FunctionType(_I32, []), "sched_yield")
        self.pthread_self = ir.Function(m, ir.FunctionType(_I64, []), "pthread_self")
        self.pause = ir.Function(m, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
        self.clock = ir.Function(m, ir.FunctionType(_I64, []), "llvm.readcyclecounter")
        self.worker = ir.Function(m, thread_fn, "hg_worker")
        self.take = ir.Function(m, ir.FunctionType(ir.VoidType(), [_I64]), "hg_take")
        self.take.linkage = "internal"
        self._take()
        self._worker()
        self._omp_body()
        self._parallel()
        self._grow()
        self._stop()
        self._forget()
        fn, b = self._function(m, "hg_set_spin", ir.VoidType(), [_I64])
        b.store_atomic(fn.args[0], self.spin, "monotonic", 8)  # read while workers spin
        b.ret_void()
        fn, b = self._function(m, "hg_set_openmp", ir.VoidType(), [_I64, _I64, _I64])
        b.store_atomic(fn.args[1], self.omp_thread_num, "release", 8)
        b.store_atomic(fn.args[2], self.omp_master, "release", 8)
        b.store_atomic(fn.args[0], self.omp_parallel, "release", 8)
        b.ret_void()

    def _global(self, name: str, ty: ir.Type, value: int | None = None) -> ir.GlobalVariable:
        g = ir.GlobalVariable(self.m, ty, f"hg_pool_{name}")
        g.initializer = ir.Constant(ty, value if value is not None else None)
        g.align = 64
        return g

    @staticmethod
    def _function(m: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]):
        fn = ir.Function(m, ir.FunctionType(ret, args), name)
        return fn, ir.IRBuilder(fn.append_basic_block("entry"))

    def _field(self, b: ir.IRBuilder, index: ir.Value, field: int) -> ir.Value:
        return b.gep(self.slots, [_const(_I32, 0), index, _const(_I32, field)], inbounds=True)

    def _futex(self, b: ir.IRBuilder, word: ir.Value, op: int, value: ir.Value) -> None:
        null = ir.Constant(_I64, 0)
        b.call(self.syscall, [_const(_I64, _SYS_FUTEX), b.ptrtoint(word, _I64),
                              _const(_I64, op), value, null, null, null])

    def _spin_until(self, b: ir.IRBuilder, fn: ir.Function, done) -> None:
        """Loop ``pause`` until ``done(b)`` is true, yielding the core after ``spin``
        ticks (a descheduled worker needs it more than the caller)."""
        start = b.call(self.clock, [])
        head, body, out = (fn.append_basic_block(n) for n in ("wait", "wait.body", "waited"))
        b.branch(head)
        b.position_at_end(head)
        b.cbranch(done(b), out, body)
        b.position_at_end(body)
        b.call(self.pause, [])
        elapsed = b.sub(b.call(self.clock, []), start)
        with b.if_then(b.icmp_unsigned(">", elapsed, self._spin_window(b))):
            b.call(self.sched_yield, [])
        b.branch(head)
        b.position_at_end(out)

    def _spin_window(self, b: ir.IRBuilder) -> ir.Value:
        return b.load_atomic(self.spin, "monotonic", 8)  # hg_set_spin may change it

    def _chunk(self, b: ir.IRBuilder, i: ir.Value, total: ir.Value, count: ir.Value):
        """(start, stop) of chunk ``i`` of ``count``: sizes differ by at most one, the
        larger first (the same boundaries as threads.chunks)."""
        base, extra = b.sdiv(total, count), b.srem(total, count)
        start = b.add(b.mul(i, base), b.select(b.icmp_signed("<", i, extra), i, extra))
        size = b.add(base, b.zext(b.icmp_signed("<", i, extra), _I64))
        return start, b.add(start, size)

    def _take(self) -> None:
        """``hg_take(p)``: run unclaimed chunks of the current job as participant ``p``:
        first those of ``p``'s home range, in the job's direction, then any left.

        The job's words are read between two reads of ``sequence`` that must agree (a
        seqlock); chunk ``i`` is claimed by raising ``claims[i]`` from below the job's
        sequence to it with a compare-and-swap. A thread holding a job that has since
        finished claims nothing: every chunk of that job holds its sequence or a later one.
        """
        fn = self.take
        (p,) = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        leave = fn.append_basic_block("leave")
        sequence = b.load_atomic(self.sequence, "acquire", 8)
        writing = b.trunc(sequence, ir.IntType(1))  # odd: a job is being written
        read = fn.append_basic_block("read")
        b.cbranch(writing, leave, read)
        b.position_at_end(read)
        job = {name: b.load_atomic(g, "acquire", 8) for name, g in self.job.items()}
        again = b.load_atomic(self.sequence, "acquire", 8)
        go = fn.append_basic_block("go")
        b.cbranch(b.icmp_unsigned("==", again, sequence), go, leave)
        b.position_at_end(go)
        count, reverse = job["count"], b.trunc(job["reverse"], ir.IntType(1))
        kernel = b.inttoptr(job["kernel"], _KERNEL_TYPE.as_pointer())
        pointers = b.inttoptr(job["pointers"], _I8P.as_pointer())

        def visit(lo: ir.Value, hi: ir.Value, backwards: ir.Value) -> None:
            # for k in range(hi - lo): claim and run chunk (hi - 1 - k if backwards else lo + k)
            with self._for(b, fn, b.sub(hi, lo)) as k:
                i = b.select(backwards, b.sub(b.sub(hi, _const(_I64, 1)), k), b.add(lo, k))
                slot = b.gep(self.claims, [_const(_I32, 0), i], inbounds=True)
                first = b.load_atomic(slot, "monotonic", 8)
                before = b.block
                head, swap, run, next_ = (fn.append_basic_block(n) for n in (
                    "claim", "claim.swap", "claim.run", "claim.next"))
                b.branch(head)
                b.position_at_end(head)
                seen = b.phi(_I64, "seen")
                seen.add_incoming(first, before)
                b.cbranch(b.icmp_unsigned("<", seen, sequence), swap, next_)
                b.position_at_end(swap)
                result = b.cmpxchg(slot, seen, sequence, "acq_rel", "monotonic")
                seen.add_incoming(b.extract_value(result, 0), b.block)  # lost: look again
                b.cbranch(b.extract_value(result, 1), run, head)
                b.position_at_end(run)
                b.call(kernel, [pointers, *self._chunk(b, i, job["total"], count)])
                b.atomic_rmw("add", self.finished, _const(_I64, 1), "release")
                b.branch(next_)
                b.position_at_end(next_)

        # Home: the p-th of `parts` equal runs of chunks (none when p >= parts).
        parts = job["parts"]
        home = b.icmp_signed("<", p, parts)
        lo, hi = self._chunk(b, b.select(home, p, _const(_I64, 0)), count, parts)
        visit(lo, b.select(home, hi, lo), reverse)
        # The rest, against the direction the owners walk: from the far end of each run.
        visit(_const(_I64, 0), count, b.not_(reverse))
        b.branch(leave)
        b.position_at_end(leave)
        b.ret_void()

    def _omp_body(self) -> None:
        """``hg_omp_body(data)``: the function each thread of an OpenMP team runs for a
        job (GOMP_parallel's ``fn``): :func:`_take` as participant ``omp_get_thread_num()``
        (the caller, the team's master, is 0)."""
        fn, b = self._function(self.m, "hg_omp_body", ir.VoidType(), [_I8P])
        fn.linkage = "internal"
        thread_num = b.inttoptr(b.load_atomic(self.omp_thread_num, "acquire", 8),
                                ir.FunctionType(_I32, []).as_pointer())
        b.call(self.take, [b.sext(b.call(thread_num, []), _I64)])
        b.ret_void()
        self.omp_body = fn

    def _worker(self) -> None:
        """``hg_worker(arg)``: arg = slot index | (the slot's gen at creation) << 16."""
        fn = self.worker
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        arg = b.ptrtoint(fn.args[0], _I64)
        index = b.and_(arg, _const(_I64, 0xFFFF))
        first = b.trunc(b.lshr(arg, _const(_I64, 16)), _I32)
        gen, sleeping = self._field(b, index, _GEN), self._field(b, index, _SLEEPING)
        entry = b.block
        wait, spin, sleep, work, run, quit_ = (fn.append_basic_block(n) for n in (
            "wait", "spin", "sleep", "work", "run", "quit"))
        b.branch(wait)

        b.position_at_end(wait)
        seen = b.phi(_I32, "seen")
        seen.add_incoming(first, entry)
        started = b.call(self.clock, [])
        b.branch(spin)

        b.position_at_end(spin)
        now = b.load_atomic(gen, "acquire", 4)
        keep_spinning = fn.append_basic_block("spin.more")
        b.cbranch(b.icmp_unsigned("!=", now, seen), work, keep_spinning)
        b.position_at_end(keep_spinning)
        b.call(self.pause, [])
        elapsed = b.sub(b.call(self.clock, []), started)
        b.cbranch(b.icmp_unsigned("<", elapsed, self._spin_window(b)), spin, sleep)

        b.position_at_end(sleep)
        b.store_atomic(_const(_I32, 1), sleeping, "seq_cst", 4)
        again = b.load_atomic(gen, "seq_cst", 4)
        with b.if_then(b.icmp_unsigned("==", again, seen)):
            self._futex(b, gen, _FUTEX_WAIT_PRIVATE, b.zext(seen, _I64))
        b.store_atomic(_const(_I32, 0), sleeping, "seq_cst", 4)
        seen.add_incoming(seen, b.block)
        b.branch(wait)

        b.position_at_end(work)
        stop = b.load_atomic(self._field(b, index, _QUIT), "acquire", 4)
        b.cbranch(b.icmp_unsigned("!=", stop, _const(_I32, 0)), quit_, run)
        b.position_at_end(run)
        b.call(self.take, [b.add(index, _const(_I64, 1))])  # the caller is participant 0
        seen.add_incoming(now, b.block)
        b.branch(wait)

        b.position_at_end(quit_)
        b.ret(ir.Constant(_I8P, None))

    def _parallel(self) -> None:
        """``hg_parallel(kernel, pointers, total, count, helpers) -> i32``: run ``count``
        chunks of ``range(total)`` here and on up to ``helpers`` workers (no more than
        have started); 1 if workers were asked, 0 if every chunk ran here (nothing to
        share, more than MAX_CHUNKS chunks, or another caller owns the workers). Chunks
        are taken in ascending order on even calls, descending on odd ones."""
        fn, b = self._function(self.m, "hg_parallel", _I32, [_I64] * 5)
        kernel, pointers, total, count, helpers = fn.args
        reverse = b.and_(b.atomic_rmw("add", self.calls, _const(_I64, 1), "monotonic"),
                         _const(_I64, 1))
        omp = b.load_atomic(self.omp_parallel, "acquire", 8)
        master = b.load_atomic(self.omp_master, "acquire", 8)
        on_omp = b.and_(b.icmp_unsigned("!=", omp, _const(_I64, 0)),
                        b.icmp_unsigned("==", b.call(self.pthread_self, []), master))
        # The pool's own workers: no more helpers than have started (OpenMP starts its own)
        started = b.zext(b.load_atomic(self.started, "acquire", 4), _I64)
        started = b.select(on_omp, helpers, started)
        helpers = b.select(b.icmp_signed("<", helpers, started), helpers, started)
        wanted = b.sub(count, _const(_I64, 1))
        helpers = b.select(b.icmp_signed("<", wanted, helpers), wanted, helpers)
        serial_bb, shared_bb = fn.append_basic_block("serial"), fn.append_basic_block("shared")
        share = b.and_(b.icmp_signed(">", helpers, _const(_I64, 0)),
                       b.icmp_signed("<=", count, _const(_I64, MAX_CHUNKS)))
        with b.if_then(share):
            owned = b.extract_value(b.cmpxchg(self.busy, _const(_I32, 0), _const(_I32, 1),
                                              "acquire", "monotonic"), 1)
            b.cbranch(owned, shared_bb, serial_bb)
        b.branch(serial_bb)

        # Serial: every chunk here.
        b.position_at_end(serial_bb)
        call = b.inttoptr(kernel, _KERNEL_TYPE.as_pointer())
        backwards = b.trunc(reverse, ir.IntType(1))
        with self._for(b, fn, count) as k:
            i = b.select(backwards, b.sub(b.sub(count, _const(_I64, 1)), k), k)
            b.call(call, [b.inttoptr(pointers, _I8P.as_pointer()),
                          *self._chunk(b, i, total, count)])
        b.ret(_const(_I32, 0))

        # Shared: publish the job under the next sequence number (odd while its words are
        # written), wake the helpers, take chunks here too, wait for the ones workers took.
        b.position_at_end(shared_bb)
        sequence = b.load_atomic(self.sequence, "monotonic", 8)  # only the owner writes it
        b.store_atomic(b.add(sequence, _const(_I64, 1)), self.sequence, "seq_cst", 8)
        job = dict(zip(_JOB, (kernel, pointers, total, count,
                              b.add(helpers, _const(_I64, 1)), reverse)))
        for name, value in job.items():
            # release: a thread that reads the new word also sees the odd sequence
            b.store_atomic(value, self.job[name], "release", 8)
        b.store_atomic(_const(_I64, 0), self.finished, "release", 8)
        b.store_atomic(b.add(sequence, _const(_I64, 2)), self.sequence, "release", 8)
        own_bb, omp_bb = fn.append_basic_block("own"), fn.append_basic_block("openmp")
        b.cbranch(on_omp, omp_bb, own_bb)
        # On OpenMP's threads: GOMP_parallel returns when every thread of the team has
        # left hg_omp_body, so every chunk has been claimed and has run.
        b.position_at_end(omp_bb)
        parallel_type = ir.FunctionType(ir.VoidType(), [
            self.omp_body.type, _I8P, _I32, _I32])
        b.call(b.inttoptr(omp, parallel_type.as_pointer()), [
            self.omp_body, ir.Constant(_I8P, None),
            b.trunc(b.add(helpers, _const(_I64, 1)), _I32), _const(_I32, 0)])
        b.store_atomic(_const(_I32, 0), self.busy, "release", 4)
        b.ret(_const(_I32, 1))
        b.position_at_end(own_bb)
        with self._for(b, fn, helpers) as w:
            gen = self._field(b, w, _GEN)
            b.atomic_rmw("add", gen, _const(_I32, 1), "seq_cst")
            asleep = b.load_atomic(self._field(b, w, _SLEEPING), "seq_cst", 4)
            with b.if_then(b.icmp_unsigned("!=", asleep, _const(_I32, 0))):
                self._futex(b, gen, _FUTEX_WAKE_PRIVATE, _const(_I64, 1))
        b.call(self.take, [_const(_I64, 0)])
        self._spin_until(b, fn, lambda b: b.icmp_signed(
            ">=", b.load_atomic(self.finished, "acquire", 8), count))
        b.store_atomic(_const(_I32, 0), self.busy, "release", 4)
        b.ret(_const(_I32, 1))

    def _grow(self) -> None:
        """``hg_grow(n) -> i32``: start workers until there are ``n``; 0, or the
        pthread_create error. Callers serialize (the Python side holds a lock)."""
        fn, b = self._function(self.m, "hg_grow", _I32, [_I32])
        head, body, done = (fn.append_basic_block(n) for n in ("head", "body", "done"))
        b.branch(head)
        b.position_at_end(head)
        have = b.load_atomic(self.started, "acquire", 4)
        b.cbranch(b.icmp_signed("<", have, fn.args[0]), body, done)
        b.position_at_end(body)
        index = b.zext(have, _I64)
        first = b.zext(b.load_atomic(self._field(b, index, _GEN), "acquire", 4), _I64)
        arg = b.inttoptr(b.or_(index, b.shl(first, _const(_I64, 16))), _I8P)
        b.store_atomic(_const(_I32, 0), self._field(b, index, _QUIT), "release", 4)
        tid = self._field(b, index, _TID)
        error = b.call(self.pthread_create, [tid, ir.Constant(_I8P, None), self.worker, arg])
        with b.if_then(b.icmp_signed("!=", error, _const(_I32, 0))):
            b.ret(error)
        b.store_atomic(b.add(have, _const(_I32, 1)), self.started, "release", 4)
        b.branch(head)
        b.position_at_end(done)
        b.ret(_const(_I32, 0))

    def _stop(self) -> None:
        """``hg_stop()``: wait for the workers to be free, ask each to quit and join it
        (joined threads have left the JIT code for good). The pool can grow again."""
        fn, b = self._function(self.m, "hg_stop", ir.VoidType(), [])
        self._spin_until(b, fn, lambda b: b.extract_value(b.cmpxchg(
            self.busy, _const(_I32, 0), _const(_I32, 1), "acquire", "monotonic"), 1))
        count = b.zext(b.load_atomic(self.started, "acquire", 4), _I64)
        with self._for(b, fn, count) as w:
            b.store_atomic(_const(_I32, 1), self._field(b, w, _QUIT), "release", 4)
            gen = self._field(b, w, _GEN)
            b.atomic_rmw("add", gen, _const(_I32, 1), "seq_cst")
            self._futex(b, gen, _FUTEX_WAKE_PRIVATE, _const(_I64, 1))
        with self._for(b, fn, count) as w:
            b.call(self.pthread_join, [b.load(self._field(b, w, _TID)),
                                       ir.Constant(_I8P.as_pointer(), None)])
        b.store_atomic(_const(_I32, 0), self.started, "release", 4)
        b.store_atomic(_const(_I32, 0), self.busy, "release", 4)
        b.ret_void()

    def _forget(self) -> None:
        """``hg_forget()``: in a forked child, where the parent's workers do not exist."""
        fn, b = self._function(self.m, "hg_forget", ir.VoidType(), [])
        for g in (self.started, self.busy):
            b.store(_const(_I32, 0), g)
        with self._for(b, fn, _const(_I64, MAX_WORKERS)) as w:
            b.store(_const(_I32, 0), self._field(b, w, _SLEEPING))
        b.ret_void()

    @staticmethod
    @contextmanager
    def _for(b: ir.IRBuilder, fn: ir.Function, n: ir.Value) -> Iterator[ir.Value]:
        """``for i in range(n)`` around the block of the ``with`` statement."""
        before = b.block
        head, body, done = (fn.append_basic_block(x) for x in ("for", "for.body", "for.done"))
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(_I64, "i")
        i.add_incoming(_const(_I64, 0), before)
        b.cbranch(b.icmp_signed("<", i, n), body, done)
        b.position_at_end(body)
        yield i
        i.add_incoming(b.add(i, _const(_I64, 1)), b.block)
        b.branch(head)
        b.position_at_end(done)


@cache
def available() -> bool:
    """Can this host run the native pool (Linux on x86-64, with its C library's threads)?"""
    return sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")


_lock = threading.Lock()  # serializes hg_grow and the first load
# The pool is compiled at LLVM's quick tier: ~9 ms instead of ~65 ms at the full one in a
# process without the disk cache's copy (a cold first training step), and its calls were
# as fast (a 2-thread add of 1e5 floats: 6.0-6.5 us either way). Its IR has no flag that
# could make the tiers differ (llvm.same_bits_at_every_tier), nor any float arithmetic.
POOL_TIER = "quick"
_LIBC = ("syscall", "pthread_create", "pthread_join", "sched_yield", "pthread_self")


@cache
def _entry_points() -> dict[str, int]:
    if not available():
        raise DeviceError("the native worker pool needs Linux on x86-64")
    libc = ctypes.CDLL(None)
    for name in _LIBC:
        binding.add_symbol(name, ctypes.cast(getattr(libc, name), ctypes.c_void_p).value)
    names = ["hg_parallel", "hg_grow", "hg_stop", "hg_forget", "hg_set_spin", "hg_set_openmp"]
    # Host code, whatever HOLOGRAM_CPU_TARGET says: the pool only ever runs here.
    host, needs = targets.host(), PROCESS_SYMBOLS.union(_LIBC)
    obj = llvm.compile_ir(str(_Module().m), host, allowed=needs, tier=POOL_TIER)
    return llvm.load_object(obj, names, allowed=needs, target=host)


class _Native:
    """The loaded pool's entry points as ctypes functions."""

    def __init__(self) -> None:
        a = _entry_points()
        i64 = ctypes.c_int64
        self.parallel = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p,
                                         i64, i64, i64)(a["hg_parallel"])
        self.grow = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32)(a["hg_grow"])
        self.stop = ctypes.CFUNCTYPE(None)(a["hg_stop"])
        self.forget = ctypes.CFUNCTYPE(None)(a["hg_forget"])
        self.set_spin = ctypes.CFUNCTYPE(None, i64)(a["hg_set_spin"])
        self.set_openmp = ctypes.CFUNCTYPE(None, i64, i64, i64)(a["hg_set_openmp"])
        self.openmp = False  # jobs run on the process's OpenMP threads
        self.started = 0  # workers known to run (a mirror of hg_pool_started)
        self.helpers = 0  # the helper count the spin window was set for


_native: _Native | None = None


def _load() -> _Native:
    global _native
    with _lock:
        if _native is None:
            native = _Native()
            _use_openmp(native)
            _native = native
            atexit.register(_shutdown)
    return _native


def _openmp_runtime() -> tuple[int, int] | None:
    """``(GOMP_parallel, omp_get_thread_num)`` of the OpenMP runtime in the process's
    global symbol scope (PyTorch's libgomp once torch is imported), or None."""
    process = ctypes.CDLL(None)
    try:
        parallel, thread_num = (process.GOMP_parallel, process.omp_get_thread_num)
    except AttributeError:
        return None
    return tuple(ctypes.cast(f, ctypes.c_void_p).value for f in (parallel, thread_num))


def _use_openmp(native: _Native) -> None:
    found = None
    if config.get().share_openmp and not _forked:
        found = _openmp_runtime()
    if native.openmp != (found is not None):
        # Own workers may have to start now: the next prepare() resizes, and native
        # launchers ask threads.native_pieces (which calls it) again.
        native.helpers = -1
        forget_pieces()
    native.openmp = found is not None
    native.set_openmp(*(found or (0, 0)), threading.main_thread().ident or 0)


def share_openmp() -> bool:
    """Look again for the process's OpenMP runtime (one loaded since the pool was, or
    ``HOLOGRAM_SHARE_OPENMP`` changed): True when jobs now run on its threads. The pool
    looks when it loads; :mod:`hologram_torch` calls this on import (PyTorch brings
    one); a pool not loaded yet is left to look then."""
    if _native is None:
        return False
    with _lock:
        _use_openmp(_native)
    return _native.openmp


def sharing_openmp() -> bool:
    """Do the main thread's jobs run on the process's OpenMP threads now?"""
    return _native is not None and _native.openmp


def run(kernel: int, pointers: ctypes.Array, total: int, count: int, helpers: int) -> None:
    """Run ``kernel(pointers, start, stop)`` on the ``count`` chunks of ``range(total)``
    (see :func:`threads.chunks`), on this thread and up to ``helpers`` native workers
    (started on first need)."""
    prepare(helpers).parallel(kernel, pointers, total, count, helpers)


def prepare(helpers: int) -> _Native:
    """The pool, ready to run calls with ``helpers`` workers (started on first need)."""
    native = _native or _load()
    if helpers != native.helpers:
        _resize(native, helpers)
    return native


def parallel_address() -> int:
    """The address of ``hg_parallel(kernel, pointers, total, count, helpers)``, which
    :func:`run` calls (native launchers call it directly, after :func:`prepare`)."""
    return _entry_points()["hg_parallel"]


def _resize(native: _Native, helpers: int) -> None:
    if helpers > native.started:  # for other threads' jobs too when the main's go to OpenMP
        _grow(native, helpers)
    # With more threads than cores a spinning worker takes the core another one needs:
    # sleep at once (a wake-up then costs a futex call).
    native.set_spin(SPIN_CYCLES if helpers < _available_cores() else 0)
    native.helpers = helpers


def _grow(native: _Native, n: int) -> None:
    """Start workers until ``n`` run (a DeviceError if the system refuses a thread)."""
    n = min(n, MAX_WORKERS)  # hg_parallel asks no more workers than have started
    with _lock:
        error = native.grow(n)
        if error:
            raise DeviceError(f"could not start CPU worker thread {native.started + 1} "
                              f"(pthread_create: {os.strerror(error)}); use fewer threads "
                              "with hologram.set_num_threads(n)")
        native.started = n


def started() -> int:
    """Native workers running now (0 before first use)."""
    return _native.started if _native is not None else 0


def _shutdown() -> None:
    # Workers spin in JIT-compiled code, which is freed when the interpreter tears its
    # modules down: stop them first.
    if _native is not None:
        _native.stop()
        _native.started = _native.helpers = 0
        forget_pieces()  # native launchers would split over the stopped pool


_forked = False  # this process is a fork() child


def _after_fork_in_child() -> None:
    # The parent's OpenMP threads are not in the child, and GNU OpenMP's state from a
    # parent that used them is not safe to use after fork(): a child runs jobs on workers
    # of its own, whether or not the parent had loaded the pool.
    global _forked
    _forked = True
    if _native is not None:
        _use_openmp(_native)
        _native.forget()
        _native.started = _native.helpers = 0
        forget_pieces()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
