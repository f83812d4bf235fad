"""GEMMs cut into pieces for the worker threads (hologram.backends.cpu.parallel_gemm),
against a float64 NumPy reference, through both library entries and both pools."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch  # noqa: F401  (its MKL is the default entry of every product)

from hologram.backends.cpu import blas, llvm, parallel_gemm, threads
from hologram.backends.cpu import target as targets
from hologram.errors import HologramError

pytestmark = pytest.mark.skipif(not blas.available(), reason=blas.describe())

DTYPES = {"f32": np.float32, "f64": np.float64}
# Row pieces, column pieces (n > m), sizes that are no multiple of the block, a product
# of one row, and ones too small to share.
SHAPES = [(512, 64, 64), (64, 512, 64), (100, 37, 129), (33, 300, 70), (1, 1000, 300),
          (300, 1, 70), (5, 5, 5), (40, 40, 40)]


def operands(dtype, trans_a, trans_b, m, n, k, pad=0, seed=0):
    """A, B (stored transposed when asked) and C filled with NaN, as views with row
    strides ``pad`` elements wider than their rows; C's padding holds 7."""
    rng = np.random.default_rng(seed)
    t = DTYPES[dtype]

    def view(rows, cols, fill=None):
        big = rng.uniform(-1, 1, (rows, cols + pad)).astype(t) if fill is None else \
            np.full((rows, cols + pad), fill, t)
        return big, big[:, :cols]

    _, a = view(*((k, m) if trans_a else (m, k)))
    _, b = view(*((n, k) if trans_b else (k, n)))
    c_big, c = view(m, n, np.nan)
    c_big[:, n:] = 7
    return a, b, c_big, c


def stride(x):
    return x.strides[0] // x.itemsize


def run(dtype, trans_a, trans_b, m, n, k, library=None, pad=0, seed=0):
    a, b, c_big, c = operands(dtype, trans_a, trans_b, m, n, k, pad, seed)
    call = parallel_gemm.prepare(dtype, trans_a, trans_b, m, n, k, stride(a), stride(b),
                                 stride(c), library)
    call(a.ctypes.data, b.ctypes.data, c.ctypes.data)
    op_a, op_b = (a.T if trans_a else a), (b.T if trans_b else b)
    expected = op_a.astype(np.float64) @ op_b.astype(np.float64)
    tol = (2e-6 if dtype == "f32" else 1e-14) * (k + 1) * 4
    np.testing.assert_allclose(c.astype(np.float64), expected, rtol=tol, atol=tol)
    assert (c_big[:, n:] == 7).all()  # nothing written past a row of C
    return c.copy()


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("library", ["openblas", None])
def test_products_match_numpy(dtype, trans_a, trans_b, library):
    """Every shape, through OpenBLAS's CBLAS entry and through the default choice (MKL's
    Fortran entry, where torch brought one), with wider row strides."""
    for m, n, k in SHAPES:
        run(dtype, trans_a, trans_b, m, n, k, library)
        run(dtype, trans_a, trans_b, m, n, k, library, pad=3)


def test_both_entries_are_exercised():
    """The products above reach the trampolines of both calling conventions (the default
    through MKL when this process has it)."""
    expected = "fortran" if blas._mkl() is not None else "cblas"
    assert blas.entry("f32", 64).abi == blas.entry("f64", 64).abi == expected
    assert blas.entry("f32", 64, "openblas").abi == "cblas"


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_the_pieces_are_the_same_on_every_pool_and_every_call(dtype):
    """Which thread runs a piece never changes the result: the native pool, Python
    threads and repeated calls give the same bits; one thread, a whole-product call."""
    shape = (dtype, False, True, 200, 96, 64)
    first = run(*shape)
    assert np.array_equal(run(*shape), first)
    threads.use_native_workers(False)
    try:
        assert np.array_equal(run(*shape), first)
    finally:
        threads.use_native_workers(True)
    before = threads.num_threads()
    try:
        threads.set_num_threads(1)
        a, b, _, c = operands(*shape)
        blas.prepare(*shape, 1.0, stride(a), stride(b), 0.0, stride(c))(
            a.ctypes.data, b.ctypes.data, c.ctypes.data)
        assert np.array_equal(run(*shape), c)
    finally:
        threads.set_num_threads(before)


