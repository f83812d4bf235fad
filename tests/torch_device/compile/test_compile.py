"""torch.compile(backend="hologram") against eager PyTorch: values, gradients, what ran
where (compile_stats) and how often dynamo compiled (CompileCounterWithBackend)."""

from __future__ import annotations

import copy
import gc
import importlib.metadata
import math
import re
import warnings

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import hologram_torch
from hologram_torch.compile import graph_lowerings, kernel

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    hologram_torch.reset_compile_stats()
    yield
    torch._dynamo.reset()


def stats():
    return hologram_torch.compile_stats()


def run_both(model, *inputs, grad=True):
    """The model's outputs (and parameter gradients) eager and compiled, on copies."""
    results = []
    for compiled in (False, True):
        m = copy.deepcopy(model)
        xs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
        counter = CompileCounterWithBackend("hologram")
        f = torch.compile(m, backend=counter) if compiled else m
        y = f(*xs)
        grads = None
        if grad:
            weights = torch.linspace(-1, 1, y.numel()).reshape(y.shape).to(y.device)
            (y.float() * weights).sum().backward()
            grads = [p.grad for p in m.parameters()] + [x.grad for x in xs if x.requires_grad]
        results.append((y.detach(), grads, counter))
    return results


def assert_same(eager, compiled):
    (y0, g0, _), (y1, g1, _) = eager, compiled
    assert y1.device == y0.device and y1.dtype == y0.dtype
    torch.testing.assert_close(y1.cpu(), y0.cpu())
    if g0 is not None:
        for a, b in zip(g0, g1):
            torch.testing.assert_close(b.cpu(), a.cpu())


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16),
                               torch.nn.ReLU(), torch.nn.Linear(16, 1))


def test_backend_is_registered_by_entry_point():
    names = importlib.metadata.entry_points(group="torch_dynamo_backends").names
    assert "hologram" in names
    assert "hologram" in torch._dynamo.list_backends()


def test_decompositions_are_the_core_ones_but_implicit_autograd_and_lowered_ops():
    """The backend's table is ``core_aten_decompositions()``'s without the entries of
    CompositeImplicitAutograd ops (they decompose while tracing anyway) and of ops the
    lowering table takes whole: every other core entry is there, the same function."""
    from torch._decomp import core_aten_decompositions

    from hologram_torch.compile.backend import decompositions

    ours, core = decompositions(), dict(core_aten_decompositions().items())
    assert all(core.get(op) is fn for op, fn in ours.items())
    left = [op for op in core if op not in ours and graph_lowerings.get(op) is None
            and not torch._C._dispatch_has_kernel_for_dispatch_key(
                op.name(), "CompositeImplicitAutograd")]
    assert left == []
    lowered = torch.ops.aten.binary_cross_entropy.default  # a fused lowering of ours
    assert graph_lowerings.get(lowered) is not None and lowered in core and lowered not in ours


def test_mlp_training_values_grads_and_counts():
    eager, compiled = run_both(mlp(), torch.randn(8, 32))
    assert_same(eager, compiled)
    s = stats()
    # one dynamo frame, AOTAutograd's forward and backward graphs, each one program:
    # every compute op lowered, only view ops (free) left outside.
    assert compiled[2].frame_count == 1
    assert s["graphs"] == 2 and s["partitions"] == 2 and s["programs"] == 2
    assert s["ops_eager"] == 0 and s["ops_lowered"] > 10
    assert s["eager_fallbacks"] == s["graph_fallbacks"] == s["recompiles"] == 0


def test_second_call_compiles_nothing():
    model = torch.compile(mlp(), backend="hologram")
    x = torch.randn(8, 32)
    with torch.no_grad():
        first = model(x)
        before = stats()
        second = model(x)
    assert stats()["programs"] == before["programs"] == 1
    assert stats()["graphs"] == before["graphs"] == 1  # the inference graph
    torch.testing.assert_close(second, first)


def test_mlp_on_hologram_device():
    x = torch.randn(8, 32, device="hologram")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager, compiled = run_both(mlp().to("hologram"), x)
    assert eager[0].device.type == "hologram"
    assert_same(eager, compiled)
    assert stats()["ops_eager"] == 0 and stats()["programs"] == 2


def transformer():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


