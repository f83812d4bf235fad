"""The decompose pass (hologram/compiler/passes/decompose.py): every rewrite it makes for a
target's capabilities computes what the undecomposed program computes, with the reference
interpreter as the oracle, on random values and on every pair of edge values (NaN, ±inf,
±0.0, denormals, the largest finite values, INT_MIN / -1, division by zero)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from util import execute, same_bits

import hologram
from hologram.backends.cpu.render import render
from hologram.backends.cpu.target import CAPABILITIES as CPU
from hologram.compiler import pipeline
from hologram.compiler.capabilities import Capabilities
from hologram.compiler.passes.decompose import WIDENED, decompose
from hologram.errors import CompileError
from hologram.frontend.graph import Graph
from hologram.isa import dtypes as dt
from hologram.isa.ir import FLOAT_UNARY_OPS, Program
from hologram.isa.verify import verify

FLOAT_EDGES = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -2.5, 3.0, 7.0, 1e-40,
               -1e-40, 6e-8, -6e-8, 1e-5, 9.2e-41, 65504.0, -65504.0, 3.38e38, -3.38e38,
               1.5, 2.0 ** -14, 0.1]
# No native narrow arithmetic, no total division, no IEEE min/max: every rewrite applies.
BARE = Capabilities(f64=True, total_division=False, ieee_minmax=False)
#: A 32-bit target that leaves every decomposition to the pass (no f64, i64, narrow
#: storage or IEEE min/max).
GPU32 = Capabilities(f64=False, i64=False, narrow_storage=False, ieee_minmax=False)


def _storage(values: np.ndarray, t: dt.DType) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    if t is dt.bfloat16:
        return dt.to_bf16_bits(values.astype(np.float32))
    with np.errstate(over="ignore"):
        return values.astype(t.storage)


def _pairs(t: dt.DType, n_random: int = 500, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of edge values of ``t``, then random pairs."""
    rng = np.random.default_rng(seed)
    if t.is_float:
        edges = FLOAT_EDGES
        randoms = rng.standard_normal((2, n_random)) * rng.choice([1e-3, 1.0, 1e3], n_random)
        store = _storage
    else:
        info = np.iinfo(t.storage)
        edges = sorted({int(info.min), int(info.min) + 1, int(info.max), 0, 1, 2, 3, 7, 100,
                        *([-1, -2, -3, -7, -100] if info.min else [])})
        randoms = rng.integers(info.min, info.max, (2, n_random), dtype=t.storage,
                               endpoint=True)
        randoms[1, ::7] = 0  # divisions by zero among the random ones too

        def store(values, t):
            return np.asarray(values).astype(t.storage)
    a, b = (np.array(c, dtype=object) for c in zip(*itertools.product(edges, edges)))
    return (store(np.concatenate([a, randoms[0].astype(object)]), t),
            store(np.concatenate([b, randoms[1].astype(object)]), t))


