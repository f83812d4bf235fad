"""The pass pipeline: canonical forms, exact rewrites, fusion, scheduling, dumps."""

from __future__ import annotations

import math
import weakref

import numpy as np
import pytest
from util import execute, inputs_for, same_bits

from hologram import backends
from hologram.compiler import CompileOptions, canonicalize, pipeline
from hologram.compiler.passes import canonicalize as canonicalize_pass
from hologram.compiler.passes import fuse
from hologram.compiler.passes.schedule import grid_rank
from hologram.errors import CompileError, ShapeError
from hologram.frontend.graph import Graph
from hologram.isa import dtypes as dt
from hologram.isa.builder import ProgramBuilder
from hologram.isa.text import parse_program
from hologram.isa.verify import verify

F32 = dt.float32


def _elementwise(build, dtype=F32, n=16, names="abc"):
    """A one-kernel program y = build(k, *loads) over inputs named ``names``."""
    b = ProgramBuilder("ew")
    ins = [b.input(name, dtype, (n,)) for name in names]
    k = b.kernel((n,))
    value = build(k, *[k.load(i) for i in ins])
    k.store(b.output("y", value.dtype, (n,)), value, shape=(n,))
    return b.build()


def _canon(program, fast_math=False):
    return canonicalize(program, CompileOptions(fast_math=fast_math))


def _ops(program):
    return [i.op for k in program.kernels for i in k.body]


# --- canonical forms -------------------------------------------------------------------
@pytest.mark.parametrize(
    "first, second",
    [
        (lambda k, a, b, c: k.add(a, b), lambda k, a, b, c: k.add(b, a)),
        (lambda k, a, b, c: k.mul(a, 2.0), lambda k, a, b, c: k.add(a, a)),
        (lambda k, a, b, c: k.add(k.mul(a, b), c), lambda k, a, b, c: k.add(c, k.mul(b, a))),
        (lambda k, a, b, c: k.gt(a, b), lambda k, a, b, c: k.lt(b, a)),
        (lambda k, a, b, c: k.sub(a, b), lambda k, a, b, c: k.add(a, k.neg(b))),
        (lambda k, a, b, c: k.max(k.min(a, b), c), lambda k, a, b, c: k.max(c, k.min(b, a))),
        (lambda k, a, b, c: k.neg(a), lambda k, a, b, c: k.mul(a, -1.0)),
        (lambda k, a, b, c: a, lambda k, a, b, c: k.div(k.neg(k.neg(a)), 1.0)),
        (lambda k, a, b, c: k.select(k.lt(a, b), a, c),
         lambda k, a, b, c: k.select(k.not_(k.gt(b, a)), c, a)),
        (lambda k, a, b, c: k.exp(a), lambda k, a, b, c: k.cast(k.cast(k.exp(a), "f64"), "f32")),
    ],
)
def test_spellings_share_one_canonical_form(first, second):
    p, q = _canon(_elementwise(first)), _canon(_elementwise(second))
    assert p.structurally_equal(q)
    assert p.fingerprint() == q.fingerprint()
    inputs = inputs_for(p)
    for x, y in zip(execute(_elementwise(first), inputs), execute(_elementwise(second), inputs)):
        assert same_bits(x, y)


def test_load_order_and_buffer_names_do_not_matter():
    def program(order, names):
        b = ProgramBuilder("p")
        x, y = b.input(names[0], F32, (8,)), b.input(names[1], F32, (8,))
        out = b.output(names[2], F32, (8,))
        k = b.kernel((8,))
        loads = {0: None, 1: None}
        for i in order:
            loads[i] = k.load((x, y)[i])
        k.store(out, k.sub(k.exp(loads[0]), loads[1]))
        return b.build()

    p, q = _canon(program((0, 1), "abc")), _canon(program((1, 0), "xyz"))
    assert p.fingerprint() == q.fingerprint()
    assert p != q  # names are kept; only the structure is compared


def test_canonicalize_is_idempotent_and_pure(monkeypatch):
    p = _elementwise(lambda k, a, b, c: k.add(k.mul(a, b), k.mul(b, a)))
    before = str(p)
    c = _canon(p)
    assert _canon(c) is c  # known canonical: handed back as it is
    # and it is: another pass over it, not knowing, changes nothing
    monkeypatch.setattr(canonicalize_pass, "_CANONICAL", weakref.WeakKeyDictionary())
    assert _canon(c) == c
    assert str(p) == before


def _lerp(shape):
    """Adam's lerp, as the torch device spells it, on tensors of ``shape``."""
    g = Graph("lerp")
    x0, x1 = g.input("x0", F32, shape), g.input("x1", F32, shape)
    s = g.cast(g.input("w", dt.float64, ()), F32)
    g.output("out0", g.where(g.binary("lt", abs(s), 0.5), x0 + (x1 - x0) * s,
                             x1 - (x1 - x0) * (1.0 - s)))
    return g.program()


def _without_extents(program):
    """Each kernel body with the shapes, maps and bounds left out."""
    return [[(i.op, i.dtype, i.args, (i.attrs[0], i.attrs[3:]) if i.op in
              ("load", "store", "gather", "scatter") else i.attrs) for i in k.body]
            for k in program.kernels]


