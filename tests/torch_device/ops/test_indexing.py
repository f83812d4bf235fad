"""Advanced indexing on the device against PyTorch on the CPU: ``x[idx]`` (``index.Tensor``
with one or several index tensors, ``None``/slices between them, broadcasting),
``index_select``, ``torch.gather`` and ``embedding`` — each one ISA gather — and the
writes by index — ``index_put_`` (``x[idx] = v``, ``x[idx] += v``, ``x[mask] = v``),
``scatter``/``scatter_add``/``scatter_reduce``, ``index_add``, ``index_copy``,
``index_fill``, embedding's gradient — each one ISA scatter. Values bit for bit in every
dtype (NaN, -0.0 included), int32 and int64 indices, negative ones, duplicates, empty,
0-d and non-contiguous operands, PyTorch's exceptions and messages for indices out of
range (raised before anything is launched), gradients, and that the calls ran
natively."""

from __future__ import annotations

import contextlib
import math
import warnings

import pytest
from util import assert_same_outcome

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
    ran.extend(hologram_torch.fallback_stats(lacking=False))


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


# --- masks: their positions read on the host, then one gather ---------------------------
def test_masks_index_natively():
    x = make((4, 3), torch.float32)
    mask = x.isnan().logical_not() & (x > 0)
    with fallbacks() as ran:
        got = dev(x)[dev(mask)]
    assert torch.equal(got.cpu(), x[mask]) and not ran


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16,
                                   torch.bfloat16], ids=str)
@pytest.mark.parametrize("padding_idx, scale", [(None, False), (2, False), (None, True),
                                                (0, True)])
@pytest.mark.parametrize("frequent", [False, True])
def test_embedding_backward(dtype, padding_idx, scale, frequent):
    """Duplicates (one index 70 times too: the rows are added one by one in index order,
    one ISA scatter, at any multiplicity), padding rows, the frequency scaling, against
    the CPU's embedding_dense_backward in float64 and in the dtype itself (both add the
    rows in index order in the dtype: without scaling, the same bits)."""
    g = torch.Generator().manual_seed(8)
    ids = torch.cat([torch.randint(0, 40, (130,), generator=g),
                     torch.full((70 if frequent else 6,), 2)])
    ids = ids[torch.randperm(ids.numel(), generator=g)].view(-1, 2)
    grad = torch.randn(ids.shape[0], 2, 16, generator=g).to(dtype)
    args = (40, -1 if padding_idx is None else padding_idx, scale)
    expected = torch.ops.aten.embedding_dense_backward(grad.double(), ids, *args).to(dtype)
    with fallbacks() as ran:
        actual = torch.ops.aten.embedding_dense_backward(dev(grad), dev(ids), *args)
    assert ran == []
    tol = {torch.float16: (4e-3, 4e-3), torch.bfloat16: (4e-2, 3e-2)}.get(dtype, (1e-5, 1e-5))
    # (half-precision sums of up to 76 terms rounded after each: a few roundings off)
    torch.testing.assert_close(actual.cpu(), expected, atol=tol[0], rtol=tol[1])
    if not scale:  # the CPU kernel adds in the same order, in the same dtype
        same_bits(actual, torch.ops.aten.embedding_dense_backward(grad, ids, *args))
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
    # Backward: embedding_dense_backward, index_add (index_select), scatter_add (gather)
    # and index_put_ with accumulate (x[i]) run natively: ISA scatters.
    assert ran == [], ran


