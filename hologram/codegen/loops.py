"""The device-neutral lowering of a scheduled Atlas kernel: its loop plan.

A renderer turns each kernel into code for one device; what it has to decide before it
emits anything is the same on every device, and is decided here:

- which kernels it can run at all (:func:`unsupported`);
- which whole-domain reductions run as partials and their fold (:func:`split_parts`);
- where each value is computed: before the grid loop over dimension ``d`` (``hoist d``:
  it varies along no grid dimension from ``d`` on and comes from no reduction), once per
  grid point (``point``), or inside a loop nest over the loop dimensions it varies along
  (``nest [...]``), recomputed there rather than stored;
- which stores share a loop nest (those varying along the same loop dimensions; a
  ``scatter`` is placed like a store, its nest walking its loop dimensions in index order,
  which is the order its writes must keep);
- how each reduction accumulates (:class:`Accumulator`): float sums in lanes of the operand
  precision, blocked, block sums in the target's ``block_sum_dtype``; products, extremes
  and integer sums in one accumulator; argmax indices in the target's ``index_dtype``;
- which float sums run across columns (:func:`column_tile`): where the summed values are
  contiguous along the last grid dimension and not along the reduced one (a bias's
  gradient, ``x.sum(0)``), a tile of neighbouring grid points is summed together, row by
  row, so that the loads are vectors instead of one strided element per grid point.

:func:`plan` returns all of it as a :class:`KernelPlan`, and :meth:`KernelPlan.dump` as
text; compilers write it under ``HOLOGRAM_DUMP_DIR`` (stage ``loops``). The cpu renderer
emits LLVM IR following it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hologram.compiler.capabilities import Capabilities
from hologram.isa import dtypes as dt
from hologram.isa.ir import WRITE_OPS, Kernel, Program

#: Elements per partial result of a split reduction, and the most partials (see
#: :func:`split_parts`). Fixed numbers, not the thread count: a split reduction's result
#: is the same bits however many threads compute its partials.
PART_WORK = 1 << 16
MAX_PARTS = 64

#: Float sums (docs/isa.md, "Float sums"): the whole groups of ``LANES`` terms of a block
#: of ``BLOCK`` go to ``LANES`` accumulators of the operand precision (float32 for
#: f16/bf16), term ``i`` to lane ``i % LANES``, ``VECTOR`` lanes at a time, added as a
#: balanced tree; a short block's further whole vectors go to ``VECTOR`` more lanes, its
#: last ``< VECTOR`` terms to one sequential sum; these sums are added in order in the
#: target's ``block_sum_dtype``. A row of at most ``SHORT_ROW`` terms is one sequential
#: sum. The error bound's constant follows from these: at most ``BLOCK / LANES - 1``
#: rounded additions per lane (``VECTOR - 1`` in the sequential sum) and ``log2(LANES)``
#: tree levels. Several vectors of lanes make independent chains of additions, so a sum
#: runs at the memory's speed rather than one vector addition's latency.
LANES = 64
BLOCK = 1024
VECTOR = 16
SHORT_ROW = 16
#: Column sums (:func:`column_tile`): the grid points summed together, and the fewest
#: neighbouring grid points that make a tile worth it (below, the rows are short).
COLUMN_TILE = 256
MIN_COLUMNS = 8


#: The capabilities plans assume where none are given (a 64-bit target).
_PLAIN = Capabilities()


def unsupported(kernel: Kernel) -> str | None:
    """Why ``kernel`` cannot be lowered to loops yet, or None."""
    if 0 in kernel.domain:
        # Values invariant along a loop are computed before it, also when it runs zero
        # times: a load would then read an empty (possibly unallocated) buffer. Such kernels
        # store nothing or reduce empty extents, so the interpreter runs them at no cost.
        return f"the domain {list(kernel.domain)} has a zero extent"
    loops = range(kernel.grid_rank, len(kernel.domain))
    for instr in kernel.body:
        if instr.op in ("reduce", "contract") and any(instr.shape[d] > 1 for d in loops):
            return ("a reduction result varies along a loop dimension "
                    f"(shape {list(instr.shape)}, grid {list(kernel.grid)})")
    return None


def split_parts(kernel: Kernel) -> int:
    """Into how many partial results a reduction of a whole domain is split (0: none).

    A kernel without a grid whose one reduction runs over dimension 0 among others, and
    whose stores all store values computed once (the reduction's result and what follows
    from it), is rendered as two functions: ``symbol`` computes partial ``p`` (the
    reduction over dimension-0 indices ``[bound(p), bound(p + 1))``, see
    :func:`part_bounds`) for the ``p`` in its ``[start, stop)``, into a scratch
    buffer passed as pointer ``len(program.buffers)``; ``symbol_final`` folds the partials
    in order and runs the rest of the kernel. The partials can then run on all threads,
    where a whole reduction would run on one."""
    if kernel.grid_rank or not kernel.domain or 0 in kernel.domain:
        return 0
    reductions = [x for x in kernel.body if x.op in ("reduce", "contract")]
    if len(reductions) != 1 or reductions[0].axes[:1] != (0,):
        return 0
    loops = range(len(kernel.domain))
    for x in kernel.body:
        if x.op in WRITE_OPS and any(x.shape[d] > 1 for d in loops):
            return 0
    parts = min(MAX_PARTS, kernel.domain[0], math.prod(kernel.domain) // PART_WORK)
    return parts if parts >= 2 else 0


def part_bounds(domain: tuple[int, ...], parts: int) -> tuple[int, int]:
    """``(base, extra)``: partial ``q`` of a split reduction over ``domain`` reduces the
    dimension-0 indices ``[bound(q), bound(q + 1))`` with ``bound(q) = min(q * base +
    min(q, extra), domain[0])``.

    A one-dimensional reduction's partials are whole blocks of :data:`BLOCK` terms but the
    last (``extra = 0``): each starts where a block of the unsplit row would, so its loads
    keep the row's alignment (unaligned partials measured the 1e6-term float32 sum 15%
    slower on one thread) and the terms meet the same lanes. Otherwise dimension 0 is
    divided evenly (``n // parts``, the first ``n % parts`` one more)."""
    n = domain[0]
    if math.prod(domain[1:]) == 1:
        # Never empty: n / parts >= PART_WORK > (MAX_PARTS - 1) * BLOCK.
        return -(-n // (parts * BLOCK)) * BLOCK, 0
    return divmod(n, parts)


def column_tile(kernel: Kernel, caps: Capabilities = _PLAIN) -> int:
    """The grid points of a column-sum tile (0: the kernel is not a column sum).

    A kernel is a column sum when its reductions are all float sums of f32, f16 or bf16
    values over the same axes (its loop dimensions), none of whose terms needs another's
    result, it stores only once per grid point,
    it reads with plain loads that step by one element or none along its last grid
    dimension ``g`` (of at least :data:`MIN_COLUMNS` points), and one of them steps along
    the innermost reduced axis by more than one element. Such a kernel is rendered tile by
    tile of up to :data:`COLUMN_TILE` neighbouring points along ``g``: for each row of the
    reduced axes, the tile's terms are added elementwise into one float32 accumulator per
    point (vector loads along ``g``), the innermost reduced axis in blocks of
    :data:`SHORT_ROW` terms (one sequential sum each, as a short row's), and the block
    sums in order in the target's ``block_sum_dtype`` (docs/isa.md, "Float sums"), which
    must be float64: uncompensated, its 29 extra bits keep the bound."""
    g = kernel.grid_rank - 1
    if caps.block_sum_dtype != "f64":
        return 0
    loop_dims = tuple(range(kernel.grid_rank, len(kernel.domain)))
    if g < 0 or not loop_dims or kernel.domain[g] < MIN_COLUMNS or 0 in kernel.domain:
        return 0
    body = kernel.body
    reductions = [x for x in body if x.op in ("reduce", "contract")]
    if not reductions or any(
            x.op != "reduce" or x.kind != "sum" or tuple(sorted(x.axes)) != loop_dims
            or body[x.args[0]].dtype not in (dt.float32, dt.float16, dt.bfloat16)
            for x in reductions):
        return 0
    if any(x.op in ("gather", "scatter") for x in body):
        return 0
    reduced: set[int] = set()  # reductions and what depends on them
    for i, x in enumerate(body):
        if x.op == "reduce" or reduced.intersection(x.args):
            if x.op == "reduce" and x.args[0] in reduced:
                return 0  # a sum of terms that need another sum (two passes)
            reduced.add(i)
    if any(x.op in WRITE_OPS and any(x.shape[d] > 1 for d in loop_dims) for x in body):
        return 0
    loads = [x for x in body if x.op == "load"]
    if any(x.shape[g] > 1 and x.map.strides[g] not in (0, 1) for x in loads):
        return 0
    inner = reductions[0].axes[-1]
    strided = any(x.shape[g] > 1 and x.map.strides[g] == 1 and x.shape[inner] > 1
                  and x.map.strides[inner] not in (0, 1) for x in loads)
    return COLUMN_TILE if strided else 0


@dataclass(frozen=True)
class Accumulator:
    """How one reduction accumulates."""

    position: int  # the reduce/contract instruction
    kind: str  # sum, prod, max, min, argmax, argmin (a contract is a sum)
    axes: tuple[int, ...]
    operand: str  # the operand dtype
    dtype: str  # the accumulator (the lanes, for a blocked float sum)
    blocked: bool = False  # LANES lanes per BLOCK, block sums in ``outer``
    outer: str = ""  # block sums' dtype
    compensated: bool = False  # block sums added with Neumaier's compensation
    index: str = ""  # argmax/argmin: the index's dtype

    def describe(self) -> str:
        text = f"%{self.position} {self.kind} axes {list(self.axes)} of {self.operand}: " \
               f"{self.dtype}"
        if self.blocked:
            text += (f" x{LANES} lanes per block of {BLOCK}, blocks in {self.outer}"
                     + (" compensated" if self.compensated else ""))
        if self.index:
            text += f", index {self.index}"
        return text


def accumulator(kernel: Kernel, position: int, caps: Capabilities = _PLAIN) -> Accumulator:
    """The accumulator of reduction ``kernel.body[position]`` on a target with ``caps``."""
    instr = kernel.body[position]
    t = kernel.body[instr.args[0]].dtype
    kind = "sum" if instr.op == "contract" else instr.kind
    if kind == "sum" and t.is_float:
        lanes = "f64" if t is dt.float64 else "f32"
        outer = caps.block_sum_dtype if t is not dt.float64 else "f64"
        return Accumulator(position, kind, instr.axes, t.name, lanes, True, outer,
                           compensated=outer == lanes)
    if kind == "prod" and t.is_float:  # any order: relative error γ(n-1) of the precision
        wide = "f64" if caps.f64 else "f32"
        return Accumulator(position, kind, instr.axes, t.name, wide)
    index = caps.index_dtype if kind in ("argmax", "argmin") else ""
    return Accumulator(position, kind, instr.axes, t.name, t.name, index=index)


@dataclass(frozen=True)
class KernelPlan:
    """The loop structure of one kernel (see the module docstring)."""

    name: str
    grid: tuple[int, ...]  # parallel dimensions, outermost first
    loops: tuple[int, ...]  # the loop dimensions' extents
    parts: int  # split_parts
    placement: tuple[str, ...]  # per instruction: "hoist d", "point" or "nest [dims]"
    # (dims, stores): the writes (stores and scatters) made in one nest over ``dims``
    store_nests: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
    accumulators: tuple[Accumulator, ...]
    unsupported: str | None
    # The placement as data, per instruction: the grid dimension it is hoisted before
    # (None: not hoisted), and the loop dimensions it varies along.
    hoist: tuple[int | None, ...] = ()
    varying: tuple[tuple[int, ...], ...] = ()
    columns: int = 0  # column_tile: grid points summed together (0: none)

    def hoisted_at(self, level: int) -> list[int]:
        """The instructions computed before the grid loop over dimension ``level``, in
        body order."""
        return [i for i, d in enumerate(self.hoist) if d == level]

    def in_nest(self, position: int) -> bool:
        """Whether instruction ``position`` is recomputed inside a loop nest (it varies
        along a loop dimension), rather than computed once per grid point or hoisted."""
        return bool(self.varying[position])

    def point_values(self, kernel: Kernel, root: int, emitted) -> list[int]:
        """What a renderer emits at grid-point level before the nests that need ``root``:
        the instructions ``root`` depends on (itself included; the walk stops at values in
        ``emitted``) that vary along no loop dimension (reductions included), in body
        order, which is a topological order. Emitting one may emit others: renderers skip
        those already emitted."""
        stack, seen = [root], set()
        while stack:
            i = stack.pop()
            if i in seen or i in emitted:
                continue
            seen.add(i)
            stack.extend(kernel.body[i].args)
        return [i for i in sorted(seen) if not self.in_nest(i)]

    def accumulator(self, position: int) -> Accumulator:
        """The accumulator of the reduction at ``position``."""
        return next(a for a in self.accumulators if a.position == position)

    def dump(self) -> str:
        lines = [f"kernel {self.name} grid {list(self.grid)} loops {list(self.loops)}"
                 + (f" split {self.parts} partials" if self.parts else "")
                 + (f" column sums in tiles of {self.columns}" if self.columns else "")]
        if self.unsupported:
            lines.append(f"  unsupported: {self.unsupported}")
        for position, where in enumerate(self.placement):
            lines.append(f"  %{position}: {where}")
        for dims, stores in self.store_nests:
            lines.append(f"  stores {['%' + str(s) for s in stores]} in nest {list(dims)}")
        if self.columns:
            lines += [f"  accumulate %{a.position} sum axes {list(a.axes)} of {a.operand}: "
                      f"{a.dtype} per grid point, blocks of {SHORT_ROW} rows, blocks in "
                      f"{a.outer}" for a in self.accumulators]
        else:
            lines += [f"  accumulate {a.describe()}" for a in self.accumulators]
        return "\n".join(lines)


@dataclass(frozen=True)
class MatmulDims:
    """Where a kernel is a matrix product (:func:`matmul`): the contraction's position,
    the domain dimensions of its rows, columns and reduced index, and the grid points of
    the dimensions before the rows (a batch)."""

    position: int
    m: int
    n: int
    k: int
    batch: int


def matmul(kernel: Kernel, plan: KernelPlan) -> MatmulDims | None:
    """The matrix-product structure of ``kernel``, or None: its one reduction is a
    contraction over its last domain dimension ``k``, its grid is ``[batch..., m, n]``,
    operand ``A`` does not vary along ``n`` nor ``B`` along ``m``, and its stores are made
    once per grid point (an epilogue). A renderer may compute such a kernel in tiles of
    outputs, each operand element read once per tile rather than once per output."""
    rank, body = kernel.grid_rank, kernel.body
    if rank < 2 or len(kernel.domain) != rank + 1 or 0 in kernel.domain:
        return None
    reductions = [i for i, x in enumerate(body) if x.op in ("reduce", "contract")]
    if len(reductions) != 1 or body[reductions[0]].op != "contract":
        return None
    instr = body[reductions[0]]
    m, n, k = rank - 2, rank - 1, rank
    if instr.axes != (k,) or any(dims for dims, _ in plan.store_nests):
        return None
    a, b = (body[x] for x in instr.args)
    if a.shape[n] != 1 or b.shape[m] != 1:
        return None
    return MatmulDims(reductions[0], m, n, k, math.prod(kernel.domain[:m]))


def plan(kernel: Kernel, caps: Capabilities = _PLAIN) -> KernelPlan:
    """The loop plan of ``kernel`` for a target with ``caps``."""
    rank = len(kernel.domain)
    loops = range(kernel.grid_rank, rank)
    from_reduction: set[int] = set()
    placement, hoist, varies = [], [], []
    for i, instr in enumerate(kernel.body):
        reduced = instr.op in ("reduce", "contract") or bool(from_reduction & set(instr.args))
        if reduced:
            from_reduction.add(i)
        varying = tuple(d for d in loops if instr.shape[d] > 1)
        varies.append(varying)
        if instr.op in WRITE_OPS or varying:
            placement.append(f"nest {list(varying)}")
            hoist.append(None)
            continue
        level = next((d for d in range(kernel.grid_rank)
                      if all(instr.shape[e] == 1 for e in range(d, rank))), None)
        level = None if reduced else level
        hoist.append(level)
        placement.append("point" if level is None else f"hoist {level}")
    nests: dict[tuple[int, ...], list[int]] = {}
    for i, instr in enumerate(kernel.body):
        if instr.op in WRITE_OPS:
            nests.setdefault(varies[i], []).append(i)
    reason = unsupported(kernel)
    return KernelPlan(
        kernel.name, kernel.grid, kernel.domain[kernel.grid_rank:],
        split_parts(kernel) if reason is None else 0, tuple(placement),
        tuple((dims, tuple(stores)) for dims, stores in nests.items()),
        tuple(accumulator(kernel, i, caps) for i, x in enumerate(kernel.body)
              if x.op in ("reduce", "contract")),
        reason, tuple(hoist), tuple(varies), column_tile(kernel, caps) if reason is None else 0)


def dump(program: Program, caps: Capabilities = _PLAIN) -> str:
    """Every kernel's plan, as text (the ``loops`` dump stage)."""
    return "\n\n".join(plan(k, caps).dump() for k in program.kernels) + "\n"