def test_the_canonical_order_does_not_depend_on_extents():
    """Operands and loads are ordered by the expression tree without its extents first,
    so one operation on tensors of other shapes lowers to the same kernel (one LLVM
    module); the order is canonical still (the spelling does not matter)."""
    lowered = [pipeline.lower(pipeline.canonical_form(_lerp(shape)))
               for shape in [(2048,), (64, 192), (12288,), (3, 5, 7)]]
    first = _without_extents(lowered[0])
    assert all(_without_extents(p) == first for p in lowered[1:])
    from hologram.backends.cpu import render

    assert len({render.render(p, {"k0": "f"}, name="m") for p in lowered[:3]}) == 1


def test_canonicalization_stops_at_a_round_that_only_ordered(monkeypatch):
    """A round in which no rule applied and nothing was dropped is the last; its result is
    the fixpoint a confirming round would find (programs after fusion, with the dead stores
    of inlined producers, included)."""
    programs = [_elementwise(lambda k, a, b, c: k.add(k.mul(b, a), k.exp(c))),
                _lerp((8, 4)),
                pipeline.run(pipeline.canonical_form(_lerp((8, 4))), start="fuse",
                             stop="fuse")]
    rounds = []
    real = canonicalize_pass.rewrite

    def counted(kernel, options):
        rounds.append(kernel.name)
        return real(kernel, options)

    monkeypatch.setattr(canonicalize_pass, "rewrite", counted)
    for p in programs:
        monkeypatch.setattr(canonicalize_pass, "_CANONICAL", weakref.WeakKeyDictionary())
        c = _canon(p)
        monkeypatch.setattr(canonicalize_pass, "_CANONICAL", weakref.WeakKeyDictionary())
        rounds.clear()
        assert _canon(c) == c
        assert len(rounds) == len(c.kernels)  # one round, which changed nothing


def test_verification_is_remembered_per_object_not_per_equal_program(monkeypatch):
    import importlib

    from hologram.errors import IRError
    from hologram.isa.ir import Instr, Program

    verify_mod = importlib.import_module("hologram.isa.verify")  # (the package exports verify)

    p = _elementwise(lambda k, a, b: k.lt(a, b), names="ab")  # verified when built
    checked = []
    real = verify_mod._verify
    monkeypatch.setattr(verify_mod, "_verify", lambda q: checked.append(q) or real(q))
    assert verify(p) is p and not checked  # the builder's check is remembered
    # An equal program with a bool constant encoded as 1 (1 == True): not valid, and not
    # taken for the one verified.
    b = ProgramBuilder("ew")
    x = b.input("a", F32, (16,))
    y = b.output("y", dt.bool_, (16,))
    k = b.kernel((16,))
    k.store(y, k.and_(k.lt(k.load(x), 0.0), k.const(True, "bool")))
    good = b.build()
    kernel = good.kernels[0]
    body = tuple(Instr(i.op, i.dtype, i.shape, i.args, (1,))
                 if i.op == "const" and i.dtype is dt.bool_ else i for i in kernel.body)
    bad = Program(good.name, good.buffers, (kernel.evolve(body=body),))
    assert bad == good
    with pytest.raises(IRError, match="not an encoded bool"):
        verify(bad)


def test_a_canonical_form_is_known_only_under_its_options():
    p = _elementwise(lambda k, a, b, c: k.add(k.mul(a, b), 0.0))
    exact = _canon(p)
    assert _ops(exact).count("add") == 1
    fast = _canon(exact, fast_math=True)  # x + 0.0 -> x is allowed now
    assert fast is not exact and "add" not in _ops(fast)


def test_fusion_with_nothing_to_fuse_keeps_the_program():
    """The same object, which the canonicalization after fusion then knows."""
    p = pipeline.canonical_form(_elementwise(lambda k, a, b, c: k.add(a, b)))
    fused = pipeline.run(p, start="fuse", stop="fuse")
    assert fused is p
    assert pipeline.run(p, start="fuse", stop="canonicalize.fused") is p


def test_common_subexpressions_merge():
    p = _canon(_elementwise(lambda k, a, b, c: k.add(k.exp(k.mul(a, b)), k.exp(k.mul(b, a)))))
    assert _ops(p).count("exp") == 1 and _ops(p).count("mul") == 2  # x+x -> x*2


def test_dead_code_and_dead_temporaries_are_removed():
    b = ProgramBuilder("dead")
    x = b.input("x", F32, (4,))
    t = b.temp("t", F32, (4,))
    y = b.output("y", F32, (4,))
    k = b.kernel((4,))
    v = k.load(x)
    k.sin(v)  # unused
    k.store(t, k.cos(v))  # never read
    k.store(y, k.exp(v))
    p = _canon(b.build())
    assert _ops(p) == ["load", "exp", "store"]
    assert [buf.name for buf in p.buffers] == ["x", "y"]


# --- exactness ------------------------------------------------------------------------
def _edge_inputs(n=16):
    values = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-40, -1e-40, 3e38,
                       -3e38, 0.5, 2.0, -2.5, 1e-45, 7.0], dtype=np.float32)[:n]
    rng = np.random.default_rng(1)
    return [values, rng.permutation(values), rng.permutation(values)]


@pytest.mark.parametrize(
    "build, survives",
    [
        (lambda k, a, b, c: k.add(a, 0.0), "add"),  # -0.0 + 0.0 is +0.0
        (lambda k, a, b, c: k.mul(a, 0.0), "mul"),  # inf * 0 is NaN, -1 * 0 is -0.0
        (lambda k, a, b, c: k.sub(a, a), "sub"),  # inf - inf is NaN
        (lambda k, a, b, c: k.div(a, a), "div"),
        (lambda k, a, b, c: k.eq(a, a), "eq"),  # NaN != NaN
        (lambda k, a, b, c: k.add(k.mul(a, b), c), "mul"),  # no fma contraction
        (lambda k, a, b, c: k.add(k.add(a, 1.0), 2.0), "add"),  # no float reassociation
    ],
)
def test_inexact_rewrites_are_not_applied(build, survives):
    p = _elementwise(build)
    c = _canon(p)
    assert survives in _ops(c)
    inputs = _edge_inputs()
    for x, y in zip(execute(p, inputs), execute(c, inputs)):
        assert same_bits(x, y)