# --- writes by index: the ISA's scatter -----------------------------------------------------
def sequential_put(x, positions, values, accumulate):
    """``x[positions[k]] = values[k]`` (or ``+=``) one at a time in order, in x's dtype:
    the device's definition, for duplicates the CPU kernels leave unspecified."""
    out = x.clone()
    flat = out.view(-1)
    for p, v in zip(positions.reshape(-1).tolist(), values.reshape(-1)):
        flat[p] = flat[p] + v if accumulate else v
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_every_dtype(dtype, accumulate):
    """``x[i] = v``, ``x[i] += v`` (index_put_ with accumulate), with duplicate and
    negative indices, one and two index tensors, a slice between, broadcast values and a
    number: natively, as the CPU computes (ints and bools exactly; floats added in index
    order in their own precision, as the CPU kernel's serial loop)."""
    x = make((6, 5, 4), dtype)
    i = torch.tensor([[1, 3, 1], [-1, 0, 5]])  # duplicates: 1 twice, 5 and -1
    v = make((2, 3, 5, 4), dtype, seed=5)
    for values in (v, make((4,), dtype, seed=9)):  # duplicates: compared with the definition
        with fallbacks() as ran:
            got = dev(x).index_put_((dev(i),), dev(values), accumulate=accumulate)
        assert not ran, ran
        if accumulate:
            same_bits(got, x.clone().index_put_((i,), values, accumulate=True))
        pos = (i % 6).reshape(-1, 1) * 20 + torch.arange(20)
        if not accumulate or not dtype.is_floating_point:
            same_bits(got, sequential_put(x, pos, values.expand(2, 3, 5, 4), accumulate))

    def put(x, a, b, w):  # x[a, :, b] (+)= w, the index pairs distinct
        x = x.clone()
        if accumulate:
            x[a, :, b] += w
        else:
            x[a, :, b] = w
        return x

    native_same(put, x, torch.tensor([[0, 5, 2], [3, -1, 1]]),
                torch.tensor([[3, 0, -1], [1, 2, -4]]), make((2, 3, 5), dtype, seed=6))
    native_same(lambda x, i, j, w: x.index_put((i, j), w, accumulate=accumulate), x,
                torch.tensor([0, 5, 2]), torch.tensor([3, -1, 4]), make((3, 4), dtype, seed=8))
    native_same(lambda x, i: x.index_put((i,), torch.tensor(3).to(x.device, x.dtype),
                                         accumulate=accumulate), x, torch.tensor([4, 0, -1]))


def test_index_put_forms_and_masks():
    """What Python's indexing reaches: ``x[idx] = v``, ``x[idx] += v``, ``x[i, :, j] = v``,
    ``x[mask] = v`` and ``x[mask] = tensor`` (the mask turned into indices on the host),
    non-contiguous self, index and values."""
    x = make((7, 6, 5), torch.float32, seed=11)
    i = torch.tensor([6, 0, -2, 3, 0])
    mask = make((7, 6), torch.bool, seed=12)

    def assign(x, i, v):
        x = x.clone()
        x[i] = v
        return x

    def add(x, i, v):
        x = x.clone()
        x[i] += v
        return x

    def strided(x, i, v):
        x = x.transpose(0, 2).clone().transpose(0, 2)  # non-contiguous self
        x[i[::2], 1:, i[1::2].abs()] = v[:, ::2]  # strided index and values
        return x

    native_same(assign, x, i, make((5, 6, 5), torch.float32, seed=13))
    native_same(add, x, (i[:3].abs() + 1) % 7, make((6, 5), torch.float32, seed=14))
    native_same(strided, x, torch.tensor([0, 4, 6, 1, 3, 2]), make((3, 10), torch.float32))
    native_same(assign, x, mask, 2.5)
    native_same(assign, x, mask, make((int(mask.sum()), 5), torch.float32, seed=15))
    native_same(lambda x, m, v: assign(x, (slice(None), m), v), x, mask[0],
                make((7, int(mask[0].sum()), 5), torch.float32, seed=16))
    native_same(assign, x, torch.tensor([], dtype=torch.int64), 1.0)


