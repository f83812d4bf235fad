"""Matrix products (hologram_torch/aten/linalg.py) and joining / index-based selection
(hologram_torch/aten/shape.py) on the hologram device, against torch's CPU kernels:
every supported dtype, NaN/inf, empty and 0-d operands, non-contiguous views, errors,
gradients, and a check that each op ran natively (no CPU fallback)."""

from __future__ import annotations

import contextlib
import warnings

import pytest

torch = pytest.importorskip("torch")
import hologram_torch  # noqa: E402
from hologram.backends.cpu import gemm  # noqa: E402
from hologram.compiler import pipeline  # noqa: E402
from hologram.compiler.options import CompileOptions  # noqa: E402
from hologram.frontend.graph import Graph  # noqa: E402
from hologram.isa import dtypes as dt  # noqa: E402
from hologram_torch.aten import linalg  # noqa: E402

D = "hologram"
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
NUMBERS = FLOATS + (torch.int64, torch.int32, torch.uint8)
ALL = NUMBERS + (torch.bool,)
TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.float64: (1e-10, 1e-10),
             torch.float16: (1e-3, 1e-3), torch.bfloat16: (1e-2, 1.6e-2)}


def make(shape, dtype, low=-4, high=4):
    if dtype is torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    return torch.randint(0 if dtype is torch.uint8 else low, high, shape, dtype=dtype)


def dev(x):
    if isinstance(x, (list, tuple)):
        return type(x)(map(dev, x))
    return x.to(D) if isinstance(x, torch.Tensor) else x


@contextlib.contextmanager
def native(*ops: str):
    """Assert that none of ``ops`` (aten overload prefixes; all ops when none are given)
    ran through the CPU fallback inside the block."""
    hologram_torch.reset_fallback_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hologram_torch.FallbackWarning)
        yield
    ran = hologram_torch.fallback_stats(lacking=False)
    bad = [name for name in ran if not ops or any(name.startswith(f"aten.{o}.") for o in ops)]
    assert not bad, f"fell back to the CPU: {bad}"


def same(fn, *args, **kwargs):
    """``fn`` on the device equals ``fn`` on the CPU (values, dtype, shape), natively."""
    expected = fn(*args, **kwargs)
    with native():
        actual = fn(*map(dev, args), **{k: dev(v) for k, v in kwargs.items()})
    assert actual.device.type == D
    atol, rtol = TOLERANCE.get(expected.dtype, (0, 0))
    torch.testing.assert_close(actual.cpu(), expected, atol=atol, rtol=rtol, equal_nan=True)
    return actual


# --- matrix products --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", NUMBERS)
def test_mm_dtypes(dtype):
    same(torch.mm, make((7, 5), dtype), make((5, 3), dtype))
    same(torch.bmm, make((2, 7, 5), dtype), make((2, 5, 3), dtype))
    same(torch.mv, make((7, 5), dtype), make((5,), dtype))
    same(torch.dot, make((5,), dtype), make((5,), dtype))
    same(torch.vdot, make((5,), dtype), make((5,), dtype))
    same(torch.addmm, make((3,), dtype), make((7, 5), dtype), make((5, 3), dtype))


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
def test_mm_views(dtype):
    a, b = make((9, 6), dtype), make((6, 8), dtype)
    same(lambda x, y: x.t() @ y.t(), a.t().contiguous(), b.t().contiguous())
    same(lambda x, y: x.t() @ y, a.t().contiguous(), b)
    same(lambda x, y: x[::2, 1:] @ y[1:, ::3], a, b)  # no unit stride in a's rows
    same(lambda x, y: x[:, ::2] @ y[::2], a, b)
    same(lambda x, y: torch.mm(x.expand(4, 6), y), make((1, 6), dtype), b)


def test_mm_special_values():
    a, b = torch.randn(4, 3), torch.randn(3, 5)
    a[0, 1], a[2, 0], b[1, 4] = float("nan"), float("inf"), float("-inf")
    same(torch.mm, a, b)
    same(torch.addmm, torch.tensor([1.0, float("nan"), 2, 3, 4]), a, b)


