"""Every reduction kind of the ISA on every dtype, over every axis combination of rank-1
to rank-3 inputs (and a rank-4 sample): one program per dtype, one output per (kind,
rank, axes), named after them. Edge values, ties, NaN and signed zeros; empty axes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from util import same_bits

from hologram.frontend.graph import Graph
from hologram.isa import dtypes as dt

from .numerics import (
    INF,
    NAN,
    REDUCTION_INPUTS,
    UNIT_ROUNDOFF,
    as_float,
    assert_reduction_close,
    axis_sets,
    both,
    kinds_for,
    reduction_inputs,
    reduction_tolerance,
    seed_of,
    storage,
    supported,
)

NAMES = [t.name for t in dt.ALL]
SHAPES = [(7,), (4, 5), (2, 3, 4), (2, 3, 2, 3)]


def reduce_program(t: dt.DType, kinds: list[str]):
    g = Graph(f"reduce_{t.name}")
    outputs = []
    for shape in SHAPES:
        x = g.input(f"x{len(shape)}", t, shape)
        for kind in kinds:
            for axes in axis_sets(len(shape)):
                name = f"{kind}{len(shape)}_{''.join(map(str, axes))}"
                g.output(name, g.reduce(kind, x, axes, keepdim=False))
                outputs.append((name, kind, shape, axes))
    return g.program(), outputs


@pytest.mark.parametrize("name", NAMES)
def test_reduce_every_kind_and_axis_set(backend, name):
    t = dt.dtype(name)
    kinds = kinds_for(backend, t)
    if not kinds:
        pytest.skip(f"{backend} declares no reduction on {name}")
    program, outputs = reduce_program(t, kinds)
    rng = np.random.default_rng(seed_of("reduce", name))
    params = [p for p in program.params if p.kind == "in"]
    datasets = {label: reduction_inputs(label, t, params, rng) for label in REDUCTION_INPUTS}
    for label, inputs in datasets.items():
        got, want = both(program, backend, inputs)
        for (out, kind, shape, axes), g, w in zip(outputs, got, want):
            assert_reduction_close(g, w, kind, t, inputs[SHAPES.index(shape)], shape, axes,
                                   f"{out} ({name}) on {label} inputs", backend)


@pytest.mark.parametrize("name", [t.name for t in dt.FLOATS])
def test_max_min_propagate_nan_and_order_signed_zeros(backend, name):
    t = dt.dtype(name)
    if not supported(backend, "reduce", t, dt.int64):
        pytest.skip(f"{backend} does not declare reductions on {name}")
    g = Graph("extremes")
    x = g.input("x", t, (6, 3))
    for kind in ("max", "min", "argmax", "argmin"):
        g.output(kind, g.reduce(kind, x, 1))
    rows = [[-0.0, 0.0, -0.0], [0.0, -0.0, 0.0], [1.0, NAN, 2.0], [NAN, 1.0, NAN],
            [-INF, -INF, -INF], [INF, 3.0, INF]]
    data = storage(rows, t).reshape(-1)
    got, want = both(g.program(), backend, [data])
    mx, mn, amx, amn = want
    assert np.signbit(as_float(mx, t)[:2]).tolist() == [False, False]
    assert np.signbit(as_float(mn, t)[:2]).tolist() == [True, True]
    assert np.isnan(as_float(mx, t)[2:4]).all() and np.isnan(as_float(mn, t)[2:4]).all()
    assert as_float(mx, t)[4:].tolist() == [-INF, INF]
    assert as_float(mn, t)[4:].tolist() == [-INF, 3.0]
    assert amx.tolist() == [1, 0, 1, 0, 0, 0] and amn.tolist() == [0, 1, 1, 0, 0, 1]
    for a, b in zip(got, want):
        assert same_bits(a, b)


def _long_extreme_rows(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Rows where a vectorized max/min's NaN and signed-zero handling decides the result,
    the special element at a random place (any lane, any unrolled vector, the tail)."""
    def at(row: np.ndarray, value: float) -> np.ndarray:
        row = row.copy()
        row[rng.integers(n)] = value
        return row

    neg, pos = -rng.uniform(1, 2, n), rng.uniform(1, 2, n)
    return [
        at(rng.standard_normal(n), NAN), at(np.full(n, NAN), 1.0), np.full(n, -0.0),
        np.full(n, 0.0), at(np.full(n, -0.0), 0.0), at(np.full(n, 0.0), -0.0),
        at(neg, 0.0), at(neg, -0.0), at(pos, 0.0), at(pos, -0.0), at(neg, -INF),
        np.full(n, -INF), at(pos, INF), at(at(pos, NAN), INF), rng.standard_normal(n),
    ]