def test_transformer_encoder_training():
    x = torch.randn(2, 6, 32, requires_grad=True)
    eager, compiled = run_both(transformer(), x)
    assert_same(eager, compiled)
    s = stats()
    # attention is traced in its math form: nothing but views stays eager
    assert s["ops_eager"] == 0, s["eager_ops"]
    assert s["graphs"] == 2 and s["partitions"] == 2


def test_transformer_encoder_inference():
    model = transformer().eval()
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        expected = model(x)
        # PyTorch's inference fast path is one fused native op per layer: left eager
        got = torch.compile(model, backend="hologram")(x)
        torch.testing.assert_close(got, expected)
        assert stats()["eager_ops"] == {"aten._transformer_encoder_layer_fwd.default": 2}
        torch._dynamo.reset()
        hologram_torch.reset_compile_stats()
        # without it, the layers' ops are lowered into one program
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            got = torch.compile(model, backend="hologram")(x)
        finally:
            torch.backends.mha.set_fastpath_enabled(True)
    torch.testing.assert_close(got, expected)
    s = stats()
    assert s["ops_eager"] == 0 and s["partitions"] == 1 and s["programs"] == 1


@pytest.mark.parametrize("rows", [3, 9, 300])
def test_embedding_and_its_gradient_compile_at_any_table_size(rows):
    """A lookup is a gather and its gradient a scatter-add, one row per index: both are
    compiled whatever the table's size (repeated indices add up)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(rows, 6), torch.nn.Linear(6, 3),
                                torch.nn.Tanh())
    tokens = torch.tensor([[0, rows - 1, 2, 0], [1, 1, rows - 1, 3]]) % rows
    eager, compiled = run_both(model, tokens)
    assert_same(eager, compiled)
    s = stats()
    assert s["eager_ops"] == {} and s["ops_eager"] == 0
    assert s["partitions"] == 2 and s["eager_fallbacks"] == 0



@pytest.mark.parametrize("op", [
    lambda x, i, s: x.index_add(0, i, s),
    lambda x, i, s: x.scatter_add(0, i[:, None].expand(-1, 8), s),
    lambda x, i, s: x.index_put((i,), s, accumulate=True),
])
def test_indexed_stores_compile(op):
    """Indexed stores (the ISA's scatter) compile; repeated indices add up as in eager."""
    x, s = torch.randn(10, 8), torch.randn(5, 8)
    i = torch.tensor([1, 3, 3, 9, 0])
    compiled_agrees(op, x, i, s)

def test_views_stay_in_regions_unless_their_values_leave():
    model = mlp().eval()
    x = torch.randn(4, 32)
    with torch.no_grad():
        got = torch.compile(model, backend="hologram")(x)
        torch.testing.assert_close(got, model(x))
    s = stats()
    # the weights' transposes are read in place by the one program: no eager view call
    assert s["views_eager"] == 0 and s["partitions"] == 1 and s["ops_eager"] == 0
    torch._dynamo.reset()
    hologram_torch.reset_compile_stats()

    def f(a):
        b = (a * 2).t()  # used by an eager op and by compiled ones
        return b.cumsum(0), torch.tanh(b).t() + 1, a.t().exp().t()

    a = torch.randn(3, 5)
    got = torch.compile(f, backend="hologram")(a)
    for g, e in zip(got, f(a)):
        torch.testing.assert_close(g, e)
    s = stats()
    assert s["graph_fallbacks"] == s["eager_fallbacks"] == 0
    assert s["eager_ops"] == {"aten.cumsum.default": 1}


def test_a_view_that_is_all_a_value_leaves_with_is_written_in_its_layout():
    """A value that leaves its region only through one dense view is written in the
    view's layout, with no eager view call (a linear layer's gradients: the weight's
    transposed back, the bias's reshaped); a value seen through two views stays one
    buffer and its views eager, sharing its memory as in eager PyTorch."""
    def f(a):
        b = torch.tanh(a)
        c = a.exp()
        return b.t(), (a * 2).view(-1).t(), c.t(), c.view(-1), (a + 1)[::2]

    a = torch.randn(4, 6)
    got = torch.compile(f, backend="hologram")(a)
    for g, e in zip(got, f(a)):
        torch.testing.assert_close(g, e)
        assert g.shape == e.shape and g.stride() == e.stride()
    assert got[2].data_ptr() == got[3].data_ptr()
    s = stats()
    assert s["views_eager"] == 3 and s["partitions"] == 1  # c's two views, the slice
    torch._dynamo.reset()

    model = torch.nn.Linear(8, 4)
    reference = copy.deepcopy(model)
    x = torch.randn(16, 8)
    out = torch.compile(model, backend="hologram")(x)
    hologram_torch.reset_compile_stats()
    out.square().sum().backward()
    s = stats()
    assert s["graphs"] == 1 and s["views_eager"] == 0 and s["ops_eager"] == 0
    reference(x).square().sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_dropout_runs_eagerly_between_compiled_regions():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.5, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
    x = torch.randn(2, 5, 16)
    compiled = torch.compile(model, backend="hologram")
    y = compiled(x)
    y.sum().backward()
    s = stats()
    # the masks are PyTorch's random draws; everything between them is compiled
    assert set(s["eager_ops"]) == {"aten.native_dropout.default"}
    assert s["partitions"] > 2 and s["eager_fallbacks"] == 0
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert not torch.equal(compiled(x), y)  # new masks on every call
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


def test_cnn_compiles_convolutions_included():
    torch.manual_seed(0)
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(4 * 3 * 3, 10), torch.nn.LogSoftmax(-1))
    eager, compiled = run_both(cnn, torch.randn(2, 3, 8, 8))
    assert_same(eager, compiled)
    s = stats()
    # the forward and the backward graph are one program each
    assert s["eager_ops"] == {} and s["partitions"] == 2 and s["eager_fallbacks"] == 0


