"""``linspace``, ``logspace``, ``eye``, ``flip`` and ``roll`` on the device against PyTorch's
CPU kernels: values bit for bit (NaN where NaN), dtypes, shapes, ``out=`` (resized or not,
strided), edge cases (0 and 1 steps, empty tensors, 0-d tensors, negative dims), and that
they run natively (no CPU fallback) where the device claims them, with PyTorch's errors
where it rejects the arguments."""

from __future__ import annotations

import itertools
import warnings

import pytest

torch = pytest.importorskip("torch")
from hologram_torch import fallback_stats, reset_fallback_stats  # noqa: E402

DEVICE = "hologram"
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
BOUNDS = [(0, 1), (-3.7, 11.3), (0.001, 7.0), (5, -20), (0.1, 0.7), (-100, 100), (3, 3),
          (-0.0, 1.0), (2, 100)]
STEPS = [0, 1, 2, 3, 7, 64, 100, 1000]


def _same(actual: torch.Tensor, expected: torch.Tensor, what) -> None:
    assert actual.device.type == DEVICE, what
    actual = actual.cpu()
    assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), what
    if expected.is_floating_point():  # bit for bit, NaN payloads aside
        assert torch.equal(actual.isnan(), expected.isnan()), what
        a, e = actual.nan_to_num(0.0), expected.nan_to_num(0.0)
        assert torch.equal(a, e) and torch.equal(a.signbit(), e.signbit()), what
    else:
        assert torch.equal(actual, expected), what


@pytest.fixture
def native():
    """The body runs without a CPU fallback."""
    reset_fallback_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    assert fallback_stats(lacking=False) == {}


@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=lambda d: str(d)[6:])
def test_linspace_bit_for_bit(dtype, native):
    for (start, end), steps in itertools.product(BOUNDS, STEPS):
        if dtype is torch.uint8 and min(start, end) < 0:
            continue
        expected = torch.linspace(start, end, steps, dtype=dtype)
        _same(torch.linspace(start, end, steps, dtype=dtype, device=DEVICE), expected,
              (start, end, steps))


def test_linspace_long_and_default_dtype(native):
    # past torch's parallel grain (32768): the CPU kernel splits the range across threads
    _same(torch.linspace(-1.5, 2.25, 70001, device=DEVICE), torch.linspace(-1.5, 2.25, 70001),
          "long")
    _same(torch.linspace(0, 10, 5, device=DEVICE), torch.linspace(0, 10, 5), "default dtype")
    start, end = torch.tensor(-2.0), torch.tensor(3.5)  # the tensor overloads
    _same(torch.linspace(start.to(DEVICE), end.to(DEVICE), 9, device=DEVICE),
          torch.linspace(start, end, 9), "tensor bounds")


def test_linspace_out(native):
    out = torch.empty(2, 3, device=DEVICE)  # same element count: not resized, 2-d
    torch.linspace(0, 1, 6, out=out)
    _same(out, torch.linspace(0, 1, 6, out=torch.empty(2, 3)), "not resized")
    out = torch.empty(4, device=DEVICE, dtype=torch.float64)
    torch.linspace(-1, 1, 11, out=out)
    _same(out, torch.linspace(-1, 1, 11, dtype=torch.float64), "resized")
    base = torch.zeros(10, device=DEVICE)
    torch.linspace(1, 5, 5, out=base[::2])  # strided: the values land at its elements
    expected = torch.zeros(10)
    torch.linspace(1, 5, 5, out=expected[::2])
    _same(base, expected, "strided out")


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16),
                         ids=lambda d: str(d)[6:])
def test_logspace_bit_for_bit(dtype, native):
    for (start, end), steps, base in itertools.product(BOUNDS, STEPS[:-1], (10.0, 2.0, 0.5)):
        start, end = start / 10, end / 10
        expected = torch.logspace(start, end, steps, base, dtype=dtype)
        _same(torch.logspace(start, end, steps, base, dtype=dtype, device=DEVICE), expected,
              (start, end, steps, base))


def test_logspace_other_dtypes_run_on_the_cpu():
    for dtype in (torch.float64, torch.int64, torch.uint8):
        _same(torch.logspace(0, 3, 4, dtype=dtype, device=DEVICE),
              torch.logspace(0, 3, 4, dtype=dtype), dtype)


