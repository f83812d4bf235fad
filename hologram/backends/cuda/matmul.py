"""Matrix products in Triton: the part of the cuda renderer (:mod:`.render`) that writes
a kernel whose reduction is a matrix product (:func:`hologram.codegen.loops.matmul`) as
tiles of ``tl.dot``, with its epilogue on the output tile, and split-K's combination of
partial tiles (:meth:`Products.combine_k`)."""

from __future__ import annotations

from hologram.codegen import loops
from hologram.isa import dtypes as dt
from hologram.isa.dtypes import DType
from hologram.isa.ir import Kernel

from .values import SCRATCH, TL, pow2

#: Matrix products: ``(BM, BN, BK)``, outputs per side of a program instance's tile and
#: indices of k per ``tl.dot`` (each at least 16, Triton's smallest dot), with the software
#: pipeline's depth and the warps. Tensor-core products (f16, bf16, TF32) take Hopper's and
#: Ampere's usual tile, their operand loads pipelined ``MATMUL_STAGES`` deep; f16 products
#: with at least ``MATMUL_WIDE_TILES`` tiles of ``MATMUL_WIDE`` take those (on an H100,
#: 4096^3: 614 TFLOP/s in 128x128 tiles, 722 in 128x256; 1024^3 keeps 128x128, enough tiles
#: for every SM). TF32 operands take twice the shared memory, so they keep the smaller
#: tile. IEEE f32 (FMA units) a smaller one, pipelined too (+18% at 4096^3). Program
#: instances are numbered in groups of ``MATMUL_GROUP`` rows of tiles, so neighbours
#: share operand tiles in L2. Measured variants: docs/cuda.md, "On an H100".
MATMUL_TENSOR_CORES = (128, 128, 64)
MATMUL_WIDE = (128, 256, 64)
MATMUL_WIDE_TILES = 256
MATMUL_IEEE = (64, 64, 32)
MATMUL_STAGES = 3
MATMUL_IEEE_STAGES = 3
MATMUL_WARPS = 8
MATMUL_GROUP = 8


