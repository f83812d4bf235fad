"""The Triton renderer: one scheduled Atlas kernel -> one ``@triton.jit`` function.

The shape of every kernel is Inductor's: a 1-D grid of program instances, each taking
``XBLOCK`` consecutive grid points (row-major) as the rows of its tiles; values computed
once per grid point are ``[XBLOCK, 1]`` tiles. The loop dimensions of a reduction or of a
store nest are walked as one flat index, ``RBLOCK`` at a time (``for r0 in range(0, n,
RBLOCK)``), as ``[1, RBLOCK]`` tiles; values recomputed in the nest (the loop plan's
``nest`` placement, :mod:`hologram.codegen.loops`) are ``[XBLOCK, RBLOCK]`` tiles. A
reduction accumulates elementwise in an ``[XBLOCK, RBLOCK]`` accumulator inside the loop
(a looped reduction; one trip when the row fits, i.e. persistent) and folds the lanes at
the end with ``tl.sum`` / ``tl.max`` / ``tl.min``. Few long rows are split (:func:`split`):
program instances compute partials per (row, chunk) into scratch buffers, and the last of
a row's to finish combines them and runs the rest of the kernel, all in one launch.

Registers: f64 values are float64 tiles; f16, bf16 and f32 values are float32 tiles
(f16/bf16 arithmetic reaches here as f32 operations and a rounding cast,
:mod:`hologram.compiler.passes.decompose`), so bf16 is never a Triton type: it is stored as
its 16 bits (an ``*i16`` pointer) and widened and rounded (to nearest even) with integer
operations. bool is ``int1`` (a byte in memory), the integer types are themselves. Float sums
accumulate in lanes of the register type with Kahan compensation;
max/min/argmax/argmin compare total-order integer keys of the bits (NaN wins, ``-0.0 <
+0.0``, ties go to the first index), so the result is the ISA's whatever the hardware's
float min/max does with NaN and signed zeros. Division and square root are the correctly
rounded ``tl.div_rn`` / ``tl.sqrt_rn`` (``/`` and ``tl.sqrt`` may be approximate on NVIDIA
GPUs), float mod is an exact remainder of the significands (``hg_fmod_*``), and kernels
are compiled with ``enable_fp_fusion=False`` (a multiply and an add are never contracted
to an FMA, which would round once instead of twice). The transcendental
functions are the shared algorithms of :mod:`hologram.codegen.mathlib`, written out by
:class:`.mathlib.TritonEmitter`: the same bits as the cpu backend's.

Reductions are written by :mod:`.reduce`, matrix products (``tl.dot`` tiles, split-K) by
:mod:`.matmul`, and each dtype's Triton types come from :mod:`.values`.

Indices (grid points, loop indices, coordinates, element addresses) are int32 in a kernel
whose index arithmetic stays below ``WIDE_INDICES`` (2**31; :meth:`_Kernel.reach`), the
fast case; a kernel that may reach it (a buffer of 2**31 elements or more, or as many
points) computes them in int64, as PyTorch's kernels switch to 64-bit indexing: its
program id and every ``tl.arange`` tile an index is made from are widened
(``.to(tl.int64)``) before they are scaled or added, so everything derived from them is
int64 (Python literals take the tile's type in Triton; a lone one past int32 is int64 or
a zero-extended uint32 offset).

A ``scatter`` (docs/isa.md) is written where a store would be (:meth:`_Kernel.scatter`).
Its writes to one element all come from one grid point (the schedule keeps only disjoint
dimensions on the grid), so the rows of a tile write different elements; one grid
point's writes along its nest are taken ``RBLOCK`` at a time, in index order, and applied
in *rounds*: a write's round is the number of earlier writes of its tile to the same
element (an ``[XBLOCK, RBLOCK, RBLOCK]`` comparison), so one round writes distinct
elements, in parallel, and every element sees its writes in index order. A barrier
follows each round (the next one may read what another thread of the program wrote). A
``replace`` tile is one round: only each element's last write in the tile is made.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hologram.codegen import loops, schedule
from hologram.codegen import mathlib as shared_math
from hologram.codegen.gpu_kernel import KernelWriter, gather_clamp, row_major
from hologram.compiler.capabilities import Capabilities
from hologram.errors import CompileError
from hologram.isa import dtypes as dt
from hologram.isa.dtypes import DType
from hologram.isa.ir import Instr, Kernel, Program

from .mathlib import F32, F64, TritonEmitter
from .matmul import Products, matmul_tiles
from .ops import Ops
from .reduce import Reductions
from .values import (
    BITS,
    POINTER,
    POINTER_OF,
    SCRATCH,
    TL,
    f32_bits,
    pow2,
    program_dtype,
    wrap32,
)

#: Elements of one tile (XBLOCK * RBLOCK) at most, and the widest RBLOCK: a row of up to
#: 4096 terms is one tile, read once per pass (on an H100, softmax of 4096x4096 f32 took
#: 83 us with 1024-wide tiles, 60 with rows whole; a 1e8-term sum read 2.45 TB/s with
#: 1024, 2.72 with 4096).
TILE = 4096
MAX_RBLOCK = 4096
#: Split reductions (:func:`split`): a kernel that reduces long rows into few outputs
#: computes partials over chunks of each row, then their combination, so that the whole
#: GPU works on it. Chunks hold at least ``SPLIT_WORK`` terms (4 or more ``RBLOCK`` trips:
#: the partials' memory traffic and their combination stay small beside the reads), and
#: a row is cut into at most ``MAX_PARTS`` of them, only as many as it takes
#: to give ``SPLIT_PROGRAMS`` program instances (about eight per SM of an H100's 132, ten
#: of an A100's 108: on an H100 a 1e8-term sum read 1.0 TB/s with 256, 2.4 with 1024).
#: ``MAX_PARTS`` is also the widest tile of their combination (``MAX_RBLOCK``). Fixed
#: numbers, not the device's: the result is the same bits on every GPU.
#: Tests lower ``SPLIT_WORK`` (the backend's target string then names it, so cached
#: artifacts never mix).
SPLIT_WORK = 1 << 14
MAX_PARTS = 1024
SPLIT_PROGRAMS = 1024
#: Split-K (:func:`split_k`): a matrix product with fewer than ``SPLIT_K_TILES`` output
#: tiles (half an H100's SMs would idle) and a long k computes partial tiles over chunks of
#: k, combined by the tile's last program instance (as a split reduction's rows). Chunks
#: hold at least ``SPLIT_K_WORK`` indices of k, a tile's k is cut into at most
#: ``MAX_K_PARTS`` of them, only as many as it takes to give ``SPLIT_K_PROGRAMS`` program
#: instances (two per SM of an H100). The partial tiles cost a write and a read of
#: ``parts`` tiles of f32 per output tile, which more tiles would not repay. Fixed
#: numbers, not the device's: the result is the same bits on every GPU. Tests lower
#: ``SPLIT_K_WORK``.
SPLIT_K_TILES = 66
SPLIT_K_WORK = 1024
MAX_K_PARTS = 16
SPLIT_K_PROGRAMS = 264
#: A scatter nest's writes per tile row at most: its rounds compare every write of a row
#: with every other, an ``[XBLOCK, RBLOCK, RBLOCK]`` tile of at most ``TILE`` elements.
SCATTER_RBLOCK = 64
#: Index width: a kernel whose indices may reach this many (:meth:`_Kernel.reach`: the
#: elements of a buffer it touches, the points of its domain, a split's chunks and
#: partials) computes them in int64, every other one in int32 (faster: 64-bit products,
#: divisions and remainders take several instructions; its source is the same as before
#: int64 indices existed). Tests lower it to run the int64 kernels of small programs (the
#: backend's target string then names it, so cached artifacts never mix).
WIDE_INDICES = 2**31
def blocks(kernel: Kernel) -> tuple[int, int]:
    """``(XBLOCK, RBLOCK)`` of a kernel: rows of grid points per program instance, and
    the flat loop index's tile (1 when it has no loop dimensions). A kernel that scatters
    along its loop dimensions takes at most ``SCATTER_RBLOCK`` writes per row and keeps
    ``XBLOCK * RBLOCK**2`` within ``TILE`` (its rounds' comparisons)."""
    loop_extent = math.prod(kernel.domain[kernel.grid_rank:])
    rblock = min(pow2(loop_extent), MAX_RBLOCK) if loop_extent > 1 else 1
    points = math.prod(kernel.grid)
    rank = len(kernel.domain)
    if any(x.op == "scatter" and any(x.shape[d] > 1 for d in range(kernel.grid_rank, rank))
           for x in kernel.body):
        rblock = min(rblock, SCATTER_RBLOCK)
        return min(pow2(points), max(1, TILE // (rblock * rblock)), 1024), rblock
    return min(pow2(points), TILE // rblock, 1024), rblock


def split(kernel: Kernel, caps: Capabilities) -> tuple[int, int, int]:
    """``(parts, chunk, rblock)``: into how many partials of ``chunk`` flat reduced indices
    each row of ``kernel``'s reduction is split, walked ``rblock`` at a time (``(0, 0,
    0)``: not split).

    Split: a kernel whose one reduction is not a matrix product, whose stores are all made
    once per grid point, and whose rows would otherwise give fewer than
    ``SPLIT_PROGRAMS`` program instances, with at least two chunks of ``SPLIT_WORK`` terms
    per row. The partials' kernel runs one program instance per (row, chunk), with
    ``parts`` at most ``MAX_PARTS`` and no more than ``SPLIT_PROGRAMS / rows`` needs
    (``caps.row_split``, :func:`hologram.codegen.schedule.parts`). ``chunk`` is a whole
    number of ``RBLOCK`` tiles, and no partial is empty."""
    layout = loops.plan(kernel, caps)
    reductions = [x for x in kernel.body if x.op in ("reduce", "contract")]
    rule = caps.row_split
    if (rule is None or layout.unsupported or 0 in kernel.domain or len(reductions) != 1
            or any(dims for dims, _ in layout.store_nests)
            or loops.matmul(kernel, layout) is not None):
        return 0, 0, 0
    total = math.prod(kernel.domain[d] for d in reductions[0].axes)
    xblock, rblock = blocks(kernel)
    rows = math.prod(kernel.grid)
    if -(-rows // xblock) >= rule.units:
        return 0, 0, 0
    # The partials' kernel takes one row per program instance.
    parts = schedule.parts(rule, total, rows)
    if not parts:
        return 0, 0, 0
    # A tile no wider than a chunk (a power of two): rows cut into short chunks (tests
    # lower SPLIT_WORK) keep at least two.
    rblock = min(rblock, 1 << ((-(-total // parts)).bit_length() - 1))
    return (*schedule.chunks(total, parts, rblock), rblock)


def split_k(kernel: Kernel, caps: Capabilities, tf32: bool = False) -> tuple[int, int]:
    """``(parts, chunk)``: into how many chunks of ``chunk`` indices of k a matrix
    product's tiles are split (``(0, 0)``: not split). Split: a matrix product of fewer
    than ``SPLIT_K_TILES`` tiles whose k holds at least two chunks of ``SPLIT_K_WORK``;
    ``parts`` at most ``MAX_K_PARTS`` and no more than ``SPLIT_K_PROGRAMS / tiles``
    needs (``caps.k_split``); ``chunk`` a whole number of ``BK``, no part empty."""
    plan = loops.plan(kernel, caps)
    mm = None if plan.unsupported or 0 in kernel.domain else loops.matmul(kernel, plan)
    if mm is None or caps.k_split is None:
        return 0, 0
    bm, bn, bk, _ = matmul_tiles(kernel, mm, tf32)
    k = kernel.domain[mm.k]
    tiles = mm.batch * -(-kernel.domain[mm.m] // bm) * -(-kernel.domain[mm.n] // bn)
    if tiles >= SPLIT_K_TILES:
        return 0, 0
    parts = schedule.parts(caps.k_split, k, tiles)
    if not parts:
        return 0, 0
    return schedule.chunks(k, parts, bk)


def render(program: Program, kernel: Kernel, caps: Capabilities,
           scratch: int = 0, tf32: bool = False) -> dict:
    """The Triton function of ``kernel`` and what compiling and launching it needs:
    ``{"name", "source", "signature", "buffers", "writes", "grid", "xblock", "rblock",
    "num_warps", "num_stages", "parts", "scratch"}`` (``buffers``: buffer indices, one
    per pointer argument; ``writes``: those it stores to; ``parts``: chunks per row of a
    split reduction, else 0). A split reduction (:func:`split`) keeps
    its partials and a counter per row in scratch buffers numbered from ``scratch`` (past
    the program's buffers; ``scratch`` lists them as ``{"index", "dtype", "count",
    "zeroed"}``, a NumPy dtype; ``zeroed``: zero before the first launch, and left zero by
    every launch). ``tf32``: f32 matrix products round their operands to TF32
    (``HOLOGRAM_CUDA_ALLOW_TF32``)."""
    parts, chunk, rblock = split(kernel, caps)
    if parts:
        return _Kernel(program, kernel, caps, split=(parts, chunk, scratch),
                       rblock=rblock).render()
    parts, chunk = split_k(kernel, caps, tf32)
    return _Kernel(program, kernel, caps, tf32=tf32,
                   split_k=(parts, chunk, scratch) if parts else None).render()


class _Kernel(Ops, Products, Reductions, KernelWriter):
    """Triton's spelling of the shared walk (:mod:`hologram.codegen.gpu_kernel`): values
    are tiles of ``XBLOCK`` grid points under a mask (``mask``, ``zero``), loop nests and
    reductions walk their flat index ``RBLOCK`` at a time, and the kernel's frame is one
    of a plain grid, a split reduction or a matrix product (split-K included)."""

    target = "cuda"

    def __init__(self, program: Program, kernel: Kernel, caps: Capabilities,
                 split: tuple[int, int, int] | None = None, tf32: bool = False,
                 rblock: int = 0, split_k: tuple[int, int, int] | None = None):
        super().__init__(program, kernel, caps)
        self.tf32 = tf32
        # Split-K: (parts, chunk of k, first scratch buffer); see matmul.
        self.split_k = split_k
        self.k_scratch: list[dict] = []  # its partial tiles and counters (combine_k)
        # A zero extent is fine here: an empty loop runs no trips, an empty grid none.
        if self.plan.unsupported and 0 not in kernel.domain:
            raise CompileError(f"cuda: kernel {kernel.name} cannot be rendered: "
                               f"{self.plan.unsupported}")
        self.xblock, self.rblock = blocks(kernel)
        if split is not None:  # one row per program instance, its chunk's tile
            self.xblock, self.rblock = 1, rblock
        # A split reduction: (parts, chunk, first scratch buffer); ``partials`` names the
        # scratch buffer of each field of the partial state (name -> (buffer, register
        # type)), written by every chunk's program instance, read by the row's last.
        self.split = split
        # int64 indices where they may reach 2**31 (WIDE_INDICES), else int32
        self.wide = self.reach() >= WIDE_INDICES
        self.index_t = "tl.int64" if self.wide else "tl.int32"
        self.partials: dict[str, tuple[int, str]] | None = None
        self.mask = "xmask"
        self.zero = "xzero"  # a zero index tile (index_t) of the mask's shape
        self.width = 1  # the flat loop index's tile in the current store nest (1: none)
        self.stages = 1  # Triton's software pipeline: only matrix products' loads gain
        self.warps: int | None = None  # by the tile's size unless a matrix product sets it

    # --- text ---------------------------------------------------------------------------
    def bind(self, expr: str) -> str:
        self.names += 1
        name = f"t{self.names}"
        self.line(f"{name} = {expr}")
        return name

    # --- indices ------------------------------------------------------------------------
    def reach(self) -> int:
        """A bound on this kernel's index arithmetic: the largest of the sizes of the
        buffers it touches (every address of an unmasked lane, and every partial sum of
        one, is an element of its buffer), the grid's points and the loop dimensions'
        (the flat indices: the grid's, a nest's or a reduction's over some of the loop
        dimensions, a matrix product's rows, columns and k; their tiles end at most one
        power-of-two block past them, which 2**31 is a multiple of), a split reduction's
        chunks (``parts * chunk`` per row) and partials (``points * parts``), a split
        matrix product's chunks of k and partial tiles."""
        kernel = self.kernel
        counts = [math.prod(kernel.grid), math.prod(kernel.loops)]
        counts += [self.program.buffers[b].size for b in kernel.reads() | kernel.writes()]
        if self.split is not None:
            parts, chunk, _ = self.split
            counts += [parts * chunk, math.prod(kernel.grid) * parts]
        if self.split_k is not None:
            parts, chunk, _ = self.split_k
            mm = loops.matmul(kernel, self.plan)
            bm, bn, _, _ = matmul_tiles(kernel, mm, self.tf32)
            tiles = mm.batch * -(-kernel.domain[mm.m] // bm) * -(-kernel.domain[mm.n] // bn)
            counts += [parts * chunk, tiles * parts * bm * bn]
        return max(counts)

    def pid(self) -> str:
        """The program instance's number, int64 in a wide kernel."""
        return "tl.program_id(0).to(tl.int64)" if self.wide else "tl.program_id(0)"

    def arange(self, n: int, column: bool) -> str:
        """``tl.arange(0, n)`` as a column (``[:, None]``) or a row (``[None, :]``) of an
        index tile, int64 in a wide kernel."""
        tile = f"tl.arange(0, {n})[{':, None' if column else 'None, :'}]"
        return f"{tile}.to(tl.int64)" if self.wide else tile

    # --- structure ----------------------------------------------------------------------
    def render(self) -> dict:
        kernel = self.kernel
        mm = loops.matmul(kernel, self.plan)
        scratch: list[dict] = []
        if self.split is not None:
            grid, tile, scratch = self.split_reduction()
        elif mm is not None:
            grid, tile, scratch = self.matmul(mm), TILE, self.k_scratch
        else:
            grid, tile = self.points(), self.xblock * self.rblock
        self.write_stores()
        buffers = self.buffers()
        signature = {f"b{i}": POINTER[program_dtype(self.program, i)] for i in buffers}
        for s in scratch:
            buffers.append(s["index"])
            signature[f"b{s['index']}"] = POINTER_OF[s["dtype"]]
        if self.split is not None:
            self.line(f"tl.store(b{scratch[-1]['index']} + row, 0)")  # for the next launch
        return self.function(f"hg_{kernel.name}", buffers, signature,
                             sorted(kernel.writes()) + [s["index"] for s in scratch], grid,
                             tile, scratch)

    def function(self, name: str, buffers: list[int], signature: dict[str, str],
                 writes: list[int], grid: int, tile: int, scratch: list[dict]) -> dict:
        args = ", ".join(f"b{i}" for i in buffers)
        source = f"@triton.jit\ndef {name}({args}):\n" + "\n".join(self.lines) + "\n"
        return {"name": name, "source": source, "signature": signature,
                "buffers": buffers, "writes": writes, "grid": grid,
                "xblock": self.xblock, "rblock": self.rblock,
                "num_warps": self.warps or (4 if tile <= 2048 else 8),
                "num_stages": self.stages,
                "parts": (self.split or self.split_k or (0,))[0],
                "scratch": scratch}

    def split_reduction(self) -> tuple[int, int, list[dict]]:
        """A split reduction in one launch: program instance ``pid`` reduces chunk
        ``pid % parts`` of row ``pid // parts`` and stores the row's partial state
        (:meth:`reduce`) at ``row * parts + chunk`` of one scratch buffer per field, then
        counts itself done on the row's counter; the row's last one (whichever it is)
        combines the row's partials (:meth:`combine`, always in chunk order: the same bits
        whatever the order of arrival) and runs the rest of the kernel, then clears the
        counter. Returns the number of program instances, the tile, and the scratch
        buffers."""
        kernel = self.kernel
        parts, chunk, first = self.split
        points = math.prod(kernel.grid)
        position = next(i for i, x in enumerate(kernel.body) if x.op in ("reduce", "contract"))
        instr = kernel.body[position]
        self.line(f"pid = {self.pid()}")
        self.line(f"part = pid % {parts}")
        self.line(f"row = pid // {parts}")
        self.line(f"x = row + {self.arange(1, True)}")
        self.line(f"xmask = x < {points}")
        self.line("xzero = x * 0")
        self.grid_indices()
        for arg in instr.args:
            self.prepare(arg)
        state = self.reduce(position, instr, part=("part", chunk))
        tile = self.xblock * self.rblock
        self.partials, scratch = {}, []
        for n, (field, (value, reg)) in enumerate(state.items()):
            index = first + n
            self.partials[field] = (index, reg)
            scratch.append({"index": index, "dtype": SCRATCH[reg][1],
                            "count": points * parts, "zeroed": False})
            self.line(f"tl.store(b{index} + x * {parts} + part + xzero, {value}, mask=xmask)")
        counter = first + len(state)
        scratch.append({"index": counter, "dtype": "i4", "count": points, "zeroed": True})
        # Every thread's partial is stored (the barrier) before the count is taken
        # (release); the last program sees every partial (acquire).
        self.line("tl.debug_barrier()")
        self.line(f"done = tl.atomic_add(b{counter} + row, 1, sem=\"acq_rel\")")
        self.line(f"if done == {parts - 1}:")
        self.depth += 1
        rblock = self.rblock
        self.combine(position, instr)
        self.rblock = rblock  # the kernel's tile is the partials'
        # Four warps: at eight, ptxas spilled registers of a bf16 max for sm_80 (at four,
        # every conformance split kernel compiles without spills for sm_80 and sm_90).
        self.warps = 4
        return points * parts, tile, scratch

    def points(self) -> int:
        """The grid-point rows of this program instance (``x``, ``xmask``) and their
        indices; the number of program instances."""
        kernel = self.kernel
        points = math.prod(kernel.grid)
        self.line(f"x = {self.pid()} * {self.xblock} + {self.arange(self.xblock, True)}")
        self.line(f"xmask = x < {points}")
        self.line("xzero = x * 0")
        self.grid_indices()
        return -(-points // self.xblock)

    def grid_indices(self) -> None:
        """The index tile of each grid dimension, from the flat grid point ``x``."""
        self.coordinates("x", range(self.kernel.grid_rank), outermost_remainder=True)

    def coordinates(self, flat: str, dims: Sequence[int], stride: int = 1,
                    outermost_remainder: bool = False) -> None:
        """Bind the index tile of each of ``dims`` (row-major: the last varies fastest)
        from the flat index ``flat`` counted in units of ``stride`` elements: ``(flat //
        stride) % n``. A dimension of extent 1 gets none (its index is 0). The innermost
        takes no division and the outermost no remainder: ``flat`` is below the product of
        the extents wherever a lane is not masked off (``x < points``, ``f < total``, every
        ``pid``), and a masked lane's index reaches no memory. That is a division or a
        remainder less per term: none at all for one dimension (a sum of a vector).
        ``outermost_remainder`` keeps the remainder (the grid's indices: one per grid
        point, so cheap, and sm_80's ptxas spilled the f32 fmod kernel's registers without
        it)."""
        shown = list(row_major(self.kernel.domain, dims, stride))
        for d, stride, n in shown:
            term = flat if stride == 1 else f"({flat} // {stride})"
            last = d == shown[-1][0] and not outermost_remainder
            self.index[d] = self.bind(term if last else f"{term} % {n}")

    def buffers(self) -> list[int]:
        k = self.kernel
        return sorted(k.reads() | k.writes())

    def nest(self, dims: list[int], body) -> None:
        """``body`` once per grid point (no ``dims``), or in a loop over the flat index of
        ``dims``, RBLOCK at a time."""
        self.local = {}
        if not dims:
            self.mask, self.zero, self.width = "xmask", "xzero", 1
            body()
            return
        total = math.prod(self.kernel.domain[d] for d in dims)
        rblock = self.width = min(pow2(total), self.rblock)
        self.open_loop(dims, total, total, rblock)
        body()
        self.depth -= 1
        for d in dims:
            self.index.pop(d, None)
        self.local = {}
        self.mask, self.zero = "xmask", "xzero"

    def open_loop(self, dims: list[int], total: int, span: int, rblock: int,
                  start: str = "") -> str:
        """Open a loop over ``span`` positions of the flat index of ``dims`` (of ``total``
        in all), ``rblock`` lanes at a time from ``start``, with the lanes' mask and zero
        and their coordinates; the name of the lanes' flat index. The caller closes it
        (``self.depth -= 1``)."""
        self.names += 1
        r0, flat = f"r{self.names}", f"f{self.names}"
        self.line(f"for {r0} in range(0, {span}, {rblock}):")
        self.depth += 1
        self.line(f"{flat} = {start}{r0} + {self.arange(rblock, False)}")
        self.mask = self.bind(f"xmask & ({flat} < {total})")
        self.zero = self.bind(f"xzero + {flat} * 0")
        self.coordinates(flat, dims)
        return flat

    def store_nest(self, dims: list[int], stores: list[Instr]) -> None:
        self.nest(dims, lambda: [self.write(s) for s in stores])

    # --- values -------------------------------------------------------------------------
    def point_reduction(self, i: int, instr: Instr) -> str:
        return self.reduce(i, instr)

    def nested_reduction(self, i: int, instr: Instr) -> str:
        # The loop plan places every reduction per grid point for this backend.
        raise CompileError(f"cuda: kernel {self.kernel.name}: reduction %{i} "
                           "inside a loop nest")

    def address(self, instr: Instr) -> str:
        terms = [self.zero, str(instr.map.offset)] if self.zero else [str(instr.map.offset)]
        terms += [f"{index} * {stride}" for index, stride in self.index_strides(instr)]
        return " + ".join(terms)

    def gather_address(self, instr: Instr) -> str:
        """A gather's (or scatter's) element (docs/isa.md): the map's element plus the
        operand clamped to the instruction's bounds, in the kernel's index type like
        every other address.

        The bounds are cut to the operand dtype's range here, so the clamp is exact in
        the operand's own width (int32 for the narrow ones, int64 for i64) and skips a
        side the operand cannot pass; bounds wholly outside that range make the clamped
        operand a constant. In an int32 kernel the clamped operand (an i64 one truncated)
        and the map's terms are then added in wrapping int32: the verifier has checked
        that the exact sum is an element of the buffer (below 2**31: a larger buffer
        makes the kernel wide, :meth:`reach`), so the sum modulo 2**32 is that element
        even where the map's own terms or the bounds lie outside 32 bits (constants are
        wrapped here, so no literal widens the sum to int64). In a wide kernel the
        clamped operand is widened to int64 (an i64 one kept whole) and the terms and
        constants are exact."""
        operand = self.kernel.body[instr.args[-1]].dtype  # a scatter's second operand
        k = self.value(instr.args[-1])
        clamp = gather_clamp(self.kernel, instr)
        terms = [self.zero] if self.zero else []
        # int64 sums are exact; int32 ones wrap (their literals wrapped too)
        literal = (lambda v: v) if self.wide else wrap32
        if clamp.operand:
            if operand.name not in ("i32", "i64"):
                k = f"{k}.to(tl.int32)"  # u8 zero-extended, i8/i16 sign-extended
            if clamp.low is not None:
                k = f"tl.maximum({k}, {clamp.low})"
            if clamp.high is not None:
                k = f"tl.minimum({k}, {clamp.high})"
            if self.wide:
                terms.append(self.bind(k if operand.name == "i64" else f"({k}).to(tl.int64)"))
            else:
                terms.append(self.bind(f"({k}).to(tl.int32)" if operand.name == "i64" else k))
        terms.insert(1, str(literal(clamp.offset)))
        terms += [f"{index} * {literal(stride)}" for index, stride in self.index_strides(instr)]
        return " + ".join(terms)

    def load(self, instr: Instr, address: str | None = None, mask: str | None = None,
             raw: bool = False) -> str:
        """A load's value, or a gather's (``address``: :meth:`gather_address`), or the
        element a scatter combines with (``mask``: the writes of its round); ``raw``: the
        storage type's value (f16 as f16). No mask: every element is inside."""
        t, buf = instr.dtype.name, instr.buffer
        if 0 in instr.shape:  # nothing to read (the loop plan places it per grid point)
            return self.constant(0, instr.dtype)
        scalar = address is None and not self.index_strides(instr)
        address = self.address(instr) if address is None else address
        mask = self.mask if mask is None else mask
        if scalar and mask is not None:
            # One element for the whole tile (a broadcast operand of a product): Triton
            # takes no tile mask on a scalar pointer, and the element is inside.
            value = self.bind(f"tl.where({mask}, tl.load(b{buf} + ({address})), 0)")
        else:
            masked = "" if mask is None else f", mask={mask}, other=0"
            value = self.bind(f"tl.load(b{buf} + ({address}){masked})")
        if raw:
            return value
        if t == "bool":
            return self.bind(f"{value} != 0")
        if t == "f16":
            return self.bind(f"{value}.to(tl.float32)")
        if t == "bf16":
            return self.bind(f"hg_bf16_to_f32({value})")
        return value

    def store(self, instr: Instr, address: str | None = None, value: str | None = None,
              mask: str | None = None) -> None:
        """A store of its operand at its map's element, or (a scatter's) ``value`` at
        ``address`` where ``mask``."""
        t, buf = instr.dtype.name, instr.buffer
        value = self.value(instr.args[0]) if value is None else value
        address = self.address(instr) if address is None else address
        mask = self.mask if mask is None else mask
        if t == "bool":
            value = f"{value}.to(tl.uint8)"
        elif t == "f16":
            value = f"{value}.to(tl.float16)"
        elif t == "bf16":
            value = f"hg_f32_to_bf16({value})"
        self.line(f"tl.store(b{buf} + ({address}), {value}, mask={mask})")

    def scatter(self, instr: Instr) -> None:
        """The writes of a scatter in the current nest's tile (see the module docstring).

        Rows (grid points) write disjoint elements. Along a nest, column ``j`` of a row is
        its tile's ``j``-th write in index order; its round is the number of earlier
        writes of the row to the same element, so a round's writes are to distinct
        elements and each element gets its writes in index order, each combined with what
        the one before left (a load, the mode's operation, a store; f16/bf16 computed in
        f32 and rounded once). A barrier after each round makes its writes visible to every
        thread of the program before the next round (or tile) reads them. ``replace``
        needs one round: each element's last write in the tile."""
        value = self.value(instr.args[0])
        address = self.bind(self.gather_address(instr))
        if self.width == 1:  # one write per grid point: the rows' elements are disjoint
            self.combine_write(instr, address, value, self.mask)
            return
        # [row, j, k]: write k of the row is made and reaches write j's element
        same = self.bind(f"({address}[:, :, None] == {address}[:, None, :]) & "
                         f"{self.mask}[:, None, :]")
        j = self.bind(f"tl.arange(0, {self.width})")
        k_vs_j = f"{j}[None, None, :] {{}} {j}[None, :, None]"
        if instr.mode == "replace":
            later = self.bind(f"tl.sum(({same} & ({k_vs_j.format('>')})).to(tl.int32), 2)")
            self.store(instr, address, value, self.bind(f"{self.mask} & ({later} == 0)"))
            self.line("tl.debug_barrier()")
            return
        rank = self.bind(f"tl.sum(({same} & ({k_vs_j.format('<')})).to(tl.int32), 2)")
        rounds = self.bind(f"tl.max(tl.where({self.mask}, {rank}, 0))")
        self.names += 1
        step = f"q{self.names}"
        self.line(f"for {step} in range(0, {rounds} + 1):")
        self.depth += 1
        self.combine_write(instr, address, value, self.bind(f"{self.mask} & ({rank} == {step})"))
        self.line("tl.debug_barrier()")
        self.depth -= 1

    def combine_write(self, instr: Instr, address: str, value: str, mask: str) -> None:
        """One write of a scatter per element of ``address`` where ``mask`` (distinct
        elements): ``value`` itself, or the mode's operation on the element and
        ``value``."""
        t = instr.dtype
        if instr.mode != "replace":
            old = self.load(instr, address, mask)
            if instr.mode in ("max", "min"):
                value = self.extreme(old, value, t, instr.mode == "max")
            else:
                value = self.rounded(self.bind(f"{old} {'+' if instr.mode == 'add' else '*'} "
                                               f"{value}"), t)
        self.store(instr, address, value, mask)

    def extreme(self, a: str, b: str, t: DType, largest: bool) -> str:
        """The ISA's ``max``/``min`` of ``a`` and ``b`` (bool: or/and): for floats NaN if
        either is NaN, and ``-0.0 < +0.0``, whatever the hardware's min/max does with
        them."""
        if t.is_bool:
            return self.bind(f"{a} | {b}" if largest else f"{a} & {b}")
        if not t.is_float:
            return self.bind(f"tl.{'maximum' if largest else 'minimum'}({a}, {b})")
        bits, _ = BITS[TL[t.name]]
        negative = self.bind(f"{a}.to({bits}, bitcast=True) < 0")
        # On a tie (equal values: the zeros differ in sign only) a is kept unless it is
        # -0.0 (max) or +0.0 (min).
        if largest:
            pick = self.bind(f"({a} > {b}) | (({a} == {b}) & ~{negative})")
        else:
            pick = self.bind(f"({a} < {b}) | (({a} == {b}) & {negative})")
        nan = self.bind(f"({a} != {a}) | ({b} != {b})")
        return self.bind(f"tl.where({nan}, {a} + {b}, tl.where({pick}, {a}, {b}))")

    def constant(self, value, t: DType) -> str:
        if t.is_bool:
            return self.bind(f"tl.full([1, 1], {int(bool(value))}, tl.int1)")
        if t is dt.float64:
            return TritonEmitter(self.bind, F64).c(float(value))
        if t.is_float:
            return self.bind(f"hg_f32_bits({f32_bits(float(value))})")
        return self.bind(f"tl.full([1, 1], {int(value)}, {TL[t.name]})")

    def index_value(self, axis: int, t: DType) -> str:
        index = self.index.get(axis)
        if index is None:
            return self.constant(0, t)
        return self.bind(f"({index}).to({TL[t.name]})")

    def compute(self, instr: Instr, a: DType, args: list[str]) -> str:
        if instr.op in shared_math.FUNCTIONS:
            return shared_math.emit(self.math(a), instr.op, *args)
        return self.bind(self.apply(instr.op, args, a, instr.dtype))

    def math(self, t: DType) -> TritonEmitter:
        """The shared algorithms' primitives for float registers of dtype ``t``."""
        return TritonEmitter(self.bind, F64 if t is dt.float64 else F32)
