"""The native worker pool (hologram/backends/cpu/workers.py): chunk boundaries, real
parallelism, concurrent callers, growth, the Python fallback, interpreter exit and fork.

The kernels here are small LLVM functions with the compiled-kernel signature
``void(i8** pointers, i64 start, i64 stop)``."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from llvmlite import ir
from util import in_forked_child, run_fresh

from hologram.backends.cpu import llvm, threads, workers

pytestmark = [pytest.mark.skipif(not workers.available(), reason="native pool: Linux x86-64"),
              pytest.mark.usefixtures("default_threads")]

I64 = ir.IntType(64)
I8PP = ir.IntType(8).as_pointer().as_pointer()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _compile(name: str, emit) -> int:
    """Address of ``name``: ``emit(builder, array, start, stop)`` fills its body, where
    ``array(k)`` is pointer ``k`` as an ``i64*``."""
    module = ir.Module(name)
    module.triple = llvm.host_cpu()[0]
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I8PP, I64, I64]), name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def array(k: int) -> ir.Value:
        return b.bitcast(b.load(b.gep(fn.args[0], [ir.Constant(I64, k)])), I64.as_pointer())

    emit(b, array, fn.args[1], fn.args[2])
    b.ret_void()
    needs = llvm.PROCESS_SYMBOLS | {"syscall"}  # futex calls
    return llvm.load_object(llvm.compile_ir(str(module), allowed=needs), [name],
                            allowed=needs)[name]


def _each(b, start, stop, emit) -> None:
    """``for i in [start, stop): emit(i)``."""
    fn, before = b.function, b.block
    head, body, done = (fn.append_basic_block(n) for n in ("head", "body", "done"))
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64)
    i.add_incoming(start, before)
    b.cbranch(b.icmp_signed("<", i, stop), body, done)
    b.position_at_end(body)
    emit(i)
    i.add_incoming(b.add(i, ir.Constant(I64, 1)), b.block)
    b.branch(head)
    b.position_at_end(done)


def _mark(b, array, start, stop):
    """out[i] = start for i in [start, stop): which chunk wrote each element."""
    out = array(0)
    _each(b, start, stop, lambda i: b.store(start, b.gep(out, [i])))


def _count(b, array, start, stop):
    """out[i] += 1 (atomically) for i in [start, stop): how often each element was run."""
    out = array(0)
    _each(b, start, stop, lambda i: b.atomic_rmw("add", b.gep(out, [i]), ir.Constant(I64, 1),
                                                 "monotonic"))


def _wait_until(b, counter, want) -> ir.Value:
    """Poll ``counter`` until it reaches ``want`` or ~2^28 polls passed; what was seen."""
    polls = b.alloca(I64)
    b.store(ir.Constant(I64, 0), polls)
    fn = b.function
    head, body, done = (fn.append_basic_block(n) for n in ("head", "body", "done"))
    b.branch(head)
    b.position_at_end(head)
    seen = b.load_atomic(counter, "seq_cst", 8)
    more = b.and_(b.icmp_signed("<", seen, want),
                  b.icmp_signed("<", b.load(polls), ir.Constant(I64, 1 << 28)))
    b.cbranch(more, body, done)
    b.position_at_end(body)
    b.store(b.add(b.load(polls), ir.Constant(I64, 1)), polls)
    b.branch(head)
    b.position_at_end(done)
    return seen


def _meet(b, array, start, stop):
    """A barrier with a time limit: count[0] += 1, then wait until count[0] reaches
    count[1]; out[start] = what was seen. Chunks that run one after another see 1, 2,
    ...; chunks that run at the same time all see count[1]."""
    count, out = array(0), array(1)
    b.atomic_rmw("add", count, ir.Constant(I64, 1), "seq_cst")
    want = b.load(b.gep(count, [ir.Constant(I64, 1)]))
    b.store(_wait_until(b, count, want), b.gep(out, [start]))


def _arrive(b, array, start, stop):
    """order[start] = how many chunks started before this one, tid[start] = the thread
    that runs it; the first state[1] chunks to start wait (with a time limit) until that
    many have: each thread's first chunk starts before anyone's second."""
    state, order, tid = array(0), array(1), array(2)
    syscall = b.module.globals.get("syscall") or ir.Function(
        b.module, ir.FunctionType(I64, [I64], var_arg=True), "syscall")
    seen = b.atomic_rmw("add", state, ir.Constant(I64, 1), "seq_cst")
    b.store(seen, b.gep(order, [start]))
    b.store(b.call(syscall, [ir.Constant(I64, 186)]), b.gep(tid, [start]))  # gettid
    want = b.load(b.gep(state, [ir.Constant(I64, 1)]))
    with b.if_then(b.icmp_signed("<", seen, want)):
        _wait_until(b, state, want)


@pytest.fixture(params=["own", "openmp"])
def pool(request, monkeypatch) -> str:
    """Jobs on the pool's own workers, or on the threads of the process's OpenMP runtime
    (PyTorch's libgomp, which importing torch loads)."""
    if request.param == "openmp":
        pytest.importorskip("torch")
        # Only the main thread's jobs go to OpenMP (pytest runs tests on it).
        assert threading.current_thread() is threading.main_thread()
    else:
        monkeypatch.setenv("HOLOGRAM_SHARE_OPENMP", "0")
    workers.prepare(0)  # loaded
    assert workers.share_openmp() == (request.param == "openmp")
    yield request.param
    monkeypatch.undo()
    workers.share_openmp()


@pytest.fixture(scope="module")
def mark() -> int:
    return _compile("test_workers_mark", _mark)


@pytest.fixture(scope="module")
def count() -> int:
    return _compile("test_workers_count", _count)


@pytest.fixture(scope="module")
def meet() -> int:
    return _compile("test_workers_meet", _meet)


@pytest.fixture(scope="module")
def arrive() -> int:
    workers.run(_compile("test_workers_warm", _mark), _pointers(np.zeros(1, np.int64)), 1,
                1, 0)  # loads the pool, which makes `syscall` known to the JIT linker
    return _compile("test_workers_arrive", _arrive)


def _pointers(*arrays: np.ndarray) -> ctypes.Array:
    return (ctypes.c_void_p * len(arrays))(*(a.ctypes.data for a in arrays))


def _expected(total: int, grain: int, n: int,
              per_thread: int = threads.CHUNKS_PER_THREAD) -> np.ndarray:
    want = np.empty(total, np.int64)
    for start, stop in threads.chunks(total, grain, n, per_thread):
        want[start:stop] = start
    return want


class _OneSplitStep:
    """An executable whose plan is one call of ``kernel`` split over the pool, for
    ``hologram._native.Launcher``; a launch through Python records its handles."""

    def __init__(self, kernel: int, rows: int, grain: int) -> None:
        self.plan = (1, (0,), ((kernel, rows, grain),))
        self.launched: list[tuple] = []

    def native_plan(self):
        return self.plan

    def launch(self, handles) -> None:
        self.launched.append(handles)


def test_native_launchers_follow_every_change_of_the_thread_count(mark, monkeypatch):
    """Launchers split steps in C by the thread count they last learnt from
    threads.native_pieces: a new HOLOGRAM_NUM_THREADS value, set_num_threads and the pool
    switched off must each reach them."""
    from hologram._native import Launcher

    total, grain = 10_007, 64
    exe = _OneSplitStep(mark, total, grain)
    launch = Launcher(exe)

    def chunked_as(n: int) -> None:
        out = np.full(total, -1, np.int64)
        launch((out.ctypes.data,))
        np.testing.assert_array_equal(out, _expected(total, grain, n))

    threads.set_num_threads(None)
    try:
        for n in (1, 3, 3, 2):  # a new value each time, the same number included
            monkeypatch.setenv("HOLOGRAM_NUM_THREADS", str(n))
            chunked_as(n)
            chunked_as(n)
        threads.set_num_threads(4)
        chunked_as(4)
        threads.set_num_threads(None)
        chunked_as(2)
        monkeypatch.delenv("HOLOGRAM_NUM_THREADS")
        chunked_as(threads.num_threads())
        assert not exe.launched
        threads.use_native_workers(False)
        launch((12345,))
        assert exe.launched == [(12345,)]
    finally:
        threads.use_native_workers(True)
        threads.set_num_threads(None)


@pytest.mark.parametrize("total", [1, 2, 7, 100, 1001, 65_537])
@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_chunks_match_the_python_pool(pool, mark, total, n):
    threads.set_num_threads(n)
    out = np.full(total, -1, np.int64)
    threads.run_kernel(mark, _pointers(out), total, 1)
    np.testing.assert_array_equal(out, _expected(total, 1, n))


def test_grain_limits_the_pieces(pool, mark):
    threads.set_num_threads(8)
    out = np.full(1000, -1, np.int64)
    threads.run_kernel(mark, _pointers(out), 1000, 300)  # 3 pieces, not 8
    np.testing.assert_array_equal(out, _expected(1000, 300, 8))
    assert len(np.unique(out)) == 3
    threads.set_num_threads(2)
    threads.run_kernel(mark, _pointers(out), 1000, 10)  # 2 threads x CHUNKS_PER_THREAD
    np.testing.assert_array_equal(out, _expected(1000, 10, 2))
    assert len(np.unique(out)) == 2 * threads.CHUNKS_PER_THREAD


def test_zero_work_runs_nothing(mark):
    out = np.full(4, -1, np.int64)
    threads.run_kernel(mark, _pointers(out), 0, 1)
    assert (out == -1).all()


@pytest.mark.parametrize("n", [2, 4])
def test_chunks_run_at_the_same_time(pool, meet, n):
    threads.set_num_threads(n)
    count = np.array([0, n], np.int64)
    out = np.zeros(n, np.int64)
    threads.run_kernel(meet, _pointers(count, out), n, 1)
    assert out.tolist() == [n] * n
    if pool == "own":
        assert workers.started() >= n - 1


def test_back_to_back_jobs_run_every_element_once(pool, count):
    # Jobs of different sizes and chunk counts on different buffers, one right after the
    # other, with more threads than cores (workers get descheduled mid-claim): a claim
    # that straddled two jobs would run an element twice, or one job's chunk on the
    # other's buffer. A stress test of the protocol; its narrowest windows are a few
    # instructions wide, so passing is evidence, not proof.
    threads.set_num_threads(4)
    outs = [np.zeros(n, np.int64) for n in (10_007, 3, 4096, 65_537, 129)]
    for rounds in range(1, 301):
        for out in outs:
            threads.run_kernel(count, _pointers(out), out.size, 1 + rounds % 7)
    for out in outs:
        assert (out == 300).all()


def _arrivals(arrive, chunks: int, waiters: int) -> tuple[np.ndarray, np.ndarray]:
    """(start order, thread id) of each of ``chunks`` one-element chunks."""
    state = np.array([0, waiters], np.int64)
    order, tid = np.full(chunks, -1, np.int64), np.zeros(chunks, np.int64)
    threads.run_kernel(arrive, _pointers(state, order, tid), chunks, 1)
    return order, tid


def test_one_thread_alternates_the_direction_of_its_chunks(arrive):
    threads.set_num_threads(1)
    orders = [_arrivals(arrive, threads.CHUNKS_PER_THREAD, 0)[0] for _ in range(3)]
    up = list(range(threads.CHUNKS_PER_THREAD))
    assert sorted([orders[0].tolist(), orders[1].tolist()]) == [up, up[::-1]]
    assert orders[2].tolist() == orders[0].tolist()


def test_each_thread_starts_on_its_home_run_in_the_direction_of_the_call(pool, arrive):
    # 2 threads, 8 chunks each: the caller's home run is chunks 0-7, the worker's 8-15.
    # Each starts at the near end of its run in the call's direction (the first two
    # chunks to start wait for each other, so neither thread can take both), and
    # consecutive calls alternate the direction.
    threads.set_num_threads(2)
    per = threads.CHUNKS_PER_THREAD
    caller = threading.get_native_id()
    firsts = []
    for _ in range(4):
        order, tid = _arrivals(arrive, 2 * per, 2)
        assert sorted(order.tolist()) == list(range(2 * per))  # each chunk ran once
        first = sorted(np.flatnonzero(order < 2).tolist())
        assert first in ([0, per], [per - 1, 2 * per - 1]), order
        assert tid[first[0]] == caller and tid[first[1]] != caller
        firsts.append(first[0])
    assert firsts[0] != firsts[1] and firsts[0] == firsts[2] and firsts[1] == firsts[3]


def test_concurrent_callers_get_their_own_results(pool, mark):
    # One caller owns the workers; the others run their chunks on their own thread.
    threads.set_num_threads(2)
    results, errors = {}, []

    def caller(k: int) -> None:
        try:
            for _ in range(50):
                out = np.full(10_000 + k, -1, np.int64)
                threads.run_kernel(mark, _pointers(out), out.size, 1)
                if not np.array_equal(out, _expected(out.size, 1, 2)):
                    results[k] = out
                    return
            results[k] = None
        except BaseException as exc:  # reported below
            errors.append(exc)

    callers = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=60)
    assert not errors
    assert results == {k: None for k in range(4)}


