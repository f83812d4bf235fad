"""``scatter`` in the ISA's host tooling: the text form, the verifier's rules (bounds,
modes, the one access per scattered buffer, grids only over disjoint dimensions), the
passes (fusion, canonicalization, scheduling, coalescing), the capability refusal and
``Graph.scatter``. Backend agreement is tests/conformance/test_scatter.py's."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from hologram.backends.cpu.target import CAPABILITIES as CPU
from hologram.backends.interp.interpreter import run
from hologram.compiler import pipeline
from hologram.compiler.capabilities import Capabilities, MissingCapabilityError
from hologram.compiler.passes.decompose import decompose
from hologram.errors import IRError, ShapeError
from hologram.frontend.graph import Graph
from hologram.isa.builder import ProgramBuilder
from hologram.isa.ir import Instr, Kernel, Program, scatter_disjoint
from hologram.isa.text import parse_program, print_program
from hologram.isa.verify import verify


def _rows(rows=5, width=3, n=4, mode="add", grid_rank=0) -> Program:
    """``x[ix[r], c] (mode)= v[r, c]``."""
    b = ProgramBuilder("rows")
    x = b.buffer("x", "f32", (rows, width), "inout")
    ix = b.input("ix", "i64", (n,))
    v = b.input("v", "f32", (n, width))
    k = b.kernel((n, width), grid_rank=grid_rank)
    k.scatter(x, k.load(v), k.mul(k.load(ix, (n, 1), 0, (1, 0)), width), mode, (n, width),
              0, (0, 1))
    return b.build()


def _replace_body(program: Program, body: tuple[Instr, ...], grid_rank: int = 0) -> Program:
    kernel = program.kernels[0]
    return Program(program.name, program.buffers,
                   (Kernel(kernel.name, kernel.domain, body, grid_rank),))


# --- text and verifier --------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["replace", "add", "mul", "max", "min"])
def test_text_round_trip_and_syntax(mode):
    program = _rows(mode=mode)
    text = print_program(program)
    assert f"scatter {mode} @x[+0; 0, 1], %0, %3 in [0, 12] : f32[4, 3]" in text
    assert parse_program(text) == program
    with pytest.raises(IRError, match="a scatter has no result"):
        parse_program(text.replace(f"    scatter {mode}", f"    %9 = scatter {mode}"))
    with pytest.raises(IRError, match="unknown scatter mode 'sum'"):
        parse_program(text.replace(f"scatter {mode}", "scatter sum"))


def test_instr_accessors_and_no_value():
    program = _rows()
    body = program.kernels[0].body
    s = body[-1]
    assert (s.op, s.buffer, s.bounds, s.mode, s.map.strides) == ("scatter", 0, (0, 12), "add",
                                                                  (0, 1))
    assert program.kernels[0].writes() == {0} and 0 in program.kernels[0].reads()
    use = Instr("neg", s.dtype, s.shape, (len(body) - 1,))
    with pytest.raises(IRError, match="is a scatter, which has no value"):
        verify(_replace_body(program, body + (use,)))


def test_modes_types_and_operands():
    program = _rows()
    body = program.kernels[0].body
    s = body[-1]
    with pytest.raises(IRError, match=r"element offset .* must be an integer"):
        verify(_replace_body(program, body[:-1] + (replace(s, args=(s.args[0], s.args[0])),)))
    with pytest.raises(IRError, match="unknown scatter mode"):
        verify(_replace_body(program, body[:-1] + (replace(s, attrs=s.attrs[:3] + ("or",)),)))
    with pytest.raises(IRError, match="scatter takes 4 attribute"):
        verify(_replace_body(program, body[:-1] + (replace(s, attrs=s.attrs[:3] + ("add", 1)),)))
    b = ProgramBuilder("bools")
    x = b.buffer("x", "bool", (4,), "inout")
    k = b.kernel((4,))
    with pytest.raises(IRError, match="scatter add needs a numeric value"):
        k.scatter(x, k.const(True, "bool"), k.index(0), "add", (4,))
    k.scatter(x, k.const(True, "bool"), k.index(0), "max", (4,))  # or: fine
    b.build()


def test_bounds_keep_every_element_inside_the_buffer():
    program = _rows()
    s = program.kernels[0].body[-1]
    for bounds, ok in [((0, 12), True), ((-1, 12), False), ((0, 13), False), ((3, 3), True),
                       ((5, 4), False)]:
        body = program.kernels[0].body[:-1] + (replace(s, attrs=(0, s.map, bounds, "add")),)
        if ok:
            verify(_replace_body(program, body))
        else:
            with pytest.raises(IRError, match=r"out of bounds|low <= high"):
                verify(_replace_body(program, body))


def test_no_scatter_into_an_input():
    program = _rows()
    buffers = (replace(program.buffers[0], kind="in"),) + program.buffers[1:]
    with pytest.raises(IRError, match="scatter to input buffer x"):
        verify(replace(program, buffers=buffers))


def test_a_scattered_buffer_has_no_other_access_in_its_kernel():
    """A load, a gather, a store or a second scatter of the buffer a kernel scatters into
    would meet its writes in an order the grid does not define."""
    for other in ("load", "store", "scatter", "gather"):
        b = ProgramBuilder(f"twice_{other}")
        x = b.buffer("x", "f32", (8,), "inout")
        ix = b.input("ix", "i32", (8,))
        k = b.kernel((8,))
        i = k.load(ix)
        k.scatter(x, k.const(1.0, "f32"), i, "add")
        if other == "load":
            y = b.output("y", "f32", (8,))
            k.store(y, k.load(x))
        elif other == "gather":
            y = b.output("y", "f32", (8,))
            k.store(y, k.gather(x, i))
        elif other == "store":
            k.store(x, k.const(0.0, "f32"), shape=(8,))
        else:
            k.scatter(x, k.const(2.0, "f32"), i, "add")
        with pytest.raises(IRError, match="scatters into x and also accesses it"):
            b.build()


def test_grid_dimensions_must_be_proven_disjoint():
    """Rows of index_add's shape may meet (the offset spans the buffer): no grid; a
    scatter along the columns of its own row (bounds within the row): the rows are."""
    with pytest.raises(IRError, match=r"the grid \[4\] is not proven disjoint"):
        _rows(grid_rank=1)
    b = ProgramBuilder("own_rows")
    x = b.buffer("x", "f32", (6, 10), "inout")
    ix = b.input("ix", "i64", (6, 4))
    k = b.kernel((6, 4), grid_rank=1)
    k.scatter(x, k.const(1.0, "f32"), k.load(ix), "add", (6, 4), 0, (10, 0), (0, 9))
    program = b.build()
    s = program.kernels[0].body[-1]
    assert scatter_disjoint(s, (6, 4), [0]) and not scatter_disjoint(s, (6, 4), [1])
    assert not scatter_disjoint(s, (6, 4), [0, 1])
    wider = replace(s, attrs=(s.buffer, s.map, (0, 10), s.mode))  # may reach the next row
    assert not scatter_disjoint(wider, (6, 4), [0])
    broadcast = replace(s, shape=(1, 4))  # every row would make the same writes again
    assert not scatter_disjoint(broadcast, (6, 4), [0])


# --- passes -----------------------------------------------------------------------------
def test_schedule_puts_only_disjoint_dimensions_on_the_grid():
    lowered = pipeline.lower(pipeline.canonical_form(_rows(rows=50, n=40)))
    (kernel,) = lowered.kernels
    assert kernel.grid_rank == 0  # index_add's rows may collide
    b = ProgramBuilder("own_rows")
    x = b.buffer("x", "f32", (64, 10), "inout")
    ix = b.input("ix", "i64", (64, 4))
    k = b.kernel((64, 4))
    k.scatter(x, k.const(1.0, "f32"), k.load(ix), "replace", (64, 4), 0, (10, 0), (0, 9))
    (kernel,) = pipeline.lower(pipeline.canonical_form(b.build())).kernels
    assert kernel.grid_rank == 1


@pytest.mark.parametrize("value", ["exp", "cast"])
def test_producers_that_only_move_values_inline_and_the_target_stays_materialized(value):
    """``g.scatter`` along rows that may collide (its kernel runs on one thread) of a
    computed value (``exp``): the value keeps its own kernel, computed in parallel; of a
    moved one (a cast of an f16 input) the value inlines into the scatter's kernel. The
    copy of ``x`` and the scatter keep their temporary (two writers), the output reads it
    after both. Results as the interpreter's before the passes."""
    g = Graph("fused")
    x = g.input("x", "f32", (6, 3))
    ix = g.input("ix", "i32", (4,))
    v = g.input("v", "f32" if value == "exp" else "f16", (4, 3))
    moved = g.unary("exp", v) if value == "exp" else g.cast(v, "f32")
    g.output("y", g.scatter(x * 2.0, (ix.reshape(4, 1), 1), moved, (4, 3), "add"))
    program = g.program()
    lowered = pipeline.lower(pipeline.canonical_form(program))
    ops = [[i.op for i in k.body] for k in lowered.kernels]
    (scatters,) = [k for k in ops if "scatter" in k]
    if value == "exp":
        assert len(ops) == 4 and "exp" not in scatters, ops
    else:
        assert len(ops) == 3 and "cast" in scatters, ops
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((6, 3)).astype(np.float32), np.array([5, 0, 5, -1], np.int32),
              rng.standard_normal((4, 3)).astype(np.float32 if value == "exp" else np.float16)]
    outs = [np.zeros((6, 3), np.float32), np.zeros((6, 3), np.float32)]
    run(program, [*inputs, outs[0]])
    run(lowered, [*inputs, outs[1]])
    expected = inputs[0] * 2
    for r, i in enumerate([5, 0, 5, 5]):  # -1 counts from the end
        expected[i] += np.exp(inputs[2][r]) if value == "exp" else inputs[2][r]
    np.testing.assert_allclose(outs[0], expected, rtol=1e-6)
    assert np.array_equal(outs[0], outs[1])


