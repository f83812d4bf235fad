"""Advanced indexing on the device against PyTorch on the CPU: ``x[idx]`` (``index.Tensor``
with one or several index tensors, ``None``/slices between them, broadcasting),
``index_select``, ``torch.gather`` and ``embedding`` — each one ISA gather. Values bit for
bit in every dtype (NaN, -0.0 included), int32 and int64 indices, negative ones, empty,
0-d and non-contiguous operands, PyTorch's exceptions and messages for indices out of
range (raised before anything is launched), embedding's gradient (natively, from the
index sorted on the host), gradients, and that the calls ran natively."""

from __future__ import annotations

import contextlib
import math
import warnings

import pytest

torch = pytest.importorskip("torch")
import hologram_torch  # noqa: E402

D = "hologram"
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
          torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
INDEX_DTYPES = (torch.int64, torch.int32)


def make(shape, dtype, seed=0):
    """Random values with the float specials (NaN, ±inf, -0.0) in the first elements."""
    g = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g).to(dtype)
        flat = x.view(-1)
        specials = torch.tensor([math.nan, -0.0, math.inf, -math.inf]).to(dtype)
        flat[: min(4, flat.numel())] = specials[: min(4, flat.numel())]
        return x
    low = 0 if dtype is torch.uint8 else -100
    return torch.randint(low, 100, shape, generator=g, dtype=dtype)


def dev(x):
    if isinstance(x, (list, tuple)):
        return type(x)(map(dev, x))
    return x.to(D) if isinstance(x, torch.Tensor) else x


@contextlib.contextmanager
def fallbacks():
    """Yields the list of ops that ran through the CPU fallback inside the block."""
    hologram_torch.reset_fallback_stats()
    ran: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hologram_torch.FallbackWarning)
        yield ran
    ran.extend(hologram_torch.fallback_stats())


