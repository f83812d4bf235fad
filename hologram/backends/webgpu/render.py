"""The WGSL renderer: one scheduled Atlas kernel -> one compute shader.

The loop plan (:func:`hologram.codegen.loops.plan`) says where each value is computed: once
per grid point, or recomputed inside a loop nest over the loop dimensions it varies along.
A kernel runs in one of two modes:

- **thread**: one invocation per grid point (:data:`WORKGROUP` per workgroup); its loop
  nests and any reductions run sequentially in the invocation. Elementwise kernels (grid
  = shape) use it, and kernels with enough grid points (a matmul's outputs).
- **group**: one workgroup per grid point, for kernels with a reduction computed once per
  grid point and fewer than :data:`GROUP_POINTS` points. Every such reduction is shared:
  invocation ``t`` folds the terms ``t, t + WORKGROUP, ...`` of the reduction's flat
  index, and the partials meet in a tree in workgroup memory (``log2(WORKGROUP)`` levels
  with a barrier each; nothing assumes a subgroup size). Store nests are split the same
  way; stores of per-point values are made by invocation 0.

Grid points are numbered in row-major order and the number of workgroups is folded into
two dimensions of at most :data:`MAX_GROUPS` each (:func:`dispatch`).

Storage is 32-bit words (WGSL has no 8- or 16-bit storage): every buffer is bound as
``array<u32>``, 32-bit values are bit casts of a word, bool/i8/u8 take a byte and
i16/f16/bf16 half a word. A kernel that stores a narrow type binds that buffer as
``array<atomic<u32>>`` and stores with ``atomicAnd``/``atomicOr`` on its bits alone, so
neighbours written by other invocations are kept. Registers: bool is ``bool``, i8/i16/i32
are ``i32`` (wrapped to their width after every operation), u8 is ``u32``, f16/bf16/f32
are ``f32`` (f16/bf16 arithmetic reaches here as f32 operations and a cast back,
:mod:`hologram.compiler.passes.decompose`; every cast to them rounds); i64 is
``vec2<u32>`` (low, high), two words in memory, its operations in :meth:`_Kernel.wide`.
Float results and constants pass through :func:`.mathlib.opaque` / ``f32_literal``, so
the driver cannot fold or reassociate them.

Reductions accumulate as :mod:`.reduce` says (compensated float sums, float products
with their own exponent, total-order keys for the extremes); matrix products run tiled
(:mod:`.tiling`); every other instruction is :mod:`.ops`'s (the op table, casts, i64 on
two words), and each dtype's registers and sizes come from :mod:`.values`.

A ``scatter`` (docs/isa.md) is written where a store would be, by one invocation per grid
point walking its nest's loops in order (in the group mode, invocation 0 of the
workgroup): its writes to one element come from one grid point (the schedule keeps only
disjoint dimensions on the grid), in index order. Each write loads the element, combines
(the op's own WGSL, f16/bf16 in f32 rounded once, i64 in two words) and stores it, narrow
elements through the atomic bit updates stores use (a neighbour in the same word may
belong to another grid point). A grid point makes at most :data:`MAX_SERIAL_WRITES`
writes: Mesa's lavapipe (the Vulkan driver the tests run on) ends an invocation's loops
after 65535 iterations in all, silently, so a longer walk would drop writes; the renderer
refuses such a kernel with a :class:`CompileError` instead.

That limit holds for every loop: a sum of 2^22 terms (65,536 per invocation) in one
workgroup came back as 131,070 from lavapipe. So the renderer counts the loop iterations
one invocation runs at most (``iterations`` in a kernel's artifact: every loop's trips
and its last test, times the trips of the loops around it), and on a CPU-emulated
adapter a kernel over :data:`EMULATED_LOOP_LIMIT` is refused when it is loaded
(:mod:`.backend`); GPUs have no such limit. Long reductions of few outputs are split
over workgroups (:func:`split`: partial states per chunk of a row, combined in a later
shader of the same launch), which keeps each invocation's share under the limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from hologram.codegen import loops, schedule
from hologram.codegen import mathlib as shared_math
from hologram.codegen.gpu_kernel import KernelWriter, gather_clamp, row_major
from hologram.compiler.capabilities import Capabilities
from hologram.errors import CompileError
from hologram.isa import dtypes as dt
from hologram.isa.dtypes import DType
from hologram.isa.ir import Instr, Kernel, Program

from . import bitlib, tiling
from .mathlib import PRELUDE, WGSLEmitter, f32_literal, i32_literal, opaque, pow_f32
from .ops import Ops
from .reduce import Accumulator, Reductions, shared_array
from .values import BYTES, REG, WORKGROUP

#: Kernels with fewer grid points than this share each reduction in a workgroup.
GROUP_POINTS = 4096
#: The math functions computed with an exactly rounded fma (:mod:`.mathlib`).
EXACT_FMA = frozenset({"sin", "cos"})
MAX_GROUPS = 65535
#: The most writes one grid point's scatter nest may make (see the module docstring).
MAX_SERIAL_WRITES = 65535
#: The most loop iterations one invocation may run in all on a CPU-emulated adapter
#: (lavapipe), each loop's last test counted as one (``trips + 1`` per loop entry).
#: Measured on lavapipe: loops whose trips and tests came to 65,536 in all (a strided loop
#: of 65,528 trips and the tree's 6, or two strided loops of 32,763 and the tree) came
#: out right, 65,537 did not (the last trip of the last loop was dropped); the limit
#: stays one below.
EMULATED_LOOP_LIMIT = 65535
#: Split reductions (:func:`split`): a group-mode kernel whose reductions are long is
#: rendered as a shader per reduction, partial states of chunks of each row (one
#: workgroup per (row, chunk)), and a last one that combines them, so that many
#: workgroups share a long reduction (one workgroup per output keeps one SM/CU busy) and
#: each invocation's loops stay under :data:`EMULATED_LOOP_LIMIT`. A chunk holds at
#: least ``SPLIT_WORK`` terms (the partials' traffic and the extra dispatches stay small
#: beside the reads), a row is cut into only as many as it takes to give
#: ``SPLIT_GROUPS`` workgroups, and into as many as it takes to keep a chunk within
#: ``MAX_CHUNK`` terms. Fixed numbers, not the adapter's: a result is the same bits on
#: every adapter.
SPLIT_WORK = 1 << 14
SPLIT_GROUPS = 256
#: The most terms of one chunk: its strided loop, the tree's levels and the loops that
#: combine earlier reductions' partials stay within :data:`EMULATED_LOOP_LIMIT`
#: iterations per invocation (the backend checks the count when it loads a shader).
MAX_CHUNK = WORKGROUP * (EMULATED_LOOP_LIMIT - 64)



def dispatch(points: int, mode: str) -> tuple[int, int, int]:
    """Workgroups to dispatch for ``points`` grid points: ``(x, y, 1)`` with ``x, y <=``
    :data:`MAX_GROUPS` (the shader numbers them ``x + y * nx`` and skips the extra ones)."""
    groups = points if mode in ("group", "tiled") else -(-points // WORKGROUP)
    x = min(groups, MAX_GROUPS)
    y = -(-groups // x) if x else 0
    if y > MAX_GROUPS:
        raise CompileError(f"a grid of {points} points needs {groups} workgroups, more than "
                           f"{MAX_GROUPS}**2; split the program")
    return x, y, 1


def split(kernel: Kernel, caps: Capabilities) -> tuple[int, int]:
    """``(parts, chunk)``: into how many partials of ``chunk`` flat reduced indices each
    row of ``kernel``'s reductions is split (``(0, 0)``: not split).

    Split: a kernel that runs in the group mode (a workgroup per grid point), whose
    reductions (no matrix product) are all computed once per grid point over the same
    axes, with no scatter, and with at least two chunks of :data:`SPLIT_WORK` terms per
    row, or a row longer than :data:`MAX_CHUNK`. A reduction may use another's result (a
    softmax's sum of ``exp(x - max)``), and stores may run in loop nests (the softmax's
    quotients): those nests are cut into ``parts`` chunks as well. ``chunk`` is a whole
    number of :data:`WORKGROUP` terms (each invocation of a partial's workgroup takes as
    many) and no partial is empty. The numbers are ``caps.row_split``'s
    (:func:`hologram.codegen.schedule.parts`)."""
    plan = loops.plan(kernel, caps)
    body = kernel.body
    reductions = [i for i, x in enumerate(body) if x.op in ("reduce", "contract")]
    points = math.prod(kernel.grid) if kernel.grid_rank else 1
    if (caps.row_split is None or plan.unsupported or 0 in kernel.domain or not reductions
            or any(plan.in_nest(i) for i in reductions) or points >= GROUP_POINTS
            or len({body[i].axes for i in reductions}) != 1
            or any(x.op == "scatter" for x in body)
            or tiling.tiling(kernel, plan) is not None):
        return 0, 0
    total = math.prod(kernel.domain[a] for a in body[reductions[0]].axes)
    nest = max((math.prod(kernel.domain[d] for d in dims) for dims, _ in plan.store_nests),
               default=1)
    parts = schedule.parts(caps.row_split, total, points, nest)
    if not parts:
        return 0, 0
    return schedule.chunks(total, parts, WORKGROUP)


def render(program: Program, kernel: Kernel, caps: Capabilities,
           scratch: int = 0, packed: dict[int, int] | None = None) -> list[dict]:
    """The shaders of ``kernel`` and what each launch needs: ``{"name", "wgsl", "mode",
    "points", "iterations", "bindings", "writable", "packed", "based"}`` (``bindings``:
    buffer indices, in binding order; ``packed``: the storage buffer ``hg_n`` follows
    them; ``based``: then a uniform of the buffers' starts).

    ``packed``: the program's numbers (:func:`numbers`) by buffer, each the word of
    ``hg_n`` where its value starts: the launch copies them there, and they take no
    binding of their own.
    One shader, or for a split reduction (:func:`split`) one per reduction, in the kernel's
    order, then the rest of the kernel, dispatched in that order: shader ``j`` stores
    reduction ``j``'s partial states into buffer ``scratch + j`` (past the program's; its
    ``"scratch"`` gives the size, ``{"index", "nbytes"}``), combining the partials of the
    reductions before it where it needs their results; the last combines them all and makes
    the kernel's stores."""
    packed = packed or {}
    parts, chunk = split(kernel, caps)
    if not parts:
        return [_Kernel(program, kernel, caps, packed).render()]
    reductions = tuple(i for i, x in enumerate(kernel.body) if x.op in ("reduce", "contract"))
    return [_Kernel(program, kernel, caps, packed, _Split(parts, chunk, scratch, reductions,
                                                          target)).render()
            for target in (*reductions, None)]


