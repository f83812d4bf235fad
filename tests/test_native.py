"""The native extension (hologram/csrc/native.c): the SDK ops' native allocating path
(FastOp), executors' buffer registries and the pool's lease. The pool itself is
tests/test_pool.py's subject."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest
from util import errors_in_threads

import hologram as hg
from hologram import _native
from hologram.errors import InvalidBufferError, OutOfMemoryError
from hologram.frontend.graph import Graph
from hologram.isa import dtypes as dt
from hologram.isa.builder import ProgramBuilder
from hologram.runtime.buffer import Buffer

RNG = np.random.default_rng(7)
CALLS = 40  # enough for a quick build to be promoted and planned (HOLOGRAM_PROMOTE_AFTER)


def arrays(shape, dtype=np.float32, count=2):
    if np.dtype(dtype).kind == "f":
        return [RNG.standard_normal(shape).astype(dtype) for _ in range(count)]
    return [RNG.integers(-50, 50, shape).astype(dtype) for _ in range(count)]


@pytest.fixture
def ex():
    with hg.Executor("cpu") as executor:
        yield executor


def test_ops_are_native_callables():
    for name in ("vector_add", "relu", "exp", "sum", "reduce_sum", "softmax", "gemm",
                 "matmul", "mse_loss", "cross_entropy_loss", "gelu", "copy"):
        op = getattr(hg.ops, name)
        assert type(op) is _native.FastOp, name
        assert op.__name__ == name and op.__doc__ and op.__wrapped__ is op.general
        assert op in op.op.natives


CASES = [
    ("vector_add", lambda a, b: a + b, 2, {}),
    ("vector_mul", lambda a, b: a * b, 2, {}),
    ("vector_max", np.maximum, 2, {}),
    ("relu", lambda a: np.maximum(a, 0), 1, {}),
    ("vector_neg", np.negative, 1, {}),
    ("sum", lambda a: a.sum(dtype=np.float64), 1, {}),
    ("max", lambda a: a.max(), 1, {}),
    ("sum", lambda a: a.sum(axis=-1, dtype=np.float64), 1, {"dim": -1}),
    ("sum", lambda a: a.sum(axis=0, keepdims=True, dtype=np.float64), 1,
     {"dim": 0, "keepdim": True}),
]


SHAPES = [(5,), (3, 70), (1000,), (2, 3, 4), ()]


@pytest.mark.parametrize(("name", "reference", "arity", "kwargs", "shape"), [
    (*case, shape) for case in CASES for shape in SHAPES
    if len(shape) >= 2 or "dim" not in case[3]])  # dim=-1 and dim=0 of one dimension: all
def test_native_calls_compute_what_the_general_path_does(ex, name, reference, arity, kwargs,
                                                         shape):
    op = getattr(hg.ops, name)
    data = arrays(shape, count=arity)
    bufs = [ex.from_numpy(x) for x in data]
    want = reference(*data)
    for _ in range(CALLS):  # the first call files, later ones run natively
        got = op(*bufs, **kwargs)
        assert type(got) is Buffer and got.executor is ex and not got.freed
        np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-6, atol=1e-6)
        assert got.shape == np.shape(want)
    assert op.fast_stats()["entries"] >= 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.int8,
                                   np.uint8, np.float16, np.bool_])
def test_every_dtype_and_broadcasting(ex, dtype):
    a, b = arrays((4, 1, 3), dtype if dtype is not np.bool_ else np.int8)
    a, b = a.astype(dtype), b[:1].reshape(1, 1, 3).astype(dtype)
    a_buf, b_buf = ex.from_numpy(a), ex.from_numpy(b)
    for _ in range(CALLS):
        got = hg.ops.vector_max(a_buf, b_buf).to_numpy()
    np.testing.assert_array_equal(got, np.maximum(a, b))
    assert got.dtype == np.result_type(a, b)


def test_results_are_new_buffers_every_call(ex):
    a, b = (ex.from_numpy(x) for x in arrays(100))
    results = [hg.ops.vector_add(a, b) for _ in range(CALLS)]
    assert len({r.handle for r in results}) == CALLS  # all alive: distinct memory
    for r in results:
        np.testing.assert_array_equal(r.to_numpy(), a.to_numpy() + b.to_numpy())
    a.from_numpy(np.ones(100, np.float32))  # new values: computed again, not remembered
    np.testing.assert_array_equal(hg.ops.vector_add(a, b).to_numpy(), 1 + b.to_numpy())


def test_a_freed_operand_and_a_closed_executor_raise(ex):
    a, b = (ex.from_numpy(x) for x in arrays(10))
    for _ in range(CALLS):
        kept = hg.ops.vector_add(a, b)
    b.free()
    with pytest.raises(InvalidBufferError, match="freed"):
        hg.ops.vector_add(a, b)
    ex.close()
    with pytest.raises(InvalidBufferError, match="closed"):
        hg.ops.vector_add(a, a)
    assert kept.freed  # native results are registered: close() ended it


def test_executors_never_share_a_validated_call():
    with hg.Executor("cpu") as one, hg.Executor("cpu") as two:
        x = arrays(8)[0]
        a, b = one.from_numpy(x), two.from_numpy(x)
        for _ in range(CALLS):
            assert hg.ops.relu(a).executor is one
            assert hg.ops.relu(b).executor is two
        with pytest.raises(InvalidBufferError, match="another executor"):
            hg.ops.vector_add(a, b)


def test_keywords_are_part_of_the_key(ex):
    x = arrays((3, 4), count=1)[0]
    buf = ex.from_numpy(x)
    for _ in range(CALLS):
        np.testing.assert_allclose(hg.ops.sum(buf, dim=0).to_numpy(), x.sum(0), rtol=1e-6)
        np.testing.assert_allclose(hg.ops.sum(buf, dim=1).to_numpy(), x.sum(1), rtol=1e-6)
        assert hg.ops.sum(buf, dim=1, keepdim=True).shape == (3, 1)
    # Equal values of another type are another call: True is not 1 here.
    assert hg.ops.sum(buf, dim=1, keepdim=1).shape == (3, 1)
    with pytest.raises(hg.HologramError):
        hg.ops.sum(buf, dim=1.0)  # refused by the general path, never served natively
    with pytest.raises(hg.HologramError):
        hg.ops.sum(buf, dim=[5])  # unhashable: the general path, which refuses it


def test_the_memory_limit_is_enforced_with_the_general_paths_error():
    with hg.Executor("cpu", memory_limit=1 << 20) as ex:
        a = ex.from_numpy(np.ones(40_000, np.float32))  # 160 kB
        results = []
        with pytest.raises(OutOfMemoryError, match="memory_limit"):
            for _ in range(10):
                results.append(hg.ops.vector_add(a, a))
        assert 2 <= len(results) < 10


def test_results_of_dead_buffers_go_back_to_the_pool(ex):
    a = ex.from_numpy(np.ones(4096, np.float32))
    for _ in range(CALLS):
        hg.ops.exp(a)
    before = ex.memory_stats()["allocated_bytes"]
    for _ in range(1000):
        hg.ops.exp(a)
    assert ex.memory_stats()["allocated_bytes"] == before


def test_concurrent_threads_get_their_own_results(ex):
    data = arrays(3000, count=4)
    bufs = [ex.from_numpy(x) for x in data]

    def work(i):
        x, y = bufs[i], bufs[(i + 1) % 4]
        want = data[i] * data[(i + 1) % 4]
        for _ in range(300):
            np.testing.assert_array_equal(hg.ops.vector_mul(x, y).to_numpy(), want)

    errors = errors_in_threads(work, 4)
    assert not errors, errors


def test_registry_keeps_only_live_buffers():
    registry = _native.Registry()

    class Item:
        pass

    kept = [Item() for _ in range(10)]
    for _ in range(1000):
        registry.add(Item())  # dies at once
    for item in kept:
        registry.add(item)
    live = registry.live()
    assert len(live) == 10 and all(x in kept for x in live)
    assert len(registry.live()) == 10
    gc.collect()


def test_buffers_of_native_results_behave_as_any(ex):
    a = ex.from_numpy(np.arange(6, dtype=np.float32))
    for _ in range(CALLS):
        r = hg.ops.vector_add(a, a)
    assert r.signature == ((6,), np.dtype(np.float32)) and r.launch_key[:2] == r.signature
    assert r.reshape(2, 3).shape == (2, 3)
    assert np.from_dlpack(r).tolist() == [0, 2, 4, 6, 8, 10]
    r.free()
    assert r.freed and r.launch_key is None
    with pytest.raises(InvalidBufferError):
        r.to_numpy()


def test_lease_exports_its_block():
    pool = hg.runtime.Pool()
    lease = pool.lease(1000)
    assert lease.nbytes == 1024 and lease.address % 64 == 0
    view = memoryview(lease)
    assert view.nbytes == 1024 and not view.readonly
    del lease  # the view keeps the block
    assert pool.stats()["allocated_bytes"] == 1024
    del view
    assert pool.stats()["allocated_bytes"] == 0


def test_file_pending_files_only_the_running_call(ex):
    op = hg.ops.vector_sub
    a = ex.from_numpy(np.ones(3, np.float32))
    op(a, a)
    launch = next(iter(op.op.kernels.values())).by_address
    # No call running: nothing to file.
    assert not _native.file_pending(op.op.natives, (a.launch_key, a.launch_key), (3,),
                                    np.dtype(np.float32), a.launch_key, 12, launch)


def test_launchers_run_small_programs_natively_after_promotion(ex):
    a, b = (ex.from_numpy(x) for x in arrays(64))
    for _ in range(CALLS):
        r = hg.ops.vector_sub(a, b)
    # this signature's entry (other tests may have compiled vector_sub at other shapes)
    compiled = next(entry.compiled for entry in hg.ops.vector_sub.op.kernels.values()
                    if entry.shape == (64,))
    assert type(compiled.launch) is _native.Launcher
    deadline = time.monotonic() + 60  # the promotion runs on a background thread (slow
    while time.monotonic() < deadline:  # when the machine is busy)
        out = ex.empty(64, np.float32)
        compiled.launch((a.handle, b.handle, out.handle))
        if compiled.launch.planned:
            break
        threading.Event().wait(0.01)
    assert compiled.launch.planned
    np.testing.assert_array_equal(out.to_numpy(), a.to_numpy() - b.to_numpy())
    np.testing.assert_array_equal(r.to_numpy(), a.to_numpy() - b.to_numpy())


def test_launchers_give_each_call_its_own_scratch(ex):
    """A program whose kernels pass temporaries (a row max and sum, then the loss) is
    planned with its arena: each native call takes a scratch block from the arena pool,
    so calls from several threads at once never share one; at the pool's limit the call
    goes through Python, which raises the pool's error."""
    from hologram.backends.cpu import backend as cpu_backend

    rng = np.random.default_rng(3)
    rows = [(rng.standard_normal((50, 300)).astype(np.float32) * 4,
             rng.integers(0, 300, 50).astype(np.int64)) for _ in range(4)]
    want = [torch_free_cross_entropy(x, t) for x, t in rows]
    bufs = [(ex.from_numpy(x), ex.from_numpy(t)) for x, t in rows]
    op = hg.ops.cross_entropy_loss
    deadline = time.monotonic() + 60  # promoted on a background thread
    compiled = None
    while time.monotonic() < deadline:
        op(*bufs[0])
        compiled = next(entry.compiled for key, entry in op.op.kernels.items()
                        if key[2][0][0] == (50, 300))
        if compiled.launch.planned:
            break
        threading.Event().wait(0.01)
    assert compiled.launch.planned
    assert compiled.launch.executable.native_plan()[3][0] > 0  # an arena

    def work(i):
        for _ in range(300):
            np.testing.assert_allclose(float(op(*bufs[i]).to_numpy()), want[i], rtol=1e-5)

    errors = errors_in_threads(work, 4)
    assert not errors, errors
    arenas = cpu_backend._ARENAS
    arenas.set_memory_limit(arenas.stats()["allocated_bytes"])
    try:
        with pytest.raises(OutOfMemoryError):
            op(*bufs[0])
    finally:
        arenas.set_memory_limit(None)


