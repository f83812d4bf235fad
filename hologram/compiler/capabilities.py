"""What a target's generated code can use: the record that numeric decompositions are
chosen by (docs/isa.md states what every choice must still guarantee).

A backend declares one :class:`Capabilities` per target
(:meth:`hologram.backends.base.Backend.capabilities`); the passes, the loop plan and the
conformance suite read it, never a backend name: a target without ``f64`` adds its block
sums with compensation in float32 instead of plainly in float64; one without ``i64``
computes argmax indices in i32 and widens them; one without 8/16-bit storage packs narrow
values into 32-bit words; f16 and bf16 arithmetic runs in float32, rounded after each
inexact operation, unless the target computes in them natively; integer division and float
min/max get the ISA's edge results from compares and selects where the target's own
instructions do not give them (:mod:`hologram.compiler.passes.decompose`).
"""

from __future__ import annotations

from dataclasses import dataclass

from hologram.errors import CompileError


@dataclass(frozen=True)
class Split:
    """How a target cuts long reductions (or a matrix product's k) into chunks computed
    in parallel (:mod:`hologram.codegen.schedule`). Fixed numbers, not the device's: a
    result is the same bits on every device of the target."""

    work: int  # the fewest terms of a chunk (its partial's traffic stays small beside it)
    units: int  # the parallel units (program instances, workgroups) a split aims to fill
    max_parts: int  # the most chunks of one row
    max_chunk: int = 0  # the most terms of one chunk (0: no limit)


@dataclass(frozen=True)
class Capabilities:
    """Arithmetic and storage a target offers (defaults: a 64-bit CPU without the
    data-dependent memory operations)."""

    f64: bool = True  # float64 arithmetic
    i64: bool = True  # 64-bit integer arithmetic
    narrow_storage: bool = True  # 8- and 16-bit loads and stores
    f16_arithmetic: bool = False  # native half-precision arithmetic
    bf16_arithmetic: bool = False  # native bfloat16 arithmetic
    # The target's own integer div/mod give the ISA's results for every divisor (x / 0,
    # x % 0, INT_MIN / -1); without it (every target so far) the decompose pass guards
    # the divisor and the renderer emits a plain division.
    total_division: bool = False
    # Float min/max with IEEE 754-2019 minimum/maximum semantics (NaN-propagating,
    # -0.0 < +0.0) lowered by the renderer; without it decompose builds them from compares.
    ieee_minmax: bool = True
    # The data-dependent load ``gather`` (docs/isa.md). A target without it refuses a
    # program that uses it (:func:`require`) instead of miscompiling it; front ends ask
    # before they lower advanced indexing to it. Every built-in backend's renderer has it.
    gather: bool = False
    # The data-dependent store ``scatter`` (docs/isa.md): its writes to one element must
    # happen in index order, which a renderer has to honour (a kernel's loops run it
    # sequentially; only grid dimensions proven disjoint run in parallel). A target
    # without it refuses such a program (:func:`require`) rather than reorder writes.
    # The cpu, webgpu and cuda renderers have it.
    scatter: bool = False
    # Schedule (hologram.codegen.schedule): reductions over few long rows cut into chunks
    # (row_split), matrix products of few output tiles cut along k (k_split), and kernels
    # whose reductions need each other's results over such rows cut into one kernel per
    # reduction, each split (fission). None/False: not done for this target.
    row_split: Split | None = None
    k_split: Split | None = None
    fission: bool = False

    @property
    def index_dtype(self) -> str:
        """The integer type argmax/argmin indices are computed in (widened to i64 when
        stored, where the target has it)."""
        return "i64" if self.i64 else "i32"

    @property
    def block_sum_dtype(self) -> str:
        """The type float-sum blocks are added in: float64 where there is one, else
        float32 with compensation."""
        return "f64" if self.f64 else "f32"


class MissingCapabilityError(CompileError):
    """A program uses an operation its target's renderer does not implement."""


#: Per capability-gated opcode: what it is, and the built-in backends whose renderers have it.
_GATED = {
    "gather": ("the data-dependent load", "the cpu, webgpu, cuda and interp backends"),
    "scatter": ("the data-dependent store, its writes in index order",
                "the cpu, webgpu, cuda and interp backends"),
}


def require(program, caps: Capabilities) -> None:
    """Raise :class:`MissingCapabilityError` if ``program`` (an Atlas ``Program``) uses an
    operation that a target with ``caps`` lacks."""
    missing = {op for op in _GATED if not getattr(caps, op)}
    if not missing:
        return
    for kernel in program.kernels:
        for pos, instr in enumerate(kernel.body):
            if instr.op in missing:
                what, where = _GATED[instr.op]
                raise MissingCapabilityError(
                    f"program {program.name}, kernel {kernel.name}, instruction %{pos}: "
                    f"{instr.op} ({what}) is not implemented by this target's renderer "
                    f"(its Capabilities have {instr.op}=False; {where} have it); run the "
                    f"program on the cpu or interp backend, or build it without "
                    f"{instr.op}")

