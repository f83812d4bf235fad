"""The transcendentals and numeric rules in C: :class:`CEmitter` implements the primitives
of :class:`hologram.codegen.mathlib.MathEmitter` as C99 expressions, each bound to a
``const`` local, so every algorithm there (and the rules of :mod:`hologram.codegen.numerics`)
is written out as the straight-line body of a ``static`` C function (:func:`function`).

Each primitive is one IEEE operation in the default environment (round to nearest even,
subnormals kept), which C99 with Annex F gives and the compile flags keep
(:mod:`.toolchain`: no contraction, no fast-math): ``+ - * /`` and conversions are rounded
once, ``fma`` is C99's (exact, in hardware or libm), ``rint`` rounds ties to even in the
default rounding mode. Integer primitives wrap: they compute in the unsigned type of the
width (signed overflow is undefined in C) and convert back, which is modulo on every
two's complement compiler; ``ashr`` is written so that it never shifts a negative value.
A float's bits are read and written with ``memcpy`` (:data:`BITS`), never a pointer cast.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from hologram.codegen.mathlib import F32, F64, Format, InfixEmitter

#: Per format: the C float type, the signed and unsigned integers of its width, the
#: bit-reading and bit-writing helpers (:data:`BITS`), libm's suffix.
_TYPES = {"f32": ("float", "int32_t", "uint32_t", "hg_bits32", "hg_float32", "f"),
          "f64": ("double", "int64_t", "uint64_t", "hg_bits64", "hg_float64", "")}

#: The helpers every use of a float's bits goes through.
BITS = """\
static int32_t hg_bits32(float x) { int32_t n; memcpy(&n, &x, sizeof n); return n; }
static float hg_float32(int32_t n) { float x; memcpy(&x, &n, sizeof x); return x; }
static int64_t hg_bits64(double x) { int64_t n; memcpy(&n, &x, sizeof n); return n; }
static double hg_float64(int64_t n) { double x; memcpy(&x, &n, sizeof x); return x; }
"""


def int_literal(value: int, width: int) -> str:
    """A C expression for the ``width``-bit two's complement integer ``value`` (wrapped);
    ``INT64_C`` only where an ``int`` may not hold it."""
    value = (value + (1 << (width - 1))) % (1 << width) - (1 << (width - 1))
    if value == -(1 << (width - 1)):
        return f"INT{width}_MIN"
    return f"INT64_C({value})" if abs(value) >= 1 << 15 and width == 64 else str(value)


def _hex(value: float) -> str:
    """``value.hex()`` without the fraction's trailing zeros (``0x1.8p+1``, ``0x1p-3``)."""
    mantissa, exponent = value.hex().split("p")
    return f"{mantissa.rstrip('0').rstrip('.')}p{exponent}"


def float_literal(value: float, fmt: Format) -> str:
    """A C expression for ``value`` rounded to ``fmt``, exact: a hexadecimal literal, or
    the bits for infinities and NaN (one quiet NaN)."""
    value = float(value)
    if fmt.width == 32 and math.isfinite(value):
        with np.errstate(over="ignore"):
            value = float(np.float32(value))  # rounded to nearest even (inf past the top)
    if math.isnan(value) or math.isinf(value):
        bits = 0x7FC00000 if math.isnan(value) else 0x7F800000
        if fmt.width == 64:
            bits = 0x7FF8000000000000 if math.isnan(value) else 0x7FF0000000000000
        sign = 1 << (fmt.width - 1) if value < 0 else 0
        return f"{_TYPES[fmt.name][4]}({int_literal(bits | sign, fmt.width)})"
    return f"({_hex(value)}{'f' if fmt.width == 32 else ''})"


