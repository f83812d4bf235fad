"""Every elementwise opcode on every dtype the backend declares, on edge values (NaN, ±inf,
-0.0, denormals, the largest values, int min/max, division by zero) and random ones: one
program per (group, dtype) with one output per opcode, named after it."""

from __future__ import annotations

import numpy as np
import pytest

import hologram
from hologram.errors import DTypeError
from hologram.isa import dtypes as dt
from hologram.isa.builder import ProgramBuilder
from hologram.isa.ir import BINARY_OPS, COMPARE_OPS, UNARY_OPS

from .numerics import (
    SINCOS_LIMIT,
    accepts,
    assert_close,
    both,
    elementwise,
    expect_known_bug,
    float_tolerance,
    fma_inputs,
    pairs,
    seed_of,
    storage,
    supported,
    values,
)

NAMES = [t.name for t in dt.ALL]


def _ops(backend: str, candidates, t, arity: int) -> list[str]:
    if not supported(backend, "load", t) or not supported(backend, "store", t, dt.bool_):
        return []
    return [op for op in candidates
            if accepts(op, [t] * arity) and supported(backend, op, t)]


def _many(name: str, types, ops, n: int, emit) -> tuple:
    """A program over ``n`` elements: inputs of ``types``, one output per op in ``ops``."""
    b = ProgramBuilder(name)
    ins = [b.input(f"a{i}", t, (n,)) for i, t in enumerate(types)]
    k = b.kernel((n,))
    loaded = [k.load(x) for x in ins]
    for op in ops:
        value = emit(k, op, loaded)
        k.store(b.output(op, value.dtype, (n,)), value)
    return b.build()


@pytest.mark.parametrize("name", NAMES)
def test_unary(backend, name):
    t = dt.dtype(name)
    ops = _ops(backend, UNARY_OPS, t, 1)
    if not ops:
        pytest.skip(f"{backend} declares no unary op on {name}")
    rng = np.random.default_rng(seed_of("unary", name))
    x = values(t, 1000, rng)
    # sin and cos get arguments in their documented range (their own input)
    limited = values(t, 1000, rng, SINCOS_LIMIT)
    size = max(x.size, limited.size)
    x, limited = np.resize(x, size), np.resize(limited, size)

    def emit(k, op, loaded):
        return k.unary(op, loaded[1] if op in ("sin", "cos") else loaded[0])

    program = _many(f"unary_{name}", [t, t], ops, size, emit)
    got, want = both(program, backend, [x, limited])
    for op, g, w in zip(ops, got, want):
        arg = limited if op in ("sin", "cos") else x
        ulps, atol = float_tolerance(op, t, w)
        assert_close(g, w, t, ulps, atol, [arg], f"{op} {name}", backend)


@pytest.mark.parametrize("name", NAMES)
def test_binary_and_compare(backend, name):
    t = dt.dtype(name)
    ops = _ops(backend, BINARY_OPS + COMPARE_OPS, t, 2)
    if not ops:
        pytest.skip(f"{backend} declares no binary op on {name}")
    rng = np.random.default_rng(seed_of("binary", name))
    a, b = pairs(t, 500, rng)
    if t.is_float:  # integral exponents of negative bases (pow)
        a = np.concatenate([a, values(t, 200, rng)[-200:]])
        b = np.concatenate([b, storage(rng.integers(-12, 12, 200), t)])
    program = _many(f"binary_{name}", [t, t], ops, a.size,
                    lambda k, op, loaded: k.binary(op, *loaded))
    got, want = both(program, backend, [a, b])
    for op, g, w in zip(ops, got, want):
        rt = dt.bool_ if op in COMPARE_OPS else t
        ulps, atol = float_tolerance(op, rt, w)
        assert_close(g, w, rt, ulps, atol, [a, b], f"{op} {name}", backend)


@pytest.mark.parametrize("name", NAMES)
def test_select(backend, name):
    t = dt.dtype(name)
    if not supported(backend, "select", dt.bool_, t):
        pytest.skip(f"{backend} does not declare select on {name}")
    rng = np.random.default_rng(seed_of("select", name))
    a = values(t, 300, rng)
    b = values(t, 300, rng)[::-1].copy()
    c = rng.random(a.size) < 0.5
    program = elementwise("select", [dt.bool_, t, t], a.size)
    (got,), (want,) = both(program, backend, [c, a, b])
    assert_close(got, want, t, inputs=[c, a, b], what=f"select {name}", backend=backend)


@pytest.mark.parametrize("name", [t.name for t in dt.FLOATS])
def test_fma_rounds_once(backend, name, request):
    expect_known_bug(request, backend, f"fma {name}")
    t = dt.dtype(name)
    if not supported(backend, "fma", t):
        pytest.skip(f"{backend} does not declare fma on {name}")
    inputs = fma_inputs(t, np.random.default_rng(seed_of("fma", name)))
    program = elementwise("fma", [t, t, t], inputs[0].size)
    (got,), (want,) = both(program, backend, inputs)
    assert_close(got, want, t, inputs=inputs, what=f"fma {name}", backend=backend)


