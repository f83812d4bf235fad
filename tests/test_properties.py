"""Property tests: random well-typed programs give bit-identical results on the reference
interpreter before and after the full pass pipeline (every rewrite is exact), and the
canonical form does not depend on how a program is spelled."""

from __future__ import annotations

import contextlib
import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from util import execute, inputs_for, same_bits

from hologram.compiler import canonicalize, pipeline
from hologram.errors import IRError
from hologram.frontend.graph import Graph, Tensor
from hologram.isa import dtypes as dt
from hologram.isa.text import parse_program, print_program
from hologram.isa.verify import broadcast

DTYPES = [dt.float32, dt.float64, dt.float16, dt.bfloat16, dt.int32, dt.int8, dt.uint8]
FLOAT_UNARY = ["exp", "log", "sqrt", "tanh", "sigmoid", "neg", "abs", "floor", "sin", "erf",
               "rsqrt", "expm1", "round"]
INT_UNARY = ["neg", "abs", "sign"]
BINARY = ["add", "sub", "mul", "div", "min", "max", "mod"]
CONSTS = [0.0, -0.0, 1.0, -1.0, 2.0, 0.5, math.inf, -math.inf, math.nan, 3.0]
# Example counts come from the hypothesis profile (tests/conftest.py): 100 by default,
# 2000 with `pytest --hypothesis-profile=thorough`.
SETTINGS = settings(deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _broadcastable(a: Tensor, b: Tensor) -> bool:
    try:
        broadcast([a.shape, b.shape])
    except IRError:
        return False
    return True


class _Skip(Exception):
    """Nothing in the pool fits the drawn operation."""


def _operation(draw, g: Graph, pool: list[Tensor], dtype: dt.DType) -> Tensor:
    def pick(where=lambda t: True) -> Tensor:
        candidates = [t for t in pool if t.dtype is dtype and where(t)]
        if not candidates:
            raise _Skip
        return draw(st.sampled_from(candidates))

    def scalar():
        value = draw(st.sampled_from(CONSTS))
        return value if dtype.is_float else int(value) if math.isfinite(value) else 3

    kind = draw(st.sampled_from(["unary", "binary", "binary", "scalar", "select", "reduce",
                                 "view", "cast", "matmul"]))
    if kind == "unary":
        return g.unary(draw(st.sampled_from(FLOAT_UNARY if dtype.is_float else INT_UNARY)),
                       pick())
    if kind in ("binary", "scalar"):
        a = pick()
        b = pick(lambda t: _broadcastable(a, t)) if kind == "binary" else scalar()
        if draw(st.booleans()):
            a, b = b, a
        return g.binary(draw(st.sampled_from(BINARY)), a, b)
    if kind == "select":
        a = pick()
        cond = g.binary(draw(st.sampled_from(["lt", "le", "eq", "ne", "gt"])), a, scalar())
        other = pick(lambda t: t.shape == a.shape) if draw(st.booleans()) else scalar()
        return g.where(cond, a, other)
    if kind == "reduce":
        reduction = draw(st.sampled_from(["sum", "max", "min", "prod"]))
        return g.reduce(reduction, pick(), draw(st.sampled_from([0, 1, (0, 1)])), keepdim=True)
    if kind == "view":
        a = pick()
        return draw(st.sampled_from([a.T, a[::-1], a[:, 1:] if a.shape[1] > 1 else a]))
    if kind == "cast":
        return g.cast(g.cast(pick(), draw(st.sampled_from(DTYPES))), dtype)
    if not dtype.is_float:
        raise _Skip
    a = pick()
    return a @ pick(lambda t: t.shape[0] == a.shape[1])


@st.composite
def programs(draw):
    """A random tensor program: three inputs and up to eight operations drawn on a pool
    of 2-D tensors, with broadcasting, views, reductions, matmuls and casts."""
    dtype = draw(st.sampled_from(DTYPES))
    rows, cols = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    g = Graph("random")
    pool = [g.input("x", dtype, (rows, cols)), g.input("y", dtype, (rows, cols)),
            g.input("r", dtype, (1, cols))]
    for _ in range(draw(st.integers(1, 8))):
        with contextlib.suppress(_Skip):
            pool.append(_operation(draw, g, pool, dtype))
    outputs = draw(st.lists(st.sampled_from(pool[3:] or pool), min_size=1, max_size=3))
    for i, t in enumerate(outputs):
        g.output(f"out{i}", t)
    return g.program()


@SETTINGS
@given(programs(), st.integers(0, 2**16))
def test_pipeline_preserves_results_bit_for_bit(program, seed):
    lowered = pipeline.run(program)
    inputs = inputs_for(program, seed)
    for before, after in zip(execute(program, inputs), execute(lowered, inputs)):
        assert same_bits(before, after), f"{program}\n---\n{lowered}"


@SETTINGS
@given(programs())
def test_canonical_form_is_a_fixpoint_and_round_trips(program):
    canonical = canonicalize(program)
    assert canonicalize(canonical) == canonical
    lowered = pipeline.run(program)
    assert parse_program(print_program(lowered)) == lowered


@SETTINGS
@given(programs(), st.randoms(use_true_random=False))
def test_spelling_does_not_change_the_canonical_form(program, random):
    """Swapping the operands of commutative ops (and flipping comparisons) in the input
    gives the same canonical program."""
    from dataclasses import replace

    flipped = {"gt": "lt", "lt": "gt", "ge": "le", "le": "ge"}
    kernels = []
    for kernel in program.kernels:
        body = []
        for instr in kernel.body:
            if instr.op in ("add", "mul", "min", "max", "eq", "ne") and random.random() < 0.5:
                instr = replace(instr, args=instr.args[::-1])
            elif instr.op in flipped and random.random() < 0.5:
                instr = replace(instr, op=flipped[instr.op], args=instr.args[::-1])
            body.append(instr)
        kernels.append(replace(kernel, body=tuple(body)))
    respelled = replace(program, kernels=tuple(kernels))
    assert canonicalize(respelled).fingerprint() == canonicalize(program).fingerprint()
    inputs = inputs_for(program)
    for a, b in zip(execute(program, inputs), execute(respelled, inputs)):
        assert same_bits(a, b)


def test_float_edge_values_survive_the_pipeline():
    g = Graph("edges")
    x = g.input("x", "f32", (11,))
    y = g.maximum(x * 1.0 + -0.0, x) - 0.0
    g.output("y", g.where(g.binary("lt", y, 0.0), -y, y / 1.0))
    program = g.program()
    values = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-40, 3.4e38,
                       -1.0, 2.0], dtype=np.float32)
    lowered = pipeline.run(program)
    assert same_bits(execute(program, [values])[0], execute(lowered, [values])[0])
