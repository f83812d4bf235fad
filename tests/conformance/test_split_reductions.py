"""Reductions of few long rows: the shape a backend computes as partials over chunks of
each row and their combination (split reductions: the cpu backend's whole-domain ones,
the cuda backend's few-rows ones, docs/cuda.md). The ISA's rules must hold across the
chunks: the first index of a repeated extreme and of the first NaN, -0.0 only when every
term is, integer wraparound, bool any/all, and float sums within the bound.

The cuda and webgpu backends split from ``SPLIT_WORK`` terms per chunk (thousands, for a
GPU; docs/cuda.md, docs/webgpu.md); here their thresholds are lowered so that rows of a
few thousand terms split, which the emulations run in seconds. The cache keys name the
lowered threshold (their target strings).
"""

from __future__ import annotations

import numpy as np
import pytest

from hologram.frontend.graph import Graph
from hologram.isa import dtypes as dt
from hologram.isa.builder import ProgramBuilder

from .numerics import (
    INF,
    NAN,
    as_float,
    assert_close,
    assert_reduction_close,
    both,
    kinds_for,
    reduction_inputs,
    seed_of,
    storage,
    supported,
    tie_values,
)

#: (shape, reduced axes): two rows, one row (no grid), three rows of two axes, and a
#: reduction over the leading axis. Rows are 2100-3100 terms: several chunks (on cuda five
#: or six of 512 terms; tests/test_cuda.py checks that they split).
CASES = [((2, 3000), (1,)), ((3100,), (0,)), ((3, 40, 60), (1, 2)), ((2100, 2), (0,))]
#: The cuda and webgpu backends' split threshold here (terms per chunk, at least).
SPLIT_WORK = 256


@pytest.fixture(autouse=True)
def _lower_the_split_threshold(monkeypatch):
    from hologram.backends.cuda import render as cuda_render
    from hologram.backends.webgpu import render as webgpu_render

    monkeypatch.setattr(cuda_render, "SPLIT_WORK", SPLIT_WORK)
    monkeypatch.setattr(webgpu_render, "SPLIT_WORK", SPLIT_WORK)


def split_program(t: dt.DType, kinds: list[str]):
    g = Graph(f"split_{t.name}")
    outputs = []
    for i, (shape, axes) in enumerate(CASES):
        x = g.input(f"x{i}", t, shape)
        for kind in kinds:
            name = f"{kind}{i}"
            g.output(name, g.reduce(kind, x, axes, keepdim=False))
            outputs.append((name, kind, i))
    return g.program(), outputs