def same_bits(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.device.type == D
    a = actual.cpu()
    assert a.dtype == expected.dtype and a.shape == expected.shape
    if expected.is_floating_point():
        nan = expected.isnan()
        assert torch.equal(a.isnan(), nan)
        width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[expected.element_size()]
        assert torch.equal(a[~nan].view(width), expected[~nan].view(width))  # -0.0 too
    else:
        assert torch.equal(a, expected)


def native_same(fn, *args):
    """``fn`` on the device equals ``fn`` on the CPU bit for bit, with no fallback."""
    expected = fn(*args)
    with fallbacks() as ran:
        actual = fn(*dev(args))
    same_bits(actual, expected)
    assert not ran, f"fell back to the CPU: {ran}"


# --- values -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_every_dtype(dtype, index_dtype):
    x = make((6, 5, 4), dtype)
    i = torch.tensor([[0, 5, -1], [-6, 2, 2]], dtype=index_dtype)  # duplicates, negatives
    j = torch.tensor([3, -4, 0], dtype=index_dtype)  # in range for dimensions 1 and 2
    native_same(lambda x, i: x[i], x, i)
    native_same(lambda x, i, j: x[i, j], x, i, j)  # broadcast to [2, 3]
    native_same(lambda x, i, j: x[i, :, j], x, i, j)  # non-adjacent: the batch goes first
    native_same(lambda x, j: x[:, j], x, j)
    native_same(lambda x, j: x[..., j], x, j)
    sel = torch.tensor([3, 0, 0, 4], dtype=index_dtype)
    native_same(lambda x, s: x.index_select(1, s), x, sel)
    if index_dtype is torch.int64:  # torch.gather takes int64 only
        g = torch.randint(0, 5, (6, 3, 4), generator=torch.Generator().manual_seed(1))
        native_same(lambda x, g: torch.gather(x, 1, g), x, g)
    if dtype.is_floating_point:  # embedding tables are floats (torch: any dtype)
        table = make((10, 7), dtype, seed=2)
        ids = torch.tensor([[9, 0, 3], [3, 3, 1]], dtype=index_dtype)
        native_same(torch.nn.functional.embedding, ids, table)


@pytest.mark.parametrize("case", ["transposed", "sliced", "expanded_index", "strided_index"])
def test_non_contiguous_operands(case):
    x = make((7, 8, 3), torch.float32, seed=3)
    i = torch.tensor([6, 0, -2, 3])
    if case == "transposed":
        native_same(lambda x, i: x.transpose(0, 2)[:, i], x, i)
    elif case == "sliced":
        native_same(lambda x, i: x[1::2, 1:][i, 2:], x, i.remainder(3))
    elif case == "expanded_index":
        native_same(lambda x, i: x[i.expand(3, 4), i[:3].view(3, 1)], x, i)
    else:
        wide = torch.tensor([[6, 9, 0, 9], [2, 9, -1, 9]])
        native_same(lambda x, w: x[w[:, ::2]], x, wide)
        native_same(lambda x, w: torch.nn.functional.embedding(w[:, ::2], x[:, :, 0]), x,
                    wide.remainder(7))


def test_empty_and_0d():
    x = make((4, 3), torch.float32)
    native_same(lambda x, i: x[i], x, torch.tensor([], dtype=torch.int64))
    native_same(lambda x, i: x[:, i], x, torch.zeros(0, 2, dtype=torch.int64))
    native_same(lambda x, i: x[i], x, torch.tensor(-2))  # a 0-d index
    native_same(lambda x, i: x[i, i], x, torch.tensor(1))
    native_same(lambda x, i: x.index_select(0, i), x, torch.tensor(3))
    native_same(lambda x, i: torch.gather(x, 1, i), x, torch.zeros(4, 0, dtype=torch.int64))
    native_same(lambda x, i: torch.gather(x, 0, i), torch.tensor(2.5), torch.tensor(0))
    native_same(lambda x, i: x.index_select(0, i), torch.tensor(-0.0), torch.tensor([0]))
    empty = torch.zeros(0, 3)
    native_same(lambda x, i: x[i], empty, torch.tensor([], dtype=torch.int64))
    native_same(torch.nn.functional.embedding, torch.zeros(2, 0, dtype=torch.int64),
                make((5, 3), torch.float32))


def test_large_lookup():
    table = make((5000, 64), torch.float32, seed=4)
    ids = torch.randint(-5000, 5000, (3, 700), generator=torch.Generator().manual_seed(5))
    native_same(lambda t, i: t[i], table, ids)
    native_same(torch.nn.functional.embedding, ids.remainder(5000), table)


# --- errors -----------------------------------------------------------------------------
def _error(fn, *args):
    """The exception fn raises, as (type, message)."""
    with pytest.raises(Exception) as info:
        fn(*args)
    return type(info.value), str(info.value)


@pytest.mark.parametrize("name, fn, args", [
    ("index high", lambda x, i: x[i], (torch.tensor([0, 4, 1]),)),
    ("index low", lambda x, i: x[i], (torch.tensor([-5]),)),
    ("index second dim", lambda x, i: x[:, i], (torch.tensor([[1], [3], [-4]]),)),
    ("two indices", lambda x, i, j: x[i, j], (torch.tensor([0, 1]), torch.tensor([2, 9]))),
    ("int32", lambda x, i: x[i], (torch.tensor([7], dtype=torch.int32),)),
    ("0-d", lambda x, i: x[i], (torch.tensor(4),)),
    ("index_select", lambda x, i: x.index_select(0, i), (torch.tensor([0, 4]),)),
    ("index_select negative", lambda x, i: x.index_select(1, i), (torch.tensor([-1]),)),
    ("gather", lambda x, i: torch.gather(x, 1, i), (torch.tensor([[0], [3]]),)),
    ("gather negative", lambda x, i: torch.gather(x, 0, i), (torch.tensor([[-1]]),)),
    ("embedding", lambda x, i: torch.nn.functional.embedding(i, x), (torch.tensor([[4]]),)),
    ("embedding negative", lambda x, i: torch.nn.functional.embedding(i, x),
     (torch.tensor([-1]),)),
])
def test_out_of_range_raises_pytorchs_error(name, fn, args):
    x = make((4, 3), torch.float32)
    expected = _error(fn, x, *args)
    with fallbacks() as ran:
        actual = _error(fn, *dev((x, *args)))
    assert actual == expected
    assert not ran  # raised by the check before launch, not counted as a fallback


# --- what stays on the fallback ----------------------------------------------------------
def test_masks_and_cpu_indices_fall_back_correctly():
    x = make((4, 3), torch.float32)
    mask = x.isnan().logical_not() & (x > 0)
    with fallbacks() as ran:
        got = dev(x)[dev(mask)]
    assert torch.equal(got.cpu(), x[mask]) and "aten.index.Tensor" in ran


@pytest.mark.parametrize("accumulate", [True, False])
def test_index_put_with_duplicates(accumulate):
    """index_put_ (``x[i] += v`` with repeated and negative indices, autograd's backward
    of ``x[i]``) runs on the CPU fallback: a native form (the index grouped on the host,
    then gathers and additions over every row) measured 2-4x slower than the CPU kernel,
    which touches only the indexed rows (docs/torch.md)."""
    x = make((6, 2, 3), torch.float32)
    i = torch.tensor([[1, 3, 1], [1, -1, 1]], dtype=torch.int32)
    v = make((2, 3, 2, 3), torch.float32, seed=7)
    expected = x.clone().index_put_((i.long(),), v, accumulate=accumulate)
    d = dev(x)
    with fallbacks() as ran:
        d.index_put_((dev(i),), dev(v), accumulate=accumulate)
    assert ran == ["aten._index_put_impl_.default"]
    if accumulate:
        torch.testing.assert_close(d.cpu(), expected, equal_nan=True)
    else:  # which duplicate wins is the CPU kernel's business: compare the other rows
        keep = torch.tensor([0, 2, 3, 4, 5])
        same_bits(d[dev(keep)], expected[keep])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16,
                                   torch.bfloat16], ids=str)