def test_graph_break():
    def f(x, w):
        y = torch.tanh(x @ w)
        torch._dynamo.graph_break()
        return (y * y).sum(-1).softmax(0)

    x, w = torch.randn(5, 4), torch.randn(4, 3)
    counter = CompileCounterWithBackend("hologram")
    got = torch.compile(f, backend=counter)(x, w)
    torch.testing.assert_close(got, f(x, w))
    assert counter.frame_count == 2
    assert stats()["graphs"] == 2 and stats()["ops_eager"] == 0


def test_inplace_ops_and_views():
    def f(x, buf):
        y = x.clone()
        y[:, 1:] *= 2.0            # in place through a view
        y.t()[0].add_(1.0)         # a view of a view
        z = y.view(3, 8).transpose(0, 1).relu_()
        buf.mul_(0.5)              # mutates a graph input
        return z[::2] + buf.sum(), y

    x = torch.randn(4, 6)
    buf0, buf1 = torch.randn(3), None
    buf1 = buf0.clone()
    expected = f(x, buf0)
    got = torch.compile(f, backend="hologram")(x, buf1)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(buf1, buf0)


def test_mixed_dtypes():
    def f(a, b, i, h, m):
        s = a * b + i                      # float32 * float64 + int64 -> float64
        t = (h.float() * 2).to(torch.bfloat16) + h  # bfloat16 arithmetic
        return s.sum(0), t, torch.where(m, i, i * 3), (i > 2) & m

    args = (torch.randn(3, 4), torch.randn(4, dtype=torch.float64),
            torch.arange(12).reshape(3, 4), torch.randn(3, 4).to(torch.bfloat16),
            torch.rand(3, 4) > 0.5)
    expected = f(*args)
    got = torch.compile(f, backend="hologram")(*args)
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b)
    assert stats()["ops_eager"] == 0


def test_dynamic_shapes_specialize_per_value():
    def f(x, w):
        return torch.nn.functional.gelu(x @ w).sum(-1) / x.shape[0]

    w = torch.randn(8, 4)
    counter = CompileCounterWithBackend("hologram")
    compiled = torch.compile(f, backend=counter, dynamic=True)
    for n in (3, 5, 9, 5):
        x = torch.randn(n, 8)
        torch.testing.assert_close(compiled(x, w), f(x, w))
    assert counter.frame_count == 1                     # one symbolic graph for dynamo
    assert stats()["programs"] == 3 and stats()["recompiles"] == 2  # one per new size
    assert stats()["ops_lowered"] > 0


