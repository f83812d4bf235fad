"""The value of every Atlas instruction except ``load`` and ``store``, in NumPy.

This module *is* the operational semantics of the ISA (``docs/isa.md`` describes it in
words): other backends are tested against it, and the constant folder calls
:func:`evaluate` on one-element arrays, so folded and executed values agree bit for bit.

Values are NumPy arrays of the instruction's shape in its dtype's ``compute`` type (bf16:
float32 arrays holding bf16-exact values). The rules that make results exact:

* Floating-point results are computed in float64 and rounded **once** to the result type
  by :func:`_round`. For ``+ - * /``, ``sqrt`` and ``fmod`` of f32/f16/bf16 operands the
  float64 result is itself correctly rounded and float64 has more than twice their
  precision plus two bits, so the double rounding is innocuous: the result is the exactly
  rounded one. Transcendental functions are as accurate as NumPy's float64 versions.
* Narrowing from float64 goes through float32 with *round-to-odd* (truncate, then set
  the last bit if anything was lost). Rounding that to f16 or bf16 to nearest-even equals
  rounding the float64 directly, so f64->bf16 never double-rounds. fma and i64->float
  use the same trick one level up: the exact result is rounded to odd in float64 first.
* Every NaN result is the canonical quiet NaN (positive, payload 0): the same NaN that
  :func:`hologram.isa.ir.encode_const` gives constants, so folding a NaN is bit-exact.
* Integer arithmetic wraps (two's complement); integer ``div``/``mod`` are total (see
  :func:`_int_div`).
* ``reduce`` and ``contract`` run over the kernel's *domain*: an operand of extent 1
  along a reduced axis is a value constant along that loop, so ``sum`` over a loop of
  extent N adds it N times (and an empty loop gives the identity).

Nothing here emits NumPy warnings: :func:`evaluate` runs under ``np.errstate(all="ignore")``
and poles, domain errors and overflow give IEEE infinities and NaNs instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from hologram.errors import IRError
from hologram.isa import dtypes as dt
from hologram.isa.dtypes import DType
from hologram.isa.ir import Instr

__all__ = ["evaluate", "from_storage", "to_storage"]

F64 = np.float64


# --- storage --------------------------------------------------------------------------
def to_storage(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Values in ``dtype.compute`` -> buffer contents in ``dtype.storage`` (bf16: the bit
    patterns of the already bf16-exact float32 values; identity otherwise)."""
    if dtype is dt.bfloat16:
        return dt.to_bf16_bits(np.asarray(values, dtype=np.float32))
    return np.asarray(values, dtype=dtype.storage)


def from_storage(raw: np.ndarray, dtype: DType) -> np.ndarray:
    """Buffer contents in ``dtype.storage`` -> values in ``dtype.compute`` (exact)."""
    if dtype is dt.bfloat16:
        return dt.from_bf16_bits(raw)
    return np.asarray(raw, dtype=dtype.compute)


# --- rounding -------------------------------------------------------------------------
def _round_odd_f64(high: np.ndarray, low: np.ndarray) -> np.ndarray:
    """Round the exact value ``high + low`` to odd in float64, where ``high`` is that
    value rounded to nearest and ``low`` the exact (representable) remainder."""
    high = np.asarray(high, dtype=F64)
    inexact = (low != 0) & np.isfinite(high)
    bits = high.view(np.uint64)
    overshoot = inexact & ((low < 0) != (high < 0))  # |high| > |exact|
    bits = np.where(overshoot, bits - np.uint64(1), bits)
    bits = np.where(inexact, bits | np.uint64(1), bits).astype(np.uint64)
    return bits.view(F64)


def _round(x: np.ndarray, dtype: DType) -> np.ndarray:
    """Round float64 ``x`` once, to nearest-even, to the float ``dtype`` (in its compute
    type); overflow gives ±inf."""
    x = np.asarray(x, dtype=F64)
    if dtype is dt.float64:
        return x
    if dtype is dt.float32:
        return x.astype(np.float32)
    if dtype is dt.float16:
        return dt.round_to_odd_f32(x).astype(np.float16)
    return dt.round_bf16(x)


def _int_to_f64(x: np.ndarray, dtype: DType) -> np.ndarray:
    """Integers as float64 fit to be rounded once more to ``dtype``: exact below 2**53; an
    i64 that float64 cannot hold is rounded to nearest for an f64 result, else to odd."""
    x64 = x.astype(F64)
    if x.dtype != np.int64 or dtype is dt.float64:
        return x64
    # The remainder x - int(x64) is exact in int64 (|remainder| <= 2**10). int(x64) may be
    # 2**63, which wraps to -2**63; the wrapped subtraction still gives the remainder.
    top = x64 >= 2.0**63
    as_int = np.where(top, np.int64(-(2**63)), np.where(top, 0.0, x64).astype(np.int64))
    return _round_odd_f64(x64, (x - as_int).astype(F64))