@pytest.mark.parametrize("shapes", [((0, 3), (3, 4)), ((3, 0), (0, 4)), ((3, 4), (4, 0)),
                                    ((0, 0), (0, 0))])
def test_mm_empty(shapes):
    a, b = (torch.randn(s) for s in shapes)
    out = same(torch.mm, a, b)
    assert out.shape == (shapes[0][0], shapes[1][1])
    same(torch.addmm, torch.randn(shapes[1][1]), a, b, beta=0.5)
    same(torch.bmm, a.expand(2, *a.shape), b.expand(2, *b.shape))


def test_addmm_scalars_and_beta_zero():
    bias, a, b = torch.randn(4, 5), torch.randn(4, 3), torch.randn(3, 5)
    same(torch.addmm, bias, a, b, beta=0.5, alpha=-2)
    same(torch.addmm, bias, a, b, beta=1, alpha=0.25)
    same(torch.addmm, torch.full((4, 5), float("nan")), a, b, beta=0)  # input ignored
    same(torch.addmm, torch.randn(1, 5), a, b)  # broadcast input
    same(torch.addmm, torch.randn(()), a, b, beta=3)
    ints = [make(s, torch.int64) for s in ((4, 5), (4, 3), (3, 5))]
    same(torch.addmm, *ints, beta=2, alpha=3)


@pytest.mark.parametrize("dtype", FLOATS)
def test_batched_affine(dtype):
    b1, b2 = make((3, 4, 5), dtype), make((3, 5, 6), dtype)
    same(torch.baddbmm, make((4, 6), dtype), b1, b2, beta=0.5, alpha=2)
    same(torch.addbmm, make((4, 6), dtype), b1, b2, beta=0.5, alpha=2)
    same(torch.addbmm, make((6,), dtype), b1[:0], b2[:0])  # no batch entries
    same(torch.addmv, make((4,), dtype), make((4, 5), dtype), make((5,), dtype), alpha=3)


def test_inplace_and_out():
    bias, a, b = torch.randn(4, 5), torch.randn(4, 3), torch.randn(3, 5)
    same(lambda c, x, y: c.clone().addmm_(x, y, beta=2), bias, a, b)
    same(lambda x, y: torch.mm(x, y, out=torch.empty(0, device=x.device)), a, b)
    # out= aliasing an input: PyTorch's CPU kernel runs (on aliases of the device memory),
    # which computes this product as on the CPU (tests/torch_device/device/test_errors.py: the cases
    # where it reads what it has overwritten, and the index ops that raise)
    x = torch.randn(4, 4)
    device_x = dev(x)
    torch.mm(device_x, device_x, out=device_x)
    torch.testing.assert_close(device_x.cpu(), x @ x)
    with pytest.raises(RuntimeError):
        torch.mm(dev(a), dev(b), out=torch.empty(4, 5, dtype=torch.float64, device=D))
    with pytest.raises(RuntimeError):
        dev(torch.randn(5)).addmm_(dev(a), dev(b))  # result shape differs from self's


@pytest.mark.parametrize("shapes", [((2, 1, 3, 4), (5, 4, 2)), ((4,), (4,)), ((3, 4), (4,)),
                                    ((4,), (4, 3)), ((2, 3, 4), (4, 5)), ((4,), (2, 4, 3)),
                                    ((2, 3, 4), (4,))])
def test_matmul_broadcasting(shapes):
    same(torch.matmul, *(torch.randn(s) for s in shapes))


def test_linear():
    x, w, bias = torch.randn(5, 2, 4), torch.randn(3, 4), torch.randn(3)
    same(torch.nn.functional.linear, x, w, bias)
    same(torch.nn.functional.linear, x, w)