_WRITE_OPS = {
    "scatter": lambda x, i, s: x.scatter(1, i, s),
    "scatter value": lambda x, i, s: x.scatter(1, i, 3),
    "scatter_add": lambda x, i, s: x.scatter_add(1, i, s),
    "scatter reduce add": lambda x, i, s: x.scatter(1, i, s, reduce="add"),
    "scatter reduce multiply": lambda x, i, s: x.scatter(1, i, s, reduce="multiply"),
    "index_add": lambda x, i, s: x.index_add(0, torch.tensor([4, 0, 4, 1, 0]).to(x.device),
                                             s.repeat(1, 2)),
    "index_add dim 1": lambda x, i, s: x.index_add(1, i[0], s[:, :3]),
    "index_fill": lambda x, i, s: x.index_fill(1, i[0] - 3, 7),
    **{f"scatter_reduce {r} {inc}": (lambda x, i, s, r=r, inc=inc: x.scatter_reduce(
        1, i, s, r, include_self=inc)) for r in ("sum", "prod", "mean", "amax", "amin")
       for inc in (True, False)},
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(_WRITE_OPS))
def test_scatters_every_dtype(name, dtype):
    """The scatter family with duplicates along ``dim`` (torch's CPU kernels: the last
    write wins, reductions in index order), natively, against the CPU."""
    if dtype is torch.bool and ("mean" in name or "multiply" in name or "prod" in name):
        pytest.skip("torch's CPU kernel has no such bool reduction")
    x = make((5, 6), dtype, seed=17)
    if dtype.is_floating_point and ("prod" in name or "multiply" in name):
        x = x.nan_to_num(1.0, 2.0, -2.0)  # products of infinities and zeros: NaN either way
    i = torch.randint(0, 6, (5, 3), generator=torch.Generator().manual_seed(18))
    s = make((5, 3), dtype, seed=19)
    fn = _WRITE_OPS[name]
    expected = fn(x, i, s)
    with fallbacks() as ran:
        got = fn(*dev((x, i, s)))
    assert not ran, ran
    if dtype in (torch.float16, torch.bfloat16) and ("mean" in name or "sum" in name):
        # torch's scatter_reduce sums half types in float32 (then rounds): within a rounding
        torch.testing.assert_close(got.cpu(), expected, atol=2e-2, rtol=2e-2, equal_nan=True)
    elif "amax" in name or "amin" in name:  # only the sign of a zero may differ (docs)
        torch.testing.assert_close(got.cpu(), expected, atol=0, rtol=0, equal_nan=True)
    else:
        same_bits(got, expected)


def test_scatters_take_int32_indices():
    """torch's scatter family takes int32 indices as well (its meta kernel rejects what
    its CPU kernel does)."""
    x = make((5, 6), torch.float32, seed=23)
    i = torch.randint(0, 6, (5, 3), generator=torch.Generator().manual_seed(24))
    s = make((5, 3), torch.float32, seed=25)
    for fn in (lambda x, i, s: x.scatter(1, i, s), lambda x, i, s: x.scatter_add(1, i, s),
               lambda x, i, s: x.scatter_reduce(1, i, s, "amax")):
        native_same(fn, x, i.int(), s)


def test_index_copy_and_duplicates_in_order():
    """index_copy with distinct indices as the CPU; with duplicates, the last copy wins
    (torch leaves the order unspecified)."""
    x = make((6, 4), torch.float64, seed=20)
    src = make((3, 4), torch.float64, seed=21)
    native_same(lambda x, i, s: x.index_copy(0, i, s), x, torch.tensor([5, 0, 2]), src)
    native_same(lambda x, i, s: x.index_copy(1, i, s.T), x, torch.tensor([3, 1]),
                make((2, 6), torch.float64, seed=22))  # a transposed source
    with fallbacks() as ran:
        got = dev(x).index_copy(0, dev(torch.tensor([2, 4, 2])), dev(src))
    assert not ran
    expected = x.clone()
    expected[4], expected[2] = src[1], src[2]
    same_bits(got, expected)


