"""``gather`` in the ISA's host tooling: the verifier's rules, the passes (fusion,
common subexpressions, folding, coalescing), the capability refusal, and
``Graph.gather``'s coordinates. Backend agreement is tests/conformance/test_gather.py's."""

from __future__ import annotations

import numpy as np
import pytest

import hologram
from hologram.backends.cpu.target import CAPABILITIES as CPU
from hologram.backends.interp.interpreter import run
from hologram.compiler import pipeline
from hologram.compiler.capabilities import Capabilities, MissingCapabilityError
from hologram.compiler.passes.decompose import decompose
from hologram.errors import IRError, ShapeError
from hologram.frontend.graph import Graph
from hologram.isa.builder import ProgramBuilder
from hologram.isa.ir import IndexMap, Instr, Kernel, Program
from hologram.isa.text import parse_program, print_program
from hologram.isa.verify import verify


def _lookup(rows=5, width=3, n=4, offset_dtype="i64") -> Program:
    b = ProgramBuilder("lookup")
    w = b.input("w", "f32", (rows, width))
    ix = b.input("ix", offset_dtype, (n,))
    y = b.output("y", "f32", (n, width))
    k = b.kernel((n, width))
    i = k.cast(k.load(ix, (n, 1), 0, (1, 0)), "i64")
    k.store(y, k.gather(w, k.mul(i, width), (n, width), 0, (0, 1)))
    return b.build()


def _replace_body(program: Program, body: tuple[Instr, ...]) -> Program:
    kernel = program.kernels[0]
    return Program(program.name, program.buffers,
                   (Kernel(kernel.name, kernel.domain, body, kernel.grid_rank),))


# --- the verifier -----------------------------------------------------------------------
def test_text_round_trip_and_syntax():
    program = _lookup()
    text = print_program(program)
    assert "gather @w[+0; 0, 1], %3 in [0, 12] : f32[4, 3]" in text
    assert parse_program(text) == program


def test_offset_must_be_an_integer():
    program = _lookup()
    body = program.kernels[0].body
    float_value = Instr("const", program.buffers[0].dtype, (1, 1), (), ("0x0.0p+0",))
    bad = body[:-2] + (float_value, Instr("gather", body[-2].dtype, body[-2].shape,
                                          (len(body) - 2,), body[-2].attrs))
    with pytest.raises(IRError, match="element offset must be an integer"):
        verify(_replace_body(program, bad + (body[-1],)))


def test_offset_shape_must_broadcast_to_the_gather():
    program = _lookup()
    body = program.kernels[0].body
    g = body[-2]
    narrow = Instr("gather", g.dtype, (4, 1), g.args, g.attrs)  # offset varies: [4, 1] ok
    verify(_replace_body(program, body[:-2] + (narrow, body[-1])))
    rows = Instr("gather", g.dtype, (1, 3), g.args, g.attrs)  # offset [4, 1] does not fit
    with pytest.raises(IRError, match=r"element offset .* does not broadcast"):
        verify(_replace_body(program, body[:-2] + (rows, body[-1])))


def test_bounds_keep_every_element_inside_the_buffer():
    """The default bounds are the widest that keep the map inside the buffer; bounds
    that would reach outside it, bounds out of order, a map wider than the buffer and a
    gather from an empty buffer (nothing to read for a non-empty shape) are rejected."""
    b = ProgramBuilder("rows")
    w = b.input("w", "f32", (5, 3))
    y = b.output("y", "f32", (4, 3))
    k = b.kernel((4, 3))
    at = k.mul(k.index(0, "i32"), 7)  # 0, 7, 14, 21: rows 0, 2 (+1 element), 4, 4
    k.store(y, k.gather(w, at, (4, 3), 0, (0, 1)))
    program = b.build()
    assert next(i for i in program.kernels[0].body if i.op == "gather").bounds == (0, 12)
    out = np.empty((4, 3), np.float32)
    run(program, [np.arange(15, dtype=np.float32), out])
    assert out.tolist() == [[0, 1, 2], [7, 8, 9], [12, 13, 14], [12, 13, 14]]
    for bounds, words in (((0, 13), "out of bounds"), ((-1, 12), "out of bounds"),
                          ((5, 4), "low <= high")):
        b = ProgramBuilder("bad")
        w = b.input("w", "f32", (5, 3))
        y = b.output("y", "f32", (4, 3))
        k = b.kernel((4, 3))
        with pytest.raises(IRError, match=words):
            k.store(y, k.gather(w, k.index(0, "i32"), (4, 3), 0, (0, 1), bounds))
            b.build()
    for size, strides in ((5, (1000,)), (0, (1,))):  # too wide a map; an empty buffer
        b = ProgramBuilder("far")
        w = b.input("w", "f32", (size,))
        y = b.output("y", "f32", (4,))
        k = b.kernel((4,))
        with pytest.raises(IRError, match=r"low <= high|out of bounds"):
            k.store(y, k.gather(w, k.index(0, "i32"), (4,), 0, strides))
            b.build()


def test_a_kernel_never_gathers_what_it_stores():
    b = ProgramBuilder("rmw")
    x = b.buffer("x", "f32", (4,), "inout")
    k = b.kernel((4,))
    k.store(x, k.gather(x, k.index(0, "i64"), (4,), 3, (-1,)))
    with pytest.raises(IRError, match="gathers from x, which it also stores; split"):
        b.build()