@pytest.mark.parametrize("threads", [1, 2])
def test_launchers_run_split_reductions_natively(ex, threads, monkeypatch):
    """Whole-array reductions split into partials (a partial function over the workers,
    then the final one) are planned too, their partials on the calling thread's stack:
    the same results as the Python launch, from several threads at once."""
    from hologram.backends.cpu import threads as cpu_threads

    monkeypatch.setenv("HOLOGRAM_NUM_THREADS", str(threads))
    rng = np.random.default_rng(4)
    x = rng.standard_normal(1 << 20).astype(np.float32)
    x[[5, 700_001]] = np.float32(9.5)  # a repeated maximum: the first index wins
    g = Graph("split_sum_argmax")
    inp = g.input("x", "f32", x.shape)
    g.output("sum", g.sum(inp))
    g.output("arg", g.reduce("argmax", inp, (0,), keepdim=False))
    compiled = hg.compile(g.program(), "cpu")
    deadline = time.monotonic() + 60  # promoted on a background thread
    while not compiled.launch.planned and time.monotonic() < deadline:
        compiled(x)
        threading.Event().wait(0.01)
    assert compiled.launch.planned
    steps = compiled.launch.executable.native_plan()[2]
    assert any(len(step) == 4 for step in steps), steps  # a split step
    cpu_threads.use_native_workers(False)  # the Python launch, for reference
    try:
        want = [o.copy() for o in compiled(x)]
    finally:
        cpu_threads.use_native_workers(True)
    assert want[1] == 5
    a = ex.from_numpy(x)

    def work(_):
        for _ in range(20):
            s, i = ex.empty((), np.float32), ex.empty((), np.int64)
            compiled.launch((a.handle, s.handle, i.handle))
            assert s.to_numpy() == want[0] and i.to_numpy() == want[1]

    errors = errors_in_threads(work, 3)
    assert not errors, errors