def numbers(program: Program) -> dict[int, int]:
    """The program's numbers: operands of one 32- or 64-bit element that its kernels only
    load (a learning rate, a step count), each with the word of ``hg_n`` where the
    launch copies its value. WebGPU adapters bind few storage buffers (lavapipe 32, many
    GPUs 8 to 31): a recorded optimizer step reads dozens of numbers, one binding each,
    which would leave its kernels past the limit."""
    written = set().union(*(k.writes() for k in program.kernels))
    other = {x.buffer for k in program.kernels for x in k.body
             if x.op in ("gather", "scatter")}
    slots, word = {}, 0
    for i, b in enumerate(program.buffers):
        if (b.kind != "temp" and b.dtype.itemsize in (4, 8) and b.nbytes == b.dtype.itemsize
                and i not in written | other and any(i in k.reads() for k in program.kernels)):
            slots[i] = word
            word += b.dtype.itemsize // 4
    return slots


@dataclass(frozen=True)
class _Split:
    """A split reduction's shape (:func:`split`), and which of its shaders is rendered:
    the partials of reduction ``target`` (a body position), or (None) the last."""

    parts: int
    chunk: int
    scratch: int  # reduction j's partial states: buffer scratch + j, at (row * parts +
    #               part) * words + word
    reductions: tuple[int, ...]
    target: int | None

    def buffer(self, position: int) -> int:
        """The scratch buffer of the reduction at body ``position``."""
        return self.scratch + self.reductions.index(position)