@pytest.mark.parametrize(
    "build",
    [
        lambda k, a, b, c: k.add(a, -0.0),
        lambda k, a, b, c: k.sub(a, 0.0),
        lambda k, a, b, c: k.mul(a, 1.0),
        lambda k, a, b, c: k.div(a, 1.0),
        lambda k, a, b, c: k.max(a, a),
        lambda k, a, b, c: k.neg(k.neg(a)),
        lambda k, a, b, c: k.select(k.lt(a, b), a, a),
        lambda k, a, b, c: k.cast(a, "f32"),
    ],
)
def test_exact_identities_reduce_to_the_operand(build):
    p = _elementwise(build)
    c = _canon(p)
    assert _ops(c) == ["load", "store"]
    inputs = _edge_inputs()
    for x, y in zip(execute(p, inputs), execute(c, inputs)):
        assert same_bits(x, y)


def test_integer_identities_use_wrapping_arithmetic():
    p = _elementwise(lambda k, a, b, c: k.add(k.mul(a, 0), k.sub(b, b)), dtype=dt.int32)
    assert _ops(_canon(p)) == ["const", "store"]
    p = _elementwise(lambda k, a, b, c: k.add(k.add(a, 7), 2**31 - 1), dtype=dt.int32)
    c = _canon(p)
    assert _ops(c).count("add") == 1
    x = np.array([0, 5, -(2**31), 2**31 - 1] * 4, dtype=np.int32)
    assert np.array_equal(execute(p, [x, x, x])[0], execute(c, [x, x, x])[0])
    # u8: x / 255 is not x / -1.
    p = _elementwise(lambda k, a, b, c: k.div(a, 255), dtype=dt.uint8)
    assert "div" in _ops(_canon(p))


def test_fast_math_allows_inexact_rewrites():
    p = _elementwise(lambda k, a, b, c: k.add(k.mul(a, b), k.add(c, 0.0)))
    fast = _canon(p, fast_math=True)
    assert "fma" in _ops(fast) and "mul" not in _ops(fast)
    assert _canon(p).fingerprint() != fast.fingerprint()
    assert CompileOptions(fast_math=True).key() != CompileOptions().key()


def test_constant_folding_follows_the_interpreter():
    b = ProgramBuilder("fold")
    y = b.output("y", F32, (4,))
    z = b.output("z", dt.int32, (4,))
    k = b.kernel((4,))
    k.store(y, k.add(k.div(k.const(1.0, F32), k.const(-0.0, F32)), k.exp(k.const(1.0, F32))),
            shape=(4,))
    k2 = b.kernel((4,))
    nan_to_int = k2.cast(k2.const(math.nan, F32), "i32")
    k2.store(z, k2.add(k2.div(k2.const(7, "i32"), k2.const(0, "i32")), nan_to_int), shape=(4,))
    p = b.build()
    c = _canon(p)
    assert [op for op in _ops(c) if op not in ("const", "store")] == []
    for x, y in zip(execute(p, []), execute(c, [])):
        assert same_bits(x, y)
    assert execute(c, [])[0][0] == -np.inf and execute(c, [])[1][0] == 0


def test_reducing_a_broadcast_value():
    b = ProgramBuilder("bcast")
    x = b.input("x", dt.int32, (4, 1))
    y = b.output("y", dt.int32, (4, 1))
    z = b.output("z", F32, (4, 1))
    k = b.kernel((4, 6), grid_rank=1)
    v = k.load(x, (4, 1), strides=(1, 0))
    k.store(y, k.reduce("sum", v, 1))  # six copies: 6 * x
    k.store(z, k.reduce("max", k.cast(v, F32), 1))
    p = b.build()
    c = _canon(p)
    assert "reduce" not in _ops(c)
    inputs = [np.array([1, -3, 2**30, 0], dtype=np.int32)]
    for u, v in zip(execute(p, inputs), execute(c, inputs)):
        assert same_bits(u, v)
    assert list(execute(c, inputs)[0]) == [6, -18, (6 * 2**30) % 2**32 - 2**32, 0]


# --- fusion -----------------------------------------------------------------------------
def _graph(build):
    g = Graph(build.__name__)
    build(g)
    return g.program()


def _pipelined(build, seed: int):
    """``build``'s program through the pipeline, with every output checked bit for bit
    against the unoptimized program's on the interpreter."""
    p = _graph(build)
    q = pipeline.run(p)
    inputs = inputs_for(p, seed=seed)
    for a, b in zip(execute(p, inputs), execute(q, inputs)):
        assert same_bits(a, b)
    return q