def test_launchers_call_products_back_and_take_large_programs():
    """A product step of a plan is a callback ``fn(a, b, c)`` on its operands' addresses
    (a pointer slot's plus a byte offset; 0 for a slot holding none), run in order with the
    other steps; its exception propagates. Plans of hundreds of buffers and steps (a
    compiled training step) run natively; past the limit, through Python."""
    seen = []

    class Program:
        def __init__(self, buffers, steps):
            self.buffers, self.steps, self.python = buffers, steps, 0

        def native_plan(self):
            return self.buffers, tuple(range(self.buffers - 1)), self.steps

        def launch(self, handles):
            self.python += 1

    def product(a, b, c):
        seen.append((a, b, c))
        if a == 7:
            raise ValueError("refused")

    buffers = 300
    steps = tuple((product, ((i, 8 * i), (i + 1, 0), (buffers - 1, 4))) for i in range(200))
    program = Program(buffers, steps)
    launcher = _native.Launcher(program)
    handles = tuple(4096 * (i + 1) for i in range(buffers - 1))
    launcher(handles)
    assert launcher.planned and program.python == 0
    assert seen == [(4096 * (i + 1) + 8 * i, 4096 * (i + 2), 0) for i in range(200)]
    seen.clear()
    with pytest.raises(ValueError, match="refused"):
        launcher((7,) + handles[1:])
    assert len(seen) == 1  # nothing ran after the failing step

    big = Program(2000, steps)
    launcher = _native.Launcher(big)
    launcher(tuple(range(1999)))
    assert not launcher.planned and big.python == 1


