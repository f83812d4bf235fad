"""The schedule decisions the GPU backends make the same way, from the target's
:class:`~hologram.compiler.capabilities.Capabilities`:

- **split reductions** (:func:`parts`, :func:`chunks`, ``caps.row_split``): a reduction over
  few long rows leaves most of a GPU idle (one program instance or workgroup per row), so
  each row is cut into chunks whose partial results are combined afterwards. A chunk holds
  at least ``work`` terms, a row is cut into at most ``max_parts`` and only into as many
  as it takes to give ``units`` parallel units, and into enough that no chunk exceeds
  ``max_chunk`` terms; chunks are whole multiples of the renderer's tile (``granule``).
  The same arithmetic cuts a matrix product of few output tiles along k (split-K,
  ``caps.k_split``). Which kernels a renderer can split (one reduction or several, stores
  along the row, tiles) is its own question; how many parts is answered here.
- **fission** (:func:`fission`, ``caps.fission``): a kernel with several reductions (a
  softmax's max then sum, a layer norm's mean then variance) cannot be split in one
  launch when its second reduction needs its first one's result for the whole row. Over
  few long rows it is rewritten into:

  * one kernel per reduction, in order: the instructions that reduction needs, the
    earlier reductions' results loaded from temporaries (one element per row), its result
    stored into its own temporary. Each has one reduction and stores once per row, so it
    is split like any such kernel. The last one also makes the kernel's stores of one
    value per row (a log-sum-exp's result);
  * one kernel for the stores along the row (softmax's probabilities), the reductions'
    results loaded per row: every element of the domain is a grid point when those stores
    write distinct elements, so it too spreads over the device.

  The instructions are the kernel's own, so each value is computed exactly as before; the
  reductions' results pass through memory in their own dtype (exact). What changes is
  only that of a split reduction: the partials' combination (docs/cuda.md).

- **bindings** (:func:`fit_bindings`): a kernel may bind at most so many buffers on some
  targets (WebGPU's storage buffers per shader stage: 8 guaranteed, 32 on lavapipe).
  A kernel past the limit that stores several results (a fused optimizer step over many
  parameters) is cut into kernels of some of its stores each, every one recomputing what
  its stores need, ordered so that a buffer is written only after every piece that reads
  it has run (in-place updates stay exact).

The cpu backend's split of whole-domain reductions across its threads is
:func:`hologram.codegen.loops.split_parts`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from hologram.compiler.capabilities import Split
from hologram.isa.ir import BufferDecl, IndexMap, Instr, Kernel, Program


def parts(rule: Split, total: int, rows: int, longest: int = 0) -> int:
    """Into how many chunks each of ``rows`` rows of ``total`` reduced terms is cut by
    ``rule`` (0: not cut, fewer than two). ``longest``: the longest other loop cut along
    with the row (stores along it), which ``max_chunk`` bounds as well."""
    n = min(rule.max_parts, total // rule.work, -(-rule.units // rows))
    if rule.max_chunk:
        n = max(n, -(-max(total, longest) // rule.max_chunk))
    return n if n >= 2 else 0


def chunks(total: int, parts: int, granule: int) -> tuple[int, int]:
    """``(parts, chunk)``: ``total`` terms cut into about ``parts`` chunks of ``chunk``
    terms, a whole multiple of ``granule`` (the renderer's tile), none empty (so there may
    be fewer parts than asked)."""
    chunk = -(-total // (parts * granule)) * granule
    return -(-total // chunk), chunk


def fission(program: Program, splits: Callable[[Kernel], bool]) -> Program:
    """``program`` with each kernel that :func:`cut` cuts replaced by its pieces;
    ``splits(kernel)``: whether the renderer splits a piece's reduction (the target's
    own split rule)."""
    buffers = list(program.buffers)
    kernels: list[Kernel] = []
    for kernel in program.kernels:
        kernels.extend(cut(kernel, buffers, splits) or [kernel])
    if len(kernels) == len(program.kernels):
        return program
    return program.evolve(buffers=tuple(buffers), kernels=tuple(kernels))


def cut(kernel: Kernel, buffers: list[BufferDecl],
        splits: Callable[[Kernel], bool]) -> list[Kernel] | None:
    """The pieces of ``kernel`` (module docstring), appending their temporaries to
    ``buffers``, or None where it is left whole: fewer than two reductions, a contraction
    or scatter, a reduction whose result varies along a loop dimension, a buffer both read
    and written, or rows that a split would not spread (``splits`` refuses a piece)."""
    body, g = kernel.body, kernel.grid_rank
    reductions = [p for p, x in enumerate(body) if x.op == "reduce"]
    if (len(reductions) < 2 or any(x.op in ("contract", "scatter") for x in body)
            or kernel.reads() & kernel.writes() or 0 in kernel.domain
            or any(body[p].shape[d] != 1 for p in reductions
                   for d in range(g, len(kernel.domain)))):
        return None
    stores = [p for p, x in enumerate(body) if x.op == "store"]
    per_row = [p for p in stores if all(body[p].shape[d] == 1
                                        for d in range(g, len(kernel.domain)))]
    along = [p for p in stores if p not in per_row]
    # One temporary per reduction (one element per row, the result's dtype): stored by its
    # own piece, loaded by the later ones; the last one's only where the stores along the
    # rows need it.
    needs_last = bool(along) and reductions[-1] in _needed(body, along, reductions)
    stored = reductions if needs_last else reductions[:-1]
    first = len(buffers)
    temps = {p: first + i for i, p in enumerate(stored)}
    pieces = []
    for i, p in enumerate(reductions):
        roots = [p] + (per_row if i == len(reductions) - 1 else [])
        pieces.append(_piece(kernel, f"{kernel.name}r{i}", roots, reductions[:i],
                             temps, p if p in temps else None))
    if along:
        domain = kernel.domain
        disjoint = all(body[s].shape == domain and body[s].map.is_injective(domain)
                       for s in along)
        pieces.append(_piece(kernel, f"{kernel.name}e", along, reductions, temps, None)
                      .evolve(grid_rank=len(domain) if disjoint else g))
    if not all(splits(piece) for piece in pieces[:len(reductions)]):
        return None
    for i, p in enumerate(stored):
        shape = tuple(n for d, n in enumerate(body[p].shape) if d < g)
        buffers.append(BufferDecl(f"{kernel.name}_r{i}", body[p].dtype, shape, "temp"))
    return pieces


def fit_bindings(program: Program, limit: int, free: Collection[int] = ()) -> Program:
    """``program`` with each kernel that binds more than ``limit`` buffers cut into pieces
    of its stores that bind at most ``limit`` each (module docstring); a kernel whose
    stores cannot be grouped so (one store's slice alone past the limit, a scatter, a
    cycle of in-place writes between groups) is left whole. The buffers in ``free`` take
    no binding (a target that passes them otherwise)."""
    kernels: list[Kernel] = []
    for kernel in program.kernels:
        kernels.extend(_fit(kernel, limit, frozenset(free)) or [kernel])
    if len(kernels) == len(program.kernels):
        return program
    return program.evolve(kernels=tuple(kernels))


def _fit(kernel: Kernel, limit: int, free: frozenset[int]) -> list[Kernel] | None:
    body = kernel.body
    if (len((kernel.reads() | kernel.writes()) - free) <= limit
            or any(x.op == "scatter" for x in body)):
        return None
    stored = set()  # buffers stored so far: a load of one after its store is left whole
    for x in body:
        if x.op == "store":
            stored.add(x.buffer)
        elif x.op in ("load", "gather") and x.buffer in stored:
            return None
    groups: list[tuple[list[int], set[int], set[int]]] = []  # (stores, reads, writes)
    for p in (p for p, x in enumerate(body) if x.op == "store"):
        needed = _needed(body, [p], [])
        reads = {body[i].buffer for i in needed if body[i].op in ("load", "gather")} - free
        writes = {body[p].buffer}
        if len(reads | writes) > limit:
            return None
        last = groups[-1] if groups else None
        if last is not None and len(last[1] | last[2] | reads | writes) <= limit:
            last[0].append(p)
            last[1].update(reads)
            last[2].update(writes)
        else:
            groups.append(([p], reads, writes))
    # A group runs once no group still waiting reads what it writes (those read the old
    # values first) and no earlier group still waiting writes the same buffer.
    order: list[int] = []
    waiting = list(range(len(groups)))
    while waiting:
        ready = [i for i in waiting if not any(
            groups[i][2] & (groups[j][1] | (groups[j][2] if j < i else set()))
            for j in waiting if j != i)]
        if not ready:
            return None  # in-place writes that each group must see before the other
        order.append(ready[0])
        waiting.remove(ready[0])
    return [_piece(kernel, f"{kernel.name}b{n}", groups[j][0], [], {}, None)
            for n, j in enumerate(order)]


def _needed(body: tuple[Instr, ...], roots: list[int], loaded: list[int]) -> set[int]:
    """Positions ``roots`` depend on, not looking through those in ``loaded`` (reductions
    whose results are loaded from memory instead)."""
    needed, stop = set(roots), set(loaded)
    for i in range(max(roots), -1, -1):
        if i in needed and i not in stop:
            needed.update(body[i].args)
    return needed


def _piece(kernel: Kernel, name: str, roots: list[int], loaded: list[int],
           temps: dict[int, int], result: int | None) -> Kernel:
    """The instructions ``roots`` need, in order, with the reductions of ``loaded`` read
    from their temporaries (at each row); ``result``, if given, a reduction stored into its
    temporary at the end."""
    body = kernel.body
    needed = _needed(body, roots + ([result] if result is not None else []), loaded)
    out: list[Instr] = []
    at: dict[int, int] = {}
    for p in sorted(needed):
        x = body[p]
        if p in loaded:
            out.append(Instr("load", x.dtype, x.shape, (), (temps[p], _row_map(x))))
        else:
            out.append(x.with_args(tuple(at[a] for a in x.args)))
        at[p] = len(out) - 1
    if result is not None:
        x = body[result]
        out.append(Instr("store", x.dtype, x.shape, (at[result],),
                         (temps[result], _row_map(x))))
    return kernel.evolve(name=name, body=tuple(out))


def _row_map(value: Instr) -> IndexMap:
    """Where a per-row value lives in its temporary: row-major over the dimensions it
    varies along (the grid's), stride 0 along the others."""
    return IndexMap.contiguous(value.shape)