@pytest.mark.parametrize("padding_idx, scale", [(None, False), (2, False), (None, True),
                                                (0, True)])
@pytest.mark.parametrize("frequent", [False, True])
def test_embedding_backward(dtype, padding_idx, scale, frequent):
    """Duplicates (up to 16 of an index: natively, the terms added one by one; one index
    70 times: the CPU fallback, faster there), padding rows, the frequency scaling,
    against the CPU's embedding_dense_backward in float64 (the CPU adds float16/bfloat16
    rows in their own precision, the device in float32, so the device's result is the
    float64 one rounded, within one rounding of the format)."""
    g = torch.Generator().manual_seed(8)
    ids = torch.cat([torch.randint(0, 40, (130,), generator=g),
                     torch.full((70 if frequent else 6,), 2)])
    ids = ids[torch.randperm(ids.numel(), generator=g)].view(-1, 2)
    grad = torch.randn(ids.shape[0], 2, 16, generator=g).to(dtype)
    args = (40, -1 if padding_idx is None else padding_idx, scale)
    expected = torch.ops.aten.embedding_dense_backward(grad.double(), ids, *args).to(dtype)
    with fallbacks() as ran:
        actual = torch.ops.aten.embedding_dense_backward(dev(grad), dev(ids), *args)
    # (a frequent padding index is dropped before the terms are counted: native)
    fallback = frequent and padding_idx != 2
    assert ran == (["aten.embedding_dense_backward.default"] if fallback else [])
    tol = {torch.float16: (1e-3, 1e-3), torch.bfloat16: (1e-2, 8e-3)}.get(dtype, (1e-5, 1e-5))
    # (the CPU kernel's half-precision sums of 70 terms: a few roundings off)
    torch.testing.assert_close(actual.cpu(), expected, atol=tol[0] * (4 if fallback else 1),
                               rtol=tol[1] * (4 if fallback else 1))
    if padding_idx is not None:
        assert not actual.cpu()[padding_idx].any()


@pytest.mark.parametrize("case", ["index", "two indices", "index_select", "gather",
                                  "embedding", "embedding padding"])
