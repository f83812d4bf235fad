"""The device's elementwise, selection, activation and foreach kernels against the CPU:
random and edge values, every dtype, broadcasting, views, in-place and out= forms, and
that each ran natively (not through the CPU fallback)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hologram_torch  # noqa: E402

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
EDGE = [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1e-40, -1e-40, 1.0, -2.5, 3.0]


def dev(x):
    return x.to("hologram")


def sample(shape, dtype, edge=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g, dtype=torch.float64) * 3
        if edge and x.numel() >= len(EDGE):
            x.view(-1)[: len(EDGE)] = torch.tensor(EDGE, dtype=torch.float64)
        return x.to(dtype)
    if dtype is torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    lo = 0 if dtype is torch.uint8 else -9
    return torch.randint(lo, 10, shape, generator=g, dtype=dtype)


def same(actual, expected, tol=None):
    assert actual.device.type == "hologram"
    rtol, atol = tol or {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}.get(
        expected.dtype, (1.3e-6, 1e-30))
    torch.testing.assert_close(actual.cpu(), expected, rtol=rtol, atol=atol, equal_nan=True)
    if expected.dtype.is_floating_point:  # signed zeros too
        zeros = (expected == 0) & (actual.cpu() == 0)
        assert torch.equal(torch.signbit(actual.cpu()[zeros]), torch.signbit(expected[zeros]))


@pytest.fixture(autouse=True)
def native_only():
    hologram_torch.reset_fallback_stats()
    yield
    stats = hologram_torch.fallback_stats(lacking=False)
    assert not stats, f"ran on the CPU fallback: {stats}"


BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "maximum": torch.maximum, "minimum": torch.minimum,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=2), "eq": torch.eq, "lt": torch.lt,
    "ge": torch.ge, "ne": torch.ne,
}


@pytest.mark.parametrize("dtype", FLOATS + (torch.int64, torch.int32, torch.uint8))
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(name, dtype):
    f = BINARY[name]
    for sa, sb in [((4, 5), (4, 5)), ((3, 1, 5), (4, 1)), ((), (6,)), ((0, 3), (3,))]:
        a, b = sample(sa, dtype), sample(sb, dtype, seed=1)
        same(f(dev(a), dev(b)), f(a, b))


@pytest.mark.parametrize("dtype", FLOATS + (torch.int64,))
def test_binary_with_python_scalars_and_promotion(dtype):
    a = sample((7,), dtype)
    for f in (lambda x: x + 1, lambda x: x * 2.5, lambda x: 3 - x, lambda x: x / 2,
              lambda x: x > 0.5, lambda x: x * True):
        same(f(dev(a)), f(a))
    i = sample((7,), torch.int32)
    same(dev(a) + dev(i), a + i)  # mixed dtypes promote as in torch
    same(dev(a) * dev(torch.tensor(2.0, dtype=torch.float64)), a * torch.tensor(2.0,
         dtype=torch.float64))  # a 0-d tensor does not promote a dimensioned one


def test_bool_arithmetic():
    a, b = sample((9,), torch.bool), sample((9,), torch.bool, seed=1)
    same(dev(a) + dev(b), a + b)
    same(dev(a) * dev(b), a * b)
    same(torch.maximum(dev(a), dev(b)), torch.maximum(a, b))


UNARY = ["exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "sin", "cos",
         "tanh", "sigmoid", "erf", "floor", "ceil", "round", "trunc", "neg", "abs", "sign",
         "reciprocal", "relu"]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", UNARY)
def test_unary_float(name, dtype):
    x = sample((40,), dtype)
    f = getattr(torch, name)
    tol = (2e-6, 1e-30) if dtype is torch.float32 and name not in ("neg", "abs") else None
    same(f(dev(x)), f(x), tol)


@pytest.mark.parametrize("name", ["exp", "sqrt", "floor", "neg", "abs", "sigmoid", "relu"])
def test_unary_int(name):
    x = sample((20,), torch.int64)
    f = getattr(torch, name)
    same(f(dev(x)), f(x))


def test_views_and_in_place():
    a = sample((6, 8), torch.float32, edge=False)
    d = dev(a)
    same(d.t() * 2, a.t() * 2)
    same(d[::2, 1::3].exp(), a[::2, 1::3].exp())
    d[1:3].add_(1.5)
    a[1:3].add_(1.5)
    d.t()[2].mul_(-1)
    a.t()[2].mul_(-1)
    d[:, 0].relu_()
    a[:, 0].relu_()
    same(d, a)
    out = torch.empty(0, device="hologram")
    torch.mul(d, d, out=out)  # out= is resized, as in torch
    same(out, a * a)
    e = dev(torch.ones(3))
    e.add_(dev(torch.tensor(2.0)))
    same(e, torch.full((3,), 3.0))


def test_in_place_errors_match_torch():
    i = dev(torch.ones(3, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="can't be cast"):
        i.add_(dev(torch.ones(3)))
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        dev(torch.ones(3)).add_(dev(torch.ones(2, 3)))
    x = dev(torch.arange(6.0))  # disjoint parts of one storage: no overlap, native
    x[:3].add_(x[3:])
    same(x, torch.tensor([3.0, 5.0, 7.0, 3.0, 4.0, 5.0]))


def test_mixing_a_cpu_tensor_is_an_error():
    with pytest.raises(Exception, match=r"CPU|cpu"):
        dev(torch.ones(3)) + torch.ones(3)


@pytest.mark.parametrize("dtype", FLOATS)
def test_selection(dtype):
    x, y = sample((5, 6), dtype), sample((6,), dtype, seed=1)
    c = sample((5, 6), torch.bool, seed=2)
    same(torch.where(dev(c), dev(x), dev(y)), torch.where(c, x, y))
    same(dev(x).masked_fill(dev(c), -7.5), x.masked_fill(c, -7.5))
    same(dev(x).clamp(-1, 0.5), x.clamp(-1, 0.5))
    same(dev(x).clamp(min=0.25), x.clamp(min=0.25))
    same(dev(x).clamp(max=dev(y)), x.clamp(max=y))
    for fn, bound in ((torch.clamp_min, 0.25), (torch.clamp_max, -0.5)):
        out, want = dev(torch.empty(0, dtype=dtype)), torch.empty(0, dtype=dtype)
        same(fn(dev(x), bound, out=out), fn(x, bound, out=want))
        same(fn(dev(x), dev(y), out=out), fn(x, y, out=want))


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
def test_activations_and_gradients(dtype):
    fns = [torch.relu, torch.sigmoid, torch.tanh, torch.nn.functional.silu,
           torch.nn.functional.gelu, lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
           lambda t: torch.nn.functional.leaky_relu(t, 0.2),
           lambda t: torch.nn.functional.hardtanh(t, -0.5, 0.7)]
    for i, f in enumerate(fns):
        x = sample((30,), dtype, edge=False).requires_grad_()
        d = dev(x.detach()).requires_grad_()
        g = torch.randn(30, dtype=dtype, generator=torch.Generator().manual_seed(i))
        f(x).backward(g)
        f(d).backward(dev(g))
        # PyTorch's float32 gelu underflows to +0.0 or -0.0 for x << 0 depending on the
        # host's SIMD width: gelu is compared with float64 rounded to the dtype
        want = f(x.double()).to(dtype) if i in (4, 5) else f(x)
        same(f(d).detach(), want.detach(), (1e-5, 1e-6))
        # tanh's backward, g * (1 - y^2), cancels for |x| > 2: the float32 tanh's 6 ulp
        # (docs/mathlib.md; PyTorch's ~1) become ~1e-6 there
        tanh_based = dtype is torch.float32 and i in (2, 5)
        same(d.grad, x.grad, (1e-5, 4e-6 if tanh_based else 1e-6))


def test_foreach_and_lerp_against_cpu():
    xs = [sample((5,), torch.float32, edge=False, seed=s) for s in range(3)]
    ys = [sample((5,), torch.float32, edge=False, seed=s + 9).abs() + 0.5 for s in range(3)]
    ds, es = [dev(x) for x in xs], [dev(y) for y in ys]
    torch._foreach_add_(xs, ys, alpha=0.5)
    torch._foreach_add_(ds, es, alpha=0.5)
    torch._foreach_mul_(xs, 0.9)
    torch._foreach_mul_(ds, 0.9)
    torch._foreach_addcdiv_(xs, ys, ys, [0.1, 0.2, 0.3])
    torch._foreach_addcdiv_(ds, es, es, [0.1, 0.2, 0.3])
    torch._foreach_lerp_(xs, ys, 0.3)
    torch._foreach_lerp_(ds, es, 0.3)
    for d, x in zip(ds, xs):
        same(d, x, (1e-6, 1e-6))
    for d, r in zip(torch._foreach_sqrt(es), torch._foreach_sqrt(ys)):
        same(d, r)
    a, b = xs[0], ys[0]
    same(dev(a).lerp(dev(b), 0.7), a.lerp(b, 0.7))
    same(dev(a).addcmul(dev(b), dev(b), value=-2), a.addcmul(b, b, value=-2))


def test_foreach_calls_seen_before_launch_their_rows_from_native_code(monkeypatch):
    """Op by op, a foreach call whose signature ran before launches its rows from native
    code, no runner.run per row, each call with its own scalars; the results are the
    CPU's. The same signature writing over its operand's memory takes the checked path
    (PyTorch's own kernel, through the CPU fallback), as before."""
    from hologram_torch.aten import runner

    if not runner.FRONT:
        pytest.skip("the device's native library is not loaded")
    g = torch.Generator().manual_seed(5)
    start = [torch.randn(3, 6, generator=g), torch.randn(11, generator=g)]  # (shapes of
    runs = [0]  # this test's own: another test in the process may have filed others)
    real = runner.run

    def counted(*args, **kwargs):
        runs[0] += 1
        return real(*args, **kwargs)

    def train(device):
        ps = [t.to(device) for t in start]
        ms = [torch.zeros_like(p) for p in ps]
        counts = []
        for step in range(4):
            runs[0] = 0
            torch._foreach_mul_(ms, 0.9)
            torch._foreach_add_(ms, ps, alpha=0.1)
            roots = torch._foreach_sqrt(torch._foreach_add(ms, 1.0))
            torch._foreach_addcdiv_(ps, ms, roots, [-0.1 * (step + 1), 0.2 / (step + 1)])
            counts.append(runs[0])
        return [*ps, *ms], counts

    monkeypatch.setattr(runner, "run", counted)
    got, counts = train("hologram")
    want, _ = train("cpu")
    for a, b in zip(got, want):
        same(a, b, (1e-6, 1e-6))
    assert counts[1:] == [0, 0, 0], counts

    def overlapping(device):
        base = torch.arange(12.0, device=device)
        torch._foreach_add_([base[0:5]], [base[6:11]])  # the signature, disjoint
        try:
            torch._foreach_add_([base[1:6]], [base[0:5]])
        except RuntimeError as e:
            return str(e)
        return base.cpu().tolist()

    assert overlapping("hologram") == overlapping("cpu")
    # (the overlapping call ran on the CPU, as the checked path sends it there)
    assert hologram_torch.fallback_stats() == {"aten._foreach_add_.List": 1}
    hologram_torch.reset_fallback_stats()


def test_empty_and_zero_dim():
    e = torch.empty(0, 3)
    same(dev(e) + 1, e + 1)
    s = torch.tensor(2.5)
    same(dev(s).exp(), s.exp())
    same(dev(s) * dev(torch.ones(4)), s * torch.ones(4))


def test_remembered_kernels_keep_signatures_apart():
    # Unary ops remember their kernel under the operand's dtype, shape and strides: the
    # second call of each signature takes that path and must still be right.
    from hologram_torch.aten import runner

    gelu = torch.nn.functional.gelu
    for dtype in (torch.float32, torch.float64, torch.int64, torch.float32):
        x = sample((4, 5), dtype)
        for _ in range(2):
            same(dev(x).exp(), x.exp())
            same(dev(x).t().exp(), x.t().exp())  # other strides
            same(dev(x).relu(), x.relu())
            if dtype.is_floating_point:  # as in test_activations_and_gradients: PyTorch's
                # float32 gelu(inf) is NaN, and 1 + erf(x) cancels for x << 0
                # (and its sign for x << 0 depends on the host: float64 is the reference)
                y = sample((4, 5), dtype, edge=False)
                same(gelu(dev(y)), gelu(y.double()).to(dtype), (1e-5, 1e-6))
                same(gelu(dev(y), approximate="tanh"),
                     gelu(y.double(), approximate="tanh").to(dtype), (1e-5, 1e-6))
    assert ("exp", (), torch.int64, torch.Size([4, 5]), (5, 1)) in runner.shortcuts


def test_numbers_copied_to_the_device_from_several_threads_keep_their_own_slots():
    """The device copies of scalar operands (numbers, CPU scalars; what kernels read on
    device memory) are shared by threads: values copied at once from several threads
    each keep a slot of their own. (Without the lock, two values took one slot and a
    thread's optimizer step read another thread's number.)"""
    import threading
    import time
    from collections import OrderedDict

    import numpy as np

    from hologram_torch import memory
    from hologram_torch.aten import runner

    class Yielding(OrderedDict):  # lets another thread in where a slot is chosen
        def __len__(self):
            n = super().__len__()
            time.sleep(0)
            return n

    scalars = runner._Scalars()
    scalars.slots = Yielding()
    addresses = {}

    def copy(t):
        for i in range(300):
            value = np.float64(t * 1000 + i).tobytes()
            addresses[value] = scalars.address(value)

    threads = [threading.Thread(target=copy, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(addresses.values())) == len(addresses) == 1200
    for value, address in addresses.items():
        assert memory.read(address, 8).tobytes() == value


def test_remembered_kernels_take_numbers_as_values():
    # x op number remembers its kernel under x's signature and the number's type; each
    # call passes its own value (and int/float/bool numbers promote as PyTorch's do).
    from hologram_torch.aten import runner

    for dtype in (torch.float32, torch.float16, torch.int64, torch.int8, torch.bool):
        x = sample((3, 4), dtype)
        for number in (2, -3, 2.5, -0.5, True, False, 7):
            for name in ("add", "sub", "mul", "div"):
                if name == "sub" and (dtype is torch.bool or type(number) is bool):
                    continue  # refused by PyTorch itself
                expected = getattr(torch, name)(x, number)
                same(getattr(torch, name)(dev(x), number), expected)
    assert ("mul", torch.ops.aten.mul.Tensor, torch.int8, torch.Size([3, 4]), (4, 1),
            float) in runner.shortcuts


# --- the sign of zero in max/min-like ops, bit for bit with PyTorch CPU (issue 16, part 8)
# PyTorch's CPU rule, observed in torch 2.13 (AVX2 build): its scalar kernels compute
# std::max/std::min, which give the *first* operand on a tie, so maximum(-0.0, +0.0) is
# -0.0 and maximum(+0.0, -0.0) is +0.0; NaN if either operand is NaN. Ops with number
# bounds (clamp, clamp_min/max, hardtanh, relu6, relu, _foreach_maximum.Scalar) follow
# it at every size. Tensor-tensor maximum/minimum/clamp/_foreach_maximum.List follow it
# in their scalar code (0-d tensors, short and strided tensors, the tail of a long one),
# while their vectorized code (blocks of 2 SIMD vectors of a contiguous tensor) gives the
# *second* operand on a tie. The device applies the scalar rule everywhere: bit for bit
# with PyTorch wherever PyTorch itself is consistent. (No f16: see test_interp.py.)
SIGNED = (torch.float32, torch.float64, torch.bfloat16)


def same_bits(actual, expected):
    assert actual.device.type == "hologram"
    actual = actual.cpu()
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    nan = torch.isnan(expected)
    assert torch.equal(torch.isnan(actual), nan)
    assert torch.equal(actual[~nan], expected[~nan])
    assert torch.equal(torch.signbit(actual[~nan]), torch.signbit(expected[~nan]))


def zero_pairs(n, dtype, strided=False):
    """``a`` and ``b`` (n elements, or 0-d for n=None) cycling through the signed-zero
    ties in both orders and NaN in either position."""
    pairs = [(-0.0, 0.0), (0.0, -0.0), (-0.0, -0.0), (0.0, 0.0), (float("nan"), -0.0),
             (0.0, float("nan")), (-0.0, 1.0), (-1.0, 0.0)]
    count = 1 if n is None else n
    a = torch.tensor([pairs[i % len(pairs)][0] for i in range(count)], dtype=dtype)
    b = torch.tensor([pairs[i % len(pairs)][1] for i in range(count)], dtype=dtype)
    if n is None:
        return a[0].clone(), b[0].clone()
    if strided:  # every other element of a twice-as-long tensor
        return (torch.stack([a, a]).T.reshape(-1)[::2], torch.stack([b, b]).T.reshape(-1)[::2])
    return a, b


NUMBER_BOUNDS = {  # f(x, bound): PyTorch gives x on a tie at every size
    "clamp_min": lambda x, s: torch.clamp(x, min=s),
    "clamp_max": lambda x, s: torch.clamp(x, max=s),
    "clamp_both": lambda x, s: torch.clamp(x, s, s),
    "clamp_min_fn": lambda x, s: torch.clamp_min(x, s),
    "clamp_max_fn": lambda x, s: torch.clamp_max(x, s),
    "clamp_": lambda x, s: x.clone().clamp_(min=s),
    "hardtanh": lambda x, s: torch.nn.functional.hardtanh(x, s, 1.0),
    "hardtanh_hi": lambda x, s: torch.nn.functional.hardtanh(x, -1.0, s),
    "relu": lambda x, s: torch.relu(x),
    "relu_": lambda x, s: x.clone().relu_(),
    "relu6": lambda x, s: torch.nn.functional.relu6(x),
    "leaky_relu": lambda x, s: torch.nn.functional.leaky_relu(x),
    "foreach_maximum": lambda x, s: torch._foreach_maximum([x], s)[0],
}


@pytest.mark.parametrize("dtype", SIGNED)
@pytest.mark.parametrize("name", sorted(NUMBER_BOUNDS))
def test_signed_zero_ties_with_number_bounds_match_torch(name, dtype):
    f = NUMBER_BOUNDS[name]
    for n in (None, 1, 1000):
        x, _ = zero_pairs(n, dtype)
        for bound in (0.0, -0.0, float("nan")):  # a NaN bound: NaN, as in torch
            same_bits(f(dev(x), bound), f(x, bound))


TENSOR_PAIRS = {  # f(a, b) of two tensors
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "max": torch.max,
    "min": torch.min,
    "clamp_min_": lambda a, b: a.clone().clamp_min_(b),
    "maximum_out": lambda a, b: torch.maximum(a, b, out=torch.empty_like(a)),
    "clamp_min_tensor": lambda a, b: torch.clamp(a, min=b),
    "clamp_max_tensor": lambda a, b: torch.clamp(a, max=b),
    "clamp_both_tensor": lambda a, b: torch.clamp(a, b, b),
    "foreach_maximum": lambda a, b: torch._foreach_maximum([a], [b])[0],
}


@pytest.mark.parametrize("dtype", SIGNED)
@pytest.mark.parametrize("name", sorted(TENSOR_PAIRS))
def test_signed_zero_ties_of_two_tensors_match_torch_scalar_kernels(name, dtype):
    f = TENSOR_PAIRS[name]
    for n, strided in ((None, False), (1, False), (7, False), (1000, True)):
        a, b = zero_pairs(n, dtype, strided)
        for x, y in ((a, b), (b, a)):
            same_bits(f(dev(x), dev(y)), f(x, y))
    # Contiguous and long: where PyTorch's vectorized blocks give the second operand, the
    # device keeps the rule above, the same result as for the strided layout.
    a, b = zero_pairs(1000, dtype)
    sa, sb = zero_pairs(1000, dtype, strided=True)
    same_bits(f(dev(a), dev(b)), f(sa, sb).contiguous())


def test_torch_maximum_of_signed_zero_scalars_is_the_first_operand():
    # the case issue 16 reported: +0.0 on the device, -0.0 on the CPU
    neg, pos = torch.tensor(-0.0), torch.tensor(0.0)
    assert torch.signbit(torch.maximum(neg, pos)) and not torch.signbit(torch.maximum(pos, neg))
    assert torch.signbit(torch.maximum(dev(neg), dev(pos)).cpu())
    assert not torch.signbit(torch.maximum(dev(pos), dev(neg)).cpu())
    assert torch.signbit(torch.relu(dev(neg)).cpu())


def test_reductions_over_an_empty_dim_list_match_torch():
    # torch 2.13: sum/amax/amin/mean over dim=() reduce every dimension, any/all reduce
    # none (issue 16, part 6: the graph's reduce over () now means "all", as sum's)
    x = sample((3, 4), torch.float32)
    x[0, 1] = 0.0
    for f in (lambda t: torch.sum(t, dim=()), lambda t: torch.amax(t, dim=()),
              lambda t: torch.amin(t, dim=(), keepdim=True), lambda t: torch.mean(t, dim=[]),
              lambda t: torch.any(t, dim=()), lambda t: torch.all(t, dim=(), keepdim=True),
              lambda t: torch.all(t), lambda t: torch.argmax(t[1, 2]),
              lambda t: torch.argmin(t[1, 2], 0, keepdim=True)):
        same(f(dev(x)), f(x))


def test_layer_norm_backward_over_every_dimension():
    # no leading dimensions: weight and bias gradients are not reduced at all
    x = sample((6,), torch.float32, edge=False).requires_grad_()
    w = sample((6,), torch.float32, edge=False, seed=1).requires_grad_()
    b = sample((6,), torch.float32, edge=False, seed=2).requires_grad_()
    g = sample((6,), torch.float32, edge=False, seed=3)
    d = [dev(t.detach()).requires_grad_() for t in (x, w, b)]
    torch.nn.functional.layer_norm(x, (6,), w, b).backward(g)
    torch.nn.functional.layer_norm(d[0], (6,), d[1], d[2]).backward(dev(g))
    for got, want in zip(d, (x, w, b)):
        same(got.grad, want.grad, (1e-5, 1e-6))


# --- integer division: trunc/floor div, //, remainder, fmod ----------------------------------

INTEGER_DIVISIONS = {
    "trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "//": lambda a, b: a // b,
    "%": lambda a, b: a % b,
    "fmod": torch.fmod,
}
INTEGER_DIVISIONS_IN_PLACE = {
    "trunc": lambda a, b: a.div_(b, rounding_mode="trunc"),
    "floor": lambda a, b: a.div_(b, rounding_mode="floor"),
    "//": lambda a, b: a.floor_divide_(b),
    "%": lambda a, b: a.remainder_(b),
    "fmod": lambda a, b: a.fmod_(b),
}
INTEGER_DIVISIONS_OUT = {
    "trunc": lambda a, b, out: torch.div(a, b, rounding_mode="trunc", out=out),
    "floor": lambda a, b, out: torch.div(a, b, rounding_mode="floor", out=out),
    "//": lambda a, b, out: torch.floor_divide(a, b, out=out),
    "%": lambda a, b, out: torch.remainder(a, b, out=out),
    "fmod": lambda a, b, out: torch.fmod(a, b, out=out),
}


def _divisor(shape, dtype, seed):
    b = sample(shape, dtype, seed=seed)
    return torch.where(b == 0, torch.ones((), dtype=dtype), b)


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("name", list(INTEGER_DIVISIONS))
def test_integer_division_matches_cpu(name, dtype):
    a, b = sample((4, 5), dtype, seed=1), _divisor((5,), dtype, seed=2)
    fn = INTEGER_DIVISIONS[name]
    for x, y in ((a, b), (a, b.view(1, 5)), (a.t(), b[:4]), (a, -3), (a, 4),
                 (a, torch.tensor(-2)), (b, a + (a == 0).to(dtype))):
        if dtype is torch.uint8 and isinstance(y, int) and y < 0:
            continue
        expected = fn(x, y)
        actual = fn(dev(x), dev(y) if isinstance(y, torch.Tensor) and y.dim() else y)
        assert actual.dtype == expected.dtype
        assert torch.equal(actual.cpu(), expected)
    expected = INTEGER_DIVISIONS_IN_PLACE[name](a.clone(), b)
    actual = INTEGER_DIVISIONS_IN_PLACE[name](dev(a), dev(b))
    assert torch.equal(actual.cpu(), expected)
    out = torch.empty(0, dtype=dtype, device="hologram")
    INTEGER_DIVISIONS_OUT[name](dev(a), dev(b), out)
    assert torch.equal(out.cpu(), fn(a, b))


_INT_MIN_CASES = """
import sys, torch, hologram_torch
results = []
for dtype in (torch.int8, torch.int16, torch.int32, torch.int64):
    low = torch.iinfo(dtype).min
    x = torch.tensor([low, 7, -7], dtype=dtype)
    for divisor in (torch.tensor([-1, -1, -1], dtype=dtype), -1):
        ops = (lambda a, b: torch.div(a, b, rounding_mode="trunc"),
               lambda a, b: torch.div(a, b, rounding_mode="floor"),
               lambda a, b: a // b, lambda a, b: a % b, torch.fmod)
        d = divisor.to("hologram") if isinstance(divisor, torch.Tensor) else divisor
        results.append([op(x.to("hologram"), d).tolist() for op in ops])
        # the CPU's floor division, remainder and fmod (its trunc traps on INT_MIN / -1)
        results.append([op(x, divisor).tolist() for op in ops[1:]])
print(results)
"""


def test_integer_division_of_int_min_by_minus_one_wraps_and_never_traps(tmp_path):
    # INT_MIN / -1 overflows: the CPU's division instruction traps (SIGFPE kills the
    # process, as PyTorch's own CPU kernel for rounding_mode="trunc" does); the ISA defines
    # it as INT_MIN (wrapping), which PyTorch's floor division gives too
    import ast
    import subprocess
    import sys
    script = tmp_path / "int_min.py"
    script.write_text(_INT_MIN_CASES)
    proc = subprocess.run([sys.executable, "-W", "ignore", str(script)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    results = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    for device, cpu in zip(results[::2], results[1::2]):
        trunc, floor, floordiv, rem, fmod = device
        assert trunc[0] == floor[0] == floordiv[0] < 0 and trunc[0] == cpu[0][0]
        assert trunc[1:] == [-7, 7] and floor[1:] == floordiv[1:] == [-7, 7]
        assert [floor, floordiv, rem, fmod] == cpu
        assert rem == fmod == [0, 0, 0]


DIVISIONS_BY_ZERO = {
    "trunc": lambda a, z: torch.div(a, z, rounding_mode="trunc"),
    "floor": lambda a, z: torch.div(a, z, rounding_mode="floor"),
    "// tensor": lambda a, z: a // z,
    "// 0": lambda a, z: a // 0,
    "% tensor": lambda a, z: a % z,
    "% 0": lambda a, z: a % 0,
    "fmod 0": lambda a, z: torch.fmod(a, 0),
    "fmod_ tensor": lambda a, z: a.fmod_(z),
    "bool // 0": lambda a, z: (a > 0) // 0,
    "// a 0-d zero": lambda a, z: a // torch.tensor(0),
    "// broadcast": lambda a, z: a // z[1:2],
}


@pytest.mark.parametrize("dtype", (torch.int64, torch.int32, torch.uint8))
@pytest.mark.parametrize("name", list(DIVISIONS_BY_ZERO))
def test_integer_division_by_zero_raises_torch_error(name, dtype):
    fn = DIVISIONS_BY_ZERO[name]
    a = torch.tensor([5, 1, 0], dtype=dtype)
    z = torch.tensor([1, 0, 2], dtype=dtype)
    with pytest.raises(RuntimeError, match=r"^ZeroDivisionError$"):
        fn(a, z)
    with pytest.raises(RuntimeError, match=r"^ZeroDivisionError$"):
        fn(dev(a), dev(z))
    # no result to compute: no error, as PyTorch
    empty = torch.empty(0, dtype=dtype)
    assert fn(dev(empty), dev(empty)).numel() == fn(empty, empty).numel() == 0


# --- deterministic mode: new memory filled as PyTorch fills it -------------------------------

FILL_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
               torch.complex128, torch.int64, torch.int32, torch.int16, torch.int8,
               torch.uint8, torch.bool)


@pytest.fixture
def deterministic():
    """``torch.use_deterministic_algorithms(True)`` with ``fill_uninitialized_memory``
    (its default), restored afterwards."""
    import torch.utils.deterministic as det
    saved = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             det.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True)
    det.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    det.fill_uninitialized_memory = saved[2]


def _storage_values(t):
    """Every element of ``t``'s storage, in ``t``'s dtype, on the CPU."""
    whole = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())
    return whole.cpu()


def _same_fill(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


FACTORIES = {
    "empty": lambda d, dt: torch.empty(2, 3, dtype=dt, device=d),
    "empty channels_last": lambda d, dt: torch.empty(1, 2, 2, 3, dtype=dt, device=d,
                                                     memory_format=torch.channels_last),
    "empty_like": lambda d, dt: torch.empty_like(torch.zeros(3, 2, dtype=dt, device=d).t()),
    "empty_strided": lambda d, dt: torch.empty_strided((2, 3), (1, 2), dtype=dt, device=d),
    "empty_strided expanded": lambda d, dt: torch.empty_strided((2, 3), (0, 1), dtype=dt,
                                                                device=d),
    "new_empty": lambda d, dt: torch.zeros(2, dtype=dt, device=d).new_empty((4,)),
    "new_empty_strided": lambda d, dt: torch.zeros(2, dtype=dt, device=d).new_empty_strided(
        (2, 2), (1, 2)),
}


@pytest.mark.parametrize("dtype", FILL_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(FACTORIES))
def test_deterministic_mode_fills_new_tensors_as_pytorch(name, dtype, deterministic):
    make = FACTORIES[name]
    expected, actual = make("cpu", dtype), make("hologram", dtype)
    assert actual.stride() == expected.stride()
    _same_fill(actual.cpu(), expected)


# (size, stride or None, new size): PyTorch's own cases for resize_
RESIZES = [
    ((10,), (1,), (5,)), ((10,), (0,), (10,)), ((10,), (1,), (20,)),
    ((2, 3, 4), None, (2, 3, 4)), ((2, 3, 4), None, (6, 3, 4)), ((2, 3, 4), None, (2, 5, 4)),
    ((2, 3, 4), None, (2, 3, 6)), ((2, 3, 4), None, (3, 4, 5)),
    ((2, 3, 4), (1, 4, 12), (2, 3, 4)), ((2, 3, 4), (1, 4, 12), (4, 3, 4)),
    ((2, 3, 4), (1, 4, 12), (2, 4, 4)), ((2, 3, 4), (1, 4, 12), (2, 3, 5)),
    ((2, 3, 4), (1, 4, 12), (3, 4, 5)), ((2, 3, 4), (1, 0, 1), (2, 4, 5)),
]


def _resized(device, dtype, size, stride, new_size):
    """PyTorch's check of a resize_ in deterministic mode (its test_deterministic_resize):
    the storage keeps its old elements, and the elements it grew by are filled."""
    if stride is None:
        a = torch.zeros(size, dtype=dtype, device=device)
    else:
        a = torch.empty_strided(size, stride, dtype=dtype, device=device).fill_(0)
    old = _storage_values(a).clone()
    a.resize_(new_size)
    new = _storage_values(a)
    assert new.numel() >= old.numel()
    _same_fill(new[:old.numel()], old)  # the elements a layout skips are garbage, kept
    grown = new[old.numel():]
    if dtype.is_floating_point or dtype.is_complex:
        assert grown.isnan().all()
    else:
        assert grown.eq(True if dtype is torch.bool else torch.iinfo(dtype).max).all()
    return a.stride(), new.numel()


@pytest.mark.parametrize("dtype", FILL_DTYPES, ids=str)
def test_deterministic_mode_fills_what_resize_grows_as_pytorch(dtype, deterministic):
    for case in RESIZES:
        assert _resized("hologram", dtype, *case) == _resized("cpu", dtype, *case), case
    # a resize into memory_format= fills its new elements too
    x = torch.zeros(2, dtype=dtype, device="hologram").resize_(
        1, 2, 2, 2, memory_format=torch.channels_last)
    y = torch.zeros(2, dtype=dtype).resize_(1, 2, 2, 2, memory_format=torch.channels_last)
    _same_fill(x.cpu(), y)


# --- scalars into device tensors keep their precision ----------------------------------------

SCALARS = [1 / 3 + 0j, 1e-300 + 1e-300j, -2.5e-320 + 1 / 7j, complex(float("inf"), -0.0),
           1 / 3, 1e-300, 2**53 + 1]


def _scalar_cases():
    """(value, dtype) pairs torch takes: no complex value for a real dtype, integer values
    alone for int64."""
    for dtype in (torch.complex128, torch.complex64, torch.float64, torch.float32,
                  torch.int64):
        for value in SCALARS:
            if ((dtype.is_complex or not isinstance(value, complex))
                    and (dtype is not torch.int64 or isinstance(value, int))):
                yield pytest.param(value, dtype, id=f"{value!r}-{dtype}")


@pytest.mark.parametrize("value, dtype", _scalar_cases())
def test_scalars_reach_the_device_exactly_as_on_the_cpu(value, dtype):
    makes = {
        "tensor": lambda d: torch.tensor(value, dtype=dtype, device=d),
        "tensor of a list": lambda d: torch.tensor([value], dtype=dtype, device=d),
        "full": lambda d: torch.full((), value, dtype=dtype, device=d),
        "copy_ of a 0-d CPU tensor": lambda d: torch.zeros((), dtype=dtype, device=d).copy_(
            torch.tensor(value, dtype=dtype)),
        "copy_ broadcast": lambda d: torch.zeros(3, dtype=dtype, device=d).copy_(
            torch.tensor(value, dtype=dtype)),
        "to": lambda d: torch.tensor(value, dtype=dtype).to(d),
        "fill_": lambda d: torch.zeros(2, dtype=dtype, device=d).fill_(value),
    }
    for name, make in makes.items():
        expected, actual = make("cpu"), make("hologram").cpu()
        assert actual.dtype == expected.dtype, name
        assert torch.equal(actual.view(-1).view(torch.uint8),
                           expected.view(-1).view(torch.uint8)), (name, actual, expected)


# --- sin and cos of huge arguments ----------------------------------------------------------

HUGE = [-1e20, 1e20, 3.4e38, -1e30, 1e10, 2.0 ** 100, 131072.0, 1e6, 16367173 * 2.0 ** 72]


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=str)
def test_sin_cos_of_huge_arguments_match_the_cpu(dtype):
    """The mathlib reduces huge arguments exactly (Payne-Hanek): cos(-1e20) is 0.7543 on
    both devices, and so is every other value here within a few ulps (the first five gave
    garbage with the Cody-Waite reduction alone)."""
    values = HUGE + ([1e300, -1.7e308, 6381956970095103 * 2.0 ** 797]
                     if dtype is torch.float64 else [])
    x = torch.tensor(values, dtype=dtype)
    for f in (torch.sin, torch.cos):
        same(f(dev(x)), f(x), (4 * torch.finfo(dtype).eps, 0.0))
    assert abs(torch.cos(dev(torch.tensor(-1e20))).item() - 0.7543) < 1e-4


def test_resizing_a_nonempty_out_warns_as_the_cpu_does():
    import warnings

    a = torch.tensor((1.0, 2, 3), device="hologram")
    for op, inputs in ((torch.exp, (a,)), (torch.add, (a, a))):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            op(*inputs, out=torch.empty(3, device="hologram"))
            op(*inputs, out=torch.empty(0, device="hologram"))
            assert not w
            out = torch.empty(2, device="hologram")
            op(*inputs, out=out)
            assert len(w) == 1 and "resized since it had shape [2]" in str(w[0].message)
            assert out.shape == (3,)