def test_programs_with_products_are_launched_natively(ex):
    """A compiled program whose steps include BLAS products (a linear layer: product, then
    bias and ReLU) is planned, its products called back from C."""
    rng = np.random.default_rng(5)
    x, w = (rng.standard_normal(s).astype(np.float32) for s in ((64, 32), (32, 48)))
    bias = rng.standard_normal(48).astype(np.float32)
    g = Graph("linear_relu")
    y = g.input("x", "f32", x.shape) @ g.input("w", "f32", w.shape)
    g.output("y", g.maximum(y + g.input("b", "f32", bias.shape), 0.0))
    compiled = hg.compile(g.program(), "cpu")
    want = np.maximum(x @ w + bias, 0)
    deadline = time.monotonic() + 60  # promoted on a background thread
    while not compiled.launch.planned and time.monotonic() < deadline:
        np.testing.assert_allclose(compiled(x, w, bias), want, rtol=1e-5, atol=1e-5)
        threading.Event().wait(0.01)
    assert compiled.launch.planned
    steps = compiled.launch.executable.native_plan()[2]
    # a callback, or with PyTorch's MKL in the process a job (the next test's subject)
    assert any(callable(step[0]) or (len(step) == 4 and isinstance(step[3], tuple))
               for step in steps), steps
    a, b, c = ex.from_numpy(x), ex.from_numpy(w), ex.from_numpy(bias)
    for _ in range(3):
        out = ex.empty(want.shape, np.float32)
        compiled.launch((a.handle, b.handle, c.handle, out.handle))
        np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("m", "k", "n"), [(64, 64, 64), (5, 3, 700), (512, 96, 80)])