def _lowered(name: str, t: dt.DType, build) -> tuple[Program, list[np.ndarray]]:
    a, b = _pairs(t)
    c = _pairs(t, seed=1)[0][: a.size] if t.is_float else None
    g = Graph(name)
    x, y = g.input("a", t, (a.size,)), g.input("b", t, (a.size,))
    z = g.input("c", t, (a.size,)) if c is not None else None
    g.output("out", build(g, x, y, z))
    inputs = [a, b] + ([c] if c is not None else [])
    return pipeline.run(g.program()), inputs


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in units in the last place between two float arrays in storage form (f16,
    f32, f64 values; bf16 bit patterns)."""
    size = a.dtype.itemsize
    bits = {2: np.int16, 4: np.int32, 8: np.int64}[size]
    magnitude = (1 << (8 * size - 1)) - 1

    def order(x: np.ndarray) -> np.ndarray:  # a monotone integer order of the floats
        x = np.ascontiguousarray(x).view(bits).astype(np.int64)
        return np.where(x < 0, -(x & magnitude), x)

    return np.abs(order(a) - order(b))


def _check(program, inputs, caps: Capabilities, t: dt.DType, exact: bool = True) -> None:
    decomposed = verify(decompose(program, caps))
    assert decomposed is not program, "nothing was decomposed"
    (want,) = execute(program, inputs)
    (got,) = execute(decomposed, inputs)
    if exact:
        if not same_bits(want, got):
            bad = [i for i in range(want.size) if not same_bits(want[i:i + 1], got[i:i + 1])]
            assert not bad, [(inputs[0][i], inputs[1][i], want[i], got[i]) for i in bad[:5]]
    else:  # two roundings (f32, then the narrow format): within one unit in the last place
        nan_w = np.isnan(dt.from_bf16_bits(want) if t is dt.bfloat16 else want)
        nan_g = np.isnan(dt.from_bf16_bits(got) if t is dt.bfloat16 else got)
        assert np.array_equal(nan_w, nan_g)
        assert _ulps(want[~nan_w], got[~nan_w]).max(initial=0) <= 1


NARROW = [dt.float16, dt.bfloat16]


@pytest.mark.parametrize("t", NARROW, ids=str)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "mod"])
def test_narrow_arithmetic_through_f32_is_correctly_rounded(op, t):
    program, inputs = _lowered(f"narrow_{op}", t, lambda g, x, y, z: g.binary(op, x, y))
    _check(program, inputs, CPU, t)


@pytest.mark.parametrize("t", NARROW, ids=str)
@pytest.mark.parametrize("op", ["sqrt", "floor", "ceil", "round", "trunc", "abs", "neg"])
def test_exact_narrow_unary_ops(op, t):
    program, inputs = _lowered(f"narrow_{op}", t, lambda g, x, y, z: g.unary(op, x))
    if op in ("abs", "neg"):  # exact in the format: left alone
        assert decompose(program, CPU) is program
        return
    _check(program, inputs, CPU, t)


@pytest.mark.parametrize("t", NARROW, ids=str)
@pytest.mark.parametrize("op", ["pow", "exp", "log", "tanh", "sigmoid", "rsqrt", "erf", "sin"])
def test_narrow_functions_through_f32_within_one_ulp(op, t):
    def build(g, x, y, z):
        return g.binary(op, x, y) if op == "pow" else g.unary(op, x)

    program, inputs = _lowered(f"narrow_{op}", t, build)
    _check(program, inputs, CPU, t, exact=False)


def _fma_ties(t: dt.DType) -> list[np.ndarray]:
    """fma operands whose product is (often) halfway between two ``t`` values, with addends
    too small for f64 to keep beside it (so f64's sum lands on the midpoint and only the
    exact value says which way to round), and the overflow tie: the product halfway
    between the largest finite value and the next power of two."""
    tiny = [2.0 ** -126, 2.0 ** -133] if t is dt.bfloat16 else [2.0 ** -24]
    top = [(7 * 2.0 ** 60, 73 * 2.0 ** 59)] if t is dt.bfloat16 else [(2520.0, 26.0)]
    a, b, c = [], [], []
    for k in range(129, 256, 2):  # odd, 8 significant bits: products need 9 or more
        for factor in (1.5, 2.5, 0.75, 3.0, -1.5):
            for sign in (1.0, -1.0):
                for addend in tiny:
                    a.append(float(k) * (4.0 if t is dt.float16 else 1.0))
                    b.append(factor)
                    c.append(sign * addend)
    for x, y in top:
        for sign in (1.0, -1.0):
            for addend in tiny:
                a += [x, -x]
                b += [y, y]
                c += [sign * addend, -sign * addend]
    return [_storage(np.array(v), t) for v in (a, b, c)]


@pytest.mark.parametrize("t", NARROW, ids=str)
def test_narrow_fma_is_rounded_once(t):
    program, inputs = _lowered("narrow_fma", t, lambda g, x, y, z: g.fma(x, y, z))
    text = str(decompose(program, CPU))
    assert ": f64[" in text and "= fma " not in text  # f64 operations, no fma
    _check(program, inputs, CPU, t)
    # Ties that f64's own rounding makes: the interpreter rounds the exact value once.
    ties = _fma_ties(t)
    g = Graph("narrow_fma_ties")
    x, y, z = (g.input(n, t, (ties[0].size,)) for n in "abc")
    g.output("out", g.fma(x, y, z))
    program = pipeline.run(g.program())
    (want,) = execute(program, ties)
    if t is dt.bfloat16:  # the cases are real: the addend's sign changes the result
        pairs = want[:-8].reshape(-1, 2, 2)  # (product, addend sign, addend)
        assert (pairs[:, 0] != pairs[:, 1]).sum() >= 20
    _check(program, ties, CPU, t)
    assert decompose(program, Capabilities(f64=False)) is program  # left to the renderer


@pytest.mark.parametrize("t", ["i8", "i16", "i32", "i64", "u8"])
@pytest.mark.parametrize("op", ["div", "mod"])
def test_integer_division_guards_give_the_isa_results(op, t):
    t = dt.dtype(t)
    program, inputs = _lowered(f"int_{op}", t, lambda g, x, y, z: g.binary(op, x, y))
    assert decompose(program, Capabilities(total_division=True)) is program
    _check(program, inputs, CPU, t)
    decomposed = decompose(program, GPU32)
    # and the cpu backend runs the decomposed program to the same bits
    (want,) = execute(program, inputs)
    got = hologram.compile(decomposed, backend="cpu")(*inputs)
    assert same_bits(np.asarray(got).reshape(-1), want)


@pytest.mark.parametrize("t", ["f16", "bf16", "f32", "f64"])
@pytest.mark.parametrize("op", ["min", "max"])
def test_min_max_from_compares_keep_nan_and_signed_zeros(op, t):
    t = dt.dtype(t)
    program, inputs = _lowered(f"float_{op}", t, lambda g, x, y, z: g.binary(op, x, y))
    assert decompose(program, CPU) is program  # llvm.minimum/maximum on the cpu
    _check(program, inputs, BARE, t)
    decomposed = decompose(program, GPU32)
    (want,) = execute(program, inputs)
    got = hologram.compile(decomposed, backend="cpu")(*inputs)
    assert same_bits(np.asarray(got).reshape(-1), want)


def test_webgpu_decomposition_of_a_mixed_program_runs_everywhere_to_the_same_bits():
    def build(g, x, y, z):
        wide = g.cast(x, "f32")
        q = g.cast(g.binary("div", g.cast(wide, "i32"), g.cast(y, "i32")), "f16")
        return g.binary("max", x * y + q, g.unary("exp", z))

    program, inputs = _lowered("mixed", dt.float16, build)
    decomposed = verify(decompose(program, GPU32))
    ops = {x.op for k in decomposed.kernels for x in k.body if x.dtype is dt.float16}
    assert not ops & (WIDENED | {"fma"}), ops
    (want,) = execute(program, inputs)
    (interp,) = execute(decomposed, inputs)
    cpu = np.asarray(hologram.compile(decomposed, backend="cpu")(*inputs)).reshape(-1)
    assert same_bits(cpu, interp)
    nan = np.isnan(want)
    assert np.array_equal(nan, np.isnan(interp))
    assert _ulps(want[~nan], interp[~nan]).max() <= 1  # exp: two roundings


def test_programs_with_nothing_to_rewrite_are_returned_unchanged():
    program, _ = _lowered("plain", dt.float32, lambda g, x, y, z: g.fma(x, y, z) + x * y)
    assert decompose(program, CPU) is program
    assert decompose(program, GPU32) is program
    native = Capabilities(f16_arithmetic=True, bf16_arithmetic=True)
    for t in NARROW:
        narrow, _ = _lowered("native", t, lambda g, x, y, z: g.unary("exp", x * y))
        assert decompose(narrow, native) is narrow


def test_the_cpu_renderer_refuses_undecomposed_narrow_arithmetic():
    program, _ = _lowered("undecomposed", dt.float16, lambda g, x, y, z: x * y)
    symbols = {k.name: f"k_{k.name}" for k in program.kernels}
    with pytest.raises(CompileError, match="decompose"):
        render(program, symbols)
    render(decompose(program, CPU), symbols)  # what the backend renders


def test_every_float_unary_op_is_widened():
    assert set(FLOAT_UNARY_OPS) <= WIDENED


def test_the_cpu_renderer_refuses_an_unguarded_integer_divisor():
    program, _ = _lowered("unguarded", dt.int32, lambda g, x, y, z: g.binary("div", x, y))
    symbols = {k.name: f"k_{k.name}" for k in program.kernels}
    with pytest.raises(CompileError, match="unguarded divisor"):
        render(program, symbols)
    text = render(decompose(program, CPU), symbols)
    assert "sdiv" in text