# --- the passes -------------------------------------------------------------------------
def _graph_lookup():
    g = Graph("emb")
    w = g.input("w", "f32", (6, 4))
    ix = g.input("ix", "i32", (3,))
    rows = g.gather(w, (ix.reshape(3, 1), 1), (3, 4))
    return g, w, ix, rows


def test_an_elementwise_consumer_fuses_with_the_gather():
    g, _, _, rows = _graph_lookup()
    g.output("y", g.unary("exp", rows) * 2.0)
    program = pipeline.run(g.program())
    assert len(program.kernels) == 1
    assert [i.op for i in program.kernels[0].body].count("gather") == 1


def test_a_gathered_temporary_stays_materialized():
    """A gather of a computed table reads it at data-dependent positions: the table's
    kernel cannot be inlined into it, and the two kernels stay apart."""
    g = Graph("scaled")
    w = g.input("w", "f32", (6, 4))
    ix = g.input("ix", "i32", (3,))
    table = g.unary("exp", w)
    g.output("y", g.gather(table, (ix.reshape(3, 1), 1), (3, 4)))
    program = pipeline.run(g.program())
    assert len(program.kernels) == 2
    gather = next(i for i in program.kernels[1].body if i.op == "gather")
    assert program.buffers[gather.buffer].kind == "temp"
    data = np.linspace(-1, 1, 24, dtype=np.float32).reshape(6, 4)
    ids = np.array([5, 0, -1], np.int32)
    got = hologram.compile(g.program(), backend="cpu")(data, ids)
    np.testing.assert_allclose(got, np.exp(data)[ids], rtol=1e-6)


def test_identical_gathers_merge_and_constant_offsets_do_not_fold():
    b = ProgramBuilder("cse")
    w = b.input("w", "f32", (8,))
    y = b.output("y", "f32", (4,))
    k = b.kernel((4,))
    at = k.const(3, "i64")
    a = k.gather(w, at, (4,), 0, (1,))
    k.store(y, k.add(a, k.gather(w, at, (4,), 0, (1,))))
    program = pipeline.run(b.build())
    body = program.kernels[0].body
    assert [i.op for i in body].count("gather") == 1
    out = np.empty(4, np.float32)
    run(program, [np.arange(8, dtype=np.float32), out])
    assert out.tolist() == [6.0, 8.0, 10.0, 12.0]


def test_coalescing_merges_a_gathers_dimensions_only_when_its_map_allows():
    g = Graph("coalesce")
    w = g.input("w", "f32", (10, 4))
    ix = g.input("ix", "i64", (2, 3))
    g.output("y", g.gather(w, (ix.reshape(2, 3, 1), 2), (2, 3, 4)))
    kernel = pipeline.run(g.program()).kernels[0]
    assert kernel.domain == (6, 4)  # the index's two dimensions walk as one
    data = np.arange(40, dtype=np.float32).reshape(10, 4)
    ids = np.array([[1, 9, 0], [-1, -10, 4]])
    got = hologram.compile(g.program(), backend="cpu")(data, ids)
    assert np.array_equal(got, data[ids])


# --- capabilities -----------------------------------------------------------------------
def test_targets_without_the_capability_refuse_it():
    program = _lookup(offset_dtype="i32")
    assert CPU.gather and not Capabilities().gather
    assert decompose(program, CPU) is program
    with pytest.raises(MissingCapabilityError) as error:
        decompose(program, Capabilities())
    message = str(error.value)
    for words in ("program lookup", "kernel", "gather", "webgpu", "cpu or interp"):
        assert words in message, (words, message)


# --- Graph.gather -----------------------------------------------------------------------
def test_graph_gather_coordinates():
    """Several tensor coordinates (negative ones counted from the end), axes walking the
    other dimensions, a strided source, int32 and uint8 indices, broadcasting."""
    g = Graph("coords")
    x = g.input("x", "f32", (4, 5, 6))
    i = g.input("i", "i32", (3, 1))
    j = g.input("j", "u8", (2,))
    view = x.permute(2, 0, 1)[::2]  # [3, 4, 5], strided
    # y[a, b, c] = view[i[a], c, j[b]]
    y = g.gather(view, (i.reshape(3, 1, 1), 2, j.reshape(1, 2, 1)), (3, 2, 4))
    g.output("y", y)
    data = np.arange(120, dtype=np.float32).reshape(4, 5, 6)
    ii = np.array([[2], [-1], [-3]], np.int32)
    jj = np.array([4, 0], np.uint8)
    v = data.transpose(2, 0, 1)[::2]
    want = np.stack([np.stack([v[ii[a, 0], :, jj[b]] for b in range(2)]) for a in range(3)])
    for backend in ("interp", "cpu"):
        got = hologram.compile(g.program(), backend=backend)(data, ii, jj)
        assert np.array_equal(got, want), backend


def test_graph_gather_errors():
    g = Graph("bad")
    x = g.input("x", "f32", (4, 5))
    i = g.input("i", "f32", (3,))
    with pytest.raises(ShapeError, match="coordinates must be integers"):
        g.gather(x, (i, 1), (3, 5))
    with pytest.raises(ShapeError, match="1 coordinates for a 2-d tensor"):
        g.gather(x, (1,), (3, 5))
    with pytest.raises(ShapeError, match="empty tensor"):
        g.gather(g.input("e", "f32", (0, 5)), (g.input("k", "i64", (3, 1)), 1), (3, 5))


def test_instr_accessors():
    """A gather's attrs are a load's: buffer and map."""
    g = _lookup().kernels[0].body[-2]
    assert g.op == "gather" and g.buffer == 0 and g.map == IndexMap(0, (0, 1))