def test_kernels_with_a_scatter_are_not_merged():
    """A reduction producing the scattered values stays in its own kernel (merged, its
    rows would lose the parallel grid to the scatter's order)."""
    g = Graph("no_merge")
    x = g.input("x", "f32", (8, 3))
    ix = g.input("ix", "i64", (8,))
    sums = g.reduce("sum", x, 1)  # [8]
    g.output("y", g.scatter(g.copy(sums[:5]), (ix,), sums, (8,), "add"))
    lowered = pipeline.lower(pipeline.canonical_form(g.program()))
    for kernel in lowered.kernels:
        ops = {i.op for i in kernel.body}
        assert not ({"scatter"} <= ops and ops & {"reduce", "contract"}), ops


def test_a_dead_scatter_into_a_temporary_is_dropped_and_identical_ones_stay_two():
    b = ProgramBuilder("dead")
    x = b.input("x", "f32", (4,))
    t = b.temp("t", "f32", (4,))
    y = b.output("y", "f32", (4,))
    k = b.kernel((4,))
    k.store(t, k.load(x))
    k = b.kernel((4,))
    k.scatter(t, k.const(1.0, "f32"), k.index(0, "i32"), "add")  # nobody reads t after
    k = b.kernel((4,))
    k.store(y, k.load(x))
    canonical = pipeline.canonical_form(b.build())
    assert all(i.op != "scatter" for k in canonical.kernels for i in k.body)
    assert len(canonical.buffers) == 2  # t is gone
    # Two identical scatter-adds are two writes (a write is never merged), so the
    # verifier sees both and refuses the kernel.
    b = ProgramBuilder("twice")
    x = b.buffer("x", "f32", (4,), "inout")
    k = b.kernel((4,))
    k.scatter(x, k.const(1.0, "f32"), k.index(0, "i32"), "add")
    k.scatter(x, k.const(1.0, "f32"), k.index(0, "i32"), "add")
    with pytest.raises(IRError, match="scatters into x and also accesses it"):
        b.build()


