"""BLAS gemm through ctypes against a float64 NumPy reference."""

from __future__ import annotations

import ctypes
import dataclasses

import numpy as np
import pytest

from hologram.backends.cpu import blas
from hologram.errors import DeviceError, DTypeError, HologramError, ShapeError

pytestmark = pytest.mark.skipif(not blas.available(), reason=blas.describe())

DTYPES = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": np.uint16}


def make(values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` stored as ``dtype`` (bf16: the high halves of their float32 bits)."""
    if dtype == "bf16":
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(DTYPES[dtype])


def wide(x: np.ndarray, dtype: str) -> np.ndarray:
    """The values of ``x`` (stored as ``dtype``) in float64."""
    if dtype == "bf16":
        return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


def out_dtype(dtype: str) -> str:
    """C's dtype: float32 for products of f16/bf16 matrices."""
    return "f32" if dtype in blas.HALF else dtype


def tolerance(dtype: str, k: int) -> float:
    return (2e-6 if out_dtype(dtype) == "f32" else 1e-14) * (k + 1) * 4


def addr(a: np.ndarray) -> int:
    """Address of a view's first element (views of bigger arrays included)."""
    return a.__array_interface__["data"][0]


def ld(a: np.ndarray) -> int:
    """Row stride of a row-major view, in elements."""
    assert a.strides[1] == a.itemsize
    return a.strides[0] // a.itemsize


def check(dtype, trans_a, trans_b, m, n, k, alpha=1.0, beta=0.0, pad=0, seed=0,
          library=None):
    """Run gemm (``prepare(..., library)`` when one is named) on (possibly padded)
    sub-blocks and compare with float64 matmul; the padding around C must stay
    untouched."""
    rng = np.random.default_rng(seed)
    a_shape = (k, m) if trans_a else (m, k)
    b_shape = (n, k) if trans_b else (k, n)

    def block(rows, cols, dtype=dtype):
        big = make(rng.uniform(-1, 1, (rows + 2 * pad, cols + 3 * pad)), dtype)
        return big, big[pad:pad + rows, pad:pad + cols]

    _, a = block(*a_shape)
    _, b = block(*b_shape)
    c_big, c = block(m, n, out_dtype(dtype))
    c_big_before = c_big.copy()
    c_before = c.astype(np.float64)
    op_a = wide(a.T if trans_a else a, dtype)
    op_b = wide(b.T if trans_b else b, dtype)
    expected = alpha * (op_a @ op_b) + beta * c_before
    if library is None:
        blas.gemm(dtype, trans_a, trans_b, m, n, k, alpha, addr(a), ld(a), addr(b), ld(b),
                  beta, addr(c), ld(c))
    else:
        blas.prepare(dtype, trans_a, trans_b, m, n, k, alpha, ld(a), ld(b), beta, ld(c),
                     library)(addr(a), addr(b), addr(c))
    tol = tolerance(dtype, k)
    np.testing.assert_allclose(c.astype(np.float64), expected, rtol=tol, atol=tol)
    mask = np.ones(c_big.shape, bool)
    mask[pad:pad + m, pad:pad + n] = False
    np.testing.assert_array_equal(c_big[mask], c_big_before[mask])


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 5, 3), (3, 17, 64), (65, 33, 130),
                                   (128, 128, 128)])
def test_gemm_matches_numpy(dtype, trans_a, trans_b, m, n, k):
    check(dtype, trans_a, trans_b, m, n, k)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True)])
def test_sub_blocks_with_larger_leading_dimensions(dtype, trans_a, trans_b):
    check(dtype, trans_a, trans_b, 9, 6, 11, pad=4)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("alpha,beta", [(2.5, 0.0), (1.0, 1.0), (-0.5, 3.0), (0.0, 2.0)])
def test_alpha_beta(dtype, alpha, beta):
    check(dtype, False, True, 12, 10, 8, alpha=alpha, beta=beta, pad=2)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_k_zero_scales_c(dtype):
    np_t = DTYPES[dtype]
    big = np.arange(1, 31, dtype=np_t).reshape(5, 6)
    c = big[1:4, 1:5]
    before = big.copy()
    blas.gemm(dtype, False, False, 3, 4, 0, 1.0, 0, 0, 0, 0, 2.0, addr(c), 6)
    expected = before.copy()
    expected[1:4, 1:5] *= 2
    np.testing.assert_array_equal(big, expected)
    c[...] = np.nan  # beta = 0 overwrites without reading, as BLAS does
    blas.gemm(dtype, True, True, 3, 4, 0, 1.0, 0, 0, 0, 0, 0.0, addr(c), 6)
    assert (c == 0).all() and not np.isnan(big).any()


@pytest.mark.parametrize("m,n", [(0, 4), (4, 0), (0, 0)])
def test_empty_output_is_a_no_op(m, n):
    c = np.full((4, 4), 5.0)
    blas.gemm("f64", False, False, m, n, 3, 1.0, 0, 0, 0, 0, 0.0, addr(c), 0)
    assert (c == 5.0).all()


def test_argument_errors():
    a = np.zeros((4, 4), np.float32)
    p = addr(a)
    with pytest.raises(DTypeError, match="'f32', 'f64', 'bf16' or 'f16'"):
        blas.gemm("i16", False, False, 2, 2, 2, 1.0, p, 4, p, 4, 0.0, p, 4)
    with pytest.raises(ShapeError, match="lda=2 < 3"):
        blas.gemm("f32", False, False, 2, 2, 3, 1.0, p, 2, p, 4, 0.0, p, 4)
    with pytest.raises(ShapeError, match="ldb=1 < 3"):
        blas.gemm("f32", False, True, 2, 2, 3, 1.0, p, 4, p, 1, 0.0, p, 4)
    with pytest.raises(ShapeError, match="ldc=1 < 2"):
        blas.gemm("f32", False, False, 2, 2, 3, 1.0, p, 4, p, 4, 0.0, p, 1)
    with pytest.raises(ShapeError, match=">= 0"):
        blas.gemm("f32", False, False, -1, 2, 3, 1.0, p, 4, p, 4, 0.0, p, 4)


def test_describe_names_the_library():
    text = blas.describe()
    lib = blas._load()
    assert "BLAS" in text and lib.path.rsplit("/", 1)[-1] in text
    assert f"{lib.prefix}openblas{lib.suffix}" in text


def test_blas_threads_round_trip():
    before = blas.blas_threads()
    try:
        blas.set_blas_threads(1)
        assert blas.blas_threads() == 1
        check("f32", False, False, 64, 64, 64)
    finally:
        blas.set_blas_threads(before)
    with pytest.raises(Exception, match="integer >= 1"):
        blas.set_blas_threads(0)


@pytest.fixture
def mkl():
    """PyTorch's MKL (importing torch is what makes it available)."""
    pytest.importorskip("torch")
    if blas._mkl() is None:
        pytest.skip("this PyTorch build exports no MKL sgemm_")
    return blas._mkl()


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 5, 3), (65, 33, 130), (64, 512, 256)])
def test_mkl_gemm_matches_numpy(mkl, dtype, trans_a, trans_b, m, n, k):
    check(dtype, trans_a, trans_b, m, n, k, library="mkl")


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, True), (False, True)])
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (-0.5, 3.0)])
def test_mkl_sub_blocks_alpha_beta(mkl, dtype, trans_a, trans_b, alpha, beta):
    check(dtype, trans_a, trans_b, 9, 6, 11, alpha=alpha, beta=beta, pad=4, library="mkl")


def test_products_go_to_mkl_and_keep_the_threads_setting(mkl, monkeypatch):
    """With torch imported, ``prepare`` sends every product to MKL unless asked for
    OpenBLAS, and products too large for MKL's 32-bit sizes to OpenBLAS; an MKL call runs
    on set_blas_threads' count as a setting of the calling thread that it puts back
    (PyTorch's torch.set_num_threads sets it too; 0 is MKL's global count)."""
    used = []
    monkeypatch.setattr(blas, "_prepare_mkl",
                        lambda *args: used.append(args[2:4]) or (lambda a, b, c: None))
    for trans_a in (False, True):
        for trans_b in (False, True):
            blas.prepare("f32", trans_a, trans_b, 4, 4, 4, 1.0, 4, 4, 0.0, 4)
    assert used == [(False, False), (False, True), (True, False), (True, True)]
    blas.prepare("f32", False, True, 4, 4, 4, 1.0, 4, 4, 0.0, 4, "openblas")
    assert len(used) == 4
    assert blas._choose_mkl(None, 2**31 - 1) is mkl
    assert blas._choose_mkl(None, 2**31) is None
    monkeypatch.undo()
    seen = []
    set_local = mkl.set_local_threads
    monkeypatch.setattr(blas, "_mkl_state", blas._Mkl(
        mkl.path, mkl.sgemm, mkl.dgemm, lambda n: seen.append(n) or set_local(n)))
    before = blas.blas_threads()
    setting = set_local(3)  # this thread's setting, read by setting another
    try:
        blas.set_blas_threads(1)
        check("f32", False, True, 64, 64, 64)
        assert seen == [1, 3]  # ran on 1, then put back what it found
    finally:
        set_local(setting)
        blas.set_blas_threads(before)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_mkl_products_set_the_openmp_count_too(mkl, monkeypatch, dtype):
    """MKL's mixed-precision products follow the calling thread's OpenMP count, not MKL's
    setting: every MKL product sets both to set_blas_threads' count and puts both back.
    (On an AMD EPYC, a bf16 product asked for one thread ran on PyTorch's two, and its
    bits depended on PyTorch's thread count.)"""
    if mkl.openmp is None:
        pytest.skip("no OpenMP runtime found beside this MKL")
    if dtype == "bf16" and blas.half_entry(dtype, 64) is None:
        pytest.skip("this process's MKL has no bf16 product")
    omp_get, omp_set = mkl.openmp
    for found in (blas.entry("f32", 64), blas.half_entry("bf16", 64)):
        if found is not None:  # what the native trampolines call
            assert found.openmp == tuple(ctypes.cast(fn, ctypes.c_void_p).value
                                         for fn in mkl.openmp)
    seen = []
    monkeypatch.setattr(blas, "_mkl_state", dataclasses.replace(
        mkl, openmp=(omp_get, lambda n: seen.append(n) or omp_set(n))))
    before, openmp = blas.blas_threads(), omp_get()
    try:
        blas.set_blas_threads(1)
        check(dtype, False, True, 16, 16, 16)
        assert seen == [1, openmp] and omp_get() == openmp
    finally:
        blas.set_blas_threads(before)


def test_library_errors(monkeypatch):
    with pytest.raises(HologramError, match="'openblas', 'mkl' or None"):
        blas.prepare("f32", False, True, 2, 2, 2, 1.0, 2, 2, 0.0, 2, "accelerate")
    monkeypatch.setattr(blas, "_mkl_state", False)
    with pytest.raises(DeviceError, match="no MKL"):
        blas.prepare("f32", False, True, 2, 2, 2, 1.0, 2, 2, 0.0, 2, "mkl")
    check("f32", False, True, 5, 6, 7)  # without MKL, OpenBLAS computes it


def test_missing_library_is_a_device_error(monkeypatch):
    monkeypatch.setattr(blas, "_state", "no BLAS found; looked in numpy.libs")
    assert not blas.available()
    assert "looked in" in blas.describe()
    with pytest.raises(DeviceError, match="looked in"):
        blas.gemm("f32", False, False, 1, 1, 1, 1.0, 1, 1, 1, 1, 0.0, 1, 1)
    blas.set_blas_threads(2)  # a no-op without a library


def batched(dtype, trans_a, trans_b, batch, m, n, k, broadcast=(), seed=0, library=None):
    """prepare_batched on batches laid out inside bigger arrays (padded rows, batch strides
    that skip memory, stride 0 for the operands in ``broadcast``) against float64 matmul;
    memory of C outside its matrices stays untouched."""
    rng = np.random.default_rng(seed)

    def operand(name, rows, cols, transposed):
        stored = (cols, rows) if transposed else (rows, cols)
        shape = tuple(1 if name in broadcast else b for b in batch)
        big = make(rng.uniform(-1, 1, (*shape, stored[0] + 1, stored[1] + 2)),
                   out_dtype(dtype) if name == "c" else dtype)
        view = big[..., 1:, 2:]
        strides = tuple(0 if name in broadcast else s // view.itemsize
                        for s in view.strides[:-2])
        op = np.swapaxes(view, -1, -2) if transposed else view
        return big, view, strides, np.broadcast_to(op, (*batch, rows, cols))

    _, a, a_strides, op_a = operand("a", m, k, trans_a)
    _, b, b_strides, op_b = operand("b", k, n, trans_b)
    c_big, c, c_strides, _ = operand("c", m, n, False)
    c[...] = np.nan  # C is written without being read
    before = c_big.copy()
    call = blas.prepare_batched(dtype, trans_a, trans_b, m, n, k, ld(a[(0,) * len(batch)]),
                                ld(b[(0,) * len(batch)]), ld(c[(0,) * len(batch)]), batch,
                                a_strides, b_strides, c_strides, library)
    call(addr(a), addr(b), addr(c))
    expected = wide(op_a, dtype) @ wide(op_b, dtype)
    tol = tolerance(dtype, k)
    np.testing.assert_allclose(c.astype(np.float64), expected, rtol=tol, atol=tol)
    mask = np.ones(c_big.shape, bool)
    mask[..., 1:, 2:] = False
    np.testing.assert_array_equal(c_big[mask], before[mask])


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True),
                                             (True, True)])
@pytest.mark.parametrize("batch,m,n,k", [((5,), 4, 3, 2), ((64,), 32, 32, 16),
                                         ((2, 3), 7, 5, 9), ((1,), 1, 1, 1)])
@pytest.mark.parametrize("library", ["openblas", "mkl"])
def test_batched_gemm_matches_numpy(request, library, dtype, trans_a, trans_b, batch, m, n,
                                    k):
    if library == "mkl":
        request.getfixturevalue("mkl")
    batched(dtype, trans_a, trans_b, batch, m, n, k, library=library)


@pytest.mark.parametrize("broadcast", [("a",), ("b",)])
@pytest.mark.parametrize("library", ["openblas", "mkl"])
def test_batched_gemm_with_a_shared_operand(request, library, broadcast):
    if library == "mkl":
        request.getfixturevalue("mkl")
    batched("f32", False, True, (3, 2), 6, 4, 5, broadcast=broadcast, library=library)


def test_batched_products_go_to_mkls_batch_entry(mkl, monkeypatch):
    """With torch imported a batch is one call of MKL's ``cblas_?gemm_batch`` (each
    matrix's address from the batch strides, row-major over the batch indices), on
    set_blas_threads' count as a setting of the calling thread that it puts back; without
    the entry, or with k = 0, NumPy's loop over OpenBLAS."""
    used = []
    real = blas._prepare_mkl_batched
    monkeypatch.setattr(blas, "_prepare_mkl_batched",
                        lambda *args: used.append(args[11]) or real(*args))
    batched("f32", True, True, (2, 3), 7, 5, 9)
    (offsets,) = used  # A's, B's and C's, one per matrix, increasing (positive strides)
    assert [len(o) for o in offsets] == [6, 6, 6]
    assert all((np.diff(o.astype(np.int64)) > 0).all() for o in offsets)
    batched("f32", False, False, (3,), 4, 5, 0)  # k = 0: C set to zero, no product
    assert len(used) == 1
    seen = []
    set_local = mkl.set_local_threads
    monkeypatch.setattr(blas, "_mkl_state", blas._Mkl(
        mkl.path, mkl.sgemm, mkl.dgemm, lambda n: seen.append(n) or set_local(n),
        mkl.sgemm_batch, mkl.dgemm_batch))
    before = blas.blas_threads()
    setting = set_local(3)
    try:
        blas.set_blas_threads(1)
        batched("f64", False, True, (4,), 3, 3, 3)
        assert seen == [1, 3] and len(used) == 2
    finally:
        set_local(setting)
        blas.set_blas_threads(before)
    monkeypatch.setattr(blas, "_mkl_state", blas._Mkl(mkl.path, mkl.sgemm, mkl.dgemm,
                                                       mkl.set_local_threads))
    batched("f32", False, True, (4,), 3, 3, 3)
    assert len(used) == 2


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("library", ["openblas", "mkl"])
def test_half_precision_products_into_float32(request, library, dtype):
    """f16/bf16 matrices multiply into a float32 C: through MKL's mixed-precision entry
    with torch imported, else (``"openblas"``) as float32 products of widened copies;
    sub-blocks, alpha and beta, k = 0, and batches (a loop of single products)."""
    if library == "mkl":
        mkl = request.getfixturevalue("mkl")
        if dtype not in dict(mkl.half_gemm):
            pytest.skip(f"this MKL has no {dtype} product")
    for trans_a, trans_b in ((False, False), (True, False), (False, True), (True, True)):
        for m, n, k in ((1, 1, 1), (7, 5, 3), (65, 33, 130)):
            check(dtype, trans_a, trans_b, m, n, k, library=library)
        check(dtype, trans_a, trans_b, 9, 6, 11, alpha=-0.5, beta=3.0, pad=4,
              library=library)
        batched(dtype, trans_a, trans_b, (2, 3), 7, 5, 9, library=library)
    batched(dtype, False, True, (3, 2), 6, 4, 5, broadcast=("a",), library=library)
    c = np.full((4, 5), 3.0, np.float32)
    blas.prepare(dtype, False, False, 4, 5, 0, 1.0, 1, 5, 2.0, 5, library)(1, 1, addr(c))
    assert (c == 6.0).all()  # k = 0: C scaled by beta, no product
    batched(dtype, False, False, (3,), 4, 5, 0, library=library)


def test_batched_gemm_with_k_zero_writes_zeros():
    batched("f64", False, False, (3,), 4, 5, 0)


def test_batched_gemm_edge_cases():
    c = np.full((2, 3, 3), 7.0)
    p = addr(c)
    for batch, m in (((0,), 3), ((2,), 0)):  # empty batch or empty matrices: nothing runs
        blas.prepare_batched("f64", False, False, m, 3, 3, 3, 3, 3, batch, (9,), (9,),
                             (9,))(p, p, p)
    assert (c == 7.0).all()
    # no batch dimension: one product, as prepare's
    a = np.arange(6.0).reshape(2, 3)
    out = np.empty((2, 2))
    blas.prepare_batched("f64", False, True, 2, 2, 3, 3, 3, 2, (), (), (), ())(
        addr(a), addr(a), addr(out))
    np.testing.assert_allclose(out, a @ a.T)


def test_batched_gemm_argument_errors():
    p = addr(np.zeros(4, np.float32))
    with pytest.raises(ShapeError, match="one per batch dimension"):
        blas.prepare_batched("f32", False, False, 2, 2, 2, 2, 2, 2, (3,), (4,), (4,), ())
    with pytest.raises(ShapeError, match=">= 0"):
        blas.prepare_batched("f32", False, False, 2, 2, 2, 2, 2, 2, (-1,), (4,), (4,), (4,))
    with pytest.raises(ShapeError, match="lda=1 < 2"):
        blas.prepare_batched("f32", False, False, 2, 2, 2, 1, 2, 2, (3,), (4,), (4,), (4,))
    with pytest.raises(DTypeError, match="i32"):
        blas.prepare_batched("i32", False, False, 2, 2, 2, 2, 2, 2, (3,), (4,), (4,), (4,))
    call = blas.prepare_batched("f32", False, False, 2, 2, 2, 2, 2, 2, (3,), (4,), (4,), (4,))
    with pytest.raises(HologramError, match="null address"):
        call(p, 0, p)


@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm_step_runs_a_batched_product_from_a_pointer_array(trans_b):
    """The cpu backend's GEMM step (gemm.step) on a step description as library_calls
    writes it: operands at offsets into their buffers, one batch dimension, and C's rows
    padded; compared with float64 NumPy."""
    import ctypes

    from hologram.backends.cpu import gemm

    rng = np.random.default_rng(1)
    batch, m, n, k = 4, 3, 5, 2
    a = rng.uniform(-1, 1, 2 + batch * m * k).astype(np.float32)  # 2 elements before A
    b_shape = (batch, n, k) if trans_b else (batch, k, n)
    b = rng.uniform(-1, 1, b_shape).astype(np.float32)
    c = np.full((batch, m, n + 1), np.nan, np.float32)
    step = {"dtype": "f32", "batch": [batch], "m": m, "n": n, "k": k,
            "a": [0, 2, [m * k], False, k], "b": [1, 0, [n * k], trans_b, k if trans_b else n],
            "c": [2, 0, [m * (n + 1)], False, n + 1]}
    pointers = (ctypes.c_void_p * 3)(addr(a), addr(b), addr(c))
    gemm.step(step)(pointers, None)
    op_a = a[2:].reshape(batch, m, k).astype(np.float64)
    op_b = np.swapaxes(b, 1, 2) if trans_b else b
    np.testing.assert_allclose(c[..., :n], op_a @ op_b.astype(np.float64), rtol=1e-5,
                               atol=1e-6)
    assert np.isnan(c[..., n]).all()  # the padding is not written
