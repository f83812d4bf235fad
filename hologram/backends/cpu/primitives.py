"""The LLVM IR primitives of one float format that both of the CPU backend's function
libraries write with: the math library (:mod:`.mathlib`, the transcendentals through
:mod:`hologram.codegen.mathlib`) and the IEEE operations some CPUs lack
(:mod:`.softfloat`). Each is one instruction: IEEE arithmetic without fast-math flags
(every step is the IEEE operation), ordered and unordered comparisons, selects, integer
operations and bit casts, and the ``fabs``/``copysign`` intrinsics, which every target
lowers without a library call."""

from __future__ import annotations

from hologram.backends.cpu import textir as ir
from hologram.codegen.mathlib import Format

#: Format name -> (float type, integer type of the same width).
TYPES = {"f32": (ir.FloatType(), ir.IntType(32)), "f64": (ir.DoubleType(), ir.IntType(64))}


class Primitives:
    """An IRBuilder bound to one float format ``fmt`` (``self.ty``, and ``self.ity`` for
    its bits)."""

    def __init__(self, builder: ir.IRBuilder, fmt: Format):
        self.b = builder
        self.fmt = fmt
        self.ty, self.ity = TYPES[fmt.name]

    # constants and intrinsics
    def c(self, value: float) -> ir.Constant:
        return ir.Constant(self.ty, value)

    def ci(self, value: int, ty: ir.IntType | None = None) -> ir.Constant:
        return ir.Constant(ty or self.ity, value)

    def _call(self, base: str, *args: ir.Value) -> ir.Value:
        """``llvm.<base>.<format>(args)``, declared on first use."""
        module = self.b.module
        name = f"llvm.{base}.{self.fmt.name}"
        fn = module.globals.get(name)
        if fn is None:
            fn = ir.namespace(module).Function(
                module, ir.FunctionType(self.ty, [self.ty] * len(args)), name)
        return self.b.call(fn, list(args))

    def fabs(self, a):
        return self._call("fabs", a)

    def copysign(self, a, b):
        return self._call("copysign", a, b)

    # arithmetic
    def add(self, a, b):
        return self.b.fadd(a, b)

    def sub(self, a, b):
        return self.b.fsub(a, b)

    def mul(self, a, b):
        return self.b.fmul(a, b)

    # comparisons (ordered ones are false for NaN, unordered ones true) and selects
    def lt(self, a, b):
        return self.b.fcmp_ordered("<", a, b)

    def ge(self, a, b):
        return self.b.fcmp_ordered(">=", a, b)

    def eq(self, a, b):
        return self.b.fcmp_ordered("==", a, b)

    def ne(self, a, b):
        return self.b.fcmp_ordered("!=", a, b)

    def ult(self, a, b):
        return self.b.fcmp_unordered("<", a, b)

    def ule(self, a, b):
        return self.b.fcmp_unordered("<=", a, b)

    def isnan(self, a):
        return self.b.fcmp_unordered("uno", a, a)

    def and_(self, a, b):
        return self.b.and_(a, b)

    def or_(self, a, b):
        return self.b.or_(a, b)

    def not_(self, a):
        return self.b.not_(a)

    def sel(self, cond, a, b):
        return self.b.select(cond, a, b)

    # integers
    def iadd(self, a, b):
        return self.b.add(a, b)

    def isub(self, a, b):
        return self.b.sub(a, b)

    def iand(self, a, b):
        return self.b.and_(a, b)

    def ior(self, a, b):
        return self.b.or_(a, b)

    def ixor(self, a, b):
        return self.b.xor(a, b)

    def shl(self, a, b):
        return self.b.shl(a, b)

    def ashr(self, a, b):
        return self.b.ashr(a, b)

    def ilt(self, a, b):
        return self.b.icmp_signed("<", a, b)

    def ine(self, a, b):
        return self.b.icmp_signed("!=", a, b)

    # bits
    def bits(self, a):
        return self.b.bitcast(a, self.ity)

    def from_bits(self, n):
        return self.b.bitcast(n, self.ty)
