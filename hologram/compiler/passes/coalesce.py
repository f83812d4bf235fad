"""Coalescing: merge adjacent grid dimensions that every access walks as one.

Dimensions ``d`` and ``d+1`` of a kernel's grid can become one dimension of extent
``D[d] * D[d+1]`` when every value either varies along both or along neither, and every
load and store steps through memory along ``d`` exactly as far as a whole run along
``d+1`` (``stride[d] == stride[d+1] * D[d+1]``). A contiguous elementwise kernel over
``[64, 1000]`` thus becomes one loop of 64,000 points, which vectorizes and splits across
threads without a division per element. Runs after scheduling (it needs grid ranks) and
changes no result.
"""

from __future__ import annotations

from hologram.compiler.options import CompileOptions
from hologram.isa.ir import MEMORY_OPS, IndexMap, Instr, Kernel, Program


def coalesce(program: Program, options: CompileOptions | None = None) -> Program:
    return program.evolve(kernels=tuple(coalesce_kernel(k) for k in program.kernels))


def coalesce_kernel(kernel: Kernel) -> Kernel:
    """``kernel`` with the grid dimensions it walks as one merged (the fusion pass also
    uses it on a whole elementwise domain, made its grid for the purpose)."""
    if 0 in kernel.domain:
        return kernel  # nothing runs; and extents of 0 hide broadcasts from the checks
    d = 0
    while d + 1 < kernel.grid_rank:
        if _mergeable(kernel, d):
            kernel = _merge(kernel, d)
        else:
            d += 1
    return kernel


def _mergeable(kernel: Kernel, d: int) -> bool:
    outer, inner = kernel.domain[d], kernel.domain[d + 1]
    for instr in kernel.body:
        if instr.op == "index" and instr.axis in (d, d + 1):
            return False
        along_outer, along_inner = instr.shape[d] > 1, instr.shape[d + 1] > 1
        # Varying along one of the two but broadcast along the other (of extent > 1).
        if 0 not in instr.shape and ((along_outer and not along_inner and inner != 1)
                                     or (along_inner and not along_outer and outer != 1)):
            return False
        if (instr.op in MEMORY_OPS and along_outer and along_inner
                and instr.map.strides[d] != instr.map.strides[d + 1] * inner):
            return False
    return True


def _merge(kernel: Kernel, d: int) -> Kernel:
    def merged(shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape[:d] + (shape[d] * shape[d + 1],) + shape[d + 2:]

    def rewrite(instr: Instr) -> Instr:
        attrs = instr.attrs
        if instr.op in MEMORY_OPS:
            s = instr.map.strides
            step = s[d + 1] if instr.shape[d + 1] > 1 else s[d] if instr.shape[d] > 1 else 0
            attrs = (instr.buffer, IndexMap(instr.map.offset, s[:d] + (step,) + s[d + 2:]),
                     *instr.attrs[2:])  # a gather's operand bounds
        elif instr.op == "index":
            attrs = (instr.axis - (instr.axis > d),)
        elif instr.op in ("reduce", "contract"):
            axes = tuple(a - (a > d) for a in instr.axes)
            attrs = (instr.kind, axes) if instr.op == "reduce" else (axes,)
        return Instr(instr.op, instr.dtype, merged(instr.shape), instr.args, attrs)

    return kernel.evolve(domain=merged(kernel.domain), body=tuple(map(rewrite, kernel.body)),
                         grid_rank=kernel.grid_rank - 1)