def test_partitions_file_their_launches_in_the_launch_cache_and_take_them_away(monkeypatch):
    from hologram.runtime.launch import launch_cache

    owners = []  # of the partitions made (not the partitions: they must be able to die)
    init = kernel.FusedKernel.__init__
    monkeypatch.setattr(kernel.FusedKernel, "__init__",
                        lambda self, *a: (init(self, *a), owners.append(self._owner))[0])

    def f(x):
        return torch.tanh(x) * 2 + 1

    compiled = torch.compile(f, backend="hologram", dynamic=False)
    for n in (3, 5, 3):
        x = torch.randn(n)
        torch.testing.assert_close(compiled(x), f(x))
    assert stats()["programs"] == 2              # the second call of size 3 was served
    keys = [key for key, _ in launch_cache().items() if any(key[0] is o for o in owners)]
    assert len(keys) == 2
    del compiled, keys
    torch._dynamo.reset()
    gc.collect()
    assert not any(key[0] is o for key, _ in launch_cache().items() for o in owners)


def test_new_shapes_recompile_without_failing():
    def f(x, w):
        return torch.relu(x @ w).sum(-1)

    w = torch.randn(8, 4)
    counter = CompileCounterWithBackend("hologram")
    compiled = torch.compile(f, backend=counter)  # dynamic=None: static, then automatic
    for n in (3, 5, 9, 5, 3):
        x = torch.randn(n, 8)
        torch.testing.assert_close(compiled(x, w), f(x, w))
    # a static graph for 3, then one symbolic graph whose region builds a program per size
    assert counter.frame_count == 2 and stats()["graphs"] == 2
    assert stats()["programs"] == 4 and stats()["recompiles"] == 2


def test_unsupported_op_runs_eagerly():
    def f(x):
        return torch.cumsum(x.exp(), 0).sort(-1).values * 2 + 1

    x = torch.randn(6, 5)
    torch.testing.assert_close(torch.compile(f, backend="hologram")(x), f(x))
    s = stats()
    assert "aten.cumsum.default" in s["eager_ops"] and "aten.sort.default" in s["eager_ops"]
    assert s["partitions"] == 2  # exp before, mul/add after


@pytest.mark.parametrize("error", [kernel.HologramError("no program for this test"),
                                   KeyError("a bug in a lowering")])
def test_failed_build_runs_eagerly(monkeypatch, error):
    def broken(*args):
        raise error

    monkeypatch.setattr(kernel, "build", broken)
    model = torch.compile(mlp(), backend="hologram")
    x = torch.randn(8, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), mlp()(x))
    assert stats()["eager_fallbacks"] == 1 and stats()["programs"] == 0


def test_options():
    x = torch.randn(8, 32)
    model = mlp()
    with torch.no_grad():
        got = torch.compile(model, backend="hologram",
                            options={"threads": 1, "fast_math": False})(x)
        torch.testing.assert_close(got, model(x))
        torch._dynamo.reset()
        fast = torch.compile(model, backend="hologram", options={"fast_math": True})(x)
        torch.testing.assert_close(fast, model(x), rtol=1e-4, atol=1e-5)
    with pytest.raises(Exception, match="unknown options"):
        torch.compile(mlp(), backend="hologram", options={"fusion": True})(x)


def test_benchmark_runs_and_checks_against_eager():
    from hologram.backends.cpu import blas
    from hologram.bench import compile as bench

    # quick: the MLP only (the transformer's rows run the same code; its compiles are slow)
    result = bench.run(quick=True)
    rows = result["rows"]
    assert [(r["model"], r["mode"]) for r in rows] == [("mlp", "inference"), ("mlp", "training")]
    assert all(r["check"] == "ok" and r["ms"]["hologram"] > 0 for r in rows)
    assert rows[1]["hologram"]["programs"] == 2
    assert any("| mlp | training | 1 |" in line for line in bench.markdown(result))
    # the section names the BLAS the programs called (torch is imported: MKL's where it is)
    assert any(f"Hologram's BLAS: {blas.describe()}." in line
               for line in bench.markdown(result))


