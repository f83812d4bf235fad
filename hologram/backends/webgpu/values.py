"""How Atlas values live in the webgpu backend's WGSL: each dtype's register type (f16 and
bf16 are f32 registers; the narrow integers i32 or u32; i64 two words, low and high, for
the few operations the backend declares on it: argmax and argmin results, casts, stores),
its size in memory (storage is 32-bit words), the integer ranges of float-to-integer
casts, and the workgroup size every shader shares."""

from __future__ import annotations

#: Invocations of every workgroup.
WORKGROUP = 64
REG = {"i64": "vec2<u32>", "bool": "bool", "i8": "i32", "i16": "i32", "i32": "i32", "u8": "u32",
       "f16": "f32", "bf16": "f32", "f32": "f32"}
BYTES = {"bool": 1, "i8": 1, "u8": 1, "i16": 2, "f16": 2, "bf16": 2, "i32": 4, "f32": 4,
         "i64": 8}
INT_RANGE = {"i8": (-128, 127), "i16": (-32768, 32767), "i32": (-2**31, 2**31 - 1),
             "u8": (0, 255)}