def test_values_broadcast_outside_a_reduction_are_stored_not_recomputed():
    """A depthwise convolution's weight gradient: per channel and tap, a sum over the
    pixels of the gradient (a chain of elementwise ops) times the input. The chain varies
    along the pixels and is broadcast along the taps, outside them: inlined into the sum,
    it is computed again for each tap. Past ``fuse.RECOMPUTED`` extra instructions a point
    it is stored once; a short chain still inlines. Bits as the unfused program's."""
    def weight_gradient(steps):
        def build(g):
            grad = g.input("grad", "f32", (4, 1, 64))
            scale = g.input("scale", "f32", (4, 1, 1))
            x = g.input("x", "f32", (4, 9, 64))
            for _ in range(steps):
                grad = grad * scale + 1.0
            g.output("y", g.sum(grad * x, axes=2))
        return build

    def recomputed(kernel):  # extra instructions a point of the kernel's domain
        return fuse._recomputed(kernel) / math.prod(kernel.domain)

    short = _pipelined(weight_gradient(1), seed=8)
    assert len(short.kernels) == 1, str(short)
    assert 0 < recomputed(short.kernels[0]) <= fuse.RECOMPUTED
    long = _pipelined(weight_gradient(6), seed=9)
    assert "temp" in [b.kind for b in long.buffers], str(long)
    assert all(recomputed(k) <= fuse.RECOMPUTED for k in long.kernels), str(long)


def relu_mad(g):
    a, b, c = (g.input(n, "f32", (1000,)) for n in "abc")
    g.output("y", g.maximum(a * b + c, 0.0))


def softmax(g):
    x = g.input("x", "f32", (8, 100))
    e = g.unary("exp", x - g.max(x, 1, keepdim=True))
    g.output("y", e / g.sum(e, 1, keepdim=True))


def layer_norm(g):
    x = g.input("x", "f32", (8, 32))
    d = x - g.mean(x, 1, keepdim=True)
    g.output("y", d * g.unary("rsqrt", g.mean(d * d, 1, keepdim=True) + 1e-5))


def linear_relu(g):
    x, w = g.input("x", "f32", (8, 16)), g.input("w", "f32", (32, 16))
    b = g.input("b", "f32", (32,))
    g.output("y", g.maximum(x @ w.T + b, 0.0))


def gelu_tanh(g):
    x, w, b = (g.input(n, "f32", (512,)) for n in "xwb")
    v = x * w + b
    inner = (v + v * v * v * 0.044715) * math.sqrt(2 / math.pi)
    g.output("y", v * 0.5 * (g.unary("tanh", inner) + 1.0))


def sum_of_squares(g):
    x = g.input("x", "f32", (6, 7))
    g.output("s", g.sum(x * x) * 0.5)


def batched_matmul(g):
    a, b = g.input("a", "f32", (3, 4, 5)), g.input("b", "f32", (5, 6))
    g.output("y", g.unary("sigmoid", a @ b))


def column_sum(g):
    x = g.input("x", "f32", (5, 9))
    g.output("y", g.sum(g.unary("exp", x), 0) + 1.0)


def reduction_in_two_spaces(g):
    x = g.input("x", "f32", (4, 8))
    s = g.sum(x, 1)
    g.output("a", s * 2.0)
    g.output("b", g.sum(x.T * s, 1))


@pytest.mark.parametrize(
    "build, kernels",
    [
        (relu_mad, 1), (softmax, 1), (layer_norm, 1), (linear_relu, 1), (gelu_tanh, 1),
        (sum_of_squares, 1), (batched_matmul, 1), (column_sum, 1),
        # s is needed row-wise by `a` and column-wise by `b`: it must materialize once.
        (reduction_in_two_spaces, 2),
    ],
)
def test_fusion_materializes_only_what_must_be(build, kernels):
    p = _graph(build)
    q = pipeline.run(p)
    assert len(q.kernels) == kernels, str(q)
    assert len(q.temps) == kernels - 1
    inputs = inputs_for(p, seed=3)
    for x, y in zip(execute(p, inputs), execute(q, inputs)):
        assert same_bits(x, y)


def test_fused_contraction_keeps_its_epilogue_in_one_kernel():
    q = pipeline.run(_graph(linear_relu))
    (kernel,) = q.kernels
    ops = [i.op for i in kernel.body]
    assert ops.index("contract") < ops.index("add") < ops.index("max")
    assert kernel.grid == (8, 32) and kernel.loops == (16,)


def test_an_epilogue_over_a_reshaped_product_merges_into_it():
    """A linear layer on a 3-d input: the product's rows ``[batch * seq, out]`` get their
    bias as ``[batch, seq, out]``; the epilogue's dimensions that every access walks as
    one merge, and it joins the contraction's kernel (the library call's epilogue)."""
    def linear_3d(g):
        x, w = g.input("x", "f32", (12, 16)), g.input("w", "f32", (16, 24))
        b = g.input("b", "f32", (24,))
        y = g.matmul(x, w).reshape(3, 4, 24) + b
        g.output("y", g.maximum(y, 0.0))

    p = _graph(linear_3d)
    q = pipeline.run(p)
    (kernel,) = q.kernels
    ops = [i.op for i in kernel.body]
    assert ops.index("contract") < ops.index("add") < ops.index("max")
    inputs = inputs_for(p, seed=5)
    assert same_bits(execute(p, inputs)[0], execute(q, inputs)[0])


def test_a_flat_copy_of_a_block_merges_into_its_producer():
    """A reduction's ``[8, 16]`` result written out flat (an output ``[128]``, as a
    training graph's saved activations are) and read again: the flat copy's dimension is
    split into the block's, and the copy becomes a second store of the reduction's
    kernel."""
    def flat_output(g):
        x = g.input("x", "f32", (8, 16, 32))
        s = g.reduce("sum", x, 2)
        g.output("flat", s.reshape(128))
        g.output("y", g.unary("exp", s))

    p = _graph(flat_output)
    q = pipeline.run(p)
    assert len(q.kernels) == 1, str(q)
    inputs = inputs_for(p, seed=9)
    for a, b in zip(execute(p, inputs), execute(q, inputs)):
        assert same_bits(a, b)