@pytest.mark.parametrize("name, fn, args", [
    ("index_put high", lambda x, i, v: x.index_put_((i,), v), (torch.tensor([0, 4]),
                                                               torch.tensor(1.0))),
    ("index_put low", lambda x, i, v: x.index_put_((i,), v, accumulate=True),
     (torch.tensor([-5]), torch.tensor(1.0))),
    ("index_put mask", lambda x, i, v: x.index_put_((i,), v), (torch.tensor([True, False]),
                                                               torch.tensor(1.0))),
    ("scatter", lambda x, i, v: x.scatter(1, i, v), (torch.tensor([[3]]), torch.ones(1, 1))),
    ("scatter negative", lambda x, i, v: x.scatter_add(0, i, v), (torch.tensor([[-1]]),
                                                                  torch.ones(1, 1))),
    ("scatter_reduce", lambda x, i, v: x.scatter_reduce(0, i, v, "amax"),
     (torch.tensor([[4]]), torch.ones(1, 1))),
    ("index_add", lambda x, i, v: x.index_add(0, i, v), (torch.tensor([4]), torch.ones(1, 3))),
    ("index_copy", lambda x, i, v: x.index_copy(0, i, v), (torch.tensor([-1]),
                                                           torch.ones(1, 3))),
    ("index_fill", lambda x, i, v: x.index_fill(1, i, 2.0), (torch.tensor([-4]), None)),
])
def test_writes_out_of_range_raise_pytorchs_error(name, fn, args):
    x = make((4, 3), torch.float32)
    expected = _error(fn, x.clone(), *args)
    with fallbacks() as ran:
        actual = _error(fn, *dev((x, *args)))
    assert actual == expected
    assert not ran  # raised by the check before launch, not counted as a fallback


@pytest.mark.parametrize("case", ["index_put", "index_put accumulate", "scatter",
                                  "scatter_add", "index_add", "index_copy", "scatter_reduce"])
def test_write_gradients(case):
    """Gradients through the writes (both the written tensor and the values), natively."""
    i = torch.tensor([[2, 0], [2, 1], [0, 3], [1, 1], [3, 0]])
    fn, index = {
        "index_put": (lambda x, v, i: x.index_put((i[:, 0],), v), i),
        "index_put accumulate": (lambda x, v, i: x.index_put((i[:, 0],), v,
                                                             accumulate=True), i),
        "scatter": (lambda x, v, i: x.scatter(1, i, v), i),
        "scatter_add": (lambda x, v, i: x.scatter_add(1, i, v), i),
        "index_add": (lambda x, v, i: x.index_add(1, i[:2, 1], v[:, :2].T.contiguous().T,
                                                  alpha=1.5), i),
        "index_copy": (lambda x, v, i: x.index_copy(1, torch.tensor([3, 0]).to(x.device),
                                                    v), i),
        "scatter_reduce": (lambda x, v, i: x.scatter_reduce(1, i, v, "sum"), i),
    }[case]
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    if case.startswith("index_put"):
        v = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 4, dtype=torch.float64)
    (fn(x, v, index) * w).sum().backward()
    xd = x.detach().to(D).requires_grad_()
    vd = v.detach().to(D).requires_grad_()
    with fallbacks() as ran:
        (fn(xd, vd, dev(index)) * dev(w)).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad)
    torch.testing.assert_close(vd.grad.cpu(), v.grad)
    assert ran == [], ran