class _Kernel(Ops, Reductions, KernelWriter):
    """WGSL's spelling of the shared walk (:mod:`hologram.codegen.gpu_kernel`): one
    invocation per grid point (a workgroup in the group mode), every value a scalar
    register, memory as 32-bit words, i64 as two (:meth:`wide`), and a count of the loop
    iterations lavapipe limits (``iterations``)."""

    indent = "  "
    target = "webgpu"
    workgroup = WORKGROUP  # invocations per workgroup (the reduction trees' width)

    def __init__(self, program: Program, kernel: Kernel, caps: Capabilities,
                 packed: dict[int, int], split: _Split | None = None):
        super().__init__(program, kernel, caps)
        self.split = split
        self.packed = {b: w for b, w in packed.items() if b in kernel.reads()}
        self.iterations = 0  # loop iterations one invocation runs at most, in all
        self.trips = 1  # iterations of the loops around the current line
        self.used: set[str] = set()  # helper functions called
        self.shared: set[str] = set()  # workgroup arrays, by WGSL type
        body = kernel.body
        self.points = math.prod(kernel.grid) if kernel.grid_rank else 1
        if all(0 in x.shape for x in body if x.op in ("store", "scatter")):
            self.points = 0  # it stores nothing (a zero extent): never dispatched
        # A workgroup per grid point only while the points alone are too few to fill the
        # device; with many (a matmul's outputs), one invocation each folds its terms
        # alone: no tree, no barriers, WORKGROUP times fewer workgroups.
        self.group = self.points < GROUP_POINTS and any(
            x.op in ("reduce", "contract") and not self.plan.in_nest(i)
            for i, x in enumerate(body))
        # A matrix product: blocks of outputs per workgroup, operands through workgroup
        # memory (.tiling).
        self.tiling = tiling.tiling(kernel, self.plan) if self.points else None
        if self.tiling is not None:
            self.group, self.points = False, self.tiling.tiles
        self.tiles: set[str] = set()  # the tiled mode's operand arrays, by WGSL type
        self.narrow_out = {x.buffer for x in body
                           if x.op in ("store", "scatter") and BYTES[x.dtype.name] < 4}
        self.writes = kernel.writes()
        self.scratch_reads: set[int] = set()  # the scratch buffers of combined partials
        # A split kernel's shaders run a workgroup per (row, part): the partials' always,
        # the last one where it has store nests to cut (else a workgroup per row).
        self.spread = split is not None and (
            split.target is not None or any(dims for dims, _ in self.plan.store_nests))
        if self.spread:
            self.points *= split.parts
        if split is not None and split.target is not None:  # reads the inputs only
            self.narrow_out, self.writes = set(), set()
        self.state_words = 0  # a split reduction's partial state, in u32 words

    # --- text ---------------------------------------------------------------------------
    def bind(self, wgsl_type: str, expr: str) -> str:
        """``let tN = expr;``; a float result (``wgsl_type`` f32, or the dtype name of a
        float) passes through :func:`opaque`."""
        self.names += 1
        name = f"t{self.names}"
        if wgsl_type in ("f32", "f16", "bf16"):
            expr = opaque(expr)
        self.line(f"let {name} = {expr};")
        return name

    def var(self, init: str, wgsl_type: str) -> str:
        self.names += 1
        name = f"a{self.names}"
        self.line(f"var {name}: {wgsl_type} = {init};")
        return name

    def block(self, head: str, body: Callable[[], None]) -> None:
        self.line(head + " {")
        self.depth += 1
        body()
        self.depth -= 1
        self.line("}")

    def loop(self, head: str, trips: int, body: Callable[[], None]) -> None:
        """:meth:`block` for a loop that runs at most ``trips`` times per entry, counted in
        :attr:`iterations` with its last test (``trips + 1`` per entry: lavapipe counts
        it, see :data:`EMULATED_LOOP_LIMIT`)."""
        self.iterations += self.trips * (trips + 1)
        outer, self.trips = self.trips, self.trips * trips
        self.block(head, body)
        self.trips = outer

    def call(self, helper: str, *args: str) -> str:
        self.used.add(helper)
        # a helper's own loop counts towards the invocation's (EMULATED_LOOP_LIMIT)
        self.iterations += self.trips * bitlib.LOOPS.get(helper, 0)
        return f"{helper}({', '.join(args)})"

    # --- structure ----------------------------------------------------------------------
    def render(self) -> dict:
        kernel = self.kernel
        self.line("let lid = lid3.x;")
        # 0 at run time (dispatches have one z group), unknown to the compiler: float
        # constants are xored with it so that they are never folded (mathlib.f32_literal).
        self.line("let hg_k = nwg.z - 1u;")
        self.line("let hg_k2 = hg_k << 1u;")
        self.line("let hg_kc = hg_k << 2u;")
        if self.mode == "thread":
            self.line(f"let g = (wid.x + wid.y * nwg.x) * {WORKGROUP}u + lid;")
        else:  # uniform: a workgroup leaves as a whole
            self.line("let g = wid.x + wid.y * nwg.x;")
        self.line(f"if (g >= {self.points}u) {{ return; }}")
        row = self.row
        if self.spread:
            self.line(f"let part = g % {self.split.parts}u;")
            self.line(f"let row = g / {self.split.parts}u;")
        if self.tiling is not None:
            tiling.emit_indices(self, self.tiling)
        grid = range(kernel.grid_rank) if self.tiling is None else ()
        for d, stride, n in row_major(kernel.domain, grid):
            self.index[d] = self.bind("i32", f"i32(({row} / {stride}u) % {n}u)")
        if self.split is not None and self.split.target is not None:
            return self.render_partials()
        self.write_stores()
        return self.shader(kernel.name)

    def shader(self, name: str) -> dict:
        """The rendered shader and its launch (:func:`render`)."""
        return {"name": name, "wgsl": self.source(), "mode": self.mode,
                "points": self.points, "iterations": self.iterations,
                "bindings": self.bindings(),
                "writable": [b in self.writes for b in self.bindings()],
                "packed": bool(self.packed), "based": bool(self.based())}

    @property
    def row(self) -> str:
        """The WGSL name of this workgroup's grid point."""
        return "row" if self.spread else "g"

    def render_partials(self) -> dict:
        """A partials' shader of a split reduction: workgroup ``g`` folds chunk ``g %
        parts`` of row ``g / parts`` of the target reduction (the reductions it uses
        combined from their partials first) and invocation 0 stores its partial state
        (:meth:`.reduce.Accumulator.state`) at ``g * words`` of the target's scratch
        buffer."""
        split = self.split
        instr = self.kernel.body[split.target]
        for a in instr.args:
            self.prepare(a)
        self.reduce(instr, shared=True)
        buffer = split.buffer(split.target)
        self.writes = {buffer}
        shader = self.shader(f"{self.kernel.name}_part{split.reductions.index(split.target)}")
        shader["scratch"] = {"index": buffer, "nbytes": 4 * self.state_words * self.points}
        return shader

    @property
    def mode(self) -> str:
        if self.tiling is not None:
            return "tiled"
        return "group" if self.group else "thread"

    def register(self, t: DType) -> str:
        """The WGSL type of ``t``'s values."""
        return REG[t.name]

    def bindings(self) -> list[int]:
        """The buffers bound one each, in binding order (not the numbers in ``hg_n``)."""
        k = self.kernel
        return sorted((k.reads() - self.packed.keys()) | self.writes | self.scratch_reads)

    def based(self) -> list[int]:
        """The bound buffers of the program's own (not scratch): their starts come from
        the uniform ``hg_base``."""
        return [b for b in self.bindings() if b < len(self.program.buffers)]

    def source(self) -> str:
        decls = []
        writes = self.writes
        bindings = self.bindings()
        for slot, buf in enumerate(bindings):
            if buf in self.narrow_out:
                decls.append(f"@group(0) @binding({slot}) var<storage, read_write> b{buf}: "
                             "array<atomic<u32>>;")
            else:
                access = "read_write" if buf in writes else "read"
                decls.append(f"@group(0) @binding({slot}) var<storage, {access}> b{buf}: "
                             "array<u32>;")
        # Where each buffer starts in its binding, in elements (a view's offset: the
        # launch binds whole allocations), from a uniform array the launch writes.
        # Scratch buffers (past the program's) start at 0.
        slot = len(bindings)
        if self.packed:
            decls.append(f"@group(0) @binding({slot}) var<storage, read> hg_n: array<u32>;")
            slot += 1
        own = self.based()
        if own:
            decls.append(f"@group(0) @binding({slot}) var<uniform> hg_base: "
                         f"array<vec4<u32>, {max(own) // 4 + 1}>;")
        for t in sorted(self.shared):
            decls.append(f"var<workgroup> {shared_array(t)}: array<{t}, {WORKGROUP}>;")
        for t in sorted(self.tiles):
            decls += [f"var<workgroup> hg_t{side}_{t}: array<{t}, "
                      f"{tiling.TILE * tiling.DEPTH}>;" for side in "ab"]
        head = [f"// kernel {self.kernel.name}: domain {list(self.kernel.domain)}, grid "
                f"{list(self.kernel.grid)}, mode {self.mode}", PRELUDE.rstrip(),
                bitlib.source(self.used), *decls,
                f"@compute @workgroup_size({WORKGROUP})",
                "fn main(@builtin(workgroup_id) wid: vec3<u32>, "
                "@builtin(local_invocation_id) lid3: vec3<u32>, "
                "@builtin(num_workgroups) nwg: vec3<u32>) {"]
        bases = [f"  let hg_o{b} = hg_base[{b // 4}].{'xyzw'[b % 4]};" for b in own]
        return ("\n".join(h for h in head if h) + "\n" + "\n".join([*bases, *self.lines])
                + "\n}\n")

    def point_reduction(self, i: int, instr: Instr) -> str:
        if self.tiling is not None and i == self.tiling.position:  # the matrix product
            return self.bind(instr.dtype.name, self.reduced(
                tiling.emit_contract(self, instr, self.tiling, Accumulator),
                "sum", self.kernel.body[instr.args[0]].dtype, instr.dtype))
        return self.reduce(instr, shared=self.group)

    def nested_reduction(self, i: int, instr: Instr) -> str:
        return self.reduce(instr, shared=False)  # folded by this invocation alone

    def store_nest(self, dims: list[int], stores: list[Instr]) -> None:
        def emit() -> None:
            self.local = {}
            for s in stores:
                self.write(s)

        scatter = any(s.op == "scatter" for s in stores)
        if scatter:
            writes = math.prod(self.kernel.domain[d] for d in dims)
            if writes > MAX_SERIAL_WRITES:
                raise CompileError(
                    f"webgpu: kernel {self.kernel.name}: a scatter makes {writes} writes per "
                    f"grid point in index order, more than the {MAX_SERIAL_WRITES} loop "
                    "iterations an invocation may run (lavapipe ends longer loops "
                    "silently); run the program on the cpu or interp backend, or split the "
                    "scatter")
        if self.tiling is not None:  # dims is empty (tiling.tiling checks)
            self.block("if (valid)", emit)
        elif not self.group:
            self.serial(dims, emit)
        elif not dims:  # spread: the row's first workgroup stores it
            self.block("if (lid == 0u && part == 0u)" if self.spread else "if (lid == 0u)",
                       emit)
        elif scatter:  # its writes in index order: one walker
            self.block("if (lid == 0u)", lambda: self.serial(dims, emit))
        elif self.spread:  # this workgroup's chunk of the nest
            total = math.prod(self.kernel.domain[d] for d in dims)
            chunk = schedule.chunks(total, self.split.parts, WORKGROUP)[1]
            start = self.bind("i32", f"i32(part) * {chunk}")
            self.strided(dims, emit, span=(start, f"min({start} + {chunk}, {total})", chunk))
        else:
            self.strided(dims, emit)

    def serial(self, dims: list[int], body: Callable[[], None]) -> None:
        """Nested sequential loops over ``dims`` around ``body``."""
        if not dims:
            body()
            return
        d, n = dims[0], self.kernel.domain[dims[0]]
        name = f"i{d}"
        self.index[d] = name

        def inner() -> None:
            self.serial(dims[1:], body)

        self.loop(f"for (var {name}: i32 = 0; {name} < {n}; {name}++)", n, inner)
        del self.index[d]

    def strided(self, dims: list[int], body: Callable[[], None], flat: str = "f",
                span: tuple[str, str, int] | None = None) -> None:
        """One loop over the flat index of ``dims``, invocation ``lid`` taking every
        :data:`WORKGROUP`-th, around ``body``; over ``span``'s ``[start, end)`` only, of
        at most its ``count`` indices, where given."""
        total = math.prod(self.kernel.domain[d] for d in dims)
        start, end, count = span if span is not None else ("0", str(total), total)

        def inner() -> None:
            stride = 1
            for d in reversed(dims):
                n = self.kernel.domain[d]
                self.index[d] = self.bind("i32", f"({flat} / {stride}) % {n}")
                stride *= n
            body()
            for d in dims:
                del self.index[d]

        self.loop(f"for (var {flat}: i32 = {start} + i32(lid); {flat} < {end}; {flat} += "
                  f"{WORKGROUP})", -(-count // WORKGROUP), inner)

    # --- values ---------------------------------------------------------------------------
    def address(self, instr: Instr) -> str:
        terms = [str(instr.map.offset)]
        terms += [f"{index} * {stride}" for index, stride in self.index_strides(instr)]
        return self.bind("u32", f"hg_o{instr.buffer} + u32({' + '.join(terms)})")

    def gather_address(self, instr: Instr) -> str:
        """A gather's element (docs/isa.md): the map's element plus the operand clamped to
        the instruction's bounds, as a u32.

        The clamp is exact in the operand's own register: the bounds are first cut to
        the operand dtype's range (a bound beyond it clamps nothing, or makes the result
        that constant), so no value is ever widened. The sum is then taken in wrapping
        u32 arithmetic: the verifier has checked that the true sum, an integer of any
        size, is an element of the buffer (below 2**32), so the sum modulo 2**32 is that
        element, however far the map's own terms or the operand run outside it. A
        constant part is folded here, in Python: WGSL rejects a constant expression
        that overflows."""
        operand = self.kernel.body[instr.args[-1]].dtype  # a scatter's second operand
        k = self.value(instr.args[-1])
        clamp = gather_clamp(self.kernel, instr)
        lo, hi = clamp.low, clamp.high
        terms = []
        if clamp.operand and operand.name == "i64":
            self.used.add("hg_u64")
            if lo is not None:
                k = self.bind("i64", f"select({k}, {self.const(lo, operand)}, "
                                     f"hg_slt64({k}, {self.const(lo, operand)}))")
            if hi is not None:
                k = self.bind("i64", f"select({k}, {self.const(hi, operand)}, "
                                     f"hg_slt64({self.const(hi, operand)}, {k}))")
            terms.append(f"{k}.x")  # the low word: the value modulo 2**32
        elif clamp.operand:
            reg = REG[operand.name]
            lit = (lambda v: f"{v}u") if reg == "u32" else i32_literal
            if lo is not None:
                k = f"max({k}, {lit(lo)})"
            if hi is not None:
                k = f"min({k}, {lit(hi)})"
            terms.append(k if reg == "u32" else f"bitcast<u32>({k})")
        terms += [f"bitcast<u32>({index}) * {stride % 2**32}u"
                  for index, stride in self.index_strides(instr)]
        return self.bind("u32", " + ".join([f"hg_o{instr.buffer}", f"{clamp.offset % 2**32}u",
                                            *terms]))

    def word(self, buf: int, at: str) -> str:
        if buf in self.narrow_out:
            return f"atomicLoad(&b{buf}[{at}])"
        return f"b{buf}[{at}]"

    def load(self, instr: Instr, at: str | None = None) -> str:
        """A load's value, or a gather's (``at``: its element, :meth:`gather_address`)."""
        t, buf = instr.dtype.name, instr.buffer
        size = BYTES[t]
        if buf in self.packed:  # a number: its one element, in hg_n
            w = self.packed[buf]
            if size == 8:
                return self.bind(t, f"vec2<u32>(hg_n[{w}], hg_n[{w + 1}])")
            return self.bind(t, f"bitcast<{REG[t]}>(hg_n[{w}])")
        at = self.address(instr) if at is None else at
        if size == 8:  # i64: two words, low first
            return self.bind(t, f"vec2<u32>({self.word(buf, f'2u * {at}')}, "
                                f"{self.word(buf, f'2u * {at} + 1u')})")
        if size == 4:
            return self.bind(t, f"bitcast<{REG[t]}>({self.word(buf, at)})")
        per = 4 // size
        shift = f"(({at} % {per}u) * {8 * size}u)"
        raw = self.bind("u32", f"({self.word(buf, f'{at} / {per}u')} >> {shift}) & "
                        f"{(1 << 8 * size) - 1:#x}u")
        if t == "bool":
            return self.bind(t, f"{raw} != 0u")
        if t == "u8":
            return raw
        if t in ("i8", "i16"):
            bits = 32 - 8 * size
            return self.bind(t, f"(bitcast<i32>({raw}) << {bits}u) >> {bits}u")
        if t == "f16":
            return self.bind(t, self.call("hg_f16_to_f32", raw))
        return self.bind(t, f"bitcast<f32>({raw} << 16u)")  # bf16

    def scatter(self, instr: Instr) -> None:
        """One write of a scatter at the current point (see the module docstring)."""
        t = instr.dtype
        value = self.value(instr.args[0])
        at = self.gather_address(instr)
        if instr.mode != "replace":
            old = self.load(instr, at)
            if t.name == "i64":
                value = self.bind(t.name, self.wide(instr.mode, [old, value]))
            elif instr.mode in ("max", "min"):
                value = self.bind(t.name, self.minmax([old, value], t, instr.mode == "max"))
            else:
                value = self.bind("f32" if t.is_float else t.name,
                                  getattr(self, f"op_{instr.mode}")([old, value], t, t))
                if t.name in ("f16", "bf16"):
                    value = self.bind(t.name, self.call(f"hg_round_{t.name}", value))
        self.store(instr, at, value)

    def store(self, instr: Instr, at: str | None = None, value: str | None = None) -> None:
        """A store of its operand at its map's element, or (a scatter's) ``value`` at
        ``at``."""
        t, buf = instr.dtype.name, instr.buffer
        value = self.value(instr.args[0]) if value is None else value
        at = self.address(instr) if at is None else at
        size = BYTES[t]
        if size == 4:
            self.line(f"b{buf}[{at}] = bitcast<u32>({value});")
            return
        if size == 8:  # i64: low word first (little-endian)
            self.line(f"b{buf}[2u * {at}] = {value}.x;")
            self.line(f"b{buf}[2u * {at} + 1u] = {value}.y;")
            return
        if t == "bool":
            bits = f"select(0u, 1u, {value})"
        elif t == "f16":
            bits = self.call("hg_f32_to_f16", value)
        elif t == "bf16":
            bits = self.call("hg_f32_to_bf16", value)
        else:
            bits = f"bitcast<u32>({value})" if t != "u8" else value
        per, width = 4 // size, 8 * size
        mask = (1 << width) - 1
        shift = self.bind("u32", f"({at} % {per}u) * {width}u")
        word = self.bind("u32", f"{at} / {per}u")
        self.line(f"atomicAnd(&b{buf}[{word}], ~({mask:#x}u << {shift}));")
        self.line(f"atomicOr(&b{buf}[{word}], (({bits}) & {mask:#x}u) << {shift});")

    def const(self, value, t: DType) -> str:
        if t.name == "i64":
            bits = int(value) & (2**64 - 1)
            return f"vec2<u32>({bits & 0xFFFFFFFF:#x}u, {bits >> 32:#x}u)"
        if t.is_bool:
            return "true" if value else "false"
        if t.kind == "u":
            return f"{int(value)}u"
        if t.is_int:
            return i32_literal(value)
        return f32_literal(value)

    def constant(self, value, t: DType) -> str:
        return self.bind(t.name, self.const(value, t))

    def index_value(self, axis: int, t: DType) -> str:
        index = self.index.get(axis, "0i")
        if t.name == "i64":  # >= 0
            return self.bind(t.name, f"vec2<u32>(u32({index}), 0u)")
        return self.bind(t.name, self.int_cast(index, dt.int32, t))

    def compute(self, instr: Instr, src: DType, args: list[str]) -> str:
        op, t = instr.op, instr.dtype
        if src.is_float and len(set(instr.args)) < len(instr.args):
            # x - x, x / x: a second operand the compiler cannot tell is the first, or it
            # folds them (to 0, 1) for NaN and inf too.
            args = [opaque(x, "hg_k2") if instr.args.index(a) != i else x
                    for i, (a, x) in enumerate(zip(instr.args, args))]
        if op in _UNARY_FLOAT_FNS:
            return self.bind(t.name, f"{_UNARY_FLOAT_FNS[op]}({args[0]})")
        if op == "pow":  # the shared f32 pow works in f64, which WGSL lacks
            return pow_f32(WGSLEmitter(self.bind, self.used, False), *args)
        if op in shared_math.FUNCTIONS:
            y = shared_math.emit(WGSLEmitter(self.bind, self.used, op in EXACT_FMA), op,
                                 args[0])
            # NaN in, NaN out, tested on the bits: the algorithms clamp with selects on
            # float comparisons, which a driver may turn into a min/max that drops the
            # NaN (WGSL allows it; NVIDIA's Vulkan driver gave exp(NaN) = 0).
            return self.bind(t.name, f"select({y}, {args[0]}, hg_isnan({args[0]}))")
        if (src.name == "i64" and op != "cast") or (op == "select" and t.name == "i64"):
            return self.bind(t.name, self.wide(op, args))
        return self.bind(t.name, self.apply(op, args, src, t))

_UNARY_FLOAT_FNS = {"floor": "floor", "ceil": "ceil", "trunc": "trunc",
                    "round": "round"}