# --- elementwise ----------------------------------------------------------------------
def _erf(x: np.ndarray) -> np.ndarray:
    # NumPy has no erf; the C library's (through math) is the reference.
    return np.asarray(np.frompyfunc(math.erf, 1, 1)(x), dtype=F64)


def _sign(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "f":  # ±0 and NaN pass through
        return np.where(x > 0, 1.0, np.where(x < 0, -1.0, x))
    return np.sign(x)


# Float-only unary ops, applied to float64 values; the result is rounded once.
_FLOAT_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),  # rsqrt(-0) = 1/-0 = -inf
    "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1,
    "log": np.log, "log2": np.log2, "log1p": np.log1p,
    "tanh": np.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "erf": _erf, "sin": np.sin, "cos": np.cos,
    "floor": np.floor, "ceil": np.ceil, "round": np.rint, "trunc": np.trunc,  # rint: ties even
}

# Unary ops on any numeric type (not: bool/int), exact in the operand's own type; integer
# abs/neg wrap (abs(INT_MIN) = INT_MIN).
_NUMERIC_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "abs": np.abs, "neg": np.negative, "not": np.invert, "sign": _sign,
}


def _float_min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # np.minimum propagates NaN but may return either zero of -0.0 == +0.0.
    return np.where(a == b, np.where(np.signbit(a), a, b), np.minimum(a, b))


def _float_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(a == b, np.where(np.signbit(a), b, a), np.maximum(a, b))