def test_a_temporary_also_written_to_an_output_is_that_output():
    """Softmax rows saved for the backward (an output) and read again by a product: the
    product reads the output, and the rows are written once, not also to a temporary.
    Not when something else writes the output, or the two writes differ in layout."""
    def saved(g, flat=False):
        x = g.input("x", "f32", (8, 16))
        w = g.input("w", "f32", (16, 4))
        e = g.unary("exp", x - g.max(x, 1, keepdim=True))
        s = e / g.sum(e, 1, keepdim=True)
        g.output("saved", s.reshape(128) if flat else s)
        g.output("y", g.matmul(s, w))

    def transposed(g):
        x = g.input("x", "f32", (8, 16))
        w = g.input("w", "f32", (16, 4))
        s = g.unary("exp", x - g.max(x, 1, keepdim=True))
        g.output("saved", s.T)
        g.output("y", g.matmul(s, w))

    def kinds(q):
        return [b.kind for b in q.buffers]

    def flat(g):
        saved(g, flat=True)

    for build in (saved, flat):
        q = _pipelined(build, seed=3)
        assert "temp" not in kinds(q), str(q)
        (contract,) = [k for k in q.kernels if any(i.op == "contract" for i in k.body)]
        out = next(i for i, b in enumerate(q.buffers) if b.name == "saved")
        assert out in contract.reads()
    q = _pipelined(transposed, seed=4)
    assert "temp" in kinds(q), str(q)


def _product_then_copy(between=None, order=(1, 0), reader=False):
    """A batched product into a temporary, then a kernel copying it into the output (what
    a convolution's lowering gave for a 1x1 kernel): ``between`` builds a kernel between
    the two, ``order`` is the copy's walk of the (4, 6) result, ``reader`` adds a second
    reader of the temporary."""
    b = ProgramBuilder("product_copy")
    x = b.input("x", F32, (4, 3))
    w = b.input("w", F32, (3, 6))
    t = b.temp("t", F32, (4, 6))
    y = b.output("y", F32, (4, 6))
    k = b.kernel((4, 6, 3))
    k.store(t, k.contract(k.load(x, (4, 1, 3), strides=(3, 0, 1)),
                          k.load(w, (1, 6, 3), strides=(0, 1, 6)), 2), strides=(6, 1, 0))
    if between is not None:
        between(b, y)
    k = b.kernel((4, 6))
    k.store(y, k.load(t, strides=(6, 1) if order == (1, 0) else (1, 4)))
    if reader:
        z = b.output("z", F32, (4, 6))
        k = b.kernel((4, 6))
        k.store(z, k.neg(k.load(t)))
    return b.build()


def test_a_temporary_copied_whole_into_an_output_is_that_output():
    """A kernel that only copies a whole temporary into an output in the same order goes:
    the product stores into the output (bit for bit the same). Not when the copy reorders
    the elements, when another kernel reads the temporary, or when a kernel between the
    two touches the output."""
    def touch(b, y):
        k = b.kernel((4, 6))
        k.store(y, k.const(1.0, F32))

    program = _product_then_copy()
    q = _canon(program)
    assert len(q.kernels) == 1 and [b.kind for b in q.buffers] == ["in", "in", "out"], str(q)
    inputs = inputs_for(program, seed=2)
    for a, b in zip(execute(program, inputs), execute(q, inputs)):
        assert same_bits(a, b)
    for kept in (_product_then_copy(order=(0, 1)), _product_then_copy(reader=True),
                 _product_then_copy(between=touch)):
        q = _canon(kept)
        assert "temp" in [b.kind for b in q.buffers], str(q)
        inputs = inputs_for(kept, seed=2)
        for a, b in zip(execute(kept, inputs), execute(q, inputs)):
            assert same_bits(a, b)


def test_kernels_selecting_by_a_small_coordinate_are_split_per_coordinate():
    """``unbind``'s gradient: a sum of selects by the packed dimension's coordinate. Fused,
    every point loaded all three gradients; split, each piece loads one and writes its
    slice (bit for bit what the sum gave, -0.0 and NaN included). Not split: a dimension
    a reduction runs along, or a select that drops no load."""
    def packed_gradient(g):
        parts = [g.input(n, "f32", (6, 5)) for n in "abc"]
        i = g.arange(3).reshape(3, 1, 1)
        total = None
        for v, part in enumerate(parts):
            term = g.where(g.binary("eq", i, v), part * 0.5 if v == 1 else part, 0.0)
            total = term if total is None else total + term
        g.output("y", total)

    def reduced_along_it(g):
        x = g.input("x", "f32", (3, 8))
        i = g.arange(3).reshape(3, 1)
        g.output("y", g.sum(g.where(g.binary("eq", i, 1), x, 0.0), axes=0))

    def nothing_to_drop(g):
        x = g.input("x", "f32", (3, 8))
        i = g.arange(3).reshape(3, 1)
        g.output("y", g.where(g.binary("eq", i, 1), x, x * 2.0))

    q = _pipelined(packed_gradient, seed=6)
    assert len(q.kernels) == 3, str(q)
    assert [sum(i.op == "load" for i in k.body) for k in q.kernels] == [1, 1, 1]
    for build in (reduced_along_it, nothing_to_drop):
        q = _pipelined(build, seed=7)
        assert len(q.kernels) == 1, str(q)


