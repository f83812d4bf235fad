"""The C helpers a rendered program may call: storage conversions (f16, bf16), the ISA's
float maximum/minimum, rounding to the narrow formats, and the math library's functions.

:class:`Helpers` collects the ones a program uses (with what they need) and writes them
in a fixed order, so a program's source holds only those (``-Wall`` reports unused static
functions) and the same program always renders the same text. The rules shared with the
other backends (bf16 rounding, round-to-odd) and the transcendentals are generated from
:mod:`hologram.codegen.numerics` and :mod:`hologram.codegen.mathlib` through
:func:`.mathlib.function`; the rest is written here, in C99.
"""

from __future__ import annotations

import re

from hologram.backends.c.mathlib import BITS, F32, F64, function
from hologram.codegen import mathlib, numerics

#: The fixed part of every program: headers, and a refusal of compilers that evaluate
#: float expressions in a wider format (x87), which would round twice.
HEADER = """\
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "hologram's c backend needs FLT_EVAL_METHOD == 0 (SSE2, not x87, on x86)"
#endif
"""

# name -> C source, callees first. f16 <-> f32 by the bits: ties to even, overflow to
# inf at 65520, subnormals through an exact scaling and one rounding, NaN kept quiet.
_FIXED = {
    **{line.split("(", 1)[0].split()[-1]: line + "\n" for line in BITS.splitlines()},
    "hg_f16_to_f32": """\
static float hg_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    float x;
    if (e == 0)
        x = (float)m * 0x1p-24f;
    else
        x = hg_float32((int32_t)((e == 31 ? 0x7F800000u : (e + 112u) << 23) | (m << 13)));
    return hg_float32((int32_t)((uint32_t)hg_bits32(x) | sign));
}
""",
    "hg_f32_to_f16": """\
static uint16_t hg_f32_to_f16(float x)
{
    const uint32_t bits = (uint32_t)hg_bits32(x), a = bits & 0x7FFFFFFFu;
    const uint32_t sign = (bits >> 16) & 0x8000u;
    if (a > 0x7F800000u)
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a >= 0x477FF000u)
        return (uint16_t)(sign | 0x7C00u);
    if (a < 0x38800000u) {
        /* below 2^-14: |x| * 2^24 is exact; adding and taking 2^23 rounds it to even */
        const float scaled = hg_float32((int32_t)a) * 0x1p24f;
        return (uint16_t)(sign | (uint32_t)((scaled + 0x1p23f) - 0x1p23f));
    }
    {
        const uint32_t m = a - 0x38000000u;
        return (uint16_t)(sign | ((m + 0xFFFu + ((m >> 13) & 1u)) >> 13));
    }
}
""",
    "hg_round_f16": """\
static float hg_round_f16(float x) { return hg_f16_to_f32(hg_f32_to_f16(x)); }
""",
    "hg_i64_to_f64": """\
/* A 64-bit integer as a double that rounds to f16 or bf16 as the integer does: above 2^53
   the low 11 bits become one sticky bit, which leaves at most 53 significant bits. */
static double hg_i64_to_f64(uint64_t magnitude, int negative)
{
    const uint64_t sticky = (uint64_t)((magnitude & 0x7FFu) != 0) << 11;
    const uint64_t cut = (magnitude & ~(uint64_t)0x7FF) | sticky;
    const double x = (double)(magnitude >= ((uint64_t)1 << 53) ? cut : magnitude);
    return negative ? -x : x;
}
""",
}
for _t, _bits in (("float", "32"), ("double", "64")):
    for _name, _op, _zero in (("maximum", ">", "b : a"), ("minimum", "<", "a : b")):
        _FIXED[f"hg_{_name}_{_bits}"] = f"""\
static {_t} hg_{_name}_{_bits}({_t} a, {_t} b)
{{
    if (a != a || b != b)
        return a + b;
    if (a {_op} b || b {_op} a)
        return a {_op} b ? a : b;
    return hg_bits{_bits}(a) < 0 ? {_zero};
}}
"""

#: Helpers generated from the shared rules: name -> (params, return type, format, rule).
_RULES = {
    "hg_bf16_bits": ([("float", "x")], "int32_t", F32, numerics.bf16_bits),
    "hg_round_bf16": ([("float", "x")], "float", F32, numerics.round_bf16),
    "hg_round_to_odd": ([("double", "x")], "float", F64, numerics.round_to_odd),
}


def math_name(function_name: str, fmt_name: str) -> str:
    """The C name of math library function ``function_name`` in format ``fmt_name``."""
    return f"hg_{function_name}_{fmt_name}"


class Helpers:
    """The helpers one program uses, written out in a fixed order (:meth:`source`)."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def use(self, name: str) -> str:
        """Note that the program calls helper ``name``; returns it. (The fixed helpers are
        found in the source by :meth:`source`; noting them is harmless.)"""
        self.used.add(name)
        return name

    def math(self, function_name: str, fmt_name: str) -> str:
        """The C function for ``mathlib`` function ``function_name`` in f32 or f64."""
        mathlib.check(function_name)
        return self.use(math_name(function_name, fmt_name))

    def source(self, code: str) -> str:
        """The helpers that ``code`` (the kernels) calls, and those they call: the
        generated ones noted with :meth:`use`, the fixed ones found by name (``-Wall``
        reports a static function nobody calls)."""
        generated = []
        for name, (params, ret, fmt, rule) in _RULES.items():
            if name in self.used:
                generated.append(function(name, params, ret, fmt, rule))
        for fname in mathlib.FUNCTIONS:
            for fmt in (F32, F64):
                name = math_name(fname, fmt.name)
                if name in self.used:
                    ctype = "float" if fmt is F32 else "double"
                    params = [(ctype, p) for p in ("x", "y")[: mathlib.arity(fname)]]
                    generated.append(function(name, params, ctype, fmt,
                                              lambda e, *args, f=fname: mathlib.emit(e, f, *args)))
        text, fixed = code + "".join(generated), []
        for name in reversed(_FIXED):  # callers after callees: a reversed walk sees callers first
            if re.search(rf"\b{name}\(", text):
                fixed.append(_FIXED[name])
                text += _FIXED[name]
        return "\n".join([*reversed(fixed), *generated])
