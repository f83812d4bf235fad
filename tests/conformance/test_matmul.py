"""Contractions (matmul, batched, transposed operands, fused epilogues) on every dtype the
backend declares, sizes 1, odd, and 0, against the interpreter within the ISA's float-sum
bound (:func:`reduction_tolerance`, kind ``contract``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from util import random_array, same_bits

from hologram.frontend.graph import Graph
from hologram.isa import dtypes as dt

from .numerics import as_float, assert_close, both, reduction_tolerance, seed_of, supported

NUMERIC = [t.name for t in dt.ALL if not t.is_bool]
SHAPES = [((17, 33), (33, 9)), ((3, 8, 5), (5, 7)), ((1, 4), (4, 1)), ((64, 1), (1, 3)),
          ((4, 64, 200), (200, 96)), ((1, 1), (1, 1))]
EMPTY = [((0, 5), (5, 3)), ((3, 0), (0, 4)), ((2, 0, 3), (3, 4)), ((4, 3), (3, 0))]


def products(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The terms a[..., i, k] * b[k, j] of each output element, in float64."""
    terms = a[..., :, None, :] * np.swapaxes(b, -1, -2)[None, :, :]
    return terms.reshape(-1, a.shape[-1])


@pytest.mark.parametrize("name", NUMERIC)
def test_matmul(backend, name):
    t = dt.dtype(name)
    if not supported(backend, "contract", t):
        pytest.skip(f"{backend} does not declare contract on {name}")
    g = Graph(f"mm_{name}")
    cases = []
    for i, (sa, sb) in enumerate(SHAPES):
        a, b = g.input(f"a{i}", t, sa), g.input(f"b{i}", t, sb)
        bt = g.input(f"bt{i}", t, sb[::-1])  # the same matrix, stored transposed
        g.output(f"plain{i}", a @ b)
        g.output(f"transposed{i}", a @ bt.T)
        cases.append((sa, sb))
    c = g.input("c", t, (9,))
    g.output("epilogue", g.maximum(g.input("e", t, (17, 33)) @ g.input("f", t, (33, 9)) + c,
                                   0 if t.is_int else 0.0))
    program = g.program()
    rng = np.random.default_rng(seed_of("mm", name))
    ins = [p for p in program.params if p.kind == "in"]
    inputs = [random_array(p, rng, edges=False).reshape(p.shape) for p in ins]
    for i in range(len(cases)):  # bt{i} holds b{i} transposed
        inputs[3 * i + 2] = np.ascontiguousarray(inputs[3 * i + 1].T)
    got, want = both(program, backend, inputs)
    for i, (sa, sb) in enumerate(cases):
        a, b = inputs[3 * i], inputs[3 * i + 1]
        fa, fb = ((as_float(v, t) if t.is_float else v.astype(np.float64)) for v in (a, b))
        terms = products(fa, fb)
        for j, what in enumerate(("plain", "transposed")):
            w, o = want[2 * i + j], got[2 * i + j]
            ulps, atol = reduction_tolerance("contract", t, w, terms)
            assert_close(o, w, t, ulps, atol, what=f"{what} {sa} @ {sb} ({name})",
                         backend=backend)
    # the epilogue: one rounding of the sum, then exact max(x + c, 0)
    e, f = (as_float(v, t) if t.is_float else v.astype(np.float64) for v in inputs[-2:])
    ulps, atol = reduction_tolerance("contract", t, want[-1], products(e.reshape(17, 33),
                                                                       f.reshape(33, 9)))
    assert_close(got[-1], want[-1], t, ulps + (1 if t.is_float else 0), atol,
                 what=f"relu(e @ f + c) ({name})", backend=backend)


#: Few outputs, a long k: on cuda each tile's k is cut into chunks (split-K; its threshold
#: lowered here to 256 indices, so these split into 4 and 2 chunks under the emulation,
#: the last one past k's end).
LONG_K = [((40, 1100), (1100, 24)), ((2, 20, 700), (700, 30))]


@pytest.mark.parametrize("name", NUMERIC)
def test_few_outputs_over_a_long_k(backend, name, monkeypatch):
    from hologram.backends.cuda import render as cuda_render

    monkeypatch.setattr(cuda_render, "SPLIT_K_WORK", 256)
    t = dt.dtype(name)
    if not supported(backend, "contract", t):
        pytest.skip(f"{backend} does not declare contract on {name}")
    g = Graph(f"mm_long_{name}")
    for i, (sa, sb) in enumerate(LONG_K):
        a, b = g.input(f"a{i}", t, sa), g.input(f"b{i}", t, sb)
        g.output(f"plain{i}", a @ b)
        g.output(f"relu{i}", g.maximum(a @ g.input(f"bt{i}", t, sb[::-1]).T
                                       + g.input(f"c{i}", t, sb[-1:]), 0 if t.is_int else 0.0))
    program = g.program()
    rng = np.random.default_rng(seed_of("mm long", name))
    inputs = [random_array(p, rng, edges=False).reshape(p.shape)
              for p in program.params if p.kind == "in"]
    for i in range(len(LONG_K)):  # bt{i} holds b{i} transposed
        inputs[4 * i + 2] = np.ascontiguousarray(inputs[4 * i + 1].T)
    got, want = both(program, backend, inputs)
    for i, (sa, sb) in enumerate(LONG_K):
        a, b = inputs[4 * i], inputs[4 * i + 1]
        terms = products(*((as_float(v, t) if t.is_float else v.astype(np.float64))
                           for v in (a, b)))
        for j, what in enumerate((f"{sa} @ {sb}", f"relu({sa} @ {sb} + c)")):
            # the epilogue: one rounding of the sum, then exact max(x + c, 0)
            ulps, atol = reduction_tolerance("contract", t, want[2 * i + j], terms)
            assert_close(got[2 * i + j], want[2 * i + j], t,
                         ulps + (j if t.is_float else 0), atol, what=f"{what} ({name})",
                         backend=backend)


@pytest.mark.parametrize("name", ["f32", "i32", "f64", "i8"])
def test_empty_matmuls(backend, name):
    t = dt.dtype(name)
    if not supported(backend, "contract", t):
        pytest.skip(f"{backend} does not declare contract on {name}")
    g = Graph("mm_empty")
    for i, (sa, sb) in enumerate(EMPTY):
        g.output(f"y{i}", g.input(f"a{i}", t, sa) @ g.input(f"b{i}", t, sb))
    inputs = [np.ones(math.prod(s), dtype=t.storage) for pair in EMPTY for s in pair]
    got, want = both(g.program(), backend, inputs, delegation_ok=True)
    for a, b in zip(got, want):
        assert same_bits(a, b)
        assert (b == 0).all() and not np.signbit(b.astype(np.float64)).any()