def test_product_errors():
    a, b = dev(torch.randn(3, 4)), dev(torch.randn(5, 6))
    with pytest.raises(RuntimeError, match="mm"):
        torch.mm(a, b)
    with pytest.raises(RuntimeError):
        torch.mm(a, dev(torch.randn(4, 2, dtype=torch.float64)))
    with pytest.raises(RuntimeError):
        torch.bmm(dev(torch.randn(2, 3, 4)), dev(torch.randn(3, 4, 5)))
    with pytest.raises(RuntimeError):
        torch.dot(dev(torch.randn(3)), dev(torch.randn(4)))
    with pytest.raises(RuntimeError):
        torch.mm(dev(torch.ones(2, 2, dtype=torch.bool)), dev(torch.ones(2, 2, dtype=torch.bool)))


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
@pytest.mark.parametrize("case", ["mm", "addmm", "bmm", "matmul", "linear", "baddbmm", "mv"])
def test_product_gradients(case, dtype):
    shapes = {"mm": [(4, 3), (3, 5)], "addmm": [(5,), (4, 3), (3, 5)],
              "bmm": [(2, 4, 3), (2, 3, 5)], "matmul": [(2, 1, 4, 3), (5, 3, 2)],
              "linear": [(6, 2, 3), (4, 3), (4,)], "baddbmm": [(4, 5), (2, 4, 3), (2, 3, 5)],
              "mv": [(4, 3), (3,)]}[case]
    fn = {"mm": torch.mm, "addmm": torch.addmm, "bmm": torch.bmm, "matmul": torch.matmul,
          "linear": torch.nn.functional.linear, "baddbmm": torch.baddbmm,
          "mv": torch.mv}[case]
    leaves = [torch.randn(s, dtype=dtype, requires_grad=True) for s in shapes]
    expected = fn(*leaves)
    grad = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, leaves, grad)
    device_leaves = [x.detach().to(D).requires_grad_() for x in leaves]
    with native("mm", "bmm", "addmm", "baddbmm", "addmv", "mv", "dot"):
        actual = fn(*device_leaves)
        actual_grads = torch.autograd.grad(actual, device_leaves, grad.to(D))
    atol, rtol = TOLERANCE[dtype]
    for a, e in zip(actual_grads, expected_grads):
        torch.testing.assert_close(a.cpu(), e, atol=atol, rtol=rtol)


def _lowered(build, *inputs):
    """The CPU backend's view of a builder: (kernels left, GEMMs split off)."""
    g = Graph("probe")
    tensors = [g.strided_input(f"x{i}", dt.float32, shape, strides)
               for i, (shape, strides) in enumerate(inputs)]
    g.output("out", build(g, *tensors, dt.float32), (5, 1))
    options = CompileOptions()
    program, gemms = gemm.split(pipeline.lower(pipeline.canonical_form(g.program(), options),
                                               options))
    return program.kernels, sum(map(len, gemms.values()))


def test_float32_products_reach_blas():
    # row-major and transposed operands: BLAS writes the output, no kernel is left
    assert _lowered(linalg._product_build, ((4, 3), (3, 1)), ((3, 5), (5, 1))) == ((), 1)
    assert _lowered(linalg._product_build, ((4, 3), (1, 4)), ((3, 5), (1, 3))) == ((), 1)
    # addmm: one GEMM, the bias is an epilogue kernel
    kernels, gemms = _lowered(
        lambda g, c, a, b, d: linalg._affine_build(g, c, a, b, None, None, d, "one", True,
                                                   False), ((5,), (1,)), ((4, 3), (3, 1)),
        ((3, 5), (5, 1)))
    assert gemms == 1 and all("contract" not in [i.op for i in k.body] for k in kernels)


# --- cat and stack ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL)
def test_cat_dtypes(dtype):
    a, b = make((2, 3), dtype), make((4, 3), dtype)
    same(torch.cat, [a, b])
    same(torch.cat, [a.t(), b.t()], dim=-1)  # non-contiguous inputs
    same(torch.stack, [a, a], dim=1)
    same(torch.hstack, [a, a])


def test_cat_cases():
    a = torch.randn(2, 3)
    same(torch.cat, [a, torch.randint(0, 5, (2, 2))], dim=1)  # type promotion
    same(torch.cat, [a, torch.randn(0)], dim=1)  # legacy: 1-D empties are skipped
    same(torch.cat, [a, torch.randn(0, 3), a], dim=0)
    same(torch.cat, [torch.randn(0, 3), torch.randn(0, 3)])
    same(torch.cat, [torch.tensor([float("nan"), float("inf")]), torch.tensor([-0.0])])
    same(torch.cat, [a[:, ::2], a[1:, 1:]], dim=0)
    same(lambda x, y: torch.cat([x, y], dim=0, out=torch.empty(0, device=x.device)), a, a)
    nhwc = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    out = same(torch.cat, [nhwc, nhwc], dim=1)
    assert out.stride() == torch.cat([nhwc, nhwc], dim=1).stride()
    with pytest.raises(RuntimeError):
        torch.cat([dev(a), dev(torch.randn(2, 4))])
    with pytest.raises(RuntimeError):
        torch.stack([dev(a), dev(torch.randn(3, 2))])