def test_constant_operands_do_not_fold_away_the_scatter():
    b = ProgramBuilder("consts")
    x = b.buffer("x", "i32", (5,), "inout")
    k = b.kernel((3,))
    k.scatter(x, k.const(7, "i32"), k.const(2, "i32"), "add", (3,))
    canonical = pipeline.canonical_form(b.build())
    assert [i.op for i in canonical.kernels[0].body][-1] == "scatter"
    data = np.arange(5, dtype=np.int32)
    run(canonical, [data])
    assert data.tolist() == [0, 1, 23, 3, 4]  # three adds to one element


def test_coalescing_keeps_a_scatters_grid_valid():
    """Two disjoint grid dimensions walked as one by every access (rows of a 3-d
    tensor's last dimension): coalesced, and the merged dimension is still disjoint."""
    b = ProgramBuilder("coalesce")
    x = b.buffer("x", "f32", (4, 5, 10), "inout")
    ix = b.input("ix", "i64", (4, 5, 3))
    k = b.kernel((4, 5, 3))
    k.scatter(x, k.const(1.0, "f32"), k.load(ix), "add", (4, 5, 3), 0, (50, 10, 0), (0, 9))
    lowered = pipeline.lower(pipeline.canonical_form(b.build()))
    (kernel,) = lowered.kernels
    assert kernel.domain == (20, 3) and kernel.grid_rank == 1
    verify(lowered)


