"""``gather``, the data-dependent load (docs/isa.md): every value dtype, every offset
dtype, offsets at and beyond their bounds (clamped), 64-bit extremes, explicit bounds,
empty and non-contiguous maps, a gather fused into arithmetic and a reduction, a large
permutation.

A backend runs gather when its target declares the ``gather`` capability
(``hologram/compiler/capabilities.py``); one that does not must refuse the program when
it compiles it, with a :class:`MissingCapabilityError` naming the op (never crash or
compute something else). Both are checked on every registered backend.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from util import same_bits

from hologram.isa import dtypes as dt
from hologram.isa.builder import ProgramBuilder
from hologram.isa.ir import Program

from .numerics import both_or_refused, edge_offsets, far_cases, seed_of, storage, values

OFFSET_DTYPES = [t for t in dt.ALL if t.is_int]
# (backend's outputs, the interpreter's), or the backend's refusal checked and skipped
gathered = functools.partial(both_or_refused, capability="gather")


def lookup(t: dt.DType, offset: dt.DType, rows: int, width: int, n: int) -> Program:
    """``y[r, c] = table[ids[r], c]``: the embedding lookup, ids of dtype ``offset``
    scaled by the row length in i64."""
    b = ProgramBuilder(f"lookup_{t.name}_{offset.name}")
    table = b.input("table", t, (rows, width))
    ids = b.input("ids", offset, (n,))
    y = b.output("y", t, (n, width))
    k = b.kernel((n, width))
    i = k.cast(k.load(ids, (n, 1), 0, (1, 0)), "i64")
    k.store(y, k.gather(table, k.mul(i, width), (n, width), 0, (0, 1)))
    return b.build()


def expected_lookup(table: np.ndarray, ids: np.ndarray, width: int) -> np.ndarray:
    """The ISA's rule in NumPy: the operand (the row's first element) clamped to the
    bounds that keep the whole row inside the table: an index past either end reads the
    first or the last row."""
    rows = table.size // width
    return table.reshape(rows, width)[np.clip(ids.astype(np.int64), 0, rows - 1)]


@pytest.mark.parametrize("t", dt.ALL, ids=lambda t: t.name)
@pytest.mark.parametrize("offset", [dt.int32, dt.int64], ids=lambda t: t.name)
def test_lookup_every_value_dtype(backend, t, offset):
    rows, width, n = 37, 5, 300
    rng = np.random.default_rng(seed_of("gather", t.name, offset.name))
    table = values(t, rows * width, rng)[: rows * width]
    # In range mostly; then the ends, and beyond them (clamped to the first/last element).
    ids = np.concatenate([rng.integers(0, rows, n - 8), [0, rows - 1, -1, rows, -rows, 2 * rows,
                                                          -2**31, 2**31 - 1]])
    ids = ids.astype(offset.storage)
    (got,), (want,) = gathered(lookup(t, offset, rows, width, n), backend, [table, ids])
    assert same_bits(got, want)
    assert same_bits(want, expected_lookup(table, ids, width).reshape(-1))


@pytest.mark.parametrize("offset", OFFSET_DTYPES, ids=lambda t: t.name)
def test_edge_offsets_of_every_integer_dtype(backend, offset):
    """Offsets taken as they are (no scaling): every edge value of the dtype, its own
    width's extremes included; unsigned ones are zero-extended. The default bounds keep
    ``5 + i + at`` inside the 300 elements for every ``i`` of the 1-d map."""
    data, ids, pos = edge_offsets("gather", offset)
    n = ids.size
    b = ProgramBuilder(f"edges_{offset.name}")
    src = b.input("src", "i32", (300,))
    at = b.input("at", offset, (n,))
    y = b.output("y", "i32", (n,))
    k = b.kernel((n,))
    k.store(y, k.gather(src, k.load(at), (n,), 5, (1,)))  # offset 5 + i + at[i]
    (got,), (want,) = gathered(b.build(), backend, [data, ids])
    assert same_bits(got, want)
    assert same_bits(want, data[pos])


@pytest.mark.parametrize("t", [dt.float64, dt.float32], ids=lambda t: t.name)
def test_explicit_bounds_and_64_bit_extremes(backend, t):
    """Bounds narrower than the buffer (the operand clamped to 2..6 whatever it holds,
    INT64_MIN and INT64_MAX included: no overflow anywhere), over a broadcast map (f32:
    the same on targets without f64)."""
    b = ProgramBuilder(f"bounds_{t.name}")
    src = b.input("src", t, (10,))
    at = b.input("at", "i64", (6,))
    y = b.output("y", t, (6,))
    k = b.kernel((6,))
    k.store(y, k.gather(src, k.load(at), (6,), 3, (0,), (2, 6)))
    data = storage(np.arange(10.0) + 0.5, t)
    ids = np.array([-2**63, 2**63 - 1, 0, 2, 4, 7], dtype=np.int64)
    (got,), (want,) = gathered(b.build(), backend, [data, ids])
    assert same_bits(got, want)
    assert want.tolist() == [5.5, 9.5, 5.5, 5.5, 7.5, 9.5]


@pytest.mark.parametrize("offset", OFFSET_DTYPES, ids=lambda t: t.name)
def test_bounds_beyond_the_operand_and_maps_far_outside(backend, offset):
    """Bounds that a narrow operand cannot reach on either side (nothing to clamp), and
    maps whose own elements lie 2**33 before or after the buffer, brought back into it by
    bounds beyond the 32-bit range: every operand but an i64 clamps to the one bound
    there, an i64 one near it is clamped for real. A renderer that sums the element in
    fewer than 64 bits must get each one exactly."""
    rng = np.random.default_rng(seed_of("gather far", offset.name))
    n = 200
    for case, (map_offset, stride, bounds, size, at) in enumerate(
            far_cases(offset, n, rng)):
        b = ProgramBuilder(f"far_{offset.name}_{case}")
        src = b.input("src", "i32", (size,))
        ids = b.input("at", offset, (n,))
        y = b.output("y", "i32", (n,))
        k = b.kernel((n,))
        k.store(y, k.gather(src, k.load(ids), (n,), map_offset, (stride,), bounds))
        data = (np.arange(size, dtype=np.int64) * 7 - 100).astype(np.int32)
        at = np.asarray(at).astype(offset.storage)
        (got,), (want,) = gathered(b.build(), backend, [data, at])
        assert same_bits(got, want)
        pos = map_offset + stride * np.arange(n) + np.clip(at.astype(np.int64), *bounds)
        assert same_bits(want, data[pos])


def test_reversed_rows_of_a_narrow_operand(backend):
    """An i8 operand scaled in i32 to a row of i16 values, each row read backwards."""
    b = ProgramBuilder("reversed")
    src = b.input("src", "i16", (12,))
    at = b.input("at", "i8", (3,))
    y = b.output("y", "i16", (3, 4))
    k = b.kernel((3, 4))
    row = k.mul(k.cast(k.load(at, (3, 1), 0, (1, 0)), "i32"), 4)
    k.store(y, k.gather(src, row, (3, 4), 3, (0, -1)))  # each row read backwards
    data = np.arange(12, dtype=np.int16) * 3
    (got,), (want,) = gathered(b.build(), backend, [data, np.array([2, -128, 127], np.int8)])
    assert same_bits(got, want)
    assert same_bits(want, data.reshape(3, 4)[[2, 0, 2], ::-1].reshape(-1))


@pytest.mark.parametrize("rows", [0, 3])
def test_empty(backend, rows):
    """No points to gather (an empty id list, from an empty or a full table). Kernels
    with a zero extent may run on the interpreter (declared: docs/architecture.md)."""
    b = ProgramBuilder(f"empty_{rows}")
    table = b.input("table", "f32", (rows, 4))
    ids = b.input("ids", "i64", (0,))
    y = b.output("y", "f32", (0, 4))
    k = b.kernel((0, 4))
    k.store(y, k.gather(table, k.mul(k.load(ids, (0, 1), 0, (1, 0)), 4), (0, 4), 0, (0, 1)))
    (got,), (want,) = gathered(b.build(), backend, [np.ones((rows, 4), np.float32),
                                                     np.zeros(0, np.int64)],
                               delegation_ok=True)
    assert got.size == want.size == 0


def test_non_contiguous_maps(backend):
    """Offsets loaded through a reversed, transposed map; a gather whose own map walks
    backwards and broadcasts; two gathers of one table in one kernel, fused with
    arithmetic and a reduction (the row sums of the gathered rows)."""
    rows, width, n = 11, 6, 7
    b = ProgramBuilder("strided_gather")
    table = b.input("table", "f32", (rows, width))
    ids = b.input("ids", "i32", (n, 2))  # read column 1 backwards, as a [n, 1] value
    y = b.output("y", "f32", (n, width))
    s = b.output("s", "f32", (n, 1))
    k = b.kernel((n, width), grid_rank=1)
    i = k.cast(k.load(ids, (n, 1), 2 * n - 1, (-2, 0)), "i64")
    rev = k.gather(table, k.mul(i, width), (n, width), width - 1, (0, -1))  # row reversed
    first = k.gather(table, k.mul(i, width), (n, width), 0, (0, 0))  # row's first, broadcast
    k.store(y, k.sub(rev, first))
    k.store(s, k.reduce("sum", rev, 1), 0, (1, 0), (n, 1))
    rng = np.random.default_rng(seed_of("strided gather"))
    data = rng.standard_normal((rows, width)).astype(np.float32)
    index = rng.integers(0, rows, (n, 2)).astype(np.int32)
    (gy, gs), (wy, ws) = gathered(b.build(), backend, [data, index])
    assert same_bits(gy, wy)
    picked = index[::-1, 1]
    assert same_bits(wy, (data[picked, ::-1] - data[picked, :1]).reshape(-1))
    np.testing.assert_allclose(gs, ws, rtol=1e-6)
    np.testing.assert_allclose(ws, data[picked].sum(1), rtol=1e-5)


def test_large_permutation(backend):
    """A 2**20-element permutation of an f32 vector (every grid split of the cpu)."""
    n = 1 << 20
    rng = np.random.default_rng(seed_of("permute"))
    data = storage(rng.standard_normal(n), dt.float32)
    perm = rng.permutation(n).astype(np.int64)
    b = ProgramBuilder("permute")
    src = b.input("src", "f32", (n,))
    at = b.input("at", "i64", (n,))
    y = b.output("y", "f32", (n,))
    k = b.kernel((n,))
    k.store(y, k.gather(src, k.load(at)))
    (got,), (want,) = gathered(b.build(), backend, [data, perm])
    assert same_bits(got, want) and same_bits(want, data[perm])