def test_large_index_add_and_accumulate():
    """1e4 rows added into a [1000, 64] table by index_add and by ``x[i] += v`` with
    accumulate (many duplicates), natively: the rows added one by one in index order (at
    this size the CPU kernels may group them otherwise: within rounding)."""
    g = torch.Generator().manual_seed(22)
    x = torch.randn(1000, 64, generator=g)
    i = torch.randint(0, 1000, (10000,), generator=g)
    v = torch.randn(10000, 64, generator=g)
    in_order = x.clone()
    for k, row in enumerate(i.tolist()):
        in_order[row] += v[k]
    with fallbacks() as ran:
        added = dev(x).index_add(0, dev(i), dev(v))
    assert not ran
    same_bits(added, in_order)
    torch.testing.assert_close(added.cpu(), x.index_add(0, i, v))
    with fallbacks() as ran:
        put = dev(x).index_put((dev(i),), dev(v), accumulate=True)
    assert not ran
    same_bits(put, in_order)
    torch.testing.assert_close(put.cpu(), x.index_put((i,), v, accumulate=True))


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
    """A compiled program's gathers clamp (docs/isa.md); the compiled region raises the
    error eager PyTorch raises (IndexError; gather: RuntimeError) instead of returning what
    the clamp read, and the same function with indices in range still computes."""
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
    error = RuntimeError if case == "gather" else IndexError
    with pytest.raises(error, match="out of"):
        fns[case](x, w, torch.tensor([0, bad, 2, 1]))
    with pytest.raises(error, match="out of"):
        f(x, w, torch.tensor([0, bad, 2, 1]))
    torch.testing.assert_close(f(x, w, good), fns[case](x, w, good))
    s = stats.compile_stats()
    assert s["ops_eager"] == 0 and s["programs"] == 1, s  # the program raised, not eager
    torch._dynamo.reset()


WRITES = {
    "scatter": (lambda x, i, v: x.scatter(0, i.reshape(-1, 1).expand(-1, 5), v) * 2,
                RuntimeError),
    "scatter_add": (lambda x, i, v: x.scatter_add(0, i.reshape(-1, 1).expand(-1, 5), v) + 1,
                    RuntimeError),
    "scatter_reduce": (lambda x, i, v: x.scatter_reduce(
        0, i.reshape(-1, 1).expand(-1, 5), v, "amax") - 1, RuntimeError),
    "index_add": (lambda x, i, v: x.index_add(0, i, v) * 3, RuntimeError),
    "index_copy": (lambda x, i, v: x.index_copy(0, i, v) * 3, IndexError),
    "index_fill": (lambda x, i, v: x.index_fill(0, i, 2.5) + 1, IndexError),
    "index_put": (lambda x, i, v: x.index_put((i,), v, accumulate=True) * 2, IndexError),
}


@pytest.mark.parametrize(("case", "bad"), [
    (case, bad) for case in WRITES for bad in (6, -7)] + [("index_fill", -6), ("index_put", -6)])
def test_compiled_writes_raise_on_indices_out_of_range(case, bad):
    """A compiled program's scatters clamp (docs/isa.md); the compiled region raises the
    error eager PyTorch raises (its type) instead of returning what the clamp wrote; an
    index eager takes from the end (index_fill, index_put) computes as in eager."""
    fn, error = WRITES[case]
    from hologram_torch.compile import stats

    torch._dynamo.reset()
    stats.reset_compile_stats()
    f = torch.compile(fn, backend="hologram")
    g = torch.Generator().manual_seed(4)
    x, v = torch.randn(6, 5, generator=g), torch.randn(4, 5, generator=g)
    good = torch.tensor([0, 5, 2, 1])
    with torch.no_grad():
        torch.testing.assert_close(f(x, good, v), fn(x, good, v))
        indices = torch.tensor([0, bad, 2, 1])
        try:
            expected = fn(x, indices, v)
        except (IndexError, RuntimeError) as e:
            assert isinstance(e, error)
            with pytest.raises(error, match="out of"):
                f(x, indices, v)
        else:
            torch.testing.assert_close(f(x, indices, v), expected)
    s = stats.compile_stats()
    assert s["ops_eager"] == 0, s  # the program raised, not eager
    torch._dynamo.reset()


# --- index shapes and boolean scalars among advanced indices ---------------------------------

def _idx(a, values):
    return torch.tensor(values, device=a.device)


def _put(a, indices, value):
    a[indices] = value
    return a