def test_gradients(case):
    fn, index = {
        "index": (lambda x, i: x[i], torch.tensor([[2, -1], [0, 2]])),
        "two indices": (lambda x, i: x[i, i], torch.tensor([3, 0, -2])),
        "index_select": (lambda x, i: x.index_select(1, i), torch.tensor([3, 3, 0])),
        "gather": (lambda x, i: torch.gather(x, 1, i), torch.tensor([[0, 3], [1, 1], [2, 0],
                                                                     [3, 3], [0, 0]])),
        "embedding": (lambda x, i: torch.nn.functional.embedding(i, x),
                      torch.tensor([[4, 0, 4], [1, 1, 2]])),
        "embedding padding": (lambda x, i: torch.nn.functional.embedding(i, x, padding_idx=1),
                              torch.tensor([[4, 0, 4], [1, 1, 2]])),
    }[case]
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(fn(x, index).shape, dtype=torch.float64)
    (fn(x, index) * w).sum().backward()
    xd = x.detach().to(D).requires_grad_()
    with fallbacks() as ran:
        (fn(xd, dev(index)) * dev(w)).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad)
    # Backward: embedding_dense_backward, index_add (index_select) and scatter_add
    # (gather) run natively; x[i]'s is index_put_, on the fallback.
    put = case in ("index", "two indices")
    assert ran == (["aten._index_put_impl_.default"] if put else []), ran


# --- torch.compile ----------------------------------------------------------------------
def test_compiled_lookups_are_one_program():
    """Under torch.compile(backend="hologram") the lookups lower through the same table:
    indexing with None between index tensors, index_select and an embedding of a table of
    100 rows join the arithmetic around them in one program."""
    from hologram_torch.compile import stats

    def f(x, i, j, w, ids):
        return ((x[i] * 2).sum(0) + x[:, j].sum(1)[:5] + x.index_select(0, i.abs()).mean()
                + torch.nn.functional.embedding(ids, w).sum(0).sum(0))

    g = torch.Generator().manual_seed(9)
    args = (torch.randn(6, 5, generator=g), torch.tensor([0, 5, -1, 2]), torch.tensor([4, 0]),
            torch.randn(100, 5, generator=g), torch.tensor([[3, 99], [0, 0]]))
    expected = f(*args)
    stats.reset_compile_stats()
    got = torch.compile(f, backend="hologram")(*args)
    torch.testing.assert_close(got, expected)
    s = stats.compile_stats()
    assert s["ops_eager"] == 0 and s["programs"] == 1, s


@pytest.mark.parametrize(("case", "bad"), [
    ("embedding", 100), ("embedding", -1), ("index", 6), ("index", -7),
    ("index_select", 6), ("gather", -7)])
def test_compiled_lookups_raise_on_indices_out_of_range(case, bad):
    """A compiled program's gathers clamp (docs/isa.md); the compiled region raises
    IndexError as eager PyTorch does instead of returning what the clamp read, and the
    same function with indices in range still computes."""
    fns = {
        "embedding": lambda x, w, i: torch.nn.functional.embedding(i, w) * 2,
        "index": lambda x, w, i: x[i] + 1,
        "index_select": lambda x, w, i: x.index_select(0, i) - 1,
        "gather": lambda x, w, i: torch.gather(x, 0, i.reshape(-1, 1).expand(-1, 5)) * 3,
    }
    from hologram_torch.compile import stats

    torch._dynamo.reset()
    stats.reset_compile_stats()
    f = torch.compile(fns[case], backend="hologram")
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(6, 5, generator=g), torch.randn(100, 4, generator=g)
    good = torch.tensor([0, 5, 2, 1])
    torch.testing.assert_close(f(x, w, good), fns[case](x, w, good))
    with pytest.raises(IndexError, match="out of"):
        f(x, w, torch.tensor([0, bad, 2, 1]))
    torch.testing.assert_close(f(x, w, good), fns[case](x, w, good))
    s = stats.compile_stats()
    assert s["ops_eager"] == 0 and s["programs"] == 1, s  # the program raised, not eager
    torch._dynamo.reset()