def _safe_divisor(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``b`` with 0 and the overflowing INT_MIN / -1 replaced by 1, and where b was 0."""
    zero = b == 0
    bad = zero
    if a.dtype.kind == "i":
        bad = zero | ((a == np.iinfo(a.dtype).min) & (b == -1))
    return np.where(bad, 1, b).astype(a.dtype), zero


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C division: truncates toward zero; x/0 = 0; INT_MIN/-1 = INT_MIN (it wraps)."""
    safe, zero = _safe_divisor(a, b)
    rem = np.fmod(a, safe)  # sign of the dividend, like C %
    return np.where(zero, 0, (a - rem) // safe)  # a - rem is an exact multiple of safe


def _int_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C %: sign of the dividend; x%0 = x; INT_MIN % -1 = 0 (so x == (x/y)*y + x%y)."""
    safe, zero = _safe_divisor(a, b)
    return np.where(zero, a, np.fmod(a, safe))


# Binary ops: (on float64 values, rounded after; on ints/bool in their own type). None
# marks an operand kind the verifier rejects.
_BINARY: dict[str, tuple[Callable | None, Callable | None]] = {
    "add": (np.add, np.add),
    "sub": (np.subtract, np.subtract),
    "mul": (np.multiply, np.multiply),
    "div": (np.divide, _int_div),
    "mod": (np.fmod, _int_mod),  # C fmod: x mod 0 = NaN, inf mod y = NaN
    "min": (_float_min, np.minimum),  # bool: min = and, max = or
    "max": (_float_max, np.maximum),
    "pow": (np.power, None),
    "and": (None, np.bitwise_and),  # logical on bool
    "or": (None, np.bitwise_or),
    "xor": (None, np.bitwise_xor),
}

_COMPARE: dict[str, Callable] = {
    "eq": np.equal, "ne": np.not_equal, "lt": np.less,
    "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
}


def _fma_exact_f64(a: float, b: float, c: float) -> float:
    """``a * b + c`` rounded once to float64, with rational arithmetic."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return a * b + c  # the product itself is ±inf or NaN
    if not math.isfinite(c):
        return c  # a finite product cannot change ±inf or NaN
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:
        # IEEE sign of an exact zero: +0 unless both addends are -0; the float product is
        # exact when a factor is zero.
        return a * b + c if a == 0 or b == 0 else 0.0
    try:
        return exact.numerator / exact.denominator  # int / int is correctly rounded
    except OverflowError:
        return math.inf if exact > 0 else -math.inf


def _fma(dtype: DType, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    a, b, c = (x.astype(F64) for x in np.broadcast_arrays(a, b, c))
    if dtype is dt.float64:
        # No exact vectorized fma in NumPy: one rational fma per element.
        fma = np.frompyfunc(_fma_exact_f64, 3, 1)
        return np.asarray(fma(a, b, c), dtype=F64)
    # f32 and narrower: a*b is exact in float64 and a+b's rounding error is exact too
    # (TwoSum; nothing here can overflow or underflow float64). Rounding to odd makes the
    # final rounding to the dtype the only one.
    product = a * b
    total = product + c
    back = total - product
    low = (product - (total - back)) + (c - back)
    return _round_odd_f64(total, np.where(np.isfinite(total), low, 0.0))


def _cast(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    """Convert values of ``src`` to ``dst`` (result not yet rounded to a float dst)."""
    if dst.is_bool:
        return x != 0  # NaN != 0, so NaN -> True
    if dst.is_float:
        return _int_to_f64(x, dst) if src.is_int else x.astype(F64)
    if not src.is_float:
        return x.astype(dst.compute)  # int/bool -> int: 0/1, or wraps
    # float -> int: truncate toward zero, saturate, NaN -> 0. dst.max as a float may round
    # up (i64: 2**63), so compare before converting anything out of range.
    t = np.trunc(x.astype(F64))
    high, low, nan = t >= float(dst.max), t <= float(dst.min), np.isnan(t)
    inside = np.where(high | low | nan, 0.0, t).astype(np.int64)
    return np.where(high, dst.max, np.where(low, dst.min, inside)).astype(dst.compute)


# --- reductions -----------------------------------------------------------------------
def _over_domain(x: np.ndarray, axes: tuple[int, ...], domain: tuple[int, ...]) -> np.ndarray:
    """``x`` broadcast to the domain's extent along the reduced ``axes``."""
    return np.broadcast_to(x, tuple(domain[d] if d in axes else n for d, n in enumerate(x.shape)))


def _extreme(x: np.ndarray, axes: tuple[int, ...], largest: bool) -> np.ndarray:
    """max/min over ``axes`` (keepdims): NaN wins, -0.0 < +0.0; empty gives the identity."""
    if x.dtype == np.bool_:
        return (np.any if largest else np.all)(x, axis=axes, keepdims=True)
    if x.dtype.kind != "f":
        info = np.iinfo(x.dtype)
        initial = info.min if largest else info.max
        reduce = np.max if largest else np.min
        return reduce(x, axis=axes, keepdims=True, initial=initial)
    x = x.astype(F64)
    if largest:
        m = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
        plus = np.any((x == 0) & ~np.signbit(x), axis=axes, keepdims=True)
        return np.where(m == 0, np.where(plus, 0.0, -0.0), m)
    m = np.min(x, axis=axes, keepdims=True, initial=np.inf)
    minus = np.any((x == 0) & np.signbit(x), axis=axes, keepdims=True)
    return np.where(m == 0, np.where(minus, -0.0, 0.0), m)


def _arg_extreme(x: np.ndarray, axes: tuple[int, ...], largest: bool) -> np.ndarray:
    """Index of the first element equal to :func:`_extreme` (a NaN if there is one; +0.0
    before -0.0 for max), into the row-major flattening of ``axes``."""
    count = math.prod(x.shape[d] for d in axes)
    if count == 0:
        raise IRError(f"arg{'max' if largest else 'min'} over an empty loop (axes {axes})")
    m = _extreme(x, axes, largest)
    if x.dtype.kind == "f":
        x = x.astype(F64)
        hit = ((x == m) & (np.signbit(x) == np.signbit(m))) | (np.isnan(x) & np.isnan(m))
    else:
        hit = x == m
    kept = [d for d in range(x.ndim) if d not in axes]
    rows = np.transpose(hit, kept + list(axes)).reshape([x.shape[d] for d in kept] + [count])
    return np.argmax(rows, axis=-1).astype(np.int64).reshape(m.shape)  # first True


def _float_sum(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """IEEE sum in float64 (NumPy's pairwise sum): -0.0 is the additive identity, so a sum
    whose terms are all -0.0 is -0.0 (as a single term is itself); an empty sum is +0.0."""
    total = np.sum(x.astype(F64), axis=axes, keepdims=True, initial=-0.0)
    return total + 0.0 if any(x.shape[a] == 0 for a in axes) else total


def _sum(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    if x.dtype.kind == "f":  # rounded once by evaluate
        return _float_sum(x, axes)
    return np.sum(x, axis=axes, keepdims=True, dtype=x.dtype)  # wraps


def _prod(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    if x.dtype.kind == "f":
        return np.prod(x.astype(F64), axis=axes, keepdims=True)
    return np.prod(x, axis=axes, keepdims=True, dtype=x.dtype)


_REDUCE: dict[str, Callable[[np.ndarray, tuple[int, ...]], np.ndarray]] = {
    "sum": _sum,
    "prod": _prod,
    "max": lambda x, axes: _extreme(x, axes, largest=True),
    "min": lambda x, axes: _extreme(x, axes, largest=False),
    "argmax": lambda x, axes: _arg_extreme(x, axes, largest=True),
    "argmin": lambda x, axes: _arg_extreme(x, axes, largest=False),
}


def _contract(a: np.ndarray, b: np.ndarray, axes: tuple[int, ...],
              domain: tuple[int, ...]) -> np.ndarray:
    a, b = np.broadcast_arrays(a, b)
    a, b = _over_domain(a, axes, domain), _over_domain(b, axes, domain)
    if a.dtype.kind == "f":  # products and sums in float64, rounded once
        return _float_sum(a.astype(F64) * b.astype(F64), axes)
    return np.sum(a * b, axis=axes, keepdims=True, dtype=a.dtype)  # wraps


# --- evaluate -------------------------------------------------------------------------
# Each handler takes (instr, operand values, domain) and returns the result before
# rounding: float64 for a float result (evaluate rounds it once), else the exact value in
# the result type.
Handler = Callable[[Instr, list[np.ndarray], tuple[int, ...]], np.ndarray]


def _const(instr: Instr, args: list[np.ndarray], domain: tuple[int, ...]) -> np.ndarray:
    return np.asarray(instr.value, dtype=F64 if instr.dtype.is_float else instr.dtype.compute)


def _index(instr: Instr, args: list[np.ndarray], domain: tuple[int, ...]) -> np.ndarray:
    indices = np.arange(domain[instr.axis], dtype=np.int64)
    return indices.astype(instr.dtype.compute).reshape(instr.shape)  # wraps to the dtype


def _unary(instr: Instr, args: list[np.ndarray], domain: tuple[int, ...]) -> np.ndarray:
    if instr.op in _FLOAT_UNARY:
        return _FLOAT_UNARY[instr.op](args[0].astype(F64))
    return _NUMERIC_UNARY[instr.op](args[0])


def _binary(instr: Instr, args: list[np.ndarray], domain: tuple[int, ...]) -> np.ndarray:
    on_float, on_int = _BINARY[instr.op]
    a, b = args
    if a.dtype.kind == "f":
        return on_float(a.astype(F64), b.astype(F64))
    return on_int(a, b)


def _cast_op(instr: Instr, args: list[np.ndarray], domain: tuple[int, ...]) -> np.ndarray:
    # The source type, from the values: float32 stands for bf16 as well, which is
    # harmless because every bf16 value is a float32 value.
    return _cast(args[0], dt.dtype(args[0].dtype), instr.dtype)


_EVAL: dict[str, Handler] = {
    "const": _const,
    "index": _index,
    **dict.fromkeys((*_FLOAT_UNARY, *_NUMERIC_UNARY), _unary),
    **dict.fromkeys(_BINARY, _binary),
    **{op: (lambda instr, args, domain, f=f: f(*args)) for op, f in _COMPARE.items()},
    "select": lambda instr, args, domain: np.where(*args),
    "fma": lambda instr, args, domain: _fma(instr.dtype, *args),
    "cast": _cast_op,
    "reduce": lambda instr, args, domain: _REDUCE[instr.kind](
        _over_domain(args[0], instr.axes, domain), instr.axes),
    "contract": lambda instr, args, domain: _contract(*args, instr.axes, domain),
}


def evaluate(instr: Instr, args: list[np.ndarray], domain: tuple[int, ...]) -> np.ndarray:
    """The value of the non-memory instruction ``instr`` in a kernel over ``domain``.

    ``args`` are its operands' values: arrays of their instructions' shapes in their
    dtypes' compute types. Returns a new C-contiguous array of exactly ``instr.shape`` and
    ``instr.dtype.compute``; float results are rounded once to ``instr.dtype`` (bf16:
    bf16-exact float32) and NaNs are canonical. Never warns; raises :class:`IRError` for
    load, store and unknown opcodes.
    """
    handler = _EVAL.get(instr.op)
    if handler is None:
        raise IRError(f"the reference semantics has no value for opcode {instr.op!r} "
                      "(load and store are executed by the interpreter)")
    with np.errstate(all="ignore"):
        result = handler(instr, [np.asarray(a) for a in args], tuple(domain))
        if instr.dtype.is_float:
            result = _round(result, instr.dtype)
            result = np.where(np.isnan(result), np.nan, result).astype(instr.dtype.compute)
        return np.array(np.broadcast_to(result, instr.shape), dtype=instr.dtype.compute)