MIXED_INDICES = {
    "lists that do not broadcast": lambda a: a[[0, 1], [0, 1, 2]],
    "around a slice": lambda a: a[[0, 1], :, [0, 1, 2]],
    "three, 2-d": lambda a: a[[[0], [1]], [0, 1, 2], [0, 1]],
    "after an int": lambda a: a[0, [0, 1], [0, 1, 2]],
    "tensors": lambda a: a[_idx(a, [0, 1]), _idx(a, [0, 1, 2])],
    "put": lambda a: _put(a, ([0, 1], [0, 1, 2]), 1.0),
    "True among indices": lambda a: a[True, [0, 1], True, True, [1], [[2]]],
    "True, None among indices": lambda a: a[True, [[0, 1]], True, None, True, [1], [[2]]],
    "False, True, ...": lambda a: a[False, True, ...],
    "False, list": lambda a: a[False, [0, 1], ...],
    "None, True, list": lambda a: a[None, True, [0, 1]],
    "list, True, list": lambda a: a[[0, 1], True, [0, 1]],
    "..., list, False": lambda a: a[..., [0], False],
    "bool tensors": lambda a: a[_idx(a, True), [0, 1], _idx(a, True), [1], [[2]]],
}


@pytest.mark.parametrize("name", list(MIXED_INDICES))
def test_index_shapes_and_boolean_scalars_as_pytorch(name):
    fn = MIXED_INDICES[name]
    # the same values, or the same error (IndexError('shape mismatch: ...') for shapes)
    assert_same_outcome(lambda device: fn(torch.arange(24.0).reshape(2, 3, 4).to(device)), D)


# --- index_fill_ into an expanded tensor: PyTorch warns (deprecated) and writes ---------------

EXPANDED_FILLS = {
    "1-d": lambda d: torch.zeros(1, device=d).expand(3).index_fill_(
        0, torch.tensor([0], device=d), 2.0),
    "rows expanded": lambda d: torch.zeros(3, 1, device=d).expand(3, 4).index_fill_(
        1, torch.tensor([0], device=d), 2.0),
    "columns expanded": lambda d: torch.zeros(1, 3, device=d).expand(4, 3).index_fill_(
        1, torch.tensor([0, 2], device=d), -1.5),
    "a 0-d tensor value": lambda d: torch.zeros(1, device=d).expand(3).index_fill_(
        0, torch.tensor([0], device=d), torch.tensor(2.0, device=d)),
    "int64": lambda d: torch.zeros(1, 3, dtype=torch.int64, device=d).expand(2, 3).index_fill_(
        1, torch.tensor([1], device=d), 7),
}


@pytest.mark.parametrize("name", list(EXPANDED_FILLS))
def test_index_fill_into_an_expanded_tensor_warns_and_writes_as_pytorch(name):
    fn = EXPANDED_FILLS[name]
    found = []
    for device in ("cpu", D):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fn(device).cpu()
        found.append((result, [(w.category, str(w.message)) for w in caught]))
    (expected, cpu_warnings), (actual, device_warnings) = found
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    assert device_warnings == cpu_warnings
    assert len(cpu_warnings) == 1 and "index_fill_ on expanded tensors" in cpu_warnings[0][1]


# --- masks: boolean and byte masks natively, with PyTorch's warnings --------------------------