# --- index_select, gather, scatter, index_add --------------------------------------------

@pytest.mark.parametrize("dtype", ALL)
def test_selection_dtypes(dtype):
    x = make((4, 5), dtype)
    index = torch.tensor([[0, 4, 2], [3, 3, 1]])
    same(torch.index_select, x, 1, torch.tensor([4, 0, 0, 2]))
    same(torch.index_select, x, 0, torch.tensor([3, 1], dtype=torch.int32))
    same(torch.gather, x, 1, index)
    same(torch.gather, x, 0, torch.tensor([[3, 0], [1, 2]]))
    src = make((2, 3), dtype)
    same(lambda s, i, v: s.scatter(1, i, v), x, torch.tensor([[0, 4, 2], [3, 1, 2]]), src)
    same(lambda s, i, v: s.scatter_add(0, i, v), x, index[:, :2] % 4, src[:, :2])
    same(lambda s, i: s.scatter(1, i, 1), x, index)
    same(lambda s, i, v: s.index_add(1, i, v), x, torch.tensor([4, 0, 4]), make((4, 3), dtype))


def test_selection_special_values():
    x = torch.tensor([[float("nan"), 1.0, float("inf")], [-float("inf"), 2.0, 3.0]])
    same(torch.gather, x, 1, torch.tensor([[1, 2], [1, 1]]))  # NaN/-inf never picked
    same(torch.gather, x, 1, torch.tensor([[0], [0]]))
    same(torch.index_select, x, 1, torch.tensor([1]))
    same(lambda s, i, v: s.scatter_add(1, i, v), x, torch.tensor([[1], [0]]),
         torch.tensor([[float("nan")], [5.0]]))


def test_selection_shapes():
    x = torch.randn(3, 4, 5)
    same(torch.index_select, x, -1, torch.tensor([4, 1]))
    same(torch.index_select, x, 1, torch.tensor(2))  # 0-d index
    same(torch.index_select, x, 1, torch.tensor([], dtype=torch.int64))
    same(torch.index_select, torch.tensor(3.5), 0, torch.tensor([0]))  # 0-d self
    same(torch.gather, torch.tensor(3.5), 0, torch.tensor(0))
    same(torch.gather, x.transpose(0, 2), 1, torch.randint(0, 4, (5, 2, 3)))
    same(torch.gather, x, 2, torch.zeros(3, 0, 2, dtype=torch.int64))
    same(lambda s, i, v: s.scatter(2, i, v), x, torch.randint(0, 5, (2, 3, 1)),
         torch.randn(3, 4, 2))
    same(lambda s, i, v: s.scatter(0, i, v), x, torch.zeros(0, 4, 5, dtype=torch.int64),
         torch.randn(3, 4, 5))
    same(lambda s, i, v: s.scatter(0, i, v, reduce="multiply"), x,
         torch.tensor([[[0, 2]], [[0, 2]]]), torch.randn(2, 1, 2))
    same(lambda s, i: s.scatter(0, i, 2.0, reduce="add"), x, torch.tensor([[[0, 2]], [[0, 2]]]))
    same(lambda s, i, v: s.clone().scatter_(1, i, v), x, torch.tensor([[[1], [3]]]),
         torch.randn(1, 2, 1))
    same(lambda s, i, v: s.clone().index_add_(0, i, v, alpha=2), x, torch.tensor([2, 2]),
         torch.randn(2, 4, 5))


def test_scatter_duplicates_last_wins():
    x = torch.zeros(2, 4)
    index = torch.tensor([[1, 1, 1], [0, 2, 0]])
    src = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    out = same(lambda s, i, v: s.scatter(1, i, v), x, index, src)
    assert out.cpu()[0, 1] == 3.0 and out.cpu()[1, 0] == 6.0