@pytest.mark.parametrize("name", [t.name for t in dt.FLOATS])
def test_max_min_of_long_rows_propagate_nan_and_order_signed_zeros(backend, name):
    """As above on rows long enough to be reduced in vectors (several per row, a tail),
    over the last axis and over a whole tensor."""
    t = dt.dtype(name)
    if not supported(backend, "reduce", t):
        pytest.skip(f"{backend} does not declare reductions on {name}")
    rng = np.random.default_rng(seed_of("long extremes", name))
    n = 1003
    rows = _long_extreme_rows(n, rng)
    g = Graph("long_extremes")
    x = g.input("x", t, (len(rows), n))
    flat = [g.input(f"r{i}", t, (n,)) for i in range(len(rows))]
    for kind in ("max", "min"):
        g.output(kind, g.reduce(kind, x, 1))
        for i, r in enumerate(flat):
            g.output(f"{kind}{i}", g.reduce(kind, r, 0))
    data = [storage(np.stack(rows), t).reshape(-1), *(storage(r, t) for r in rows)]
    got, want = both(g.program(), backend, data)
    for a, b in zip(got, want):
        assert same_bits(a, b), (a, b)
    mx, mn = (as_float(w, t) for w in want[:: len(rows) + 1])
    assert np.isnan(mx[:2]).all() and np.isnan(mn[:2]).all()
    assert np.signbit(mx[2:6]).tolist() == [True, False, False, False]
    assert np.signbit(mn[2:6]).tolist() == [True, False, True, True]
    assert mx[6] == 0 and not np.signbit(mx[6]) and mx[7] == 0 and np.signbit(mx[7])
    assert mn[8] == 0 and not np.signbit(mn[8]) and mn[9] == 0 and np.signbit(mn[9])


EMPTY = [((0,), (0,)), ((3, 0), (1,)), ((0, 4), (0,)), ((2, 0, 3), (1, 2)), ((2, 0, 3), (0, 2))]


@pytest.mark.parametrize("name", NAMES)
def test_reductions_over_empty_axes_give_identities(backend, name):
    t = dt.dtype(name)
    if not supported(backend, "reduce", t):
        pytest.skip(f"{backend} does not declare reductions on {name}")
    kinds = ["max", "min"] + ([] if t.is_bool else ["sum", "prod"])
    identity = {"sum": 0, "prod": 1, "max": t.min, "min": t.max}
    g = Graph("empty")
    cases = []
    for shape, axes in EMPTY:
        x = g.input(f"x{len(cases)}", t, shape)
        for kind in kinds:
            g.output(f"{kind}{len(cases)}", g.reduce(kind, x, axes, keepdim=False))
        cases.append((shape, axes))
    inputs = [np.zeros(0, dtype=t.storage) for _ in cases]
    # zero-extent kernels may run elsewhere (the backend's policy, reported by it)
    got, want = both(g.program(), backend, inputs, delegation_ok=True)
    results = iter(zip(got, want))
    for shape, axes in cases:
        size = math.prod(n for d, n in enumerate(shape) if d not in axes)
        for kind in kinds:
            a, b = next(results)
            assert same_bits(a, b), (kind, shape, axes, a, b)
            assert a.size == size
            value = as_float(a, t) if t.is_float else a.astype(np.int64)
            assert (value == identity[kind]).all(), (kind, shape, axes)
            if t.is_float and kind == "sum":
                assert not np.signbit(value).any()  # +0.0


def _large(label: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if label == "uniform":
        return rng.uniform(0, 1, n)
    if label == "normal":
        return rng.standard_normal(n)
    if label == "cancelling":  # pairs that cancel, plus a small remainder
        x = rng.standard_normal(n // 2) * 1e4
        return np.concatenate([x, -x, rng.uniform(0, 1e-3, n - 2 * (n // 2))])
    return rng.standard_normal(n) * 10.0 ** rng.integers(-8, 9, n)  # mixed magnitudes


@pytest.mark.parametrize("name", ["f32", "f16", "bf16", "f64"])
def test_large_sums_within_the_bound(backend, name):
    """Sums of ~1e6 terms against the exact sum (math.fsum), within the ISA's bound (the
    dedicated check of :func:`reduction_tolerance` on long rows, where accumulation order
    and precision matter)."""
    t = dt.dtype(name)
    if not supported(backend, "reduce", t):
        pytest.skip(f"{backend} does not declare reductions on {name}")
    labels = ["uniform", "normal", "cancelling", "mixed"]
    n = 1_000_003
    g = Graph(f"large_sums_{name}")
    for label in labels:
        g.output(label, g.sum(g.input(f"x_{label}", t, (n,))))
    rng = np.random.default_rng(seed_of("large", name))
    limit = 6e4 if t is dt.float16 else 1e30
    inputs = [storage(np.clip(_large(label, n, rng), -limit, limit), t) for label in labels]
    got, want = both(g.program(), backend, inputs)
    for label, x, a, w in zip(labels, inputs, got, want):
        terms = as_float(x, t)[None, :]
        exact = np.array([math.fsum(terms[0])])
        ulps, atol = reduction_tolerance("sum", t, w, terms)
        result, reference = as_float(a, t)[0], as_float(w, t)[0]
        # the bound against the exact sum: the interpreter's rounding of it is part of
        # u_r |s| already, so measure from the exact value; plus ``ulps`` of the result
        allowed = float(np.asarray(atol).reshape(-1)[0]) + ulps * 2 * \
            UNIT_ROUNDOFF[name] * abs(reference)
        assert abs(result - exact[0]) <= allowed, (
            f"{label} sum of {n} {name}: {backend} {result!r}, exact {exact[0]!r}, "
            f"interp {reference!r}, allowed error {allowed:.3g}")
