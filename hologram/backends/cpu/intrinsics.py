"""Float operations some CPUs lack, emitted so that no target needs a runtime library.

LLVM lowers ``llvm.fma``, ``llvm.floor``/``ceil``/``trunc``/``rint``/``roundeven``, ``frem``
and half-precision conversions to library calls (``fmaf``, ``floorf``, ``fmod``,
``__truncdfhf2``, ...) on CPUs without the instruction: x86-64 before SSE4.1 or FMA, and
double -> half on every x86 CPU without AVX512-FP16. Our JIT resolves no such symbol. Each
function here asks LLVM whether the target has the operation
(:func:`~.llvm.lowers_natively`) and emits the intrinsic if so, our own IR
(:mod:`.softfloat`) if not. Both compute the same IEEE result.
"""

from __future__ import annotations

from hologram.backends.cpu import llvm, softfloat
from hologram.backends.cpu import textir as ir
from hologram.backends.cpu.target import Target

I16 = ir.IntType(16)
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
_SUFFIX = {F16: "f16", F32: "f32", F64: "f64"}
# Intrinsics that become library calls where the CPU lacks the instruction.
_MAY_NEED_LIBRARY = frozenset({"fma", "floor", "ceil", "trunc", "rint", "roundeven"})


def declare(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    """The intrinsic ``llvm.<name>`` (full name with its type suffixes) in ``module``."""
    full = f"llvm.{name}"
    fn = module.globals.get(full)
    if fn is None:
        fn = ir.namespace(module).Function(module, ir.FunctionType(ret, args), full)
    return fn


def call(b: ir.IRBuilder, name: str, args: list[ir.Value], target: Target) -> ir.Value:
    """``llvm.<name>.<type>(args)`` (result of the first argument's type), or the
    :mod:`.softfloat` function computing it where ``target`` would need a library call."""
    ty = args[0].type
    if ty in (F32, F64) and name in _MAY_NEED_LIBRARY and \
            not llvm.lowers_natively(target, name, str(ty)):
        soft = "rint" if name == "roundeven" else name  # the same in the default mode
        return b.call(softfloat.get(b.module, soft, ty), args)
    return b.call(declare(b.module, f"{name}.{_SUFFIX[ty]}", ty, [a.type for a in args]), args)


def fmod(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """C ``fmod`` (``frem``), which no CPU has as an instruction: always our own IR."""
    return b.call(softfloat.get(b.module, "fmod", x.type), [x, y])


def f16_to_f32(b: ir.IRBuilder, bits: ir.Value, target: Target) -> ir.Value:
    """The float32 value of half-precision ``bits`` (i16); exact."""
    if llvm.lowers_natively(target, "f16_to_f32", ""):
        return b.fpext(b.bitcast(bits, F16), F32)
    return b.call(softfloat.get(b.module, "f16_to_f32", I16), [bits])


def f32_to_f16(b: ir.IRBuilder, x: ir.Value, target: Target) -> ir.Value:
    """``x`` (float32) rounded to the nearest half (ties to even), as i16 bits."""
    if llvm.lowers_natively(target, "f32_to_f16", ""):
        return b.bitcast(b.fptrunc(x, F16), I16)
    return b.call(softfloat.get(b.module, "f32_to_f16", F32), [x])

