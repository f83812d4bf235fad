"""``scatter``, the data-dependent store (docs/isa.md): every value dtype in every mode,
every offset dtype, duplicate targets (the last write wins; accumulations in index
order), offsets at and beyond their bounds (clamped), 64-bit extremes, explicit bounds,
empty, an offset operand broadcast over the scatter's shape, rows written in parallel (a
grid proven disjoint), a producer fused into the scattered value, a large accumulation.

A backend runs scatter when its target declares the ``scatter`` capability
(``hologram/compiler/capabilities.py``); one that does not must refuse the program when
it compiles it, with a :class:`MissingCapabilityError` naming the op (never reorder
writes, crash or compute something else). Both are checked on every registered backend.
Expected values are also computed here by a plain sequential loop (:func:`sequential`),
so the interpreter itself is checked against the ISA's definition.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from util import same_bits

import hologram
import hologram.errors
from hologram.compiler import pipeline
from hologram.isa import dtypes as dt
from hologram.isa.builder import ProgramBuilder
from hologram.isa.ir import SCATTER_MODES, Instr, Program
from hologram.isa.semantics import evaluate, from_storage, to_storage

from .numerics import both_or_refused, edge_offsets, far_cases, seed_of, storage, values

OFFSET_DTYPES = [t for t in dt.ALL if t.is_int]


def modes_of(t: dt.DType) -> list[str]:
    """The modes the ISA defines on ``t`` (no add/mul of bool: max is or, min is and)."""
    return [m for m in SCATTER_MODES if not (t.is_bool and m in ("add", "mul"))]
# (backend's outputs, the interpreter's), or the backend's refusal checked and skipped
scattered = functools.partial(both_or_refused, capability="scatter", words=("index order",))


def sequential(buffer: np.ndarray, positions: np.ndarray, vals: np.ndarray, t: dt.DType,
               mode: str) -> np.ndarray:
    """The ISA's definition, one write at a time in index order: ``buffer`` (storage)
    after writing ``vals`` (storage) at flat ``positions`` (already clamped)."""
    out = buffer.copy()
    op = Instr(mode, t, (1,)) if mode != "replace" else None
    for p, v in zip(positions.reshape(-1), vals.reshape(-1)):
        if op is None:
            out[p] = v
        else:
            old = from_storage(out[p:p + 1], t)
            out[p:p + 1] = to_storage(evaluate(op, [old, from_storage(np.array([v]), t)],
                                               (1,)), t)
    return out


def rows_program(t: dt.DType, offset: dt.DType, rows: int, width: int, n: int,
                 mode: str) -> Program:
    """``table[ids[r], c] (mode)= v[r, c]``: whole rows written at ids of dtype
    ``offset`` scaled by the row length in i64 (index_put / index_add's shape)."""
    b = ProgramBuilder(f"rows_{t.name}_{offset.name}_{mode}")
    table = b.buffer("table", t, (rows, width), "inout")
    ids = b.input("ids", offset, (n,))
    v = b.input("v", t, (n, width))
    k = b.kernel((n, width))
    i = k.cast(k.load(ids, (n, 1), 0, (1, 0)), "i64")
    k.scatter(table, k.load(v), k.mul(i, width), mode, (n, width), 0, (0, 1))
    return b.build()


@pytest.mark.parametrize("t", dt.ALL, ids=lambda t: t.name)
@pytest.mark.parametrize("offset", [dt.int32, dt.int64], ids=lambda t: t.name)
def test_rows_every_value_dtype_and_mode(backend, t, offset):
    rows, width, n = 37, 5, 300
    rng = np.random.default_rng(seed_of("scatter", t.name, offset.name))
    # Duplicates (300 ids into 37 rows), the ends, and beyond them (clamped to the first
    # or the last row).
    ids = np.concatenate([rng.integers(0, rows, n - 8), [0, rows - 1, -1, rows, -rows,
                                                         2 * rows, -2**31, 2**31 - 1]])
    ids = ids.astype(offset.storage)
    table = values(t, rows * width, rng)[: rows * width]
    v = values(t, n * width, rng)[: n * width]
    if t.is_float:  # mul of many random values overflows: keep the products finite
        v = np.where(rng.random(v.size) < 0.5, storage(np.full(v.size, 1.0), t), v)
    for mode in modes_of(t):
        (got,), (want,) = scattered(rows_program(t, offset, rows, width, n, mode), backend,
                                    [table, ids, v])
        assert same_bits(got, want), mode
        clamped = np.clip(ids.astype(np.int64), 0, rows - 1)
        positions = (clamped[:, None] * width + np.arange(width)).reshape(-1)
        assert same_bits(want, sequential(table, positions, v, t, mode)), mode


@pytest.mark.parametrize("offset", OFFSET_DTYPES, ids=lambda t: t.name)
def test_edge_offsets_of_every_integer_dtype(backend, offset):
    """Offsets taken as they are (no scaling): every edge value of the dtype, its own
    width's extremes included; unsigned ones are zero-extended. The default bounds keep
    ``5 + i + at`` inside the 300 elements for every ``i`` of the 1-d map."""
    data, ids, pos = edge_offsets("scatter", offset)
    n = ids.size
    b = ProgramBuilder(f"edges_{offset.name}")
    dst = b.buffer("dst", "i32", (300,), "inout")
    at = b.input("at", offset, (n,))
    k = b.kernel((n,))
    k.scatter(dst, k.index(0, "i32"), k.load(at), "add", (n,), 5, (1,))  # += i at 5+i+at[i]
    (got,), (want,) = scattered(b.build(), backend, [data, ids])
    assert same_bits(got, want)
    assert same_bits(want, sequential(data, pos, np.arange(n, dtype=np.int32), dt.int32,
                                      "add"))


@pytest.mark.parametrize("t", [dt.float64, dt.float32], ids=lambda t: t.name)
def test_explicit_bounds_and_64_bit_extremes(backend, t):
    """Bounds narrower than the buffer (the operand clamped to 2..6 whatever it holds,
    INT64_MIN and INT64_MAX included: no overflow anywhere), every point writing through
    one broadcast element of the map: the last write to each element wins."""
    b = ProgramBuilder(f"bounds_{t.name}")
    dst = b.buffer("dst", t, (10,), "inout")
    at = b.input("at", "i64", (6,))
    v = b.input("v", t, (6,))
    k = b.kernel((6,))
    k.scatter(dst, k.load(v), k.load(at), "replace", (6,), 3, (0,), (2, 6))
    data = storage(np.arange(10.0) + 0.5, t)
    ids = np.array([-2**63, 2**63 - 1, 0, 2, 4, 7], dtype=np.int64)
    new = storage(np.arange(6.0) * 100, t)
    (got,), (want,) = scattered(b.build(), backend, [data, ids, new])
    assert same_bits(got, want)
    # ids clamp to 2, 6, 2, 2, 4, 6 -> elements 5, 9, 5, 5, 7, 9: the last writes win
    assert want.tolist() == [0.5, 1.5, 2.5, 3.5, 4.5, 300.0, 6.5, 400.0, 8.5, 500.0]


@pytest.mark.parametrize("offset", OFFSET_DTYPES, ids=lambda t: t.name)
def test_bounds_beyond_the_operand_and_maps_far_outside(backend, offset):
    """Bounds that a narrow operand cannot reach on either side (nothing to clamp), and
    maps whose own elements lie 2**33 before or after the buffer, brought back into it by
    bounds beyond the 32-bit range (an i64 operand near the bound clamped for real). A
    renderer that sums the element in fewer than 64 bits must get each one exactly."""
    rng = np.random.default_rng(seed_of("scatter far", offset.name))
    n = 200
    for case, (map_offset, stride, bounds, size, at) in enumerate(
            far_cases(offset, n, rng)):
        b = ProgramBuilder(f"far_{offset.name}_{case}")
        dst = b.buffer("dst", "i32", (size,), "inout")
        ids = b.input("at", offset, (n,))
        k = b.kernel((n,))
        k.scatter(dst, k.index(0, "i32"), k.load(ids), "max", (n,), map_offset, (stride,),
                  bounds)
        data = (np.arange(size, dtype=np.int64) * 7 - 100).astype(np.int32)
        at = np.asarray(at).astype(offset.storage)
        (got,), (want,) = scattered(b.build(), backend, [data, at])
        assert same_bits(got, want)
        pos = map_offset + stride * np.arange(n) + np.clip(at.astype(np.int64), *bounds)
        assert same_bits(want, sequential(data, pos, np.arange(n, dtype=np.int32), dt.int32,
                                          "max"))


@pytest.mark.parametrize("t", [dt.float32, dt.float16, dt.bfloat16, dt.float64],
                         ids=lambda t: t.name)
def test_accumulation_order_is_index_order(backend, t):
    """Float additions into one element are made in index order, each rounded to the
    dtype: 2**s + 1 + 1 + ... stays 2**s (each 1 is lost), while the ones first would
    count. A backend that reorders (atomics, a parallel loop, a tree) gets another
    value."""
    big = {"f16": 2048.0, "bf16": 256.0, "f32": 2.0**24, "f64": 2.0**53}[t.name]
    n = 64
    b = ProgramBuilder(f"order_{t.name}")
    dst = b.buffer("dst", t, (3,), "inout")
    at = b.input("at", "i32", (n,))
    v = b.input("v", t, (n,))
    k = b.kernel((n,))
    k.scatter(dst, k.load(v), k.load(at), "add")
    ids = np.array([1] * n, dtype=np.int32)
    ids[-1] = 2
    vals = storage([big] + [1.0] * (n - 2) + [-big], t)
    (got,), (want,) = scattered(b.build(), backend, [storage([0.0, 0.0, 5.0], t), ids, vals])
    assert same_bits(got, want)
    assert from_storage(want, t).tolist() == [0.0, big, 5.0 - big]


def test_empty(backend):
    """No points to write (an empty id list); kernels with a zero extent may run on the
    interpreter (declared: docs/architecture.md)."""
    b = ProgramBuilder("scatter_empty")
    dst = b.buffer("dst", "f32", (3, 4), "inout")
    ids = b.input("ids", "i64", (0,))
    k = b.kernel((0, 4))
    k.scatter(dst, k.const(1.0, "f32"), k.mul(k.load(ids, (0, 1), 0, (1, 0)), 4), "add",
              (0, 4), 0, (0, 1))
    data = np.arange(12, dtype=np.float32)
    (got,), (want,) = scattered(b.build(), backend, [data, np.zeros(0, np.int64)],
                                delegation_ok=True)
    assert same_bits(got, want) and same_bits(want, data)


def test_broadcast_operands(backend):
    """The offset broadcast over the columns (one per row, [n, 1]) and the value over
    everything (a constant): every column of a chosen row gets +1 per time it is named;
    rows named never keep their values."""
    rows, width, n = 9, 7, 40
    b = ProgramBuilder("broadcast")
    dst = b.buffer("dst", "i16", (rows, width), "inout")
    ids = b.input("ids", "u8", (n,))
    k = b.kernel((n, width))
    row = k.mul(k.cast(k.load(ids, (n, 1), 0, (1, 0)), "i32"), width)
    k.scatter(dst, k.const(1, "i16"), row, "add", (n, width), 0, (0, 1))
    rng = np.random.default_rng(seed_of("scatter broadcast"))
    index = rng.integers(0, rows + 3, n).astype(np.uint8)  # some past the end: the last row
    data = np.arange(rows * width, dtype=np.int16)
    (got,), (want,) = scattered(b.build(), backend, [data, index])
    assert same_bits(got, want)
    counts = np.bincount(np.minimum(index, rows - 1), minlength=rows)
    assert same_bits(want, (data.reshape(rows, width) + counts[:, None]).astype(np.int16)
                     .reshape(-1))


@pytest.mark.parametrize("mode", ["replace", "add"])
def test_rows_in_parallel(backend, mode):
    """torch's ``scatter(dim=1)``: each row writes only inside its own row (the bounds
    say so), so the schedule makes the rows a parallel grid; duplicates within a row keep
    index order. Enough rows to split across the cpu's threads."""
    rows, cols, n = 4096, 33, 12
    b = ProgramBuilder(f"parallel_rows_{mode}")
    dst = b.buffer("dst", "f32", (rows, cols), "inout")
    ids = b.input("ids", "i64", (rows, n))
    v = b.input("v", "f32", (rows, n))
    k = b.kernel((rows, n))
    k.scatter(dst, k.load(v), k.load(ids), mode, (rows, n), 0, (cols, 0), (0, cols - 1))
    program = b.build()
    lowered = pipeline.lower(pipeline.canonical_form(program))
    assert lowered.kernels[-1].grid_rank == 1  # the rows: proven disjoint
    rng = np.random.default_rng(seed_of("scatter rows", mode))
    index = rng.integers(0, cols, (rows, n))
    data = rng.standard_normal(rows * cols).astype(np.float32)
    new = rng.standard_normal(rows * n).astype(np.float32)
    (got,), (want,) = scattered(program, backend, [data, index, new])
    assert same_bits(got, want)
    positions = (np.arange(rows)[:, None] * cols + index).reshape(-1)
    assert same_bits(want, sequential(data, positions, new, dt.float32, mode))


def test_fused_value_and_a_second_kernel(backend):
    """The scattered value computed in the kernel (an elementwise producer inlined by
    fusion), and a later kernel reading the scattered buffer: it sees every write (the
    writes of a kernel are visible to the kernels after it)."""
    n, size = 50, 8
    b = ProgramBuilder("fused_scatter")
    x = b.input("x", "f32", (n,))
    ids = b.input("ids", "i32", (n,))
    t = b.temp("t", "f32", (size,))
    s = b.output("s", "f32", (size,))
    k = b.kernel((size,))
    k.store(t, k.const(0.0, "f32"), shape=(size,))
    k = b.kernel((n,))
    k.scatter(t, k.mul(k.load(x), 2.0), k.load(ids), "add")
    k = b.kernel((size,))
    k.store(s, k.add(k.load(t), 1.0))
    rng = np.random.default_rng(seed_of("fused scatter"))
    data = rng.standard_normal(n).astype(np.float32)
    index = rng.integers(0, size, n).astype(np.int32)
    (got,), (want,) = scattered(b.build(), backend, [data, index])
    assert same_bits(got, want)
    expected = sequential(np.zeros(size, np.float32), index, data * 2, dt.float32, "add")
    assert same_bits(want, expected + np.float32(1.0))


def test_large_accumulation(backend):
    """2**18 additions into 1000 elements of i32 (wrapping, exact in any order: the
    values themselves are checked) and the same into f32 (index order: bit for bit).
    webgpu refuses a walk this long (lavapipe would cut it short: its render.py)."""
    n, size = 1 << 18, 1000
    if backend == "webgpu":
        b = ProgramBuilder("too_long")
        dst = b.buffer("dst", "f32", (size,), "inout")
        k = b.kernel((n,))
        k.scatter(dst, k.const(1.0, "f32"), k.index(0, "i32"), "add")
        with pytest.raises(hologram.errors.CompileError, match="more than the 65535"):
            hologram.compile(b.build(), backend=backend)
        pytest.skip("webgpu refuses scatters of more than 65535 writes per grid point")
    rng = np.random.default_rng(seed_of("scatter large"))
    index = rng.integers(0, size, n).astype(np.int64)
    for t in (dt.int32, dt.float32):
        b = ProgramBuilder(f"large_{t.name}")
        dst = b.buffer("dst", t, (size,), "inout")
        at = b.input("at", "i64", (n,))
        v = b.input("v", t, (n,))
        k = b.kernel((n,))
        k.scatter(dst, k.load(v), k.load(at), "add")
        new = (rng.integers(-2**31, 2**31, n) if t.is_int else rng.standard_normal(n))
        new = new.astype(t.storage)
        (got,), (want,) = scattered(b.build(), backend, [np.zeros(size, t.storage), index,
                                                          new])
        assert same_bits(got, want)
        if t.is_int:
            expected = np.zeros(size, np.int64)
            np.add.at(expected, index, new.astype(np.int64))
            assert same_bits(want, expected.astype(np.int32))