def test_targets_without_the_capability_refuse_it():
    with pytest.raises(MissingCapabilityError, match=r"scatter .*index order.*cpu or interp"):
        decompose(_rows(), Capabilities())
    assert decompose(_rows(), CPU) == _rows()


# --- Graph.scatter ------------------------------------------------------------------------
def test_graph_scatter_modes_and_coordinates():
    """Coordinates as Graph.gather takes them: a tensor per indexed dimension (negative:
    from the end), an axis per walked one; numbers as values; the result is a new tensor,
    ``x`` unchanged."""
    g = Graph("modes")
    x = g.input("x", "i32", (3, 4))
    ix = g.input("ix", "i64", (5,))
    jx = g.input("jx", "i64", (5,))
    g.output("put", g.scatter(x, (ix, jx), 100, (5,)))
    g.output("add", g.scatter(x, (ix, jx), g.arange(5, "i32"), (5,), "add"))
    g.output("col", g.scatter(x, (ix.reshape(5, 1), 1), -1, (5, 4), "min"))
    g.output("same", g.copy(x))
    data = np.arange(12, dtype=np.int32).reshape(3, 4)
    rows, cols = np.array([0, 2, -1, 1, 0]), np.array([3, 0, 0, -4, 3])
    outs = [np.zeros((3, 4), np.int32) for _ in range(4)]
    run(g.program(), [data, rows, cols, *outs])
    put, add, col, same = outs
    expected = data.copy()
    expected[rows, cols] = 100
    assert np.array_equal(put, expected) and np.array_equal(same, data)
    expected = data.copy()
    np.add.at(expected, (rows, cols), np.arange(5, dtype=np.int32))
    assert np.array_equal(add, expected)
    expected = data.copy()
    expected[np.unique(rows % 3)] = -1
    assert np.array_equal(col, expected)


def test_graph_scatter_errors():
    g = Graph("errors")
    x = g.input("x", "f32", (3, 4))
    ix = g.input("ix", "i64", (5,))
    fx = g.input("fx", "f32", (5,))
    with pytest.raises(ShapeError, match="1 coordinates for a 2-d"):
        g.scatter(x, (ix,), 1.0, (5,))
    with pytest.raises(ShapeError, match="integers"):
        g.scatter(x, (fx, 0), 1.0, (5,))
    with pytest.raises(ShapeError, match="do not broadcast"):
        g.scatter(x, (ix, ix), g.input("v", "f32", (4,)), (5,))
    with pytest.raises(ShapeError, match="cast them first"):
        g.scatter(x, (ix, ix), ix, (5,))
    with pytest.raises(ShapeError, match="empty tensor"):
        g.scatter(g.input("e", "f32", (0, 4)), (ix, ix), 1.0, (5,))
