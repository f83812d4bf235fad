"""The cpu backend's library calls: the GEMMs :mod:`hologram.compiler.passes.library_calls`
finds, for the dtypes OpenBLAS takes; :mod:`.backend` runs them through :mod:`.blas`."""

from __future__ import annotations

from hologram.compiler.passes import library_calls
from hologram.compiler.passes.library_calls import Gemm, Matrix
from hologram.isa.ir import Program

__all__ = ["DTYPES", "Gemm", "Matrix", "split"]

#: What the BLAS the cpu backend binds (sgemm, dgemm) multiplies.
DTYPES = ("f32", "f64")


def split(program: Program) -> tuple[Program, dict[int, list[Gemm]]]:
    """:func:`hologram.compiler.passes.library_calls.split` for the cpu backend's BLAS."""
    return library_calls.split(program, DTYPES)