def test_views_compose_into_producer_maps():
    def transposed_slice(g):
        x = g.input("x", "f32", (6, 8))
        e = g.unary("exp", x)
        g.output("y", e.T[::-1, 1:5] * 2.0)

    p = _graph(transposed_slice)
    q = pipeline.run(p)
    assert len(q.kernels) == 1
    (load,) = [i for i in q.kernels[0].body if i.op == "load"]
    assert load.map.strides == (-1, 8) and load.map.offset == 7 + 8
    inputs = inputs_for(p)
    assert same_bits(execute(p, inputs)[0], execute(q, inputs)[0])


def test_views_that_split_or_straddle_producer_dimensions_compose():
    """Attention's head split: a ``[seq, batch, heads * head]`` block read as ``[batch *
    heads, seq, head]``. The heads step through the last dimension and the batch through
    the one before, so one step of the reader's first dimension crosses from one of the
    block's dimensions into the next: the reader's dimension is split in two, and each
    part moves along one. Several of the reader's dimensions may share one of the block's
    (the head's and the heads' parts of its last)."""
    def head_split(g):
        x = g.input("x", "f32", (32, 4, 64))
        e = g.unary("exp", x)
        heads = e.reshape(32, 4, 4, 16).permute(1, 2, 0, 3).reshape(16, 32, 16)
        g.output("y", heads * 2.0)

    def shared_dimension(g):
        x = g.input("x", "f32", (8, 96))
        e = g.unary("exp", x)
        g.output("y", e.reshape(8, 3, 32).permute(1, 0, 2) + 1.0)

    for build in (head_split, shared_dimension):
        q = _pipelined(build, seed=7)
        assert len(q.kernels) == 1, str(q)


def test_a_reshape_that_is_not_a_view_of_the_block_materializes():
    def flatten_after_exp(g):
        x = g.input("x", "f32", (4, 8))
        e = g.unary("exp", x[:, :4])  # (4, 4) block
        g.output("y", g.sum(e.reshape(16)))

    p = _graph(flatten_after_exp)
    q = pipeline.run(p)
    inputs = inputs_for(p)
    assert same_bits(execute(p, inputs)[0], execute(q, inputs)[0])


def test_fusion_keeps_memory_order():
    # k1 overwrites x (inout) after k0 read it; the reader of k0's temporary must not
    # recompute from the new x.
    b = ProgramBuilder("war")
    x = b.buffer("x", F32, (4,), "inout")
    t = b.temp("t", F32, (4,))
    y = b.output("y", F32, (4,))
    k = b.kernel((4,))
    k.store(t, k.exp(k.load(x)))
    k = b.kernel((4,))
    k.store(x, k.const(0.0, F32), shape=(4,))
    k = b.kernel((4,))
    k.store(y, k.add(k.load(t), 1.0))
    p = b.build()
    q = pipeline.run(p)
    inputs = [np.arange(4, dtype=np.float32)]
    for u, v in zip(execute(p, inputs), execute(q, inputs)):
        assert same_bits(u, v)


# --- scheduling ------------------------------------------------------------------------
def test_grid_excludes_reduced_and_repeated_store_dimensions():
    q = pipeline.run(_graph(softmax))
    assert q.kernels[0].grid_rank == 1
    assert pipeline.run(_graph(relu_mad)).kernels[0].grid_rank == 1
    assert pipeline.run(_graph(sum_of_squares)).kernels[0].grid_rank == 0
    b = ProgramBuilder()
    x, y = b.input("x", F32, (4, 8)), b.output("y", F32, (4,))
    k = b.kernel((4, 8))
    k.store(y, k.load(x, (4, 1), strides=(8, 0)))  # constant along dimension 1
    assert grid_rank(b.build().kernels[0]) == 1


def test_arena_reuses_memory_of_dead_temporaries():
    def chain(g):
        x = g.input("x", "f32", (64, 64))
        a = g.sum(x, 1, keepdim=True)  # materialized: read column-wise below
        b = g.sum(x.T * a.T, 1, keepdim=True)
        c = g.sum(x * b.T, 0, keepdim=True)
        g.output("y", g.sum(x * c, 1))

    p = _graph(chain)
    q = pipeline.run(p)
    assert len(q.temps) >= 2
    assert q.arena_bytes < sum(t.nbytes for t in q.temps) + 64 * len(q.temps)
    assert all(t.offset % 64 == 0 for t in q.temps)
    verify(q)  # the verifier re-checks that live temporaries never share bytes
    inputs = inputs_for(p, edges=False)
    np.testing.assert_array_equal(execute(p, inputs)[0], execute(q, inputs)[0])


# --- pipeline mechanics ----------------------------------------------------------------
def test_pipeline_is_one_named_list():
    names = [name for name, _ in pipeline.PIPELINE]
    assert names[0] == "verify" and names[-1] == "verify.final"
    assert {"canonicalize", "fuse", "schedule"} <= set(names)
    assert pipeline.KEY_STAGE in names


def test_dump_dir_gets_every_stage(tmp_path, monkeypatch):
    monkeypatch.setenv("HOLOGRAM_DUMP_DIR", str(tmp_path))
    p = _graph(softmax)
    q = pipeline.run(p)
    files = sorted(tmp_path.iterdir())
    assert [f.name.split(".", 2)[2] for f in files] == [
        f"{name}.atlas" for name, _ in pipeline.PIPELINE
    ]
    assert parse_program(files[-1].read_text()) == q