def matmul_tiles(kernel: Kernel, mm: loops.MatmulDims,
                 tf32: bool) -> tuple[int, int, int, bool]:
    """``(BM, BN, BK, tensor_cores)`` of matrix product ``mm`` (module constants)."""
    domain = kernel.domain
    t = kernel.body[kernel.body[mm.position].args[0]].dtype
    tensor_cores = t in (dt.float16, dt.bfloat16) or (tf32 and t is dt.float32)
    if t is dt.float16 and mm.batch * -(-domain[mm.m] // MATMUL_WIDE[0]) * \
            -(-domain[mm.n] // MATMUL_WIDE[1]) >= MATMUL_WIDE_TILES:
        side_m, side_n, depth = MATMUL_WIDE
    elif t.is_float:
        side_m, side_n, depth = MATMUL_TENSOR_CORES if tensor_cores else MATMUL_IEEE
    else:
        side_m, side_n, depth = 32, 32, 16
    bm, bn = (min(side, max(16, pow2(domain[d])))
              for side, d in ((side_m, mm.m), (side_n, mm.n)))
    return bm, bn, min(depth, max(16, pow2(domain[mm.k]))), tensor_cores


class Products:
    """The matrix products of :class:`.render._Kernel` (a mixin): they use its text
    builders (``line``, ``bind``, ``pid``, ``arange``, ``coordinates``), its values
    (``value``, ``load``, ``rounded``) and its state (``index``, ``mask``, ``zero``,
    ``local``, ``point``, ``split_k``, ``tf32``)."""

    def matmul(self, mm: loops.MatmulDims) -> int:
        """A matrix product (:func:`hologram.codegen.loops.matmul`): each program instance
        computes a ``[BM, BN]`` tile of outputs over chunks of ``BK`` indices of ``k``.

        f16 operands go to ``tl.dot`` as f16 and bf16 ones as TF32 (both exact), f32 as
        TF32 only with ``tf32`` (``HOLOGRAM_CUDA_ALLOW_TF32``): these take the tensor cores
        and accumulate in f32 as cuBLAS does (the dot-product bound of library calls,
        docs/isa.md). IEEE f32 (FMA units) adds the chunks' sums with compensation, which
        keeps its error within the ISA's float-sum bound (a chunk costs at most ``BK``
        roundings, the compensated sum of the chunks about two). A sum of -0.0 products
        comes out +0.0, as from BLAS. Integers (which ``tl.dot`` takes only as i8) sum
        broadcast products, wrapping. Sizes are static: edges are masked only where a
        tile passes them. The epilogue then runs on the tile, ``xmask`` its valid
        outputs. Split-K (``split_k``): each program instance takes one chunk of k of a
        tile, and the tile's last one combines the chunks (:meth:`combine_k`) and runs the
        epilogue. Returns the number of program instances."""
        kernel, domain = self.kernel, self.kernel.domain
        instr = kernel.body[mm.position]
        t = kernel.body[instr.args[0]].dtype
        bm, bn, bk, tensor_cores = matmul_tiles(kernel, mm, self.tf32)
        self.xblock, self.rblock = bm * bn, bk
        if tensor_cores:
            self.stages, self.warps = MATMUL_STAGES, MATMUL_WARPS
        elif t.is_float:
            self.stages = MATMUL_IEEE_STAGES
        tiles_m, tiles_n = -(-domain[mm.m] // bm), -(-domain[mm.n] // bn)
        parts, chunk = self.split_k[:2] if self.split_k else (1, domain[mm.k])
        self.line(f"pid = {self.pid()}")
        if parts > 1:  # program instance pid takes chunk `part` of k of tile `pid // parts`
            self.line(f"part = pid % {parts}")
            self.line(f"pid = pid // {parts}")
        self.coordinates("pid", range(mm.m), tiles_m * tiles_n)
        tile = self.bind(f"pid % {tiles_m * tiles_n}")
        group = min(MATMUL_GROUP, tiles_m)
        if group > 1 and tiles_n > 1:
            # Tile i of a group of ``group`` rows of tiles: down its column first.
            first = self.bind(f"({tile} // {group * tiles_n}) * {group}")
            size = group if tiles_m % group == 0 else \
                self.bind(f"tl.minimum({tiles_m} - {first}, {group})")
            within = self.bind(f"{tile} % {group * tiles_n}")
            tile_m, tile_n = f"({first} + {within} % {size})", f"({within} // {size})"
        else:
            tile_m, tile_n = f"({tile} // {tiles_n})", f"({tile} % {tiles_n})"
        rows = self.bind(f"{tile_m} * {bm} + {self.arange(bm, True)}")
        cols = self.bind(f"{tile_n} * {bn} + {self.arange(bn, False)}")

        def inside(v: str, d: int, block: int) -> str | None:
            return self.bind(f"{v} < {domain[d]}") if domain[d] % block else None

        row_ok, col_ok = inside(rows, mm.m, bm), inside(cols, mm.n, bn)
        acc_t = TL[t.name]
        acc, comp = self.bind(f"tl.zeros([{bm}, {bn}], {acc_t})"), f"comp{mm.position}"
        compensated = t.is_float and not tensor_cores
        if compensated:
            self.line(f"{comp} = tl.zeros([{bm}, {bn}], {acc_t})")
        if parts > 1:
            self.line(f"for k0 in range(part * {chunk}, part * {chunk} + {chunk}, {bk}):")
        else:
            self.line(f"for k0 in range(0, {domain[mm.k]}, {bk}):")
        self.depth += 1

        def operand(arg: int, index: dict[int, str], ok: str | None, k: str,
                    shape: tuple[int, int]) -> str:
            # Positions past the matrices' edges are computed, then zeroed (a load there
            # reads 0 already).
            self.index.pop(mm.m, None), self.index.pop(mm.n, None)
            self.index.update(index)
            masks = [m for m in (ok, inside(k, mm.k, chunk if parts > 1 else bk))
                     if m is not None]
            self.mask = self.bind(" & ".join(masks)) if masks else None
            self.zero, self.local = None, {}
            source = kernel.body[arg]
            if source.op == "load" and t is dt.float16:
                # Straight from memory to the dot: the pipeline copies it to shared memory.
                value = self.load(source, raw=True)
            else:
                value = self.value(arg)
                if t is dt.float16:
                    value = f"({value}).to(tl.float16)"
                if self.mask is not None and source.op != "load":
                    value = f"tl.where({self.mask}, {value}, 0)"
            return self.bind(f"tl.broadcast_to({value}, {list(shape)})")

        ka = self.bind(f"k0 + {self.arange(bk, False)}")
        a = operand(instr.args[0], {mm.m: rows, mm.k: ka}, row_ok, ka, (bm, bk))
        kb = self.bind(f"k0 + {self.arange(bk, True)}")
        b = operand(instr.args[1], {mm.n: cols, mm.k: kb}, col_ok, kb, (bk, bn))
        if t is dt.float16:
            self.line(f"{acc} = tl.dot({a}, {b}, {acc}, out_dtype=tl.float32)")
        elif tensor_cores:
            # bf16 values are exact in TF32 (8 exponent bits, 10 of significand), so bf16
            # takes the tensor cores through TF32 (Triton's interpreter has no bf16 dot).
            self.line(f"{acc} = tl.dot({a}, {b}, {acc}, input_precision=\"tf32\")")
        elif compensated:
            y = self.bind(f"tl.dot({a}, {b}, input_precision=\"ieee\") - {comp}")
            total = self.bind(f"{acc} + {y}")
            self.line(f"{comp} = tl.where(tl.abs({total}) < HG_INF, "
                      f"({total} - {acc}) - {y}, 0.0)")
            self.line(f"{acc} = {total}")
        else:
            # tl.sum widens narrow integers: the wrap must happen in the dtype
            self.line(f"{acc} = {acc} + tl.sum({a}[:, :, None] * {b}[None, :, :], 1)"
                      f".to({acc_t})")
        self.depth -= 1
        del self.index[mm.k]
        self.index[mm.m], self.index[mm.n] = rows, cols
        masks = [m for m in (row_ok, col_ok) if m is not None]
        self.line(f"xmask = {' & '.join(masks)}" if len(masks) == 2 else
                  f"xmask = tl.broadcast_to({masks[0]}, [{bm}, {bn}])" if masks else
                  f"xmask = tl.full([{bm}, {bn}], 1, tl.int1)")
        self.line(f"xzero = tl.zeros([{bm}, {bn}], {self.index_t})")
        self.mask, self.zero, self.local = "xmask", "xzero", {}
        if compensated:
            acc = self.bind(f"tl.where(({comp} == 0.0) | ~(tl.abs({acc}) < HG_INF), "
                            f"{acc}, {acc} - {comp})")
        if parts > 1:
            acc = self.combine_k(acc, acc_t, t, bm, bn, parts, mm.batch * tiles_m * tiles_n)
        if t.is_float:
            acc = self.rounded(acc, t)
        self.point[mm.position] = acc
        return mm.batch * tiles_m * tiles_n * parts

    def combine_k(self, acc: str, acc_t: str, t: DType, bm: int, bn: int, parts: int,
                  tiles: int) -> str:
        """Split-K: store this chunk's partial tile (``acc``, compensated already) to
        scratch at ``(tile * parts + part)``, count the tile's arrivals (as a split
        reduction counts a row's), and let the tile's last program instance sum the
        partials in chunk order (floats in float64, rounded once to the accumulator's
        type: the same bits whichever instance is last; integers wrapping in their dtype),
        clear the counter and run the epilogue. Sets ``k_scratch``."""
        first = self.split_k[2]
        self.k_scratch = [
            {"index": first, "dtype": SCRATCH[acc_t][1], "count": tiles * parts * bm * bn,
             "zeroed": False},
            {"index": first + 1, "dtype": "i4", "count": tiles, "zeroed": True}]
        within = self.bind(f"tl.arange(0, {bm})[:, None] * {bn} + tl.arange(0, {bn})[None, :]")
        self.line(f"tl.store(b{first} + (pid * {parts} + part) * {bm * bn} + {within}, "
                  f"{acc})")
        # Every thread's partial is stored before the count (release); the last one sees
        # them all (acquire).
        self.line("tl.debug_barrier()")
        self.line(f"done = tl.atomic_add(b{first + 1} + pid, 1, sem=\"acq_rel\")")
        self.line(f"if done == {parts - 1}:")
        self.depth += 1
        wide = "tl.float64" if t.is_float else acc_t
        total = self.bind(f"tl.zeros([{bm}, {bn}], {wide})")
        self.line(f"for p in range({parts}):")
        self.line(f"    {total} += tl.load(b{first} + (pid * {parts} + p) * {bm * bn} + "
                  f"{within}, cache_modifier=\".cg\").to({wide})")
        self.line(f"tl.store(b{first + 1} + pid, 0)")  # for the next launch
        if wide == acc_t:
            return total
        # f16/bf16 through float32 rounded to odd: their own rounding is then the only one
        narrow = t.name in ("f16", "bf16")
        return self.bind(f"hg_f64_to_f32_odd({total})" if narrow else f"{total}.to({acc_t})")