def test_strided_expanded_scalar_empty_and_half_inputs():
    def f(a, b, s, e, h):
        return (a * b + s).sigmoid(), e.exp() + 1, (h * 3).relu() - h.mean(), a.sum(1) * s

    args = (torch.randn(6, 4).t(),                  # transposed: read through its strides
            torch.randn(1, 6).expand(4, 6),         # expanded: stride 0, no copy
            torch.tensor(0.5),                      # 0-d
            torch.randn(0, 3),                      # empty
            torch.randn(5, 3).to(torch.float16))
    expected = f(*args)
    got = torch.compile(f, backend="hologram")(*args)
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b)
    assert stats()["eager_fallbacks"] == 0


def test_optimizer_step_ops_fma_and_scalar_pow():
    """What a compiled Adam step leaves after decomposition: prims.fma (from lerp) and
    aten.pow.Scalar (beta ** step), against eager on random values and edge cases."""
    edge = torch.tensor([0.0, -0.0, 1.0, -1.5, 3.0, float("inf"), -float("inf"),
                         float("nan")])

    def f(a, b, c, step):
        return torch.lerp(a, b, c), 0.9 ** step, 2 ** step, torch.lerp(a, b, 0.25)

    torch.manual_seed(0)
    for args in ((torch.randn(6, 5), torch.randn(6, 5), torch.rand(6, 5), torch.rand(5) * 9),
                 (edge, edge.flip(0), edge.roll(3), edge),
                 (edge.double(), edge.roll(1).double(), edge.roll(2).double(),
                  torch.arange(8.0, dtype=torch.float64))):
        torch._dynamo.reset()
        hologram_torch.reset_compile_stats()
        got = torch.compile(f, backend="hologram")(*args)
        for g, e in zip(got, f(*args)):
            assert g.dtype == e.dtype
            torch.testing.assert_close(g, e, equal_nan=True)
        assert stats()["ops_eager"] == 0, stats()["eager_ops"]

    torch._dynamo.reset()
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    reference = copy.deepcopy(model)
    reference_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2)
    x = torch.randn(8, 32)
    step = torch.compile(optimizer.step, backend="hologram")
    for _ in range(3):
        for m, opt, run in ((model, optimizer, step),
                            (reference, reference_optimizer, reference_optimizer.step)):
            opt.zero_grad()
            m(x).square().mean().backward()
            run()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


@pytest.fixture
def blas_products(monkeypatch):
    """The products compile/graph_lowerings.blas_product made a BLAS call of (a strided
    matrix-vector product padded to a matrix product), as ("sum" or "mm", m, k, n): a sum
    multiplies by ones, a broadcast constant."""
    seen = []
    original = graph_lowerings.blas_product

    def spy(g, a, b):
        if graph_lowerings._strided_vector_product(a, b):
            kind = "sum" if a.strides[1] == 0 else "mm"
            seen.append((kind, a.shape[0], a.shape[1], b.shape[1]))
        return original(g, a, b)

    monkeypatch.setattr(graph_lowerings, "blas_product", spy)
    return seen


def compiled_agrees(fn, *inputs):
    """fn compiled (no grad) gives eager's values, dtype and shape."""
    expected = fn(*inputs)
    with torch.no_grad():
        got = torch.compile(fn, backend="hologram")(*inputs)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    torch.testing.assert_close(got, expected)
    assert stats()["ops_eager"] == 0 and stats()["eager_fallbacks"] == 0


@pytest.mark.parametrize("shape,dim,keepdim,dtype,padded", [
    ((64, 48), [0], False, torch.float32, True),
    ((64, 48), [-2], True, torch.float64, True),
    ((4, 8, 40), [0, 1], False, torch.float32, True),
    ((4, 8, 40), [0, 1], True, torch.float32, True),
    ((8, 40), [0], False, torch.float32, False),      # too few rows for a BLAS call
    ((64, 8), [0], False, torch.float32, False),      # too few columns
    ((64, 48), [1], False, torch.float32, False),     # rows: contiguous, the kernel's
    ((4, 8, 40), [0, 2], False, torch.float32, False),  # not the leading dimensions
])
def test_column_sums_as_products(blas_products, shape, dim, keepdim, dtype, padded):
    x = torch.randn(shape, dtype=dtype)
    x[3, 1] = float("inf") if padded else x[3, 1]  # infinities propagate as in a sum
    compiled_agrees(lambda t: t.sum(dim, keepdim=keepdim) * 2, x)
    assert bool(blas_products) == padded


