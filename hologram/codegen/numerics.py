"""The ISA's numeric rules that are not transcendental functions, written once for every
device.

Like :mod:`.mathlib`, each rule is written against :class:`~.mathlib.MathEmitter`'s
primitives (integer operations on a float's bits, compares, selects), so a backend gets
it from the emitter it already has for the math library, in its own language, with the
same bits everywhere:

- :func:`round_bf16` / :func:`bf16_bits`: a float32 rounded to the nearest bfloat16, ties
  to even, a NaN kept a quiet NaN (the ISA's cast to bf16, and the rounding after each
  bf16 operation computed in float32);
- :func:`order_key` / :func:`from_order_key`: a float's bits as a signed integer whose
  order is the floats' total order (``-NaN < -inf < ... < -0.0 < +0.0 < ... < +inf <
  +NaN``): max/min and argmax/argmin compare keys, so a NaN wins and ``-0.0 < +0.0``
  whatever the device's float min/max does;
- :func:`round_to_odd`: a float64 rounded to float32 toward zero with the last bit set
  when inexact, whose rounding to f16/bf16 then rounds the float64 once (float32 keeps at
  least two more bits than either).

Every rule is straight-line (no branches), so it vectorizes and inlines anywhere. The
rules use the integer primitives ``ior`` and ``ixor``, which :class:`~.mathlib.MathEmitter`
composes from others for emitters that do not write them natively.
"""

from __future__ import annotations

from .mathlib import F32, F64, MathEmitter, Value

#: Bits of a float32's value that survive rounding to bfloat16 (its high half).
_BF16_KEPT = -0x10000  # 0xFFFF0000 as a signed int32
_BF16_QUIET = 0x00400000  # the quiet bit of a float32 NaN, the highest bf16 keeps


def bf16_bits(e: MathEmitter, x: Value) -> Value:
    """The float32 bits of ``x`` (an f32 emitter's float) rounded to the nearest bf16,
    ties to even: the bf16 in the high half, the low half zero. Overflow gives inf (the
    carry runs into the exponent); a NaN keeps its sign and payload's high bits and
    becomes quiet (a payload only in the low half would otherwise round to inf)."""
    assert e.fmt is F32, "bf16 rounds from float32"
    b = e.bits(x)
    lsb = e.iand(e.ashr(b, e.ci(16)), e.ci(1))
    rounded = e.iand(e.iadd(e.iadd(b, e.ci(0x7FFF)), lsb), e.ci(_BF16_KEPT))
    quiet = e.iand(e.ior(b, e.ci(_BF16_QUIET)), e.ci(_BF16_KEPT))
    return e.sel(e.isnan(x), quiet, rounded)


def round_bf16(e: MathEmitter, x: Value) -> Value:
    """``x`` (float32) rounded to the nearest bf16 (:func:`bf16_bits`), as a float32."""
    return e.from_bits(bf16_bits(e, x))


def _magnitude(e: MathEmitter) -> int:
    return (1 << (e.fmt.width - 1)) - 1


def order_key(e: MathEmitter, x: Value) -> Value:
    """``x``'s bits as a signed integer of the format's width whose order is the total
    order of the floats: a non-negative float's bits order like its value already; a
    negative one's (negative as integers) order backwards, so their magnitude bits are
    flipped. NaNs sort by their sign beyond the infinities."""
    b = e.bits(x)
    return e.sel(e.ilt(b, e.ci(0)), e.ixor(b, e.ci(_magnitude(e))), b)


def from_order_key(e: MathEmitter, k: Value) -> Value:
    """The float whose :func:`order_key` is ``k`` (the flip undoes itself)."""
    return e.from_bits(e.sel(e.ilt(k, e.ci(0)), e.ixor(k, e.ci(_magnitude(e))), k))


def round_to_odd(e: MathEmitter, x: Value) -> Value:
    """``x`` (an f64 emitter's float) rounded to float32 *to odd*: toward zero, the last
    bit set when inexact. Rounding that to nearest f16 or bf16 gives the nearest f16/bf16
    of ``x`` itself (one rounding, not two). inf and NaN convert plainly."""
    assert e.fmt is F64, "rounds a float64"
    f = e.for_format(F32)
    near = e.convert(x, F32)  # to nearest: at most half a unit from x, either side
    back = f.convert(near, F64)
    inexact = e.ne(back, x)
    away = e.lt(e.fabs(x), e.fabs(back))
    bits = f.bits(near)
    bits = f.sel(e.and_(inexact, away), f.isub(bits, f.ci(1)), bits)  # toward zero
    return f.from_bits(f.sel(inexact, f.ior(bits, f.ci(1)), bits))
