"""The shared numeric rules (hologram.codegen.numerics) on NumPy: each rule written out by
tests/test_codegen_mathlib.py's :class:`NumpyEmitter` (whose ``ior``/``ixor`` are the
interface's composed defaults, so those are checked too) against the ISA's definition in
:mod:`hologram.isa.dtypes`. The backends' renderings of the same rules run in their
conformance suites (casts to bf16, max/min/argmax of NaN and signed zeros)."""

from __future__ import annotations

import numpy as np
from test_codegen_mathlib import NumpyEmitter

from hologram.codegen import numerics
from hologram.codegen.mathlib import F32, F64
from hologram.isa import dtypes as dt


def _f32_patterns(rng: np.random.Generator) -> np.ndarray:
    """Float32 bit patterns: random ones, every exponent with the bf16 tie cases (low half
    0x7FFF, 0x8000, 0x8001, either parity of the kept bit), NaN payloads only in the low
    half, and the extremes."""
    random = rng.integers(0, 2**32, 1 << 18, dtype=np.uint64).astype(np.uint32)
    high = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    ties = (high[:, None] | np.array([0x7FFF, 0x8000, 0x8001, 0, 0xFFFF, 1],
                                     np.uint32)).ravel()
    return np.concatenate([random, ties])


def test_bf16_rounding_is_the_isas():
    bits = _f32_patterns(np.random.default_rng(0))
    x = bits.view(np.float32)
    got = numerics.bf16_bits(NumpyEmitter(F32), x).view(np.uint32)
    assert not (got & 0xFFFF).any()
    want = dt.to_bf16_bits(x).astype(np.uint32) << np.uint32(16)
    bad = np.flatnonzero(got != want)
    assert not bad.size, [(hex(bits[i]), hex(got[i]), hex(want[i])) for i in bad[:5]]
    rounded = numerics.round_bf16(NumpyEmitter(F32), x)
    assert np.array_equal(rounded.view(np.uint32), want)


def test_order_keys_sort_floats_in_total_order_and_invert():
    for fmt, ft, it in ((F32, np.float32, np.int32), (F64, np.float64, np.int64)):
        e = NumpyEmitter(fmt)
        values = np.array([-np.inf, -1e30, -1.5, -np.finfo(ft).smallest_subnormal, -0.0,
                           0.0, np.finfo(ft).smallest_subnormal, 2.0, np.finfo(ft).max,
                           np.inf], ft)
        keys = numerics.order_key(e, values)
        assert keys.dtype == it and (np.diff(keys) > 0).all(), keys
        nan = np.array([np.nan], ft)
        negative_nan = -nan
        assert numerics.order_key(e, nan)[0] > keys[-1]
        assert numerics.order_key(e, negative_nan)[0] < keys[0]
        random = np.random.default_rng(1).standard_normal(1000).astype(ft)
        every = np.concatenate([values, nan, negative_nan, random])
        back = numerics.from_order_key(e, numerics.order_key(e, every))
        assert np.array_equal(back.view(it), every.view(it))


def test_round_to_odd_then_to_f16_or_bf16_rounds_once():
    rng = np.random.default_rng(2)
    x = np.concatenate([
        rng.standard_normal(1 << 16) * 2.0 ** rng.integers(-30, 30, 1 << 16),
        # halfway between two f16 / bf16 neighbours, and a hair either side: a double
        # rounding through nearest float32 gets these wrong
        (1 + 2.0 ** -11) + np.array([0.0, 2.0 ** -40, -2.0 ** -40]),
        (1 + 2.0 ** -8) + np.array([0.0, 2.0 ** -40, -2.0 ** -40]),
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e300, -1e-300]])
    with np.errstate(over="ignore"):  # 1e300 rounds to float32 inf first
        odd = numerics.round_to_odd(NumpyEmitter(F64), x)
    assert odd.dtype == np.float32
    assert np.array_equal(odd.view(np.int32), dt.round_to_odd_f32(x).view(np.int32))
    with np.errstate(over="ignore"):
        assert np.array_equal(odd.astype(np.float16), x.astype(np.float16), equal_nan=True)
    assert np.array_equal(dt.to_bf16_bits(odd), dt.to_bf16_bits(x))
