"""The Triton functions every kernel module of the cuda backend starts with (Triton inlines
them): -0.0 and float32 constants from their bits (a -0.0 literal compiles to +0.0 for a
GPU), bf16 widening, C's fmod exactly, an int64 as a float64 rounded to odd, and the rules
every target shares (:mod:`hologram.codegen.numerics`: bf16 rounding, the total-order keys
of max/min and argmax/argmin, float64 to float32 rounded to odd) written out by the math
library's Triton emitter. The kernels (:mod:`.render`) call them by name."""

from __future__ import annotations

from hologram.codegen import numerics

from .mathlib import F32, F64, function

PRELUDE = '''import triton
import triton.language as tl

HG_INF = tl.constexpr(float("inf"))
HG_NAN = tl.constexpr(float("nan"))


@triton.jit
def hg_neg_zero():
    # From the bits: a -0.0 literal compiles to +0.0 for a GPU (the interpreter keeps it).
    return tl.full([1, 1], -2147483648, tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def hg_f32_bits(x):
    return tl.full([1, 1], x, tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def hg_bf16_to_f32(b):
    return ((b.to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)


@triton.jit
def hg_i64_to_f64_odd(v):
    # An int64 as a float64 rounded to odd, so that rounding it to f16/bf16 (through
    # hg_f64_to_f32_odd) rounds the integer once: the sum of its two words (each exact),
    # and the sum's error (two-sum); an inexact sum with an even last bit steps one unit
    # toward the exact value. No |v|: compiled for an H200 (Triton 3.6.0), the magnitude
    # of a sign-extended int32 came out wrong at -2**31; and int64's has no room.
    hi = (v >> 32).to(tl.float64) * 4294967296.0
    lo = (v & 0xFFFFFFFF).to(tl.float64)
    s = hi + lo
    b = s - hi
    err = (hi - (s - b)) + (lo - b)
    bits = s.to(tl.int64, bitcast=True)
    step = tl.where((err > 0) == (s > 0), 1, -1)
    odd = tl.where((err != 0) & ((bits & 1) == 0), bits + step, bits)
    return odd.to(tl.float64, bitcast=True)


@triton.jit
def hg_mul(a, b):
    return a * b


@triton.jit
def hg_fmod_f32(x, y):
    # C fmod, exact (NVPTX's frem divides inexactly). With |x| = mx * 2**ex and
    # |y| = my * 2**ey (integer significands, ex >= ey), the result is the remainder of
    # mx * 2**(ex - ey) by my, times 2**ey: a remainder taken 39 bits of the shift at a
    # time (mx, my < 2**24: every step fits int64), exact in float32.
    bx = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    by = y.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    fx, fy = bx >> 23, by >> 23
    mx = tl.where(fx == 0, bx, (bx & 0x7FFFFF) | 0x800000).to(tl.int64)
    my = tl.where(fy == 0, by, (by & 0x7FFFFF) | 0x800000).to(tl.int64)
    my = tl.where(my == 0, 1, my)
    ey = tl.maximum(fy, 1)
    d = tl.maximum(tl.maximum(fx, 1) - ey, 0)
    r = mx % my
    while tl.max(d) > 0:  # at most 7 trips (d < 254)
        s = tl.minimum(d, 39)
        r = (r << s.to(tl.int64)) % my
        d -= s
    scale = ((ey.to(tl.int64) - 150 + 1023) << 52).to(tl.float64, bitcast=True)
    v = (r.to(tl.float64) * scale).to(tl.float32)  # exact: a multiple of 2**(ey - 150)
    v = (v.to(tl.int32, bitcast=True) | (x.to(tl.int32, bitcast=True) & -0x80000000))
    v = v.to(tl.float32, bitcast=True)
    ax, ay = tl.abs(x), tl.abs(y)
    bad = (x != x) | (y != y) | (ax == HG_INF) | (ay == 0.0)
    return tl.where(bad, HG_NAN, tl.where(ax < ay, x, v))


@triton.jit
def hg_fmod_f64(x, y):
    # hg_fmod_f32's remainder for float64: significands < 2**53, 10 bits of the shift
    # per step (up to 205 trips: huge ratios are slow, and exact).
    sign = -0x7FFFFFFFFFFFFFFF - 1
    bx = x.to(tl.int64, bitcast=True) & 0x7FFFFFFFFFFFFFFF
    by = y.to(tl.int64, bitcast=True) & 0x7FFFFFFFFFFFFFFF
    fx, fy = bx >> 52, by >> 52
    low = 0xFFFFFFFFFFFFF
    mx = tl.where(fx == 0, bx, (bx & low) | (low + 1))
    my = tl.where(fy == 0, by, (by & low) | (low + 1))
    my = tl.where(my == 0, 1, my)
    ey = tl.maximum(fy, 1)
    d = tl.maximum(tl.maximum(fx, 1) - ey, 0)
    r = mx % my
    while tl.max(d) > 0:
        s = tl.minimum(d, 10)
        r = (r << s) % my
        d -= s
    # r * 2**(ey - 1075), exactly: 2**(ey - 1075) is subnormal for small ey, so scale by
    # a normal power of two and then by 2**-54 (exact: the result is representable)
    k = ey - 1075
    tiny = k < -1000
    scale = ((tl.where(tiny, k + 54, k) + 1023) << 52).to(tl.float64, bitcast=True)
    v = r.to(tl.float64) * scale
    v = tl.where(tiny, v * 5.551115123125783e-17, v)  # 2**-54
    v = (v.to(tl.int64, bitcast=True) | (x.to(tl.int64, bitcast=True) & sign))
    v = v.to(tl.float64, bitcast=True)
    ax, ay = tl.abs(x), tl.abs(y)
    bad = (x != x) | (y != y) | (ax == HG_INF) | (ay == 0.0)
    return tl.where(bad, HG_NAN, tl.where(ax < ay, x, v))
''' + "\n\n\n".join([
    # The shared rules (hologram.codegen.numerics): bf16 rounding, the total-order keys
    # of max/min and argmax/argmin, and float64 to float32 rounded to odd (whose rounding
    # to f16/bf16 then rounds the float64 once).
    function("hg_f32_to_bf16", ("x",), F32, numerics.bf16_bits, "({} >> 16).to(tl.int16)"),
    function("hg_round_bf16", ("x",), F32, numerics.round_bf16),
    *(function(f"hg_key_{fmt.name}", ("x",), fmt, numerics.order_key) for fmt in (F32, F64)),
    *(function(f"hg_unkey_{fmt.name}", ("k",), fmt, numerics.from_order_key)
      for fmt in (F32, F64)),
    function("hg_f64_to_f32_odd", ("x",), F64, numerics.round_to_odd),
]) + "\n"
