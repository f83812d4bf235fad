"""hg.jit: traced functions equal eager ops, fuse, cache by signature, and refuse what a
trace cannot express."""

from __future__ import annotations

import numpy as np
import pytest

import hologram as hg
from hologram import backends
from hologram.compiler import pipeline
from hologram.errors import HologramError, InvalidBufferError, ShapeError
from hologram.isa import dtypes as dt

ops = hg.ops
# every registered backend that runs here (device memory too: executors copy in and out)
BACKENDS = backends.available()


@pytest.fixture(scope="module", params=BACKENDS)
def ex(request):
    with hg.Executor(request.param) as executor:
        yield executor


def rand(shape, dtype=np.float32, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 2).astype(dtype)


def kernels(program) -> int:
    return len(pipeline.lower(pipeline.canonical_form(program)).kernels)


def same(got, want, rtol=1e-6, atol=1e-7):
    assert isinstance(got, hg.Buffer)
    want = want.to_numpy() if isinstance(want, hg.Buffer) else np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype,
                                                                 want.shape, want.dtype)
    np.testing.assert_allclose(got.to_numpy(), want, rtol=rtol, atol=atol, equal_nan=True)


class Counter:
    """Wraps a function and counts how often Python runs it (how often jit traces)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0
        self.__name__ = fn.__name__

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


def test_relu_fma_is_one_kernel_and_matches_eager(ex):
    def f(a, b, c):
        return ops.relu(a * b + c)

    fused = hg.jit(f)
    a, b, c = (ex.from_numpy(rand((37, 129), seed=i)) for i in range(3))
    same(fused(a, b, c), f(a, b, c), rtol=0, atol=0)
    assert kernels(fused.trace(a, b, c)) == 1
    x = rand((37, 129), seed=0) * rand((37, 129), seed=1) + rand((37, 129), seed=2)
    same(fused(a, b, c), np.maximum(x, 0))


@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (4, 5), (300_007,)])
def test_shapes(ex, shape):
    fused = hg.jit(lambda a, b: ops.sigmoid(a) * b - 1.5)
    a, b = ex.from_numpy(rand(shape, seed=1)), ex.from_numpy(rand(shape, seed=2))
    same(fused(a, b), ops.sigmoid(a) * b - 1.5)


def test_many_ops_match_eager(ex):
    def f(x, y, w):
        h = ops.gelu(ops.matmul(x, w), approximate="tanh")
        s = ops.softmax(h, dim=-1)
        m = ops.mean(s * y, dim=1, keepdim=True)
        z = ops.clip(ops.exp(-abs(h)) / 2, 0.1, max=0.4) + ops.clip(h, max=0.0)
        return ops.sum(z, dim=0), m, ops.max(h), ops.tanh(ops.sqrt(abs(h)) ** 2)

    x, w, y = rand((8, 16), seed=1), rand((16, 12), seed=2), rand((8, 12), seed=3)
    X, W, Y = ex.from_numpy(x), ex.from_numpy(w), ex.from_numpy(y)
    got = hg.jit(f)(X, Y, W)
    want = f(X, Y, W)
    assert isinstance(got, tuple) and len(got) == 4
    for g, w_ in zip(got, want):
        same(g, w_, rtol=1e-5, atol=1e-6)


def test_losses_and_reductions_in_jit(ex):
    def f(logits, labels, p, t):
        return [ops.cross_entropy_loss(logits, labels), ops.mse_loss(p, t, reduction="sum"),
                ops.binary_cross_entropy_loss(ops.sigmoid(p), ops.relu(t) / 10,
                                              reduction="none"),
                ops.sum(labels), ops.min(logits, dim=0)]

    logits = ex.from_numpy(rand((6, 5), seed=1))
    labels = ex.from_numpy(np.array([0, 4, 2, 1, 1, 3], np.int32))
    p, t = ex.from_numpy(rand(9, seed=2)), ex.from_numpy(rand(9, seed=3))
    got = hg.jit(f)(logits, labels, p, t)
    assert isinstance(got, list) and len(got) == 5
    for g, w in zip(got, f(logits, labels, p, t)):
        same(g, w, rtol=1e-5, atol=1e-6)


def test_dtypes_and_promotion(ex):
    def f(i, h):
        return i + 1, i * 0.5, i / 2, ops.sum(i), h + i, ops.exp(i), -h

    i = ex.from_numpy(np.arange(-3, 5, dtype=np.int16))
    h = ex.from_numpy(rand(8, np.float16, 1))
    got = hg.jit(f)(i, h)
    want = f(i, h)
    for g, w in zip(got, want):
        same(g, w, rtol=1e-3, atol=1e-3)
    assert [g.dtype for g in got] == [np.int16, np.float32, np.float32, np.int64, np.float16,
                                      np.float32, np.float16]


def test_gemm_and_matvec_in_jit(ex):
    def f(a, b, v):
        c = ops.gemm(a, b, m=3, n=4, k=5)
        return ops.relu(c) + 1, ops.matvec(a, v, m=3, n=5)

    a = ex.from_numpy(rand(15, seed=1))
    b = ex.from_numpy(rand((5, 4), seed=2))
    v = ex.from_numpy(rand(5, seed=3))
    got = hg.jit(f)(a, b, v)
    A = a.to_numpy().reshape(3, 5)
    same(got[0], np.maximum(A @ b.to_numpy(), 0) + 1, rtol=1e-5, atol=1e-6)
    same(got[1], A @ v.to_numpy(), rtol=1e-5, atol=1e-6)


def test_operators_and_reversed_scalars(ex):
    def f(a, b):
        return 2 - a, 3 / b, 2 ** a, a ** 2, a @ b, abs(-a), 1 + a * 2

    a, b = ex.from_numpy(rand((3, 3), seed=1)), ex.from_numpy(rand((3, 3), seed=2) + 5)
    for g, w in zip(hg.jit(f)(a, b), f(a, b)):
        same(g, w, rtol=1e-5, atol=1e-6)


def test_reshape_inside_trace(ex):
    def f(a):
        return ops.sum(a.reshape(3, 4), dim=1), a.reshape((2, 6)) * 2, a.reshape(-1, 2) + 0

    x = rand(12, seed=1)
    got = hg.jit(f)(ex.from_numpy(x))
    same(got[0], x.reshape(3, 4).sum(1), rtol=1e-6)
    same(got[1], x.reshape(2, 6) * 2)
    same(got[2], x.reshape(6, 2))


def test_caching_by_signature(ex):
    counter = Counter(lambda a, b: ops.relu(a * b))
    fused = hg.jit(counter)
    a, b = ex.from_numpy(rand(10, seed=1)), ex.from_numpy(rand(10, seed=2))
    fused(a, b)
    fused(a, b)
    fused(ex.from_numpy(rand(10, seed=3)), b)  # same shapes and dtypes: no retrace
    assert counter.calls == 1
    fused(ex.from_numpy(rand(11, seed=3)), ex.from_numpy(rand(11, seed=4)))  # new shape
    assert counter.calls == 2
    same(fused(a.reshape(2, 5), b.reshape(2, 5)), ops.relu(a * b).reshape(2, 5))
    assert counter.calls == 3
    wide = np.float64 if backends.get(ex.backend).supports("mul", dt.float64) else np.float16
    fused(ex.from_numpy(rand(10, wide, 1)), b)  # new dtype (webgpu has no f64)
    assert counter.calls == 4
    fused(a, b)
    assert counter.calls == 4
    other = hg.Executor(next(name for name in BACKENDS if name != ex.backend))
    same(fused(other.from_numpy(a.to_numpy()), other.from_numpy(b.to_numpy())),
         ops.relu(a * b))  # another backend: a new program
    assert counter.calls == 5
    other.close()


def test_scalars_are_constants(ex):
    counter = Counter(lambda a, s: a * s + 1)
    fused = hg.jit(counter)
    a = ex.from_numpy(rand(6, seed=1))
    same(fused(a, 2.0), a * 2.0 + 1)
    same(fused(a, 2.0), a * 2.0 + 1)
    assert counter.calls == 1
    same(fused(a, 3.0), a * 3.0 + 1)
    assert counter.calls == 2
    same(fused(a, 3), a * 3 + 1)  # an int is another constant than 3.0 (type in the key)
    assert counter.calls == 3
    i = ex.from_numpy(np.arange(6, dtype=np.int32))
    same(fused(i, 2), i * 2 + 1)
    same(fused(i, 0.5), i * 0.5 + 1)
    assert fused(i, 0.5).dtype == np.float32
    same(fused(i, True), i * True + 1)
    kw = hg.jit(lambda a, approximate: ops.gelu(a, approximate=approximate))
    same(kw(a, "tanh"), ops.gelu(a, approximate="tanh"))
    same(kw(a, "none"), ops.gelu(a))


def test_numpy_scalar_constants(ex):
    fused = hg.jit(lambda a, s: a + s)
    a = ex.from_numpy(rand(4, seed=1))
    same(fused(a, np.float32(1.5)), a + 1.5)
    same(fused(a, np.int64(2)), a + 2)


def test_results_are_fresh_buffers(ex):
    fused = hg.jit(lambda a: a + 1)
    a = ex.from_numpy(rand(5, seed=1))
    r1, r2 = fused(a), fused(a)
    assert r1.to_numpy().ctypes.data != r2.to_numpy().ctypes.data
    r1.from_numpy(np.zeros(5, np.float32))
    same(r2, a + 1)


def test_return_an_argument_unchanged_and_duplicates(ex):
    a = ex.from_numpy(rand(5, seed=1))
    r = hg.jit(lambda x: x)(a)  # an argument returned as is: a new buffer with its values
    same(r, a)
    r.from_numpy(np.zeros(5, np.float32))
    same(a, rand(5, seed=1))
    fused = hg.jit(lambda x: (x + 1, x + 1))
    r1, r2 = fused(a)
    same(r1, a + 1)
    same(r2, a + 1)
    twice = hg.jit(lambda x: (lambda y: (y, y))(x * 2))
    r1, r2 = twice(a)
    same(r1, a * 2)
    same(r2, a * 2)
    assert r1.to_numpy().ctypes.data != r2.to_numpy().ctypes.data


def test_errors(ex):
    a = ex.from_numpy(rand(5, seed=1))
    captured = ex.from_numpy(rand(5, seed=2))
    out = ex.allocate(5)

    with pytest.raises(HologramError, match="out"):
        hg.jit(lambda x: ops.vector_add(x, x, out=out))(a)
    with pytest.raises(HologramError, match="out"):
        hg.jit(lambda x: ops.vector_add(ex, x, x, out))(a)
    with pytest.raises(HologramError):
        hg.jit(lambda x: ops.softmax(x, out=out))(a)
    with pytest.raises(HologramError):
        hg.jit(lambda x: ops.sum(x, out=out))(a)
    with pytest.raises(HologramError):
        hg.jit(lambda x: 3)(a)
    with pytest.raises(HologramError):
        hg.jit(lambda x: None)(a)
    with pytest.raises(HologramError):
        hg.jit(lambda x: ())(a)
    with pytest.raises(HologramError):
        hg.jit(lambda x: (x + 1, 2))(a)
    with pytest.raises(HologramError, match="in place"):
        hg.jit(lambda x: ops.fill(x, 2.0))(a)
    with pytest.raises(HologramError, match="out"):
        hg.jit(lambda x, y: ops.copy(x, y))(a, out)
    with pytest.raises(HologramError, match="captured"):
        hg.jit(lambda x: x + captured)(a)
    with pytest.raises(HologramError, match="captured"):
        hg.jit(lambda x: ops.vector_mul(captured, x))(a)
    with pytest.raises(HologramError):
        hg.jit(lambda x: ops.gemm(x.reshape(1, 5), captured.reshape(5, 1)))(a)
    with pytest.raises(HologramError):
        hg.jit(lambda x: captured + 1)(a)  # eager op, then a non-traced result
    with pytest.raises(HologramError, match="tracing"):
        hg.jit(lambda x: ex.from_numpy(x.to_numpy()))(a)
    with pytest.raises(HologramError):
        hg.jit(lambda x: x + float(np.asarray(x).sum()))(a)
    with pytest.raises(HologramError):
        hg.jit(lambda x: x + 1)(3.0)
    with pytest.raises(HologramError):
        hg.jit(lambda x, s: x + 1)(a, [1, 2])
    with pytest.raises(ShapeError):
        hg.jit(lambda x, y: x + y)(a, ex.allocate(4))
    with pytest.raises(ShapeError):
        hg.jit(lambda x: ops.softmax(x, dim=3))(a)
    other = hg.Executor(ex.backend)
    with pytest.raises(InvalidBufferError):
        hg.jit(lambda x, y: x + y)(a, other.allocate(5))
    other.close()
    freed = ex.allocate(5)
    freed.free()
    with pytest.raises(InvalidBufferError):
        hg.jit(lambda x: x + 1)(freed)


def test_failed_trace_leaves_no_entry(ex):
    state = {"fail": True}

    def f(x):
        if state["fail"]:
            raise ValueError("boom")
        return x * 3

    fused = hg.jit(f)
    a = ex.from_numpy(rand(4, seed=1))
    with pytest.raises(ValueError):
        fused(a)
    state["fail"] = False
    same(fused(a), a * 3)


def test_nested_jit(ex):
    inner = hg.jit(lambda x: ops.relu(x) * 2)
    outer = hg.jit(lambda x, y: inner(x) + y)
    a, b = ex.from_numpy(rand(6, seed=1)), ex.from_numpy(rand(6, seed=2))
    same(outer(a, b), ops.relu(a) * 2 + b)  # inlined into outer's trace
    assert kernels(outer.trace(a, b)) == 1
    assert inner.compiled_signatures == 0
    same(inner(a), ops.relu(a) * 2)


def test_n_inside_jit(ex):
    fused = hg.jit(lambda x, y: ops.vector_add(x, y, n=3))
    a, b = ex.from_numpy(rand(6, seed=1)), ex.from_numpy(rand(6, seed=2))
    same(fused(a, b), (a.to_numpy() + b.to_numpy())[:3])
    m = hg.jit(lambda x: ops.sum(x, n=4))
    same(m(a.reshape(2, 3)), a.to_numpy()[:4].sum(), rtol=1e-6)
    with pytest.raises(ShapeError):
        hg.jit(lambda x: ops.vector_neg(x, n=7))(a)
    with pytest.raises(ShapeError):
        hg.jit(lambda x: ops.softmax(x, None, 2))(a)


def test_trace_returns_program(ex):
    fused = hg.jit(lambda a, b: ops.softmax(a * b, dim=-1))
    a, b = ex.from_numpy(rand((4, 9), seed=1)), ex.from_numpy(rand((4, 9), seed=2))
    program = fused.trace(a, b)
    assert [p.kind for p in program.params].count("out") == 1
    assert kernels(program) == 1
    assert "1 compiled" not in repr(fused)
    fused(a, b)
    assert "1 compiled" in repr(fused)
    assert fused.__name__ == "<lambda>"


def test_input_output_aliasing_not_reused(ex):
    """Calling a jitted function with the same buffer twice, and with overlapping views."""
    fused = hg.jit(lambda x, y: x * 2 + y)
    a = ex.from_numpy(rand(8, seed=1))
    same(fused(a, a), a * 3, rtol=1e-6)
    same(fused(a.reshape(2, 4), a.reshape(2, 4)), (a * 3).reshape(2, 4), rtol=1e-6)


def test_jit_of_a_jit_function_and_callable_objects(ex):
    """jit copies only the name and docstring of what it wraps: a wrapped object's own
    attributes (here ``fn``, and another JitFunction's cache) must not replace jit's."""
    inner = hg.jit(lambda x: x + 1)
    outer = hg.jit(inner)
    a = ex.from_numpy(rand(3, seed=1))
    same(outer(a), a + 1)
    assert outer.compiled_signatures == 1 and inner.compiled_signatures == 0


def test_float_constants_by_bits(ex):
    """-0.0 == 0.0 and nan != nan: constants must still select (and reuse) their program."""
    counter = Counter(lambda a, s: a * s)
    fused = hg.jit(counter)
    a = ex.from_numpy(np.array([1.0, -2.0], np.float32))
    assert not np.signbit(fused(a, 0.0).to_numpy()[0])
    assert np.signbit(fused(a, -0.0).to_numpy()[0])
    assert not np.signbit(fused(a, (0.0, 1)[0]).to_numpy()[0])
    assert counter.calls == 2
    assert np.isnan(fused(a, float("nan")).to_numpy()).all()
    assert np.isnan(fused(a, float("nan")).to_numpy()).all()
    assert counter.calls == 3
    tup = hg.jit(lambda x, t: x * t[0])
    assert np.signbit(tup(a, (-0.0,)).to_numpy()[0])
    assert not np.signbit(tup(a, (0.0,)).to_numpy()[0])


def test_empty_results(ex):
    fused = hg.jit(lambda x: (ops.softmax(x, dim=1), ops.sum(x, dim=1), ops.exp(x)))
    s, t, e = fused(ex.allocate((3, 0)))
    assert s.shape == (3, 0) and e.shape == (3, 0)
    same(t, np.zeros(3, np.float32))
    s, = hg.jit(lambda x: (ops.softmax(x, dim=1),))(ex.allocate((3, 0)))
    assert s.shape == (3, 0)


# --- keyword arguments and in-place writes (issue 16, part 6) ---------------------------

def test_keyword_arguments_bind_like_the_function(ex):
    counted = Counter(lambda a, b, scale=2.0: a * scale + b)

    def f(a, b, scale=2.0):
        return counted(a, b, scale)

    fused = hg.jit(f)
    a, b = ex.from_numpy(rand(6, seed=1)), ex.from_numpy(rand(6, seed=2))
    want = a.to_numpy() * 2 + b.to_numpy()
    same(fused(a, b=b), want)
    same(fused(b=b, a=a), want)
    same(fused(a, b), want)
    assert counted.calls == 1  # by keyword or by position: one signature
    same(fused(a, b, scale=3.0), a.to_numpy() * 3 + b.to_numpy())
    assert counted.calls == 2  # a keyword constant is part of the signature like any other
    with pytest.raises(TypeError, match=r"f\(\).*'b'"):
        fused(a, c=b)
    with pytest.raises(TypeError, match=r"f\(\)"):
        fused(a, b, a=a)


def test_keyword_only_and_var_keyword_arguments(ex):
    @hg.jit
    def shifted(x, *, shift, scale=1.0):
        return x * scale + shift

    a = ex.from_numpy(rand(5, seed=3))
    same(shifted(a, shift=1.5), a.to_numpy() + 1.5)
    same(shifted(a, scale=2.0, shift=0.5), a.to_numpy() * 2 + 0.5)
    with pytest.raises(TypeError, match="shift"):
        shifted(a)

    @hg.jit
    def doubled(**buffers):
        return tuple(v * 2.0 for v in buffers.values())

    b = ex.from_numpy(rand(5, seed=4))
    x, y = doubled(first=a, second=b)
    same(x, a.to_numpy() * 2)
    same(y, b.to_numpy() * 2)
    y, x = doubled(second=b, first=a)  # results in the call's order, as eagerly
    same(x, a.to_numpy() * 2)
    same(y, b.to_numpy() * 2)
    program = doubled.trace(first=a, second=b)
    assert len(program.params) == 4


def test_keyword_arguments_inside_another_trace(ex):
    inner = hg.jit(lambda x, y, *, k=1.0: x * k + y)
    outer = hg.jit(lambda a, b: inner(a, y=b, k=3.0))
    a, b = ex.from_numpy(rand(7, seed=5)), ex.from_numpy(rand(7, seed=6))
    same(outer(a, b), a.to_numpy() * 3 + b.to_numpy())
    assert kernels(outer.trace(a, b)) == 1


@pytest.mark.parametrize("write", [
    lambda x: x.fill(1.0),
    lambda x: ops.fill(x, 1.0),
    lambda x: x.copy_from(x),
    lambda x: x.from_numpy(np.zeros(5, np.float32)),
])
def test_in_place_writes_inside_jit_explain_what_to_do(ex, write):
    def f(x):
        write(x)
        return x + 1

    a = ex.from_numpy(rand(5, seed=7))
    with pytest.raises(HologramError) as info:
        hg.jit(f)(a)
    message = str(info.value)
    for part in ("in place", "hg.jit", "[5] float32", "before calling the function",
                 "Python numbers"):
        assert part in message, (part, message)
    assert not isinstance(info.value, AttributeError)