def test_products_on_mkl_are_native_jobs(ex, threads, m, k, n, monkeypatch):
    """With PyTorch's MKL in the process, a product step is a job of the launcher: its
    trampoline called from C on words holding the sizes and operand addresses, as one
    piece with every thread or as pieces on the pool (the last shape: rows cut in
    pieces on 2 threads; the second: columns). Its bits are those of the same program
    launched through Python, on every thread count."""
    pytest.importorskip("torch")  # its MKL: without it, products are OpenBLAS callbacks
    from hologram.backends.cpu import blas, parallel_gemm

    monkeypatch.setenv("HOLOGRAM_NUM_THREADS", str(threads))
    assert blas.entry("f32", 1).abi == "fortran"
    x, w = (RNG.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n)))
    g = Graph("product_job")
    g.output("y", g.input("x", "f32", x.shape) @ g.input("w", "f32", w.shape))
    compiled = hg.compile(g.program(), "cpu")
    deadline = time.monotonic() + 60  # promoted on a background thread
    while not compiled.launch.planned and time.monotonic() < deadline:
        compiled(x, w)
        threading.Event().wait(0.01)
    assert compiled.launch.planned
    executable = compiled.launch.executable
    (step,) = executable.native_plan()[2]
    assert len(step) == 4 and isinstance(step[3], tuple), step
    blocks, grain = parallel_gemm.cut("f32", m, n, k)
    assert step[1:3] == (blocks, grain)
    a, b = ex.from_numpy(x), ex.from_numpy(w)
    native, python = ex.empty((m, n), np.float32), ex.empty((m, n), np.float32)
    for _ in range(3):
        compiled.launch((a.handle, b.handle, native.handle))
        executable.launch((a.handle, b.handle, python.handle))
        np.testing.assert_array_equal(native.to_numpy(), python.to_numpy())
    np.testing.assert_allclose(native.to_numpy(), x @ w, rtol=1e-4, atol=1e-4)


def test_job_steps_are_checked_when_planned():
    """A job step's words, operands and thread word are checked when the plan is made (a
    ValueError, nothing run); an operand in an empty slot sends the launch to Python,
    which raises the product's error, before any step runs."""

    class Program:
        def __init__(self, steps):
            self.steps, self.python = steps, 0

        def native_plan(self):
            return 3, (0, 1, 2), self.steps

        def launch(self, handles):
            self.python += 1

    words = bytes(8 * 4)
    good = ((0, 0, 0), (1, 0, 1), (2, 0, 2))
    for job in [(bytes(7), good, -1, None), (bytes(8 * 25), good, -1, None),
                (words, good, 4, None), (words, ((0, 0, 0), (1, 0, 1)), -1, None),
                (words, ((0, 0, 0), (1, 0, 1), (3, 0, 2)), -1, None),
                (words, ((0, 0, 0), (1, -8, 1), (2, 0, 2)), -1, None),
                (words, ((0, 0, 0), (1, 0, 1), (2, 0, 4)), -1, None)]:
        with pytest.raises(ValueError, match="native_plan"):
            _native.Launcher(Program(((1, 1, 1, job),)))((8, 16, 24))
    with pytest.raises(ValueError, match="without rows"):
        _native.Launcher(Program(((1, 0, 1, (words, good, -1, None)),)))((8, 16, 24))
    program = Program(((1, 1, 1, (words, good, -1, None)),))
    launcher = _native.Launcher(program)
    launcher((8, 0, 24))  # B in no buffer: through Python (a kernel at address 1 never runs)
    assert launcher.planned and program.python == 1


