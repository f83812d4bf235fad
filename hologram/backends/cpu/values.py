"""How Atlas values live in LLVM IR on the cpu backend: each dtype's register type and
memory type, and float constants.

bool is ``i1`` in registers and ``i8`` in memory; f16 and bf16 are ``float`` in registers
(rounded to their format by every cast to it) and ``i16`` in memory (see
:mod:`.render`'s docstring for why not LLVM's ``half``).
"""

from __future__ import annotations

import math

from hologram.backends.cpu import textir as ir
from hologram.isa import dtypes as dt
from hologram.isa.dtypes import DType

I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
F32, F64 = ir.FloatType(), ir.DoubleType()
PTR = ir.PointerType(I8)

REGISTER = {"bool": I1, "i8": I8, "u8": I8, "i16": I16, "i32": I32, "i64": I64,
            "f16": F32, "bf16": F32, "f32": F32, "f64": F64}
MEMORY = {**REGISTER, "bool": I8, "f16": I16, "bf16": I16}
NARROW = (dt.float16, dt.bfloat16)  # float formats computed in float32
FLOAT = {"f32": F32, "f64": F64}


def register_type(t: DType) -> ir.Type:
    return REGISTER[t.name]


def float_const(t: ir.Type, value: float) -> ir.Constant:
    if math.isnan(value):  # one canonical quiet NaN
        return ir.Constant(t, float("nan"))
    return ir.Constant(t, value)


def float_bits(ty: ir.Type) -> int:
    return {F32: 32, F64: 64}[ty]