class CEmitter(InfixEmitter):
    """Primitives as C expressions; each result is bound to a fresh ``const`` local through
    ``bind(ctype, expression) -> name``; ``types`` maps every bound name to its C type."""

    def __init__(self, bind: Callable[[str, str], str], types: dict[str, str],
                 fmt: Format = F32):
        super().__init__(fmt)
        self.bind, self.types = bind, types
        self.ft, self.it, self.ut, self._bits, self._from, self.sfx = _TYPES[fmt.name]

    def for_format(self, fmt: Format) -> CEmitter:
        return CEmitter(self.bind, self.types, fmt)

    def convert(self, a, fmt: Format):
        return a if fmt is self.fmt else self.bind(_TYPES[fmt.name][0],
                                                   f"({_TYPES[fmt.name][0]}){a}")

    def c(self, value: float) -> str:
        return self.bind(self.ft, float_literal(value, self.fmt))

    def ci(self, value: int) -> str:
        return self.bind(self.it, int_literal(int(value), self.fmt.width))

    # Masks are ints of 0 and 1, combined bitwise (no short circuit to order).
    AND = "&"
    OR = "|"

    def floating(self, expression: str) -> str:
        return self.bind(self.ft, expression)

    def integer(self, expression: str) -> str:
        return self.bind(self.it, expression)

    def mask(self, expression: str) -> str:
        return self.bind("int", expression)

    SPELLING: ClassVar[dict[str, str]] = {
        "div": "{a} / {b}", "neg": "-{a}", "fma": "fma{e.sfx}({a}, {b}, {c})",
        "fabs": "fabs{e.sfx}({a})", "copysign": "copysign{e.sfx}({a}, {b})",
        "floor": "floor{e.sfx}({a})", "rint": "rint{e.sfx}({a})",
        "ne": "({a} < {b}) | ({a} > {b})", "isnan": "{a} != {a}",
        "shl": "({e.it})(({e.ut}){a} << ({e.ut}){b})",
        # Never a negative operand (implementation-defined in C): ~a >= 0 when a < 0.
        "ashr": "{a} < 0 ? ~(~{a} >> {b}) : {a} >> {b}",
        "to_int": "({e.it}){a}", "to_float": "({e.ft}){a}", "bits": "{e._bits}({a})",
        "from_bits": "{e._from}({a})",
    }

    def sel(self, cond, a, b):
        return self.bind(self.types[a], f"{cond} ? {a} : {b}")

    def _wrap(self, a, op: str, b) -> str:
        return self.integer(f"({self.it})(({self.ut}){a} {op} ({self.ut}){b})")

    def iadd(self, a, b):
        return self._wrap(a, "+", b)

    def isub(self, a, b):
        return self._wrap(a, "-", b)


_NAME = re.compile(r"\b[a-z]\d+\b")


def function(name: str, params: list[tuple[str, str]], ret: str, fmt: Format,
             rule: Callable[..., str]) -> str:
    """A ``static`` C function ``ret name(params)`` (``(ctype, name)`` pairs) whose body is
    ``rule(emitter, *names)`` written out by a :class:`CEmitter` for ``fmt``: one ``const``
    local per primitive, those the result does not need left out (the algorithms compute
    a few values some formats do not use, which ``-Wall`` would report)."""
    lines: list[tuple[str, str]] = []
    types = {p: t for t, p in params}

    def bind(ctype: str, expression: str) -> str:
        var = f"v{len(lines)}"
        lines.append((var, f"const {ctype} {var} = {expression};"))
        types[var] = ctype
        return var

    result = rule(CEmitter(bind, types, fmt), *(p for _, p in params))
    needed, kept = set(_NAME.findall(result)), []
    for var, line in reversed(lines):
        if var in needed:
            kept.append(line)
            needed.update(_NAME.findall(line.split("=", 1)[1]))
    signature = ", ".join(f"{t} {p}" for t, p in params)
    body = "".join(f"    {line}\n" for line in reversed(kept))
    return f"static {ret} {name}({signature})\n{{\n{body}    return {result};\n}}\n"


__all__ = ["BITS", "F32", "F64", "CEmitter", "float_literal", "function", "int_literal"]
