"""How Atlas values are typed in the Triton kernels of the cuda backend: each dtype's
pointer type in memory (bf16 as its bits, bool as a byte), its register type (f16 and bf16
are float32 tiles), the integer type of its total-order key (max/min), and the scratch
memory of split reductions; and the small numeric helpers the renderer's modules share."""

from __future__ import annotations

import struct

from hologram.isa import dtypes as dt
from hologram.isa.dtypes import DType
from hologram.isa.ir import Program

#: The Triton pointer type of each buffer dtype (bf16 as its bits, bool as a byte).
POINTER = {"f64": "*fp64", "f32": "*fp32", "f16": "*fp16", "bf16": "*i16", "i64": "*i64",
           "i32": "*i32", "i16": "*i16", "i8": "*i8", "u8": "*u8", "bool": "*u8"}
TL = {"f64": "tl.float64", "f32": "tl.float32", "f16": "tl.float32", "bf16": "tl.float32",
      "i64": "tl.int64", "i32": "tl.int32", "i16": "tl.int16", "i8": "tl.int8",
      "u8": "tl.uint8", "bool": "tl.int1"}
KEY = {"f64": "tl.int64", "f32": "tl.int32", "f16": "tl.int32", "bf16": "tl.int32",
       "i32": "tl.int32", "i64": "tl.int64"}
LIMITS = {"tl.int64": (-2**63, 2**63 - 1), "tl.int32": (-2**31, 2**31 - 1),
          "tl.int16": (-2**15, 2**15 - 1), "tl.int8": (-2**7, 2**7 - 1), "tl.uint8": (0, 255)}
#: Per float register type: the integer type of its bits and the sign bit.
BITS = {"tl.float32": ("tl.int32", -2**31), "tl.float64": ("tl.int64", -2**63)}
#: Scratch memory of split reductions: pointer and NumPy types of a register type, and the
#: pointer type of a NumPy type.
SCRATCH = {"tl.float64": ("*fp64", "f8"), "tl.float32": ("*fp32", "f4"),
           "tl.int64": ("*i64", "i8"), "tl.int32": ("*i32", "i4"), "tl.int16": ("*i16", "i2"),
           "tl.int8": ("*i8", "i1"), "tl.uint8": ("*u8", "u1")}
POINTER_OF = {storage: pointer for pointer, storage in SCRATCH.values()}


def pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def f32_bits(value: float) -> int:
    return struct.unpack("<i", struct.pack("<f", value))[0]


def wrap32(value: int) -> int:
    """``value`` modulo 2**32 as a signed int32 (an int32 literal in Triton)."""
    return (value + 2**31) % 2**32 - 2**31


def float_format(t: DType) -> str:
    """The float format of float dtype ``t``'s registers (f16 and bf16 are float32)."""
    return "f64" if t is dt.float64 else "f32"


def program_dtype(program: Program, buffer: int) -> str:
    return program.buffers[buffer].dtype.name
