"""Index maps (transposed, reversed, broadcast, offset views; strided stores; in-place
read-modify-write), 0-d and empty tensors, several outputs, the index opcode."""

from __future__ import annotations

import numpy as np
import pytest
from util import inputs_for, same_bits

from hologram.frontend.graph import Graph
from hologram.isa import dtypes as dt
from hologram.isa.builder import ProgramBuilder

from .numerics import assert_close, both, delegated, reduction_tolerance, rmw_program


def test_views_through_index_maps(backend):
    g = Graph("views")
    x = g.input("x", "f32", (6, 8))
    r = g.input("r", "f32", (8,))
    g.output("transposed", x.T * 2.0 + 1.0)
    g.output("sliced", x[1:5, ::3] - 1.0)
    g.output("reversed", x[::-1, ::-2] * x[:, 1::2])
    g.output("broadcast", x + r)
    g.output("column", x[:, 3] * r[2])
    g.output("transposed_sum", g.sum(x.T, 1))
    program = g.program()
    inputs = inputs_for(program, 1)
    got, want = both(program, backend, inputs)
    for a, b in zip(got[:-1], want[:-1]):
        assert same_bits(a, b)
    terms = inputs[0].astype(np.float64).reshape(6, 8).T
    ulps, atol = reduction_tolerance("sum", dt.float32, want[-1], terms)
    assert_close(got[-1], want[-1], dt.float32, ulps, atol, what="sum(x.T, 1)", backend=backend)


@pytest.mark.parametrize("offset, strides, shape", [
    (0, (1, 4), (4, 3)),  # transposed
    (11, (-4, -1), (3, 4)),  # walking backwards
    (2, (0, 1), (5, 2)),  # broadcast rows
    (5, (0, 0), (3, 2)),  # one element everywhere
    (1, (8, 2), (1, 3)),  # strided, one row
])
def test_loads_through_raw_maps(backend, offset, strides, shape):
    b = ProgramBuilder("maps")
    x = b.input("x", "i32", (12,))
    k = b.kernel(shape)
    out = b.output("y", "i32", shape)
    k.store(out, k.mul(k.load(x, shape, offset, strides), 3))
    data = np.arange(12, dtype=np.int32) * 7 - 20
    (got,), (want,) = both(b.build(), backend, [data])
    assert same_bits(got, want)
    expected = [3 * int(data[offset + i * strides[0] + j * strides[1]])
                for i in range(shape[0]) for j in range(shape[1])]
    assert want.tolist() == expected


@pytest.mark.parametrize("offset, strides", [(11, (-4, -1)), (0, (1, 3)), (2, (4, 1))])
def test_stores_through_raw_maps(backend, offset, strides):
    """Reversed, transposed and offset stores; elements they do not reach keep their
    (poison) contents."""
    b = ProgramBuilder("stores")
    x = b.input("x", "f64", (3, 3))
    y = b.output("y", "f64", (14,))
    k = b.kernel((3, 3))
    k.store(y, k.mul(k.load(x), 2.0), offset, strides)
    data = np.arange(9.0) - 4.0
    (got,), (want,) = both(b.build(), backend, [data])
    assert same_bits(got, want)
    reached = {offset + i * strides[0] + j * strides[1] for i in range(3) for j in range(3)}
    assert np.isnan(np.delete(got, sorted(reached))).all()


@pytest.mark.parametrize("strided", [False, True])
def test_inout_read_modify_write(backend, strided):
    rng = np.random.default_rng(4)
    x0, y0 = (rng.standard_normal(80).astype(np.float32) for _ in range(2))
    (got,), (want,) = both(rmw_program(strided), backend, [x0, y0])
    assert same_bits(got, want)
    if strided:  # every other column of rows 1..6: the rest stays as it was
        untouched = np.ones((8, 10), dtype=bool)
        untouched[1:7, ::2] = False
        assert same_bits(want.reshape(8, 10)[untouched], x0.reshape(8, 10)[untouched])


def test_rank0_programs(backend):
    g = Graph("scalar")
    x = g.input("x", "f32", ())
    v = g.input("v", "f64", (5,))
    g.output("y", g.unary("sqrt", x * x + 1.0))
    g.output("s", g.sum(v))
    g.output("m", g.reduce("argmax", v))
    x0, v0 = np.array(3.0, dtype=np.float32), np.array([1.0, 5.0, -2.0, 5.0, 0.5])
    got, want = both(g.program(), backend, [x0, v0])
    assert want[2].tolist() == [1] and want[1].tolist() == [9.5]
    for a, b in zip(got, want):
        assert same_bits(a, b)


EMPTY_SHAPES = [(0,), (3, 0), (0, 5), (2, 0, 4)]


@pytest.mark.parametrize("shape", EMPTY_SHAPES)
def test_empty_tensors(backend, shape):
    """Kernels with a zero extent may run elsewhere (a backend's policy), but the backend
    must say so in its artifact; results agree either way."""
    g = Graph("empty")
    x = g.input("x", "f32", shape)
    g.output("e", g.unary("exp", x) + 1.0)
    g.output("c", g.cast(x, "i32"))
    g.output("s", g.sum(x, len(shape) - 1))
    g.output("m", g.max(x, 0))
    data = np.zeros(shape, dtype=np.float32)
    got, want = both(g.program(), backend, [data], delegation_ok=True)
    for a, b in zip(got, want):
        assert same_bits(a, b)
    if delegated(g.program(), backend):  # reported, not silent: shown in the test log
        print(f"{backend} runs zero-extent kernels of {shape} elsewhere")


def test_multiple_outputs_of_different_dtypes(backend):
    g = Graph("many")
    x = g.input("x", "f32", (5, 7))
    g.output("f", x * 2.0)
    g.output("h", g.cast(x, "f16"))
    g.output("b", g.binary("lt", x, 0.0))
    g.output("i", g.reduce("argmin", x, 1))
    g.output("u", g.cast(g.cast(x, "i32"), "u8"))
    inputs = inputs_for(g.program(), 2)
    got, want = both(g.program(), backend, inputs)
    assert len(got) == 5
    for a, b in zip(got, want):
        assert same_bits(a, b)


@pytest.mark.parametrize("name, n", [("i8", 300), ("u8", 300), ("i16", 70000), ("i64", 33)])
def test_index_wraps_to_its_dtype(backend, name, n):
    b = ProgramBuilder("iota")
    out = b.output("y", name, (n,))
    k = b.kernel((n,))
    k.store(out, k.index(0, name))
    (got,), (want,) = both(b.build(), backend, [])
    assert same_bits(got, want)
    assert same_bits(want, np.arange(n).astype(dt.dtype(name).storage))


def test_broadcast_value_reduced_counts_the_domain_extent(backend):
    """A value constant along the reduced axis is reduced as often as the axis is long."""
    b = ProgramBuilder("broadcast_reduce")
    x = b.input("x", "i32", (5,))
    outs = {kind: b.output(kind, "i64" if kind.startswith("arg") else "i32", (5,))
            for kind in ("sum", "prod", "max", "argmin")}
    k = b.kernel((5, 300))
    loaded = k.load(x, (5, 1), 0, (1, 0))
    for kind, out in outs.items():
        k.store(out, k.reduce(kind, loaded, 1), strides=(1, 0), shape=(5, 1))
    data = np.array([2, -1, 7, 0, 3], dtype=np.int32)
    got, want = both(b.build(), backend, [data])
    assert want[0].tolist() == (data * 300).tolist()
    for a, w in zip(got, want):
        assert same_bits(a, w)