def torch_free_cross_entropy(x: np.ndarray, t: np.ndarray) -> float:
    z = x.astype(np.float64)
    z = z - z.max(1, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(t)), t]))


@pytest.mark.parametrize("threads", [1, 2])
def test_launchers_split_large_kernels_over_the_workers_natively(ex, threads, monkeypatch):
    """A kernel whose rows are split over the worker pool is planned too (hg_parallel called
    from C, threads.native_pieces deciding the pieces); without native workers the same
    launcher goes through Python."""
    from hologram.backends.cpu import threads as cpu_threads

    monkeypatch.setenv("HOLOGRAM_NUM_THREADS", str(threads))
    x, y = arrays(300_001)  # odd: the last piece is short
    a, b = ex.from_numpy(x), ex.from_numpy(y)
    g = Graph("split_mul")
    g.output("out", g.input("a", "f32", x.shape) * g.input("b", "f32", x.shape))
    compiled = hg.compile(g.program(), "cpu")
    deadline = time.monotonic() + 60  # promoted on a background thread
    while not compiled.launch.planned and time.monotonic() < deadline:
        np.testing.assert_array_equal(compiled(x, y), x * y)
        threading.Event().wait(0.01)
    assert compiled.launch.planned
    assert any(len(step) == 3 for step in compiled.launch.executable.native_plan()[2])
    for _ in range(3):
        out = ex.empty(x.shape, np.float32)
        compiled.launch((a.handle, b.handle, out.handle))
        np.testing.assert_array_equal(out.to_numpy(), x * y)
    cpu_threads.use_native_workers(False)  # the pool switched off: Python
    try:
        out = ex.empty(x.shape, np.float32)
        compiled.launch((a.handle, b.handle, out.handle))
        np.testing.assert_array_equal(out.to_numpy(), x * y)
    finally:
        cpu_threads.use_native_workers(True)


@pytest.mark.parametrize(("dtype", "number"), [
    (np.float32, 2.5), (np.float32, 3), (np.float64, -1.25), (np.int8, 3), (np.int8, -128),
    (np.uint8, 200), (np.int32, 7), (np.int64, -(1 << 40)), (np.bool_, True),
    (np.float16, 0.5)])
def test_python_numbers_are_runtime_values(ex, dtype, number):
    data = (RNG.standard_normal(50) * 4).astype(dtype) if np.dtype(dtype).kind == "f" else (
        RNG.integers(0, 2, 50).astype(dtype))
    buf = ex.from_numpy(data)
    for i in range(CALLS):  # a new value each call: runtime arguments, never remembered
        value = type(number)(number if i % 2 else number * (0 if dtype is np.bool_ else 1))
        if dtype is np.bool_:  # bool has no product: the larger of the two
            got, want = hg.ops.vector_max(buf, value).to_numpy(), data | value
        else:
            got = hg.ops.scalar_mul(buf, value).to_numpy()
            want = data * np.array(value, dtype)
        np.testing.assert_array_equal(got, want.astype(got.dtype))


def test_numbers_a_dtype_cannot_hold_take_the_general_paths_error(ex):
    buf = ex.from_numpy(np.arange(4, dtype=np.int8))
    for _ in range(CALLS):
        hg.ops.scalar_add(buf, 5)
    with pytest.raises(hg.DTypeError, match="does not fit"):
        hg.ops.scalar_add(buf, 300)
    huge = ex.from_numpy(np.ones(4, np.float32))
    for _ in range(CALLS):
        hg.ops.scalar_add(huge, 1)
    # Past 2**53 an int would round twice into float32: computed by the general path.
    assert hg.ops.scalar_add(huge, (1 << 60) + 1).to_numpy()[0] == np.float32(1 << 60)