def test_pool_is_compiled_quickly_and_the_same_at_every_tier(tmp_path):
    """The pool's module carries nothing that could differ between LLVM's tiers, and a
    process without its cached object compiles it at the quick one (POOL_TIER)."""
    assert workers.POOL_TIER == "quick"
    assert llvm.same_bits_at_every_tier(str(workers._Module().m))
    code = (
        "from hologram.backends.cpu import llvm, workers\n"
        "tiers = []\n"
        "real = llvm._compile_ir\n"
        "def counting(ir, target, allowed, dump, tier):\n"
        "    tiers.append(tier)\n"
        "    return real(ir, target, allowed, dump, tier)\n"
        "llvm._compile_ir = counting\n"
        "workers._entry_points()\n"
        "print(tiers)\n")
    done = run_fresh(code, {"HOLOGRAM_CACHE_DIR": str(tmp_path),
                            "HOLOGRAM_DISABLE_DISK_CACHE": None}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["['quick']"]


def test_idle_workers_sleep():
    # After the spin window the workers block in the kernel: an idle process burns no CPU.
    threads.set_num_threads(2)
    out = np.zeros(1000, np.int64)
    threads.run_kernel(_compile("test_workers_idle", _mark), _pointers(out), 1000, 1)
    time.sleep(0.05)
    before = os.times()
    time.sleep(0.3)
    after = os.times()
    used = (after.user - before.user) + (after.system - before.system)
    assert used < 0.1, f"{used:.2f} s of CPU while idle"


def test_without_native_workers_the_python_pool_runs_kernels(mark, monkeypatch):
    monkeypatch.setattr(threads, "_NATIVE", False)
    threads.set_num_threads(3)
    out = np.full(999, -1, np.int64)
    threads.run_kernel(mark, _pointers(out), 999, 1)
    np.testing.assert_array_equal(out, _expected(999, 1, 3, per_thread=1))


_CHILD = """
import sys
import numpy as np
sys.path.insert(0, "tests")
import test_cpu_workers as t
from hologram.backends.cpu import threads
threads.set_num_threads(4)
address = t._compile("exit_mark", t._mark)
out = np.zeros(100_000, np.int64)
for _ in range(100):
    threads.run_kernel(address, t._pointers(out), out.size, 1)
assert (out == t._expected(out.size, 1, 4)).all()
"""


def test_interpreter_exit_with_spinning_workers():
    # Exit right after a parallel kernel, while the workers still spin in JIT code.
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, timeout=60,
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_child_starts_its_own_workers(pool, meet):
    threads.set_num_threads(2)
    count = np.array([0, 2], np.int64)
    out = np.zeros(2, np.int64)
    threads.run_kernel(meet, _pointers(count, out), 2, 1)  # the parent has workers

    def child() -> bool:
        count[:] = [0, 2]
        threads.run_kernel(meet, _pointers(count, out), 2, 1)
        return out.tolist() == [2, 2] and not workers.sharing_openmp() \
            and workers.started() == 1

    # The child has none of the parent's threads, its own workers nor OpenMP's: it starts
    # a worker of its own.
    assert in_forked_child(child, 30, "run_kernel") == 0
    count[:] = [0, 2]
    threads.run_kernel(meet, _pointers(count, out), 2, 1)  # and the parent's still work
    assert out.tolist() == [2, 2]


_SHARED = """
import os
import sys
import threading
import torch
sys.path.insert(0, "tests")
import test_cpu_workers as t
from hologram.backends.cpu import threads, workers

def tasks():
    return set(map(int, os.listdir("/proc/self/task")))

def helper_thread():
    order, tid = t._arrivals(arrive, 2, 2)  # two chunks that run at the same time
    assert sorted(order.tolist()) == [0, 1]
    assert tid[0] != tid[1]
    return int(tid[tid != threading.get_native_id()][0])

torch.set_num_threads(2)
threads.set_num_threads(2)
before = tasks()
torch.ones(1 << 22).mul_(3)  # a parallel PyTorch op starts OpenMP's second thread
openmp = tasks() - before
assert len(openmp) == 1, openmp
pid = os.fork()
if pid == 0:  # a fork child loads the pool with its own workers, not the parent's OpenMP
    workers.prepare(1)
    os._exit(0 if not workers.sharing_openmp() and workers.started() == 1 else 3)
assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
workers.prepare(1)  # loads the pool, which finds PyTorch's runtime (and links `syscall`)
arrive = t._compile("shared_arrive", t._arrive)
assert workers.sharing_openmp() and workers.started() == 1
own_workers = tasks() - before - openmp
assert len(own_workers) == 1, own_workers
for _ in range(20):  # the main thread's jobs: the second chunk on PyTorch's thread
    assert helper_thread() in openmp
    torch.ones(1 << 22).mul_(3)
assert tasks() - before == openmp | own_workers
# Another thread's jobs (the autograd engine's device thread, say) run on the own
# workers: in OpenMP they would start a second team spinning beside PyTorch's.
found = []
other = threading.Thread(target=lambda: found.append(helper_thread()))
other.start()
other.join()
assert found[0] in own_workers, (found, own_workers)
os.environ["HOLOGRAM_SHARE_OPENMP"] = "0"
assert not workers.share_openmp()
assert helper_thread() in own_workers and workers.started() == 1
print("ok")
"""


def test_jobs_run_on_pytorchs_openmp_threads():
    """In a process with PyTorch, the main thread's jobs run on the OpenMP threads
    PyTorch's own parallel ops use, another thread's on the pool's own worker; with
    HOLOGRAM_SHARE_OPENMP=0 every job runs on the pool's worker."""
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items()
           if k not in ("HOLOGRAM_SHARE_OPENMP", "HOLOGRAM_NUM_THREADS", "OMP_NUM_THREADS")}
    proc = subprocess.run([sys.executable, "-c", _SHARED], cwd=ROOT, timeout=120, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["ok"]


def test_without_an_openmp_runtime_jobs_stay_on_the_pools_workers():
    """A process that never loaded an OpenMP runtime (no torch) uses the own workers."""
    code = ("from hologram.backends.cpu import workers\n"
            "workers.prepare(1)\n"
            "print(workers._openmp_runtime(), workers.sharing_openmp(), workers.started())")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=120,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["None", "False", "1"]