@pytest.mark.parametrize("make", [
    lambda x: x.t(),                    # columns contiguous: the table's reduction
    lambda x: x.to(torch.int64),        # integers: not a BLAS dtype
    lambda x: x[:, ::2],                # no unit stride: BLAS could not take it
])
def test_column_sums_the_table_keeps(blas_products, make):
    x = torch.randn(64, 80)
    compiled_agrees(lambda t: make(t).sum(0), x)
    compiled_agrees(lambda t: t.sum(0, dtype=torch.float64), x)  # a dtype change
    assert blas_products == []


@pytest.mark.parametrize("a_shape,b_shape,transpose_a,transpose_b,padded", [
    ((1, 32), (32, 40), False, False, True),   # ones @ dy: a column sum
    ((1, 32), (40, 32), False, True, False),   # b's columns contiguous: a fast kernel
    ((24, 32), (32, 1), True, False, True),    # dy.T @ x of a layer with one output
    ((24, 32), (32, 1), False, False, False),  # a's rows contiguous
    ((1, 8), (8, 40), False, False, False),    # too few terms
])
def test_matrix_vector_products_go_to_blas(blas_products, a_shape, b_shape, transpose_a,
                                           transpose_b, padded):
    a = torch.randn(a_shape[::-1]).t() if transpose_a else torch.randn(a_shape)
    b = torch.randn(b_shape).t() if transpose_b else torch.randn(b_shape)
    compiled_agrees(torch.mm, a, b)
    assert bool(blas_products) == padded


def test_bias_and_one_output_gradients_through_blas(blas_products):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 24), torch.nn.Tanh(),
                                torch.nn.Linear(24, 1))
    eager, compiled = run_both(model, torch.randn(32, 40))
    assert_same(eager, compiled)
    # the first layer's bias gradient (sum over 32 rows of 24 columns) and the last
    # layer's weight gradient (1 x 32 @ 32 x 24)
    assert set(blas_products) == {("sum", 1, 32, 24), ("mm", 1, 32, 24)}
    assert stats()["ops_eager"] == 0