def test_jit_functions_of_buffers_run_natively(ex):
    f = hg.jit(lambda a, b: hg.ops.relu(a * b + 1.0))
    data = arrays(300)
    a, b = (ex.from_numpy(x) for x in data)
    for _ in range(CALLS):
        r = f(a, b)
        np.testing.assert_allclose(r.to_numpy(), np.maximum(data[0] * data[1] + 1, 0),
                                   rtol=1e-6)
    assert f._native.fast_stats()["entries"] == 1
    assert f(a, b=b).shape == (300,)  # keywords: the general path
    g = hg.jit(lambda a: (a + 1, a * 2))  # two results: the general path
    assert len(g(a)) == 2


def test_concurrent_first_calls_file_their_own_keywords(ex):
    # Two threads' first calls of one op with different keywords, each general path
    # releasing the GIL midway (compiling): each call is filed under its own key.
    x = RNG.standard_normal((16, 8)).astype(np.float32)
    buf = ex.from_numpy(x)
    results, errors = {}, []

    def work(dim):
        try:
            for _ in range(CALLS):
                results[dim] = hg.ops.mean(buf, dim=dim).to_numpy()
                np.testing.assert_allclose(results[dim], x.mean(dim), rtol=1e-5)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(d,)) for d in (0, 1, 0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results[0].shape == (8,) and results[1].shape == (16,)


def _cross_entropy(logits, labels):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return -np.take_along_axis(log_probs, labels.astype(np.int64)[:, None], -1).mean()


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int16, np.int8, np.uint8])
def test_native_calls_check_index_ranges(ex, dtype, monkeypatch):
    """cross_entropy_loss declares its class indices an index into the logits' last
    dimension (Op.index_ranges): its calls are filed for the native path, which reads the
    indices in C before each launch. In range, every call after the first is native; a
    class index outside [0, C), on the first call or on any call after the signature was
    filed (another buffer, or the same one rewritten), goes to the general path, which
    raises IndexOutOfRangeError: never a loss, never a crash."""
    from hologram.sdk.ops import reduce

    general = []
    run = reduce.run

    def counted(*args, **kwargs):
        general.append(args[0].name)
        return run(*args, **kwargs)

    monkeypatch.setattr(reduce, "run", counted)
    op = hg.ops.cross_entropy_loss
    op.forget()
    info = np.iinfo(dtype)
    logits = RNG.standard_normal((6, 10)).astype(np.float32)
    good = np.array([0, 9, 3, 1, 9, 0], dtype)
    L, G = ex.from_numpy(logits), ex.from_numpy(good)
    bad = [v for v in (10, -1, 11, info.max, info.min, 2**40, -2**62) if not 0 <= v < 10
           and info.min <= v <= info.max]
    with pytest.raises(hg.IndexOutOfRangeError):  # the first call: not filed
        op(L, ex.from_numpy(np.array([0, 9, 3, 1, 9, bad[0]], dtype)))
    assert op.fast_stats()["entries"] == 0
    for _ in range(CALLS):
        np.testing.assert_allclose(op(L, G).to_numpy(), _cross_entropy(logits, good),
                                   rtol=1e-5)
    assert len(general) == 2 and op.fast_stats()["entries"] == 1  # filed by the 2nd call
    for value in bad:
        for at in (0, 3, 5):
            labels = good.copy()
            labels[at] = value
            with pytest.raises(hg.IndexOutOfRangeError, match=f"class index {value} "):
                op(L, ex.from_numpy(labels))
    G.write(np.array([9, 9, 9, 9, 9, bad[0]], dtype))  # the filed buffer itself
    with pytest.raises(hg.IndexOutOfRangeError, match=f"class index {bad[0]} "):
        op(L, G)
    declined = len(general)
    assert declined == 2 + 1 + 3 * len(bad)
    G.write(good)
    for _ in range(CALLS):  # in range again: native again
        np.testing.assert_allclose(op(L, G).to_numpy(), _cross_entropy(logits, good),
                                   rtol=1e-5)
    assert len(general) == declined and op.fast_stats()["entries"] == 1