def test_selection_errors():
    x = dev(torch.randn(3, 4))
    with pytest.raises(IndexError, match="index out of range"):
        torch.index_select(x, 0, dev(torch.tensor([3])))
    with pytest.raises(RuntimeError, match="out of DATA bounds"):  # the CPU's error here
        torch.index_select(x, 1, dev(torch.tensor([-1])))
    with pytest.raises(RuntimeError, match="index 4 is out of bounds for dimension 1"):
        torch.gather(x, 1, dev(torch.tensor([[4]])))
    with pytest.raises(RuntimeError, match="index -1 is out of bounds"):
        x.scatter(0, dev(torch.tensor([[-1]])), 1.0)
    with pytest.raises(RuntimeError):
        x.scatter_add(0, dev(torch.tensor([[3]])), dev(torch.ones(1, 1)))
    with pytest.raises(RuntimeError, match="index 5 is out of bounds for dimension 0"):
        x.index_add(0, dev(torch.tensor([5])), dev(torch.ones(1, 4)))  # as on the CPU
    with pytest.raises(RuntimeError):  # index of another rank
        torch.gather(x, 1, dev(torch.tensor([1])))
    with pytest.raises(RuntimeError):  # float index
        torch.index_select(x, 0, dev(torch.tensor([1.0])))


@pytest.mark.parametrize("case", ["gather", "index_select", "scatter", "scatter_add", "cat",
                                  "stack", "index_add"])
def test_selection_gradients(case):
    fn, shapes, extra = {
        "gather": (lambda x, i: torch.gather(x, 1, i), [(3, 4)],
                   [torch.tensor([[0, 3], [2, 2], [1, 0]])]),
        "index_select": (lambda x, i: torch.index_select(x, 1, i), [(3, 4)],
                         [torch.tensor([3, 3, 0])]),
        "scatter": (lambda x, v, i: x.scatter(1, i, v), [(3, 4), (3, 2)],
                    [torch.tensor([[0, 3], [2, 1], [1, 0]])]),
        "scatter_add": (lambda x, v, i: x.scatter_add(1, i, v), [(3, 4), (3, 2)],
                        [torch.tensor([[0, 0], [2, 1], [1, 3]])]),
        "cat": (lambda x, y: torch.cat([x, y], 1), [(3, 4), (3, 2)], []),
        "stack": (lambda x, y: torch.stack([x, y]), [(3, 4), (3, 4)], []),
        "index_add": (lambda x, v, i: x.index_add(0, i, v), [(3, 4), (2, 4)],
                      [torch.tensor([2, 2])]),
    }[case]
    leaves = [torch.randn(s, dtype=torch.float64, requires_grad=True) for s in shapes]
    expected = fn(*leaves, *extra)
    grad = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, leaves, grad)
    device_leaves = [x.detach().to(D).requires_grad_() for x in leaves]
    with native("gather", "index_select", "scatter", "scatter_add", "cat", "index_add"):
        actual = fn(*device_leaves, *map(dev, extra))
        actual_grads = torch.autograd.grad(actual, device_leaves, grad.to(D))
    for a, e in zip(actual_grads, expected_grads):
        torch.testing.assert_close(a.cpu(), e)


@pytest.mark.parametrize("dtype", (torch.float32, torch.int64))
@pytest.mark.parametrize("offset, dims", [(0, (-2, -1)), (1, (0, 2)), (-2, (2, 0))])
def test_diag_embed(dtype, offset, dims):
    # writes through a diagonal view, a layout a program does not store to (the copy into
    # it runs on the CPU): values and gradients as on the CPU
    x = make((2, 3, 4), dtype)
    expected = torch.diag_embed(x, offset, *dims)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hologram_torch.FallbackWarning)
        actual = torch.diag_embed(dev(x), offset, *dims)
        assert actual.device.type == D and torch.equal(actual.cpu(), expected)
        if dtype.is_floating_point:
            leaf = dev(x).requires_grad_()
            torch.diag_embed(leaf, offset, *dims).sum().backward()
            assert torch.equal(leaf.grad.cpu(), torch.ones_like(x))
