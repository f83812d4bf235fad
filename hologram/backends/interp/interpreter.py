"""The reference interpreter: runs an Atlas program on NumPy arrays.

Kernels run in program order. Within a kernel each instruction runs once over the whole
domain (vectorized): a load (or gather) reads its elements, a value instruction is
:func:`~hologram.isa.semantics.evaluate`, a store scatters. Since loads copy
and run in body order, every load sees memory as the kernel found it, except that a load
placed after the store of the same buffer (which the verifier allows only through the same
map, so point to point) sees the stored values, as it would point by point. The allowed
read-modify-write (``x += 1``: load then store through one map) is a gather followed by a
scatter. A ``scatter`` instruction makes its writes in index order (:func:`_scatter`).

Temporaries live in one arena of ``program.arena_bytes`` bytes at the byte offsets the
scheduler planned, so a wrong plan gives wrong results; unplaced temporaries get their own
memory. All of it starts as poison (every byte 0xFF: NaN for floats, -1 for ints), so
reading a temporary before writing it is visible in tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from hologram.backends.base import check_arrays
from hologram.errors import IRError
from hologram.isa.ir import IndexMap, Instr, Kernel, Program
from hologram.isa.semantics import evaluate, from_storage, to_storage

POISON = 0xFF


def run(program: Program, arrays: Sequence[np.ndarray]) -> None:
    """Run the verified ``program``, writing its outputs into ``arrays`` in place.

    ``arrays`` holds one array per parameter (``program.params``, in order): a
    C-contiguous ndarray (any shape) of ``buffer.size`` elements in ``buffer.dtype.storage``
    (bf16: uint16 bit patterns). Raises :class:`ShapeError` or :class:`DTypeError` naming
    the program and buffer when they do not fit; inputs are never written.
    """
    execute(program, check_arrays(program, arrays, f"program {program.name}"))


def execute(program: Program, params: Sequence[np.ndarray]) -> None:
    """:func:`run` on arrays already checked and flattened (``check_arrays``)."""
    arena = np.full(program.arena_bytes, POISON, dtype=np.uint8)
    given = iter(params)
    memory = []
    for buf in program.buffers:
        if buf.kind != "temp":
            memory.append(next(given))
        elif buf.offset is not None:
            memory.append(arena[buf.offset : buf.offset + buf.nbytes].view(buf.dtype.storage))
        else:
            memory.append(np.full(buf.nbytes, POISON, dtype=np.uint8).view(buf.dtype.storage))
    for kernel in program.kernels:
        run_kernel(program, kernel, memory)


def _indices(imap: IndexMap, shape: tuple[int, ...]) -> np.ndarray:
    """Flat element index of every point of ``shape``: offset + sum(i[d] * strides[d])."""
    if 0 in shape:  # no points (an aranged other extent could be too large to allocate)
        return np.empty(shape, dtype=np.int64)
    index = np.full((1,) * len(shape), imap.offset, dtype=np.int64)
    for d, (n, stride) in enumerate(zip(shape, imap.strides)):
        step = np.arange(n, dtype=np.int64) * stride
        index = index + step.reshape([n if e == d else 1 for e in range(len(shape))])
    return np.broadcast_to(index, shape)


def _access(program: Program, kernel: Kernel, instr: Instr,
            memory: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The flat buffer and indices a load or store reaches, bounds-checked (NumPy would
    silently wrap a negative index of an unverified program)."""
    flat = memory[instr.buffer]
    low, high = instr.map.extent(instr.shape)
    if high >= low and (low < 0 or high >= flat.size):
        name = program.buffers[instr.buffer].name
        raise IRError(f"kernel {kernel.name}: {instr.op} of {name} reaches elements "
                      f"{low}..{high} of {flat.size} (run hologram.isa.verify first)")
    return flat, _indices(instr.map, instr.shape)


def _gather(instr: Instr, at: np.ndarray, flat: np.ndarray) -> np.ndarray:
    """Element ``i`` is ``flat[offset + sum(i[d] * strides[d]) + clamp(at[i], low,
    high)]`` for the instruction's ``bounds``; the verifier made sure every such element
    is inside the buffer (checked again here: NumPy would wrap a negative index)."""
    return from_storage(flat[_positions(instr, at, flat)], instr.dtype)


def _positions(instr: Instr, at: np.ndarray, flat: np.ndarray) -> np.ndarray:
    """A gather's or scatter's flat element per point of its shape (``at`` clamped to
    its bounds and added to the map's element), checked to lie inside ``flat``."""
    index = _indices(instr.map, instr.shape)
    if index.size:
        low, high = instr.bounds
        # Every Atlas integer fits in int64 (there is no u64): the clamp is exact.
        at = np.clip(np.asarray(at).astype(np.int64), low, high)
        index = index + np.broadcast_to(at, instr.shape)
        if index.min() < 0 or index.max() >= flat.size:
            raise IRError(f"{instr.op} reaches elements {index.min()}..{index.max()} of "
                          f"{flat.size} (run hologram.isa.verify first)")
    return index


def _scatter(instr: Instr, value: np.ndarray, at: np.ndarray, flat: np.ndarray) -> None:
    """For every point ``i`` of the scatter's shape in row-major (index) order, element
    ``p = _positions(...)[i]`` of ``flat`` becomes ``value[i]`` ("replace") or
    ``mode(flat[p], value[i])`` with the ISA's binary op of that name, so duplicates see
    the writes before them: replace keeps the last, add accumulates in index order with
    the dtype's rounding after each step. Vectorized by rounds: round ``r`` applies every
    element's ``r``-th write (distinct elements, so one NumPy operation each)."""
    positions = _positions(instr, at, flat).reshape(-1)
    if not positions.size:
        return
    values = np.broadcast_to(value, instr.shape).reshape(-1)
    order = np.argsort(positions, kind="stable")  # each element's writes, in index order
    ranked = positions[order]
    first = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])
    counts = np.diff(np.r_[first, ranked.size])
    rank = np.arange(ranked.size) - np.repeat(first, counts)  # the write's number per element
    if instr.mode == "replace":
        last = order[np.r_[first[1:], ranked.size] - 1]
        flat[positions[last]] = to_storage(values[last], instr.dtype)
        return
    combine = Instr(instr.mode, instr.dtype, (1,))
    for r in range(int(counts.max())):
        which = order[rank == r]
        at_r = positions[which]
        old = from_storage(flat[at_r], instr.dtype)
        new = evaluate(replace(combine, shape=(which.size,)), [old, values[which]],
                       (which.size,))
        flat[at_r] = to_storage(new, instr.dtype)


def run_kernel(program: Program, kernel: Kernel, memory: list[np.ndarray]) -> None:
    """Run one kernel of ``program`` on ``memory`` (one flat storage array per buffer)."""
    values: list[np.ndarray | None] = []
    for instr in kernel.body:
        if instr.op == "load":
            flat, index = _access(program, kernel, instr, memory)
            values.append(from_storage(flat[index], instr.dtype))  # a gather copies
        elif instr.op == "gather":
            values.append(_gather(instr, values[instr.args[0]], memory[instr.buffer]))
        elif instr.op == "store":
            flat, index = _access(program, kernel, instr, memory)
            value = np.broadcast_to(values[instr.args[0]], instr.shape)
            flat[index] = to_storage(value, instr.dtype)
            values.append(None)  # a store has no value
        elif instr.op == "scatter":
            value, at = (values[a] for a in instr.args)
            _scatter(instr, value, at, memory[instr.buffer])
            values.append(None)
        else:
            values.append(evaluate(instr, [values[a] for a in instr.args], kernel.domain))