def test_a_failing_pass_becomes_a_compile_error(monkeypatch):
    def broken(program, options):
        raise ZeroDivisionError("oops")

    monkeypatch.setattr(pipeline, "PIPELINE", (("broken", broken),))
    with pytest.raises(CompileError, match="pass 'broken' failed on program relu_mad") as info:
        pipeline.run(_graph(relu_mad))
    assert "program relu_mad {" in info.value.source


def test_deep_kernels_compile_without_recursion_limits():
    b = ProgramBuilder("deep")
    x, y = b.input("x", F32, (8,)), b.output("y", F32, (8,))
    k = b.kernel((8,))
    v = k.load(x)
    for i in range(5000):  # deeper than Python's recursion limit
        v = k.neg(v) if i % 2 else k.mul(v, 1.5)
    k.store(y, v)
    p = b.build()
    q = pipeline.run(p)
    inputs = inputs_for(p)
    assert same_bits(execute(p, inputs)[0], execute(q, inputs)[0])


def test_long_elementwise_chains_fuse_into_one_kernel():
    g = Graph("chain")
    x = g.input("x", "f32", (8,))
    y = x
    for i in range(200):
        y = g.unary("neg", y) if i % 2 else y * 1.5
    g.output("y", y)
    p = g.program()
    q = pipeline.run(p)
    assert len(p.kernels) == 201 and len(q.kernels) == 1
    inputs = inputs_for(p)
    assert same_bits(execute(p, inputs)[0], execute(q, inputs)[0])


def test_unsigned_abs_of_a_negation_is_not_abs():
    # u8: -255 wraps to 1, and abs is the identity: |-x| is not |x|.
    p = _elementwise(lambda k, a, b, c: k.abs(k.neg(a)), dtype=dt.uint8)
    x = np.array([255, 1, 0, 128] * 4, dtype=np.uint8)
    assert np.array_equal(execute(_canon(p), [x, x, x])[0], (-x.astype(np.int64)) % 256)


def test_coalesce_flattens_contiguous_grids_only():
    q = pipeline.run(_graph(relu_mad))
    assert q.kernels[0].domain == (1000,)

    def broadcast_add(g):
        x, r = g.input("x", "f32", (6, 8)), g.input("r", "f32", (8,))
        g.output("y", g.unary("exp", x) + r)

    q = pipeline.run(_graph(broadcast_add))
    assert q.kernels[0].domain == (6, 8)  # r does not vary along rows: cannot merge

    def contiguous_3d(g):
        x = g.input("x", "f32", (2, 3, 4))
        g.output("y", g.sum(x * x, 2, keepdim=True))

    q = pipeline.run(_graph(contiguous_3d))
    assert q.kernels[0].domain == (6, 4) and q.kernels[0].grid_rank == 1


def test_empty_tensors_go_through_the_pipeline():
    def empty_softmax(g):
        x = g.input("x", "f32", (0, 7))
        e = g.unary("exp", x - g.max(x, 1, keepdim=True))
        g.output("y", e / g.sum(e, 1, keepdim=True))
        g.output("s", g.sum(x, 0))  # sums over an empty axis: +0.0

    p = _graph(empty_softmax)
    q = pipeline.run(p)
    (y, s) = execute(q, inputs_for(p))
    assert y.size == 0 and s.tolist() == [0.0] * 7 and not np.signbit(s).any()


def test_fusion_does_not_nest_reductions():
    """Per-row cross-entropy terms feed a mean over the rows: merging the two would leave
    the row reductions inside a loop (no parallel grid, per-row scratch on every backend)."""
    from hologram.compiler.passes.fuse import _nests_reductions
    from hologram.frontend import functional as F

    def cross_entropy(g):
        x, t = g.input("x", "f32", (16, 10)), g.input("t", "i64", (16,))
        g.output("loss", F.cross_entropy(x, t))

    p = _graph(cross_entropy)
    q = pipeline.run(p)
    assert [k.grid_rank for k in q.kernels] == [1, 0]
    assert not any(_nests_reductions(k) for k in q.kernels)
    inputs = [inputs_for(p)[0], np.arange(16, dtype=np.int64) % 10]
    assert same_bits(execute(p, inputs)[0], execute(q, inputs)[0])


def test_fusion_keeps_each_contraction_in_a_kernel_of_its_own():
    """A weight gradient summed over time steps, ``sum_t g[t].T @ x[t]``: each product
    reads the running sum in its epilogue, and merging them all would give one loop nest
    of many contractions, which no library call takes. Each stays a kernel of its own (a
    GEMM with the addition as its epilogue)."""
    from hologram.backends.cpu import gemm

    def summed_products(g):
        gs, xs = g.input("g", "f32", (6, 4, 12)), g.input("x", "f32", (6, 4, 8))
        total = gs[0].T @ xs[0]
        for t in range(1, 6):
            total = total + gs[t].T @ xs[t]
        g.output("w", total)

    p = _graph(summed_products)
    q = pipeline.run(p)
    assert [sum(i.op == "contract" for i in k.body) for k in q.kernels] == [1] * 6
    assert sum(map(len, gemm.split(q)[1].values())) == 6  # every product a BLAS call
    inputs = inputs_for(p, seed=7)
    assert same_bits(execute(p, inputs)[0], execute(q, inputs)[0])