def test_errors_are_pytorchs():
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.linspace(0, 1, -1, device=DEVICE)
    with pytest.raises(RuntimeError, match="overflow"):
        torch.linspace(0, 300, 5, dtype=torch.int8, device=DEVICE)
    with pytest.raises(RuntimeError, match="must be greater or equal to 0"):
        torch.eye(-1, device=DEVICE)
    with pytest.raises((RuntimeError, IndexError), match="appears multiple times"):
        torch.flip(torch.zeros(2, 3, device=DEVICE), [0, -2])
    with pytest.raises(IndexError, match="out of range"):
        torch.flip(torch.zeros(2, 3, device=DEVICE), [2])
    with pytest.raises(RuntimeError, match="shifts and dimensions must align"):
        torch.roll(torch.zeros(2, 3, device=DEVICE), [1, 2], [0])


@pytest.mark.parametrize("dtype", FLOATS + INTS + (torch.bool,), ids=lambda d: str(d)[6:])
def test_eye(dtype, native):
    for n, m in ((0, 0), (1, 1), (3, 3), (3, 5), (5, 2), (0, 4)):
        _same(torch.eye(n, m, dtype=dtype, device=DEVICE), torch.eye(n, m, dtype=dtype), (n, m))
    _same(torch.eye(4, dtype=dtype, device=DEVICE), torch.eye(4, dtype=dtype), 4)
    out = torch.full((6, 6), 7, dtype=dtype, device=DEVICE)
    torch.eye(3, 2, out=out[::2, ::3])  # a strided out of the right shape: written in place
    expected = torch.full((6, 6), 7, dtype=dtype)
    torch.eye(3, 2, out=expected[::2, ::3])
    _same(out, expected, "strided out")


def _sample(dtype, *shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0)) * 50
    return x.to(dtype)


@pytest.mark.parametrize("dtype", FLOATS + INTS + (torch.bool,), ids=lambda d: str(d)[6:])
def test_flip(dtype, native):
    x = _sample(dtype, 3, 4, 5)
    for dims in ([0], [1], [2], [-1], [0, 2], [2, 0, 1], []):
        _same(torch.flip(x.to(DEVICE), dims), torch.flip(x, dims), dims)
    t = x.transpose(0, 2)  # a view: read through its strides
    _same(torch.flip(t.to(DEVICE).transpose(0, 2).transpose(0, 2), [0, 1]),
          torch.flip(t, [0, 1]), "view")
    _same(torch.flip(x[0, 0, 0].to(DEVICE), [0]), torch.flip(x[0, 0, 0], [0]), "0-d")
    empty = torch.zeros(0, 3, dtype=dtype)
    _same(torch.flip(empty.to(DEVICE), [0, 1]), torch.flip(empty, [0, 1]), "empty")
    _same(torch.fliplr(x.to(DEVICE)), torch.fliplr(x), "fliplr")
    _same(torch.rot90(x.to(DEVICE), 1, [1, 2]), torch.rot90(x, 1, [1, 2]), "rot90")


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.int64, torch.bool),
                         ids=lambda d: str(d)[6:])
def test_roll(dtype, native):
    x = _sample(dtype, 3, 4, 5)
    for shifts, dims in (((1,), (0,)), ((-2,), (1,)), ((7,), ()), ((-61,), ()),
                         ((2, 3), (0, 2)), ((0,), (0,)), ((13,), (-1,)), ((4,), (1,))):
        _same(torch.roll(x.to(DEVICE), shifts, dims), torch.roll(x, shifts, dims),
              (shifts, dims))
    t = x.transpose(0, 2)
    _same(torch.roll(x.to(DEVICE).transpose(0, 2), 2), torch.roll(t, 2), "view, flattened")
    _same(torch.roll(x[0, 0, 0].to(DEVICE), 3), torch.roll(x[0, 0, 0], 3), "0-d")
    empty = torch.zeros(0, 3, dtype=dtype)
    _same(torch.roll(empty.to(DEVICE), 1, 1), torch.roll(empty, 1, 1), "empty")


def test_flip_and_roll_gradients():
    x = torch.randn(3, 4, requires_grad=True)
    d = x.detach().to(DEVICE).requires_grad_()
    g = torch.randn(3, 4)
    (torch.roll(torch.flip(x, [1]), 1, 0) * g).sum().backward()
    (torch.roll(torch.flip(d, [1]), 1, 0) * g.to(DEVICE)).sum().backward()
    _same(d.grad, x.grad, "gradient")
