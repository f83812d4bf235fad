"""Specialization: a kernel split along a small dimension whose coordinate selects what it
computes.

A gradient flowing into several slices of one tensor arrives as a sum of selects: the
backward of ``q, k, v = packed.unbind(0)`` (attention's packed projection) is
``where(i == 0, dq, 0) + where(i == 1, dk, 0) + where(i == 2, dv, 0)`` over the packed
shape, and fused into one kernel every point loads all three gradients to keep one. Here
such a kernel becomes one kernel per coordinate ``v`` of that dimension: the dimension is
extent 1 at offset ``v`` in every memory access, its ``index`` is the constant ``v``, and
the canonicalizer's rules (which run next) fold the comparisons and drop the loads no
longer used. Each piece writes its own slice; together they write what the kernel did.

A dimension qualifies when its extent is at most :data:`MAX_EXTENT`, no reduction or
contraction runs along it, every write moves along it (two pieces never write one
element), the kernel reads no buffer it writes (a piece would read a slice an earlier one
wrote) and holds no scatter, and the split drops loads: the pieces read fewer values in
all than the kernel did.
"""

from __future__ import annotations

from hologram.compiler.options import CompileOptions
from hologram.compiler.passes.canonicalize import rewrite
from hologram.isa.body import Body
from hologram.isa.ir import MEMORY_OPS, READ_OPS, WRITE_OPS, IndexMap, Instr, Kernel, Program

#: The largest extent of a dimension split into one kernel per coordinate.
MAX_EXTENT = 4


def specialize(program: Program, options: CompileOptions | None = None) -> Program:
    """``program`` with qualifying kernels split (a pure function)."""
    options = options or CompileOptions()
    kernels: list[Kernel] = []
    for kernel in program.kernels:
        kernels.extend(_split(kernel, options) or (kernel,))
    if len(kernels) == len(program.kernels):
        return program
    return program.evolve(kernels=tuple(kernels))


def _split(kernel: Kernel, options: CompileOptions) -> list[Kernel] | None:
    body = kernel.body
    if kernel.reads() & kernel.writes() or any(i.op == "scatter" for i in body):
        return None
    for d, n in enumerate(kernel.domain):
        if not 1 < n <= MAX_EXTENT or not any(i.op == "index" and i.axis == d for i in body):
            continue
        if any(i.op in ("reduce", "contract") and d in i.axes for i in body):
            continue
        if any(i.op in WRITE_OPS and i.map.strides[d] == 0 for i in body):
            continue
        pieces = [rewrite(_at(kernel, d, v), options)[0] for v in range(n)]
        reads = sum(1 for piece in pieces for i in piece.body if i.op in READ_OPS)
        if reads < n * sum(1 for i in body if i.op in READ_OPS):
            return [piece.evolve(name=f"{kernel.name}_{v}") for v, piece in enumerate(pieces)]
    return None


def _at(kernel: Kernel, d: int, v: int) -> Kernel:
    """``kernel`` over coordinate ``v`` of dimension ``d`` only (that dimension extent 1)."""
    domain = kernel.domain[:d] + (1,) + kernel.domain[d + 1:]
    body = Body(domain, kernel.grid_rank)
    remap: list[int] = []
    for instr in kernel.body:
        args = tuple(remap[a] for a in instr.args)
        if instr.op == "index" and instr.axis == d:
            remap.append(body.const(v, instr.dtype))
        elif instr.op in MEMORY_OPS:
            remap.append(body.add(_moved(instr, d, v).with_args(args)))
        else:
            remap.append(body.copy(instr, args, kernel.body))
    return kernel.evolve(domain=domain, body=tuple(body.instrs))


def _moved(instr: Instr, d: int, v: int) -> Instr:
    """A memory access at coordinate ``v`` of dimension ``d``, which becomes extent 1."""
    m = instr.map
    strides = m.strides[:d] + (0,) + m.strides[d + 1:]
    shape = instr.shape[:d] + (1,) + instr.shape[d + 1:]
    moved = IndexMap(m.offset + v * m.strides[d], strides)
    return Instr(instr.op, instr.dtype, shape, instr.args, (instr.buffer, moved, *instr.attrs[2:]))