def test_a_recurrence_read_twice_per_step_is_not_recomputed_from_its_start():
    """``h[t] = h[t-1] * a[t] + b[t]``, each step also written out: every ``h[t]`` is read
    twice (the next step, its output). Inlined at both reads, step ``t``'s kernel would
    recompute the chain from the first step: quadratic work. Past ``SHARED_READS``
    reads a step's value is stored once instead."""
    from hologram.compiler.passes.fuse import SHARED_READS

    def recurrence(g):
        a, b = g.input("a", "f32", (steps, 16)), g.input("b", "f32", (steps, 16))
        h = a[0]
        for t in range(1, steps):
            h = h * a[t] + b[t]
            g.output(f"h{t}", g.unary("tanh", h))

    for steps in (16, 64):
        p = _graph(recurrence)
        q = pipeline.run(p)
        work = sum(i.op not in ("load", "store", "const", "cast")
                   for k in q.kernels for i in k.body)
        # A step is a multiply, an add and a tanh, its chain recomputed at no more than
        # SHARED_READS reads: linear in the steps (165 and 551 instructions here;
        # unbounded, 255 and 4,095).
        assert work <= 3 * SHARED_READS * steps, (steps, work)
    inputs = inputs_for(p, seed=11)
    for x, y in zip(execute(p, inputs), execute(q, inputs)):
        assert same_bits(x, y)


# --- HOLOGRAM_DUMP_DIR that is missing or not a directory (issue 16, part 6) ------------
def test_dump_dir_is_created_with_its_parents(tmp_path, monkeypatch):
    target = tmp_path / "missing" / "nested" / "dumps"
    monkeypatch.setenv("HOLOGRAM_DUMP_DIR", str(target))
    pipeline.run(_graph(relu_mad))
    assert len(list(target.iterdir())) == len(pipeline.PIPELINE)


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_dump_dir_that_cannot_be_a_directory_is_one_clear_error(tmp_path, monkeypatch, where):
    import hologram
    from hologram.errors import HologramError

    blocker = tmp_path / "dumps"
    blocker.write_text("not a directory")
    target = blocker if where == "file" else blocker / "sub"
    monkeypatch.setenv("HOLOGRAM_DUMP_DIR", str(target))
    messages = set()
    for build in (relu_mad, softmax, relu_mad):  # every compile: the same error, raised
        with pytest.raises(HologramError) as info:  # before any stage runs
            pipeline.run(_graph(build))
        assert not isinstance(info.value, OSError)
        messages.add(str(info.value))
    (message,) = messages
    assert "HOLOGRAM_DUMP_DIR" in message and repr(str(target)) in message
    assert "is a file" in message and "unset it" in message
    g = Graph(f"dump_dir_{where}")  # a program no other test compiled (no memo hit)
    x = g.input("x", "f32", (3,))
    g.output("y", x * x)
    with pytest.raises(HologramError, match="HOLOGRAM_DUMP_DIR"):
        hologram.compile(g.program(), "interp")
    assert blocker.read_text() == "not a directory"


def test_dump_file_names_are_safe_for_any_program_name(tmp_path, monkeypatch):
    monkeypatch.setenv("HOLOGRAM_DUMP_DIR", str(tmp_path))
    g = Graph("a/b c<lambda>")
    x = g.input("x", "f32", (4,))
    g.output("y", x + x)
    pipeline.run(g.program())
    files = sorted(f.name for f in tmp_path.iterdir())
    assert files[0] == "a_b_c_lambda_.00.verify.atlas" and len(files) == len(pipeline.PIPELINE)


# --- graph reductions over () and of 0-d tensors, as PyTorch (issue 16, part 6) ---------
@pytest.mark.parametrize("backend", backends.available())
def test_graph_reductions_over_no_axes_and_of_0d_tensors_follow_torch(backend):
    import hologram

    torch = pytest.importorskip("torch")
    g = Graph("reduce_edges")
    x = g.input("x", "f32", (2, 3))
    s = g.input("s", "f32", ())
    cases = {  # graph result, and what torch computes for it
        "sum_none": (g.reduce("sum", x, ()), lambda t, u: torch.sum(t, dim=())),
        "sum_none_keep": (g.reduce("sum", x, (), keepdim=True),
                          lambda t, u: torch.sum(t, dim=(), keepdim=True)),
        "max_none": (g.reduce("max", x, ()), lambda t, u: torch.amax(t, dim=())),
        "min_none": (g.reduce("min", x, ()), lambda t, u: torch.amin(t, dim=())),
        "mean_none": (g.mean(x, ()), lambda t, u: torch.mean(t, dim=())),
        "argmax_all": (g.reduce("argmax", x), lambda t, u: torch.argmax(t)),
        "argmax_0d": (g.reduce("argmax", s), lambda t, u: torch.argmax(u)),
        "argmin_0d": (g.reduce("argmin", s, ()), lambda t, u: torch.argmin(u)),
        "argmax_0d_dim": (g.reduce("argmax", s, 0), lambda t, u: torch.argmax(u, 0)),
        "sum_0d": (g.reduce("sum", s, -1), lambda t, u: torch.sum(u, -1)),
        "max_0d": (g.reduce("max", s), lambda t, u: torch.amax(u)),
    }
    for name, (value, _) in cases.items():
        g.output(name, value)
    xv = np.array([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]], np.float32)
    sv = np.array(-4.5, np.float32)
    results = hologram.compile(g.program(), backend)(xv, sv)
    for (name, (_, reference)), got in zip(cases.items(), results):
        want = reference(torch.from_numpy(xv), torch.from_numpy(sv)).numpy()
        assert got.shape == want.shape and got.dtype == want.dtype, (name, got, want)
        np.testing.assert_array_equal(got, want, err_msg=name)
    with pytest.raises(ShapeError, match="out of range"):
        g.reduce("sum", x, 2)
    with pytest.raises(ShapeError, match="out of range"):
        g.reduce("sum", s, 1)