@pytest.mark.parametrize("name", ["i8", "i16", "i32", "i64", "u8"])
def test_integer_division_corner_cases(backend, name):
    """Division by zero, min / -1 and truncation toward zero, as docs/isa.md defines them."""
    t = dt.dtype(name)
    if not supported(backend, "div", t) or not supported(backend, "mod", t):
        pytest.skip(f"{backend} does not declare div/mod on {name}")
    lo, hi = t.min, t.max
    if t.kind == "u":
        a = np.array([hi, 0, 7, 200, hi, 5], dtype=t.storage)
        b = np.array([0, 0, 2, 100, hi, 3], dtype=t.storage)
    else:
        a = np.array([lo, lo, 7, -7, 7, -7, hi, 5, lo], dtype=t.storage)
        b = np.array([-1, 0, 2, 2, -2, -2, -1, 0, lo], dtype=t.storage)
    program = _many(f"divmod_{name}", [t, t], ["div", "mod"], a.size,
                    lambda k, op, loaded: k.binary(op, *loaded))
    (q, r), (q0, r0) = both(program, backend, [a, b])
    assert_close(q, q0, t, inputs=[a, b], what=f"div {name}", backend=backend)
    assert_close(r, r0, t, inputs=[a, b], what=f"mod {name}", backend=backend)
    if t.kind == "i":  # the definition, spelled out
        assert q0.tolist() == [lo, 0, 3, -3, -3, 3, -hi, 0, 1]
        assert r0.tolist() == [0, lo, 1, -1, 1, -1, 0, 5, 0]


def test_declared_pairs_cover_the_isa_or_are_refused(backend):
    """Every (op, dtype) the ISA accepts is either declared (and run above) or refused at
    compile time with a DTypeError that names the backend, the op and the dtype."""
    refused = 0
    for t in dt.ALL:
        for op, arity in [*((o, 1) for o in UNARY_OPS), *((o, 2) for o in BINARY_OPS),
                          *((o, 2) for o in COMPARE_OPS)]:
            if not accepts(op, [t] * arity) or supported(backend, op, t):
                continue
            refused += 1
            with pytest.raises(DTypeError) as error:
                hologram.compile(elementwise(op, [t] * arity, 4), backend=backend)
            for word in (repr(backend), op, t.name):
                assert word in str(error.value), (word, str(error.value))
    if backend == "interp":
        assert refused == 0  # the ISA's definition supports all of it


#: Arguments of sin and cos far past the Cody-Waite range (docs/mathlib.md, "sin, cos"):
#: huge values and the arguments closest to a multiple of pi/2 that f32 (16367173 * 2^72,
#: 10741887 * 2^11, ...) and f64 (6381956970095103 * 2^797) have.
HUGE_SINCOS = {
    "f32": [1e20, -1e20, 3.4e38, -3.4028235e38, 1e30, 2.0 ** 100, 131072.0, 205888.0, 1e6,
            16367173 * 2.0 ** 72, 10741887 * 2.0 ** 11, 16367173 * 2.0 ** 73,
            10057457 * 2.0 ** 62, 11617958 * 2.0 ** 17, 16573937 * 2.0 ** -16],
    "f64": [1e20, -1e300, 1.7976931348623157e308, 1e22, 2.0 ** 1000, 1e14, 1e15,
            6381956970095103 * 2.0 ** 797, -6381956970095103 * 2.0 ** 798,
            5261692873635770 * 2.0 ** 499],
}


@pytest.mark.parametrize("name", ["f32", "f64", "bf16", "f16"])
def test_sin_cos_of_huge_arguments(backend, name):
    """sin and cos of arguments up to the largest finite value (the bound of their
    documented accuracy), few of them: the emulated cuda backend is slow."""
    t = dt.dtype(name)
    ops = [op for op in ("sin", "cos") if supported(backend, op, t)]
    if not ops or not supported(backend, "load", t):
        pytest.skip(f"{backend} has no sin/cos on {name}")
    rng = np.random.default_rng(seed_of("huge sincos", name))
    top = {"f64": 308, "f16": 4.8}.get(name, 38)
    random = 10.0 ** rng.uniform(4, top, 48) * rng.choice([-1.0, 1.0], 48)
    x = storage(np.concatenate([HUGE_SINCOS.get(name, HUGE_SINCOS["f32"]), random]), t)
    program = _many(f"huge_sincos_{name}", [t], ops, x.size,
                    lambda k, op, loaded: k.unary(op, loaded[0]))
    got, want = both(program, backend, [x])
    for op, g, w in zip(ops, got, want):
        ulps, atol = float_tolerance(op, t, w)
        assert_close(g, w, t, ulps, atol, [x], f"{op} {name}", backend)
