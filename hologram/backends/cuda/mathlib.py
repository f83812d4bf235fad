"""The transcendental functions in Triton: :class:`TritonEmitter` implements the primitives
of :class:`hologram.codegen.mathlib.MathEmitter` as Triton tile expressions, so every
algorithm there is written out as straight-line statements of the kernel (f32, and f64
where an f32 algorithm works in f64: ``pow``).

Each primitive is one exactly rounded operation on NVIDIA GPUs and in Triton's interpreter
alike: f32 division is ``tl.div_rn`` (an f32 ``/`` may be approximate on a GPU), ``tl.fma`` is a
fused multiply-add (the interpreter computes it exactly too), and kernels are compiled with
FMA contraction off (:data:`.backend.OPTIONS`), so ``a * b + c`` stays two roundings.
Sign and NaN primitives work on the bits. ``rint`` is built from an addition of
``2^mant`` (exact in round-to-nearest-even) rather than a libdevice call, which the
interpreter does not have.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import ClassVar

from hologram.codegen.mathlib import F32, F64, Format, InfixEmitter

#: Per format: the Triton float type, the integer type of its width, and the sign bit.
_TYPES = {"f32": ("tl.float32", "tl.int32", -2**31), "f64": ("tl.float64", "tl.int64", -2**63)}


def float_bits(value: float, fmt: Format) -> int:
    """The bits of ``value`` rounded to ``fmt``, as a signed integer of its width."""
    if fmt.width == 32:
        return struct.unpack("<i", struct.pack("<f", value))[0]
    return struct.unpack("<q", struct.pack("<d", value))[0]


class TritonEmitter(InfixEmitter):
    """Primitives as Triton expressions; each result is bound to a fresh variable through
    ``bind(expression) -> name``."""

    def __init__(self, bind: Callable[[str], str], fmt: Format = F32):
        super().__init__(fmt)
        self.bind = bind
        self.ft, self.it, self.sign = _TYPES[fmt.name]

    # Triton's masks are tiles of int1, combined bitwise; every value is bound alike.
    AND = "&"
    OR = "|"

    def floating(self, expression: str) -> str:
        return self.bind(expression)

    integer = mask = floating

    SPELLING: ClassVar[dict[str, str]] = {
        "fma": "tl.fma({a}, {b}, {c})", "ne": "({a} != {b}) & ({a} == {a}) & ({b} == {b})",
        "isnan": "{a} != {a}", "shl": "{a} << {b}",
        "ashr": "{a} >> {b}",  # signed operands: an arithmetic shift
        "to_int": "{a}.to({e.it})", "to_float": "{a}.to({e.ft})",
        "bits": "{a}.to({e.it}, bitcast=True)", "from_bits": "{a}.to({e.ft}, bitcast=True)",
    }

    def for_format(self, fmt: Format) -> TritonEmitter:
        return TritonEmitter(self.bind, fmt)

    def convert(self, a, fmt: Format):
        return a if fmt is self.fmt else self.bind(f"{a}.to({_TYPES[fmt.name][0]})")

    def c(self, value: float) -> str:
        # From the bits: exact for every value, inf and NaN included.
        return self.bind(f"tl.full([1, 1], {float_bits(value, self.fmt)}, {self.it})"
                         f".to({self.ft}, bitcast=True)")

    def ci(self, value: int) -> str:
        return self.bind(f"tl.full([1, 1], {int(value)}, {self.it})")

    def div(self, a, b):
        # tl.div_rn takes f32 only; an f64 division is correctly rounded on NVIDIA GPUs
        # (div.rn.f64) and in the interpreter.
        return self.bind(f"tl.div_rn({a}, {b})" if self.fmt is F32 else f"{a} / {b}")

    def neg(self, a):
        return self.from_bits(self.bind(f"{self.bits(a)} ^ {self.sign}"))

    def fabs(self, a):
        return self.from_bits(self.bind(f"{self.bits(a)} & {~self.sign}"))

    def copysign(self, a, b):
        return self.from_bits(self.bind(f"({self.bits(a)} & {~self.sign}) | "
                                        f"({self.bits(b)} & {self.sign})"))

    def floor(self, a):
        r = self.bind(f"tl.floor({a})")
        if self.fmt is F64:
            return r
        # Triton links libdevice with flushing f32 subnormals to zero (__CUDA_FTZ), so on a
        # GPU floorf(-subnormal) is -0.0, not -1.0.
        tiny = self.c(-1.1754943508222875e-38)  # -FLT_MIN
        return self.bind(f"tl.where(({a} < 0.0) & ({a} > {tiny}), {self.c(-1.0)}, {r})")

    def ceil(self, a):
        # -floor(-a), exact: shares floor's subnormal fix (ceil(subnormal) is 1.0).
        return self.neg(self.floor(self.neg(a))) if self.fmt is F32 else \
            self.bind(f"tl.ceil({a})")

    def rint(self, a):
        # |a| + 2^mant - 2^mant rounds |a| to an integer, ties to even, when |a| < 2^mant;
        # larger values (and inf) are integers already; NaN fails the compare and stays.
        big = self.c(2.0 ** self.fmt.mant)
        m = self.fabs(a)
        r = self.sel(self.lt(m, big), self.sub(self.add(m, big), big), m)
        return self.copysign(r, a)

    def ult(self, a, b):
        return self.not_(self.ge(a, b))

    def ule(self, a, b):
        return self.not_(self.bind(f"{a} > {b}"))

    def not_(self, a):
        return self.bind(f"{a} == 0")

    def sel(self, cond, a, b):
        return self.bind(f"tl.where({cond}, {a}, {b})")


def function(name: str, params: tuple[str, ...], fmt: Format, rule: Callable[..., str],
             result: str = "{}") -> str:
    """A ``@triton.jit`` function ``name(params)`` whose body is ``rule(emitter, *params)``
    (a shared rule, :mod:`hologram.codegen.numerics`) written out by a
    :class:`TritonEmitter` for ``fmt``, returning ``result`` formatted with the rule's
    value."""
    lines: list[str] = []

    def bind(expression: str) -> str:
        name = f"v{len(lines)}"
        lines.append(f"    {name} = {expression}")
        return name

    value = rule(TritonEmitter(bind, fmt), *params)
    return "\n".join([f"@triton.jit\ndef {name}({', '.join(params)}):", *lines,
                      f"    return {result.format(value)}"])


__all__ = ["F32", "F64", "TritonEmitter", "float_bits", "function"]