def _crafted(t: dt.DType, n: int, rng: np.random.Generator, label: str) -> np.ndarray:
    """Inputs whose answer depends on rules that cross chunks (512-1024 terms each)."""
    if label == "late extremes":  # the extreme repeats in later chunks: first one wins
        x = tie_values(t, n, rng) if t.is_bool else random_array_like(t, n, rng)
        if t.is_float:
            x = storage(np.clip(np.asarray(x, np.float64), -100, 100), t)
            x[[n // 2, n * 3 // 4, n - 1]] = storage([INF, INF, INF], t)
            x[[n // 2 + 300, n - 7]] = storage([-INF, -INF], t)
        elif not t.is_bool:
            x[[n // 2, n * 3 // 4, n - 1]] = t.max
            x[[n // 2 + 300, n - 7]] = t.min
        return x
    if label == "late NaN" and t.is_float:  # NaN wins max/min/arg*: first NaN only
        x = storage(rng.uniform(-1, 1, n), t)
        x[[n // 2, n - 3]] = storage([NAN, NAN], t)
        return x
    if label == "signed zeros" and t.is_float:  # all -0.0 but one chunk's +0.0
        x = storage(np.full(n, -0.0), t)
        x[n - 1] = storage([0.0], t)[0]
        return x
    if label == "wrap" and t.is_int:  # sums and products that wrap
        info = np.iinfo(t.storage)
        return rng.choice(np.array([info.max, info.max - 1, 3], dtype=t.storage), n)
    return random_array_like(t, n, rng)


def random_array_like(t: dt.DType, n: int, rng: np.random.Generator) -> np.ndarray:
    if t.is_bool:
        return rng.random(n) < 0.5
    if t.is_int:
        info = np.iinfo(t.storage)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), n, dtype=t.storage)
    return storage(rng.standard_normal(n) * 3, t)


@pytest.mark.parametrize("name", [t.name for t in dt.ALL])
def test_few_long_rows_every_kind(backend, name):
    t = dt.dtype(name)
    kinds = kinds_for(backend, t)
    if not kinds:
        pytest.skip(f"{backend} declares no reduction on {name}")
    program, outputs = split_program(t, kinds)
    rng = np.random.default_rng(seed_of("split", name))
    params = [p for p in program.params if p.kind == "in"]
    labels = ["edges", "ties", "late extremes"]  # edges: random values with edge values
    labels += ["late NaN", "signed zeros"] if t.is_float else ["wrap"] if t.is_int else []
    for label in labels:
        if label in ("edges", "ties"):
            inputs = reduction_inputs(label, t, params, rng)
        else:
            inputs = [_crafted(t, p.size, rng, label) for p in params]
        got, want = both(program, backend, inputs)
        for (out, kind, i), g, w in zip(outputs, got, want):
            shape, axes = CASES[i]
            assert_reduction_close(g, w, kind, t, inputs[i], shape, axes,
                                   f"{out} {shape} axes {axes} ({name}) on {label} inputs",
                                   backend)


@pytest.mark.parametrize("name", ["f32", "f16", "bf16", "f64"])
def test_a_long_sum_of_negative_zeros_is_negative_zero(backend, name):
    t = dt.dtype(name)
    if not supported(backend, "reduce", t):
        pytest.skip(f"{backend} does not declare reductions on {name}")
    g = Graph(f"split_zeros_{name}")
    g.output("s", g.sum(g.input("x", t, (2, 3000)), 1))
    x = storage(np.full(6000, -0.0), t)
    got, want = both(g.program(), backend, [x])
    assert np.signbit(np.asarray(got[0], np.float64) if t is not dt.bfloat16
                      else dt.from_bf16_bits(got[0])).all()
    assert_close(got[0], want[0], t, what=f"sum of -0.0 ({name})", backend=backend)


def gathered_rows(kind: str, rows: int, n: int):
    """``y[r] = reduce(kind, table[r, at[r, :]])``: each row's terms read through a gather
    (the index loaded with the term), one row without a grid when ``rows`` is 1."""
    b = ProgramBuilder(f"gathered_{kind}_{rows}")
    shape = (rows, n) if rows > 1 else (n,)
    strides = (n, 0) if rows > 1 else (0,)
    table = b.input("table", "f32", shape)
    at = b.input("at", "i32", shape)
    y = b.output("y", "i64" if kind.startswith("arg") else "f32", (rows,))
    k = b.kernel(shape, grid_rank=1) if rows > 1 else b.kernel(shape)
    v = k.gather(table, k.load(at), shape, 0, strides)
    axis = 1 if rows > 1 else 0
    k.store(y, k.reduce(kind, v, axis), 0, (1, 0) if rows > 1 else (0,),
            (rows, 1) if rows > 1 else (1,))
    return b.build()


@pytest.mark.parametrize("kind", ["sum", "argmax"])
@pytest.mark.parametrize("rows", [2, 1])
def test_rows_read_through_a_gather(backend, kind, rows):
    """Terms gathered by an index loaded with them (a permutation of each row, a few
    indices out of range, clamped to the row's ends): a split reduction's partials'
    kernel gathers its own chunk's terms. Small integers, so every sum is exact and the
    argmax ties (its first index across chunks)."""
    n = 3000 if rows > 1 else 3100
    rng = np.random.default_rng(seed_of("split gather", kind, rows))
    table = rng.integers(-50, 50, (rows, n)).astype(np.float32)
    at = np.stack([rng.permutation(n) for _ in range(rows)]).astype(np.int32)
    at[:, [5, n // 2, n - 9]] = [-1, n, -2**31]
    inputs = [table.reshape(-1), at.reshape(-1)]
    (got,), (want,) = both(gathered_rows(kind, rows, n), backend, inputs)
    picked = np.take_along_axis(table, np.clip(at, 0, n - 1), 1)
    expect = picked.sum(1) if kind == "sum" else picked.argmax(1)
    assert np.array_equal(want, expect) and np.array_equal(got, want), (got, want, expect)


def chained_rows(t: dt.DType):
    """Reductions that need each other's results, over every case's few long rows: a
    softmax with its log-sum-exp (max, then a sum of exponentials) and a layer norm (mean,
    then the mean of squared deviations). On cuda each such kernel is cut into one kernel
    per reduction, each split (docs/cuda.md, "Split reductions")."""
    g = Graph(f"chained_{t.name}")
    for i, (shape, axes) in enumerate(CASES):
        x = g.input(f"x{i}", t, shape)
        m = g.max(x, axes, keepdim=True)
        e = g.unary("exp", x - m)
        s = g.sum(e, axes, keepdim=True)
        g.output(f"softmax{i}", e / s)
        g.output(f"logsumexp{i}", g.unary("log", s) + m)
        d = x - g.mean(x, axes, keepdim=True)
        g.output(f"norm{i}", d * g.unary("rsqrt", g.mean(d * d, axes, keepdim=True) + 1e-5))
    return g.program()


@pytest.mark.parametrize("name", ["f32", "f64", "f16", "bf16"])
def test_reductions_that_need_each_other_over_few_long_rows(backend, name):
    """Against the interpreter, within a few units of each output's largest magnitude
    (the split sums round differently, docs/isa.md's bound); NaN and infinity where the
    interpreter has them: a row with -inf terms (masked attention: they weigh 0), a NaN
    in a row's last chunk (the whole row NaN)."""
    t = dt.dtype(name)
    if not supported(backend, "exp", t) or not supported(backend, "reduce", t):
        pytest.skip(f"{backend} does not declare exp and reductions on {name}")
    program = chained_rows(t)
    rng = np.random.default_rng(seed_of("chained", name))
    inputs = []
    for shape, _ in CASES:
        x = random_array_like(t, int(np.prod(shape)), rng)
        x[[7, 1500, 2040]] = storage([-INF, -INF, -INF], t)
        inputs.append(x)
    inputs[2][-5] = storage([NAN], t)[0]  # the last of three rows: a NaN at its end
    got, want = both(program, backend, inputs)
    bits = {"f64": 52, "f32": 23, "f16": 10, "bf16": 7}[name]
    for out, g, w in zip(program.params[len(CASES):], got, want):
        finite = as_float(w, t)[np.isfinite(as_float(w, t))]
        scale = np.abs(finite).max() if finite.size else 1.0
        assert_close(g, w, t, 4, 2.0 ** (4 - bits) * scale, what=f"{out.name} ({name})",
                     backend=backend)