def test_native_index_ranges_of_numbers_and_empty_operands(ex):
    """A Python number as the class index (one sample) is checked as a one-element
    operand; empty class indices (a mean of nothing: NaN, as PyTorch) pass every call."""
    op = hg.ops.cross_entropy_loss
    logits = RNG.standard_normal(10).astype(np.float32)
    L = ex.from_numpy(logits)
    want = _cross_entropy(logits[None], np.array([3]))
    for _ in range(CALLS):
        np.testing.assert_allclose(op(L, 3).to_numpy(), want, rtol=1e-5)
    for value in (10, -1, 2**62, -2**63):
        with pytest.raises(hg.IndexOutOfRangeError, match=f"class index {value} "):
            op(L, value)
    np.testing.assert_allclose(op(L, 9).to_numpy(),
                               _cross_entropy(logits[None], np.array([9])), rtol=1e-5)
    empty, none = ex.allocate((0, 10)), ex.from_numpy(np.zeros(0, np.int64))
    for _ in range(CALLS):
        assert np.isnan(op(empty, none).to_numpy())
        assert op(empty, none, reduction="sum").to_numpy() == 0
        assert op(empty, none, reduction="none").shape == (0,)


# --- compiled programs called on NumPy arrays (arrays.c: ArrayCall) ---------------------

def _inout_program():
    """y = x * 2 (out), acc += x (inout): one parameter of each kind."""
    b = ProgramBuilder("twice_and_accumulate")
    x = b.input("x", dt.float32, (5, 7))
    acc = b.buffer("acc", dt.float32, (5, 7), "inout")
    y = b.output("y", dt.float32, (5, 7))
    k = b.kernel((5, 7))
    v = k.load(x)
    k.store(y, k.mul(v, 2.0))
    k.store(acc, k.add(k.load(acc), v))
    return b.build()


def test_compiled_programs_take_arrays_natively_as_the_general_path_does(monkeypatch):
    compiled = hg.compile(_inout_program(), "cpu")
    x = RNG.standard_normal((5, 7)).astype(np.float32)
    acc = np.ones((5, 7), np.float32)
    calls = []
    native = compiled._native_call
    monkeypatch.setattr(compiled, "_native_call",
                        lambda *a: calls.append(len(a)) or native(*a))
    assert [p.name for p in compiled.params] == ["x", "acc", "y"]
    want = np.ones((5, 7), np.float32) + x
    acc_out, y = compiled(x, acc)  # the inputs alone: y made fresh, acc updated in place
    assert acc_out is acc and np.array_equal(y, x * 2) and np.array_equal(acc, want)
    y2 = np.empty((5, 7), np.float32)
    got = compiled(x, acc, y2)  # every parameter
    assert got[0] is acc and got[1] is y2
    assert np.array_equal(y2, x * 2) and np.array_equal(acc, want + x)
    assert calls == [2, 3]


@pytest.mark.parametrize("case", ["dtype", "size", "strided", "read-only output",
                                  "subclass", "list", "count"])
def test_compiled_programs_send_other_arrays_to_the_general_path(case):
    """A call ArrayCall does not take runs the general path: the same error as before, or
    (an ndarray subclass) the same result."""
    g = Graph("scale")
    g.output("y", g.input("x", "f32", (6,)) * 3.0)
    compiled = hg.compile(g.program(), "cpu")
    x = np.arange(6, dtype=np.float32)
    y = np.empty(6, np.float32)
    args = {"dtype": (x.astype(np.float64),), "size": (x[:5],),
            "strided": (np.arange(12, dtype=np.float32)[::2],),
            "read-only output": (x, np.frombuffer(bytes(24), np.float32)),
            "subclass": (np.asarray(x).view(np.memmap),), "list": ([0.0] * 6,),
            "count": (x, y, y)}[case]
    assert compiled._native_call(*args) is NotImplemented
    if case == "subclass":
        assert np.array_equal(compiled(*args), x * 3)
        return
    with pytest.raises((hg.errors.DTypeError, hg.errors.ShapeError)) as err:
        compiled(*args)
    assert "scale on cpu" in str(err.value)


def test_large_fresh_outputs_come_from_the_pool():
    from hologram.runtime.launch import POOL_THRESHOLD

    n = POOL_THRESHOLD // 4
    g = Graph("negate")
    g.output("y", -g.input("x", "f32", (n,)))
    compiled = hg.compile(g.program(), "cpu")
    x = np.ones(n, np.float32)
    y = compiled(x)
    assert np.array_equal(y, -x) and isinstance(y.base, _native.Lease)
