"""Scheduling: each kernel's parallel grid, and where temporaries live.

**Grid.** A kernel's grid is the longest prefix of its domain whose dimensions can run in
any order and in parallel: no reduction or contraction runs over them, every store
writes distinct elements along them (a store that is constant along a dimension would have
all grid points along it write the same element), and every scatter is proven to write
disjoint elements for different indices along them
(:func:`hologram.isa.ir.scatter_disjoint`: its writes to one element must stay in index
order, which only a loop keeps). The remaining dimensions are the kernel's structured
loops. Backends split the grid across threads or GPU blocks.

**Arena.** Temporaries that are live at the same time must not share memory; others may.
Each temporary's lifetime is the span of kernels that touch it; temporaries are placed
largest first at the lowest 64-byte-aligned offset of one arena that does not overlap a
placed temporary with an intersecting lifetime (first fit). ``Program.arena_bytes`` is the
arena's size; backends allocate it once per call (or keep it between calls).
"""

from __future__ import annotations

from dataclasses import replace

from hologram.compiler.options import CompileOptions
from hologram.isa.ir import Kernel, Program, scatter_disjoint

ALIGNMENT = 64


def schedule(program: Program, options: CompileOptions | None = None) -> Program:
    kernels = tuple(k.evolve(grid_rank=grid_rank(k)) for k in program.kernels)
    return plan_arena(program.evolve(kernels=kernels))


def grid_rank(kernel: Kernel) -> int:
    """Length of the longest domain prefix that can run in parallel."""
    rank = len(kernel.domain)
    for instr in kernel.body:
        if instr.op in ("reduce", "contract"):
            rank = min(rank, instr.axes[0])
        elif instr.op == "store":
            for d, n in enumerate(instr.shape):
                if n != kernel.domain[d]:
                    rank = min(rank, d)
                    break
        elif instr.op == "scatter":
            while rank and not scatter_disjoint(instr, kernel.domain, range(rank)):
                rank -= 1
    return rank


def plan_arena(program: Program) -> Program:
    live = program.lifetimes()
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
    offsets: dict[int, int] = {}
    order = sorted(live, key=lambda b: (-program.buffers[b].nbytes, b))
    for b in order:
        first, last = live[b]
        size = -(-program.buffers[b].nbytes // ALIGNMENT) * ALIGNMENT
        offset = 0
        for start, end, f, l in sorted(placed):
            overlaps_in_time = f <= last and first <= l
            if overlaps_in_time and start < offset + size and offset < end:
                offset = -(-end // ALIGNMENT) * ALIGNMENT
        placed.append((offset, offset + size, first, last))
        offsets[b] = offset
    buffers = tuple(
        replace(buf, offset=offsets.get(i)) if buf.kind == "temp" else buf
        for i, buf in enumerate(program.buffers)
    )
    return program.evolve(buffers=buffers)