def test_openblas_runs_pieces_on_one_thread_then_gets_the_process_count_back(monkeypatch):
    before = threads.num_threads()
    try:
        threads.set_num_threads(2)
        blas.set_blas_threads(2)
        seen = []
        original = blas.set_openblas_threads
        monkeypatch.setattr(blas, "set_openblas_threads", lambda n: (seen.append(n), original(n)))
        run("f32", False, False, 256, 64, 64, "openblas")
        assert seen == [1, 2] and blas.blas_threads() == 2
    finally:
        threads.set_num_threads(before)


def test_concurrent_callers_of_one_product():
    """Two Python threads call one prepared product on their own operands at once: each
    gets its own product (a job per call)."""
    m, n, k = 256, 64, 64
    call = parallel_gemm.prepare("f32", False, False, m, n, k, k, n, n)
    errors = []

    def worker(seed):
        try:
            for _ in range(20):
                a, b, _, c = operands("f32", False, False, m, n, k, seed=seed)
                call(a.ctypes.data, b.ctypes.data, c.ctypes.data)
                expected = a.astype(np.float64) @ b.astype(np.float64)
                np.testing.assert_allclose(c, expected, rtol=1e-4, atol=1e-4)
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    pool = [threading.Thread(target=worker, args=(seed,)) for seed in (1, 2)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors


def test_pieces_that_read_a_large_operand_whole_are_large():
    """Each piece's library call packs the operand it reads whole (B for pieces of rows,
    A for pieces of columns) again: pieces hold at least MIN_PIECE rows (or columns), and
    beyond SHARED_BYTES of that operand at least MIN_SHARED_PIECE; the work may ask for
    more."""
    least = parallel_gemm.MIN_SHARED_PIECE // parallel_gemm.BLOCK
    few = parallel_gemm.MIN_PIECE // parallel_gemm.BLOCK
    assert least > few > 1
    assert parallel_gemm.cut("f32", 1024, 64, 64) == (64, few)  # B of 16 KiB
    assert parallel_gemm.cut("f32", 1024, 16, 16) == (64, 32)  # 1 << 18 flops a piece
    assert parallel_gemm.cut("f32", 1024, 256, 512) == (64, few)  # B of 512 KiB exactly
    assert parallel_gemm.cut("f32", 1024, 512, 512) == (64, least)  # 1 MiB
    assert parallel_gemm.cut("f32", 1024, 1024, 1024) == (64, least)
    assert parallel_gemm.cut("f32", 256, 4096, 4096) == (256, least)  # columns: A of 4 MiB
    assert parallel_gemm.cut("f32", 64, 64, 0) == (0, 1)  # nothing to share
    # large operands, cut into pieces (and not), through both entries and layouts
    for dtype in DTYPES:
        for trans_a, trans_b in ((False, False), (True, True)):
            for m, n, k in ((600, 300, 1000), (300, 600, 1000), (400, 300, 1000)):
                run(dtype, trans_a, trans_b, m, n, k)


def test_a_null_address_is_refused():
    call = parallel_gemm.prepare("f32", False, False, 256, 64, 64, 64, 64, 64)
    x = np.zeros(256 * 64, np.float32)
    with pytest.raises(HologramError, match="null address"):
        call(x.ctypes.data, 0, x.ctypes.data)


def test_empty_and_k_zero_products():
    c = np.full((64, 64), np.nan, np.float32)
    parallel_gemm.prepare("f32", False, False, 64, 64, 0, 1, 64, 64)(1, 1, c.ctypes.data)
    assert (c == 0).all()  # beta 0 with nothing to add: zeros, as BLAS
    parallel_gemm.prepare("f32", False, False, 0, 64, 8, 8, 64, 64)(1, 1, c.ctypes.data)


@pytest.mark.parametrize("triple, cpu", [(None, "host"), (None, "x86-64"),
                                         ("aarch64-unknown-linux-gnu", "neoverse-v1"),
                                         ("arm64-apple-macosx", "apple-m1")])
@pytest.mark.parametrize("abi,int64", [("cblas", True), ("cblas", False),
                                       ("fortran", False)])
def test_the_trampolines_compile_for_other_machines(triple, cpu, abi, int64):
    """Every trampoline compiles to an object (ELF, Mach-O) that calls nothing from
    outside, only the entry whose address its job holds, here and for machines this one
    cannot run."""
    tgt = targets.named(cpu) if triple is None else \
        targets.Target("test", triple, cpu, "", frozenset())
    for dtype in ("f32", "f64"):
        obj = llvm.compile_ir(parallel_gemm.trampoline_ir(abi, int64, dtype, tgt.triple),
                              tgt, allowed=(), tier="quick", cached=False)
        assert not set(llvm.undefined_symbols(obj)) - {"_GLOBAL_OFFSET_TABLE_"}


@pytest.mark.parametrize("triple, cpu", [(None, "host"), (None, "x86-64"),
                                         ("aarch64-unknown-linux-gnu", "neoverse-v1"),
                                         ("arm64-apple-macosx", "apple-m1")])
@pytest.mark.parametrize("kind", parallel_gemm.BATCH_KINDS)
def test_the_batch_loops_compile_for_other_machines(triple, cpu, kind):
    tgt = targets.named(cpu) if triple is None else \
        targets.Target("test", triple, cpu, "", frozenset())
    obj = llvm.compile_ir(parallel_gemm.batch_trampoline_ir(tgt.triple, kind), tgt,
                          allowed=(), tier="quick", cached=False)
    assert not set(llvm.undefined_symbols(obj)) - {"_GLOBAL_OFFSET_TABLE_"}


def half(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 ``values`` stored as f16, or as bf16 bits (their high halves); f32/f64 as
    they are."""
    if dtype in ("f32", "f64"):
        return values.astype(np.float32 if dtype == "f32" else np.float64)
    if dtype == "f16":
        return values.astype(np.float16)
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def widened(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype in ("f16", "f32", "f64"):
        return x.astype(np.float64)
    return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32", "f64"])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True)])
def test_batches_on_mkl_run_as_a_native_loop_on_every_thread_count(dtype, trans_a, trans_b):
    """A batch of products (f16/bf16 into float32 through MKL's mixed-precision entry,
    f32/f64 through its sgemm/dgemm; a batch dimension of stride 0 for B included), the
    batch split over the pool's threads as a native job: within the float32 GEMM bound
    of the exact products, the same bits on any thread count, nothing written between
    C's matrices."""
    found = (blas.half_entry(dtype, 64) if dtype in blas.HALF else
             blas.entry(dtype, 64) if blas.entry(dtype, 64).abi == "fortran" else None)
    if found is None:
        pytest.skip(f"this process's MKL has no {dtype} product")
    rng = np.random.default_rng(3)
    batch, m, n, k = (3, 7), 24, 20, 40
    a_rows, a_cols = (k, m) if trans_a else (m, k)
    b_rows, b_cols = (n, k) if trans_b else (k, n)
    a = half(rng.uniform(-1, 1, (*batch, a_rows, a_cols)), dtype)
    b = half(rng.uniform(-1, 1, (1, batch[1], b_rows, b_cols)), dtype)
    c_big = np.full((*batch, m, n + 3), 7.0, np.float64 if dtype == "f64" else np.float32)
    c = c_big[..., :n]
    elements = [s // x.itemsize for x in (a, b, c_big) for s in x.strides[:2]]
    call = parallel_gemm.prepare_batched(dtype, trans_a, trans_b, m, n, k, a_cols, b_cols,
                                         n + 3, batch, tuple(elements[:2]),
                                         (0, elements[3]), tuple(elements[4:]))
    assert call.job.kernel  # what the launcher runs (test_native: its job steps)
    op_a, op_b = widened(a, dtype), widened(b, dtype)
    op_a = np.swapaxes(op_a, -1, -2) if trans_a else op_a
    op_b = np.swapaxes(op_b, -1, -2) if trans_b else op_b
    expected = op_a @ op_b
    results = []
    for count in (1, 2, 3):
        threads.set_num_threads(count)
        try:
            c[...] = np.nan
            call(a.ctypes.data, b.ctypes.data, c_big.ctypes.data)
        finally:
            threads.set_num_threads(None)
        tol = 2e-6 * (k + 1) * 4
        np.testing.assert_allclose(c.astype(np.float64), expected, rtol=tol, atol=tol)
        assert (c_big[..., n:] == 7).all()
        results.append(c.copy())
    assert all(np.array_equal(results[0], r) for r in results[1:])