def _masked_outcome(fn, device):
    x = torch.arange(60.0).reshape(3, 4, 5).to(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = fn(x, device).cpu()
        except Exception as exc:  # the error under test
            result = (type(exc), str(exc))
    return result, [(w.category, str(w.message)) for w in caught]


def _m(values, dtype, device):
    return torch.tensor(values, dtype=dtype, device=device)


def _set(x, key, value):
    x[key] = value
    return x


MASK_DTYPES = {"bool": torch.bool, "uint8": torch.uint8}
MASKED = {
    "x[mask]": lambda x, d, t: x[_m([1, 0, 1], t, d)],
    "x[2-d mask]": lambda x, d, t: x[_m([[1, 0, 1, 0], [0, 0, 0, 1], [1, 1, 0, 0]], t, d)],
    "x[:, mask]": lambda x, d, t: x[:, _m([0, 1, 1, 0], t, d)],
    "x[mask, :, list]": lambda x, d, t: x[_m([1, 0, 1], t, d), :, [0, 4]],
    "x[all false]": lambda x, d, t: x[_m([0, 0, 0], t, d)],
    "x[CPU mask]": lambda x, d, t: x[_m([1, 1, 0], t, "cpu")],
    "x[mask] = tensor": lambda x, d, t: _set(x, _m([1, 0, 1], t, d),
                                             torch.ones(2, 4, 5, device=d)),
    "x[mask] = 2.5": lambda x, d, t: _set(x, _m([1, 0, 1], t, d), 2.5),
    "x[:, mask] = row": lambda x, d, t: _set(x, (slice(None), _m([0, 1, 1, 0], t, d)),
                                             torch.arange(5.0, device=d)),
    "index_put_ accumulate": lambda x, d, t: x.index_put_(
        (_m([1, 0, 1], t, d),), torch.tensor(1.0, device=d), accumulate=True),
    "mask of the wrong shape": lambda x, d, t: x[_m([1, 0], t, d)],
}


@pytest.mark.parametrize("mask_dtype", list(MASK_DTYPES))
@pytest.mark.parametrize("name", list(MASKED))
def test_masks_index_as_pytorch_with_its_warnings_only(name, mask_dtype):
    # byte masks are deprecated: PyTorch warns once per mask (and masked_fill_ refuses
    # them); the device adds no warning of its own (it ran these through the CPU fallback,
    # whose warning PyTorch's tests counted)
    fn, dtype = MASKED[name], MASK_DTYPES[mask_dtype]
    hologram_torch.reset_fallback_stats()
    (expected, cpu_warnings) = _masked_outcome(lambda x, d: fn(x, d, dtype), "cpu")
    (actual, device_warnings) = _masked_outcome(lambda x, d: fn(x, d, dtype), D)
    if isinstance(expected, tuple):
        assert actual == expected
    else:
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    assert device_warnings == cpu_warnings
    if not isinstance(expected, tuple):
        assert hologram_torch.fallback_stats(lacking=False) == {}


@pytest.mark.parametrize("name", ["masked_fill", "masked_fill_", "masked_select"])
def test_byte_masks_refused_as_pytorch_without_a_fallback_warning(name):
    def fn(device):
        x = torch.arange(6.0, device=device)
        mask = torch.tensor([1, 0, 1, 0, 0, 1], dtype=torch.uint8, device=device)
        return {"masked_fill": lambda: x.masked_fill(mask, 1.0),
                "masked_fill_": lambda: x.masked_fill_(mask, 1.0),
                "masked_select": lambda: x.masked_select(mask)}[name]()

    outcomes = []
    for device in ("cpu", D):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(RuntimeError) as info:
                fn(device)
        outcomes.append((str(info.value), [str(w.message) for w in caught]))
    assert outcomes[1] == outcomes[0]


# --- writes into a slice: slice_scatter, select_scatter and autograd's backward ops ------

SLICES = [(0, 1, 3, 1), (1, -4, None, 2), (2, 0, 5, 3), (1, 2, 2, 1), (1, 5, 100, 1),
          (2, None, None, 1), (0, -1, None, 1)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_slice_and_select_writes_and_their_gradients_match_pytorch(dtype):
    """``slice_scatter``/``select_scatter`` and ``slice_backward``/``select_backward``
    (one program each: the gradient among zeros, never a fill and a copy into a view) bit
    for bit, every step, empty slices, a source of another dtype and a transposed one."""
    x = make((4, 6, 5), dtype)
    same = same_bits
    with fallbacks() as ran:
        for seed, (dim, start, end, step) in enumerate(SLICES):
            shape = x[(slice(None),) * dim + (slice(start, end, step),)].shape
            src = make(shape, dtype, seed + 1)
            same(torch.slice_scatter(dev(x), dev(src), dim, start, end, step),
                 torch.slice_scatter(x, src, dim, start, end, step))
            args = (list(x.shape), dim, 0 if start is None else start,
                    2**62 if end is None else end, step)
            same(torch.ops.aten.slice_backward(dev(src), *args),
                 torch.ops.aten.slice_backward(src, *args))
        for seed, (dim, index) in enumerate([(0, 2), (1, -1), (2, 0)]):
            src = make(x.select(dim, index).shape, dtype, seed + 9)
            same(torch.select_scatter(dev(x), dev(src), dim, index),
                 torch.select_scatter(x, src, dim, index))
            same(torch.ops.aten.select_backward(dev(src), list(x.shape), dim, index),
                 torch.ops.aten.select_backward(src, list(x.shape), dim, index))
        base, src = make((6, 5), dtype), make((3, 6), dtype, 20).t()  # a strided source
        same(torch.slice_scatter(dev(base), dev(src), 1, 1, 4),
             torch.slice_scatter(base, src, 1, 1, 4))
        wide = make((6, 3), torch.float64, 21)  # cast to self's dtype, as torch does
        if dtype.is_floating_point:
            same(torch.slice_scatter(dev(base), dev(wide), 1, 0, 3),
                 torch.slice_scatter(base, wide, 1, 0, 3))
    assert ran == []


def test_slice_writes_refuse_what_pytorch_refuses():
    x = torch.zeros(5, 6)
    for fn in (lambda t, s: torch.slice_scatter(t, s, 1, 0, 3),
               lambda t, s: torch.select_scatter(t, s[:, 0], 1, 9)):
        outcomes = []
        for device in ("cpu", D):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", hologram_torch.FallbackWarning)
                with pytest.raises((RuntimeError, IndexError)) as info:
                    fn(x.to(device), torch.ones(5, 2, device=device))
            outcomes.append((type(info.value), str(info.value)))
        assert outcomes[1] == outcomes[0]


def test_attention_gradients_through_select_run_on_the_device():
    """Multi-head attention splits its packed projection with ``select``; the gradient
    goes back through ``select_backward``, a device kernel (no CPU fallback), as does
    its softmax (``_safe_softmax``)."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 5, 8)
    grads = []
    for device in ("cpu", D):
        m = mha.to(device)
        xd = x.detach().to(device).requires_grad_()
        with fallbacks() as ran:
            m(xd, xd, xd, need_weights=False)[0].sum().backward()
        assert ran == []
        grads.append([xd.grad.cpu(), m.in_proj_weight.grad.cpu()])
        m.zero_grad()
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_index_add_of_half_types_rounds_as_the_cpu_kernel(dtype):
    """The CPU kernel adds a vector's elements one by one in its dtype (each sum rounded)
    and a larger tensor's slices in float32 (rounded once): with many duplicates the two
    differ, and the device gives each the CPU's bits."""
    g = torch.Generator().manual_seed(3)
    index = torch.randint(0, 10, (400,), generator=g)
    for shape in ((10,), (10, 3), (3, 10)):
        dim = 1 if shape == (3, 10) else 0
        self = torch.randn(shape, generator=g).to(dtype)
        source = torch.randn(*(400 if d == dim else n for d, n in enumerate(shape)),
                             generator=g).to(dtype)
        # (a vector's loop scales by alpha in its dtype too; slices with alpha != 1 take
        # another CPU path, not matched bit for bit)
        for alpha in (1, 0.3, -1.7) if len(shape) == 1 else (1,):
            want = self.clone().index_add_(dim, index, source, alpha=alpha)
            got = self.to("hologram").index_add_(dim, index.to("hologram"),
                                                 source.to("hologram"), alpha=alpha)
            assert torch.equal(got.cpu(), want), (shape, alpha,
                                                  (got.cpu() - want).abs().max())
