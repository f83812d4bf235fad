"""Programs generic in their length: one compile serves an elementwise program at every
size.

An *elementwise* program computes each element of one shape ``S`` from the same element
of its operands, and from single values (scalars, 0-d tensors): every buffer holds
``prod(S)`` elements or one; every kernel runs over ``S`` (reading and writing those
buffers in storage order) or over nothing (single values); and its instructions are loads,
stores, constants and elementwise arithmetic, with no reduction, contraction, gather,
scatter nor index. Such a program at shape ``S`` and at shape ``S'`` is one computation
applied to ``prod(S)`` or ``prod(S')`` elements in a row, so a backend whose code does
not depend on that count compiles it once (an optimizer's elementwise updates on each
parameter of a model: one compile per op instead of one per parameter size).

:func:`elementwise_shape` recognizes such a program and :func:`resize` states it at
another flat length: :func:`hologram.runtime.launch.compile` compiles
``resize(program, shape, TEMPLATE_LENGTH)`` (the *template*) and runs its code at the
program's own length, where the backend says its code allows that
(:meth:`hologram.backends.base.Executable.resized`).
"""

from __future__ import annotations

import math

from hologram.isa.ir import BufferDecl, IndexMap, Instr, Kernel, Opcode, Program

#: The length templates are compiled at: large, so that the lowering plans them as it
#: plans long rows (a parallel grid), and no length a scalar buffer has.
TEMPLATE_LENGTH = 1 << 20

_ELEMENTWISE = frozenset(("const", "unary", "binary", "compare", "fma", "select", "cast"))


def elementwise_shape(program: Program) -> tuple[int, ...] | None:
    """The shape ``S`` over which ``program`` is elementwise (see the module docstring),
    or None when it is not, or when ``S`` has fewer than 2 elements (a single element is
    not told apart from the scalars then)."""
    shape = None
    for kernel in program.kernels:
        if kernel.domain:
            if shape is None:
                shape = kernel.domain
            elif kernel.domain != shape:
                return None
    if shape is None:
        return None
    n = math.prod(shape)
    if n < 2 or any(b.size not in (1, n) for b in program.buffers):
        return None
    # _moves compares dimensions of extent > 1 only, where these are the row-major strides
    rows = IndexMap.contiguous(shape).strides
    ones = (1,) * len(shape)
    for kernel in program.kernels:
        scalar = not kernel.domain
        for instr in kernel.body:
            if instr.shape not in (((),) if scalar else (ones, shape)):
                return None
            group = instr.op.group
            if group == "memory":
                if instr.op not in (Opcode.LOAD, Opcode.STORE):
                    return None
                m, size = instr.map, program.buffers[instr.buffer].size
                if m.offset != 0:
                    return None
                if size == n:  # an element of S, the same one as the kernel's index
                    if scalar or instr.shape != shape or not _moves(shape, m.strides, rows):
                        return None
                elif not scalar and (instr.op == Opcode.STORE  # one element from every index
                                     or not _moves(instr.shape, m.strides, (0,) * len(shape))):
                    return None
            elif group not in _ELEMENTWISE:
                return None
    return shape


def resize(program: Program, shape: tuple[int, ...], length: int) -> Program:
    """``program``, elementwise over ``shape`` (:func:`elementwise_shape`), stated over the
    flat length ``length``: its ``prod(shape)``-element buffers and kernels become 1-D."""
    n = math.prod(shape)
    flat, one = (length,), (1,)
    buffers = tuple(BufferDecl(b.name, b.dtype, flat, b.kind, b.offset) if b.size == n else b
                    for b in program.buffers)
    contiguous, fixed = IndexMap(0, (1,)), IndexMap(0, (0,))
    kernels = []
    for kernel in program.kernels:
        if not kernel.domain:
            kernels.append(kernel)
            continue
        body = []
        for instr in kernel.body:
            attrs = instr.attrs
            if instr.op in (Opcode.LOAD, Opcode.STORE):
                big = program.buffers[instr.buffer].size == n
                attrs = (instr.buffer, contiguous if big else fixed)
            body.append(Instr(instr.op, instr.dtype, flat if instr.shape == shape else one,
                              instr.args, attrs))
        kernels.append(Kernel(kernel.name, flat, tuple(body), min(kernel.grid_rank, 1)))
    return Program(program.name, buffers, tuple(kernels))


def _moves(shape: tuple[int, ...], strides: tuple[int, ...], wanted: tuple[int, ...]) -> bool:
    """Do ``strides`` move as ``wanted`` along every dimension that has more than one
    index (an extent-1 dimension's stride moves nothing)?"""
    return all(s == w for n, s, w in zip(shape, strides, wanted) if n > 1)
