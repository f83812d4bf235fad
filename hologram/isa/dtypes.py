"""Atlas ISA data types.

Ten types: ``bool``, ``i8 i16 i32 i64``, ``u8``, ``f16 bf16 f32 f64``. A :class:`DType` is
an interned singleton, so ``is`` and ``==`` agree and dtypes can be dictionary keys.

NumPy has no bfloat16. Hologram stores bf16 data as its raw 16-bit patterns in ``uint16``
arrays (``DType.storage``) and computes on it in float32 (``DType.compute``), rounding to
nearest-even after every operation; :func:`to_bf16_bits` and :func:`from_bf16_bits` are
the conversions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hologram.errors import DTypeError


@dataclass(frozen=True, eq=False)
class DType:
    name: str  # Atlas name, used in the text form: "f32"
    kind: str  # "b" bool, "i" signed int, "u" unsigned int, "f" float
    bits: int
    storage: np.dtype  # NumPy dtype of buffer memory
    compute: np.dtype  # NumPy dtype values are computed in by the reference interpreter

    @property
    def itemsize(self) -> int:
        return max(self.bits // 8, 1)

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in ("i", "u")

    @property
    def is_bool(self) -> bool:
        return self.kind == "b"

    @property
    def min(self) -> int | float:
        """Smallest value (``-inf`` for floats)."""
        if self.is_float:
            return float("-inf")
        return 0 if self.kind != "i" else -(1 << (self.bits - 1))

    @property
    def max(self) -> int | float:
        """Largest value (``inf`` for floats)."""
        if self.is_float:
            return float("inf")
        if self.is_bool:
            return 1
        return (1 << (self.bits - (self.kind == "i"))) - 1

    def __repr__(self) -> str:
        return self.name

    def __reduce__(self):
        return (dtype, (self.name,))


bool_ = DType("bool", "b", 8, np.dtype(np.bool_), np.dtype(np.bool_))
int8 = DType("i8", "i", 8, np.dtype(np.int8), np.dtype(np.int8))
int16 = DType("i16", "i", 16, np.dtype(np.int16), np.dtype(np.int16))
int32 = DType("i32", "i", 32, np.dtype(np.int32), np.dtype(np.int32))
int64 = DType("i64", "i", 64, np.dtype(np.int64), np.dtype(np.int64))
uint8 = DType("u8", "u", 8, np.dtype(np.uint8), np.dtype(np.uint8))
float16 = DType("f16", "f", 16, np.dtype(np.float16), np.dtype(np.float16))
bfloat16 = DType("bf16", "f", 16, np.dtype(np.uint16), np.dtype(np.float32))
float32 = DType("f32", "f", 32, np.dtype(np.float32), np.dtype(np.float32))
float64 = DType("f64", "f", 64, np.dtype(np.float64), np.dtype(np.float64))

ALL: tuple[DType, ...] = (
    bool_, int8, int16, int32, int64, uint8, float16, bfloat16, float32, float64,
)
FLOATS = tuple(t for t in ALL if t.is_float)
INTS = tuple(t for t in ALL if t.is_int)

#: Each dtype's full name, as NumPy and PyTorch spell it (``np.float32``, ``torch.float32``;
#: NumPy has no bfloat16). The one dtype table: the SDK's buffer dtypes and the torch
#: device's dtype map derive from this and :attr:`DType.storage`.
FULL_NAMES: dict[DType, str] = {
    bool_: "bool", int8: "int8", int16: "int16", int32: "int32", int64: "int64",
    uint8: "uint8", float16: "float16", bfloat16: "bfloat16", float32: "float32",
    float64: "float64",
}
#: NumPy dtypes with an Atlas dtype of the same storage (every dtype but bfloat16).
NUMPY_DTYPES: tuple[np.dtype, ...] = tuple(t.storage for t in ALL if t is not bfloat16)

_BY_NAME = {t.name: t for t in ALL}
_ALIASES = {**{name: t for t, name in FULL_NAMES.items()},
            "half": float16, "float": float32, "double": float64}
_BY_NUMPY = {t.storage: t for t in ALL if t is not bfloat16}


def dtype(spec: object) -> DType:
    """Resolve an Atlas dtype from a DType, an Atlas or NumPy name, or a NumPy dtype."""
    if isinstance(spec, DType):
        return spec
    if isinstance(spec, str):
        found = _BY_NAME.get(spec) or _ALIASES.get(spec)
        if found is not None:
            return found
    else:
        try:
            found = _BY_NUMPY.get(np.dtype(spec))
        except TypeError:
            found = None
        if found is not None:
            return found
    names = ", ".join(t.name for t in ALL)
    raise DTypeError(f"unsupported dtype {spec!r}; Atlas dtypes are: {names}")


def exactly_representable(src: DType, dst: DType) -> bool:
    """True when every value of ``src`` converts to ``dst`` without rounding or wrapping.

    Canonicalization uses this to drop an intermediate cast: ``cast(cast(x, A), B)`` equals
    ``cast(x, B)`` whenever ``x``'s type is exactly representable in ``A``.
    """
    if src is dst or src.is_bool:
        return True
    if dst.is_bool:
        return False
    if src.is_float:
        return dst.is_float and (
            (src.bits < dst.bits and src is not bfloat16)
            or (src is bfloat16 and dst.bits >= 32)
        )
    # integers
    if dst.is_float:
        mantissa = {float16: 11, bfloat16: 8, float32: 24, float64: 53}[dst]
        return src.bits - (src.kind == "i") <= mantissa
    if src.kind == "u":
        return dst.bits >= src.bits if dst.kind == "u" else dst.bits > src.bits
    return dst.kind == "i" and dst.bits >= src.bits


def round_to_odd_f32(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounded to odd: truncated toward zero, last bit set if inexact.

    Rounding the result to nearest-even in any format with at most 22 significant bits
    (f16, bf16) gives the same value as rounding ``x`` directly: no double rounding."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):
        near = x.astype(np.float32)
    back = near.astype(np.float64)
    inexact = (back != x) & ~np.isnan(x)
    bits = near.view(np.uint32)
    # Round-to-nearest went away from zero: step one ulp back (works for either sign,
    # and turns an overflowed inf into FLT_MAX).
    bits = np.where(inexact & (np.abs(back) > np.abs(x)), bits - np.uint32(1), bits)
    bits = np.where(inexact, bits | np.uint32(1), bits).astype(np.uint32)
    return bits.view(np.float32)


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Round float32 or float64 values once to bfloat16 (nearest-even; NaN stays a quiet
    NaN) and return their uint16 bit patterns, in the input's shape."""
    values = np.asarray(values)
    if values.dtype == np.float64:
        values = round_to_odd_f32(values)
    f32 = np.ascontiguousarray(values, dtype=np.float32)
    bits = f32.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    # Rounding a NaN could carry into the exponent and produce inf; force a quiet NaN.
    rounded = np.where(np.isnan(f32), (bits >> np.uint32(16)) | np.uint32(0x0040), rounded)
    return rounded.astype(np.uint16).reshape(values.shape)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """Widen bfloat16 bit patterns (uint16) to float32, exactly, in the input's shape."""
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(bits.shape)


def round_bf16(values: np.ndarray) -> np.ndarray:
    """Round float32 or float64 values once to the nearest bfloat16, as float32."""
    return from_bf16_bits(to_bf16_bits(values))