@pytest.mark.parametrize("shape,affine,dtype,padded", [
    ((4, 10, 48), True, torch.float32, True),
    ((40, 24), True, torch.float64, True),
    ((4, 10, 48), False, torch.float32, False),  # no weight or bias: nothing to sum
    ((2, 5, 48), True, torch.float32, False),    # 10 rows: the kernel's reduction
])
def test_layer_norm_parameter_gradients_through_blas(blas_products, shape, affine, dtype,
                                                     padded):
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(shape[-1], elementwise_affine=affine, dtype=dtype)
    if affine:
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    x = (torch.randn(shape, dtype=dtype) * 2 + 1).requires_grad_()
    eager, compiled = run_both(torch.nn.Sequential(norm, torch.nn.Tanh()), x)
    assert_same(eager, compiled)
    rows, cols = math.prod(shape[:-1]), shape[-1]
    assert set(blas_products) == ({("sum", 1, rows, cols)} if padded else set())
    assert stats()["ops_eager"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_outer_product_mm(dtype):
    """mm with k = 1 (a one-output layer's input gradient) is a broadcast multiply: one
    term per element, so eager's values bit for bit, infinities and NaN included."""
    a, b = torch.randn(64, 1, dtype=dtype), torch.randn(1, 40, dtype=dtype)
    a[3, 0], b[0, 5], b[0, 7] = float("inf"), 0.0, float("nan")
    with torch.no_grad():
        got = torch.compile(torch.mm, backend="hologram")(a, b)
    assert torch.equal(got.isnan(), torch.mm(a, b).isnan())
    torch.testing.assert_close(got, torch.mm(a, b), rtol=0, atol=0, equal_nan=True)
    assert stats()["ops_eager"] == 0 and stats()["eager_fallbacks"] == 0


def _same_error_or_value(eager, compiled, x, index, bad):
    """``compiled(x, index)`` raises what ``eager(x, index)`` raises (its type, and its
    message but for which bad index it names: eager names the first or the last one
    depending on the kernel; the program, the first), or both return the same value."""
    try:
        want = eager(x, index)
    except (IndexError, RuntimeError) as error:
        with pytest.raises(type(error)) as got:
            compiled(x, index)
        message = str(got.value)
        assert type(got.value) is type(error), got.value
        number = re.search(r"-?\d+", message)
        if number is not None:
            assert int(number.group()) == next(v for v in index.flatten().tolist()
                                               if bad(v)), message
        assert re.sub(r"-?\d+", "#", message, count=1) == \
            re.sub(r"-?\d+", "#", str(error), count=1), (message, str(error))
    else:
        torch.testing.assert_close(compiled(x, index), want)


NLL = {
    "cross_entropy": lambda x, t: torch.nn.functional.cross_entropy(x, t),
    "cross_entropy_none": lambda x, t: torch.nn.functional.cross_entropy(x, t, reduction="none"),
    "nll_loss": lambda x, t: torch.nn.functional.nll_loss(x.log_softmax(1), t) * 2,
    "nll_loss_ignore_7": lambda x, t: torch.nn.functional.nll_loss(x, t, ignore_index=7),
    "cross_entropy_2d": lambda x, t: torch.nn.functional.cross_entropy(
        x.reshape(2, 5, 3), t.reshape(2, 3)),
}


@pytest.mark.parametrize("case", list(NLL))
@pytest.mark.parametrize("labels", [[1, 4, 0, 2, 3, 4], [1, 5, 0, 2, -5, 3], [1, -5, 0, 2, 5, 3],
                                    [1, -100, 0, 2, 3, 4], [7, 0, 0, 1, 1, 1], [0] * 5 + [99]])
def test_compiled_class_labels_out_of_range_raise_as_eager(case, labels):
    """nll_loss's target is a lookup: a class outside [0, C) that is not ignore_index
    (-100 by default) raises IndexError('Target 5 is out of bounds.') as eager does, the
    first such label named; the program raised (no eager fallback), and still computes
    when the labels are in range."""
    fn = NLL[case]
    compiled = torch.compile(fn, backend="hologram")
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(5))
    good = torch.tensor([1, 4, 0, 2, 3, 4])
    torch.testing.assert_close(compiled(x, good), fn(x, good))
    ignored = 7 if case == "nll_loss_ignore_7" else -100
    _same_error_or_value(fn, compiled, x, torch.tensor(labels),
                         lambda v: not 0 <= v < 5 and v != ignored)
    torch.testing.assert_close(compiled(x, good), fn(x, good))
    assert stats()["ops_eager"] == 0 and stats()["eager_fallbacks"] == 0, stats()


@pytest.mark.parametrize("index", [[[1], [4], [0]], [[1], [5], [0]], [[-1], [2], [0]],
                                   [[0], [2], [-9]]])
def test_compiled_gather_out_of_range_raises_as_eager(index):
    """torch.gather takes no index from the end: eager raises RuntimeError('index 5 is out
    of bounds for dimension 1 with size 5') for 5 and -1 alike; so does the program."""
    fn = lambda x, i: torch.gather(x, 1, i) * 2  # noqa: E731
    compiled = torch.compile(fn, backend="hologram")
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(6))
    _same_error_or_value(fn, compiled, x, torch.tensor(index), lambda v: not 0 <= v < 5)
    assert stats()["ops_eager"] == 0 and stats()["eager_fallbacks"] == 0, stats()


@pytest.mark.parametrize("shape, dim", [((6,), 0), ((6, 5), 0), ((6, 5), 1), ((6, 5, 4), 1),
                                        ((6, 5, 4), 2), ((6, 5, 4), -1)])
@pytest.mark.parametrize("index", [[0, 3], [0, -1], [-5, 2], [1, 9]])
def test_compiled_index_select_out_of_range_raises_as_eager(shape, dim, index):
    """index_select takes no index from the end either: eager raises IndexError('index out
    of range in self'), or along dim 1 RuntimeError('INDICES element is out of DATA
    bounds, id=9 axis_dim=5'); so does the program."""
    fn = lambda x, i: torch.index_select(x, dim, i) + 1  # noqa: E731
    compiled = torch.compile(fn, backend="hologram")
    x = torch.randn(shape, generator=torch.Generator().manual_seed(7))
    size = shape[dim]
    _same_error_or_value(fn, compiled, x, torch.tensor(index), lambda v: not 0 <= v < size)
    assert stats()["ops_eager"] == 0 and stats()["eager_fallbacks"] == 0, stats()
