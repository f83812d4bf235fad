"""GEMMs cut into pieces that the cpu backend's worker threads run.

BLAS libraries thread a product themselves with a static split: each of their threads
gets its share up front and the caller waits for the slowest. When another thread holds
a core (a background compile, a data loader, another process), a share whose thread has
no core waits for a scheduler time slice: on a 2-core machine, products that take 30-60 µs
took 3-28 ms each during a model's first training step, whose compiles run beside it.
The worker pool (:mod:`.threads`, :mod:`.workers`) hands pieces out as threads come for
them and the caller runs what no worker took, so a busy core costs at most one piece.

So :func:`prepare` cuts C into pieces of whole rows (or of whole columns, when C has
more columns than rows; :func:`cut` says how large), each computed by one
single-threaded call of the library entry :func:`.blas.prepare` would call, and runs
them with :func:`threads.run_kernel` through a small native trampoline: one function per
calling convention and dtype, compiled once per process (cached on disk, like the pool).
The pieces depend only on the sizes and the thread count, never on which thread runs
them, so a product's bits are the same from one call to the next; they may differ in the
last place from one whole-product call (the library's kernels for a piece's edge tiles
are its own), as a library's threads' do.
Products too small to share, and every product on one thread, make one call.
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np
from llvmlite import ir

from hologram.backends.cpu import blas, llvm, threads
from hologram.backends.cpu import target as targets
from hologram.errors import HologramError

__all__ = ["BATCH_KINDS", "BLOCK", "MIN_PIECE", "MIN_PIECE_FLOPS", "MIN_SHARED_PIECE",
           "SHARED_BYTES", "NativeJob", "batch_trampoline_ir", "batch_trampoline_name", "cut",
           "prepare", "prepare_batched", "trampoline_ir", "trampoline_name"]

#: Rows (or columns) of C a piece holds a multiple of: BLAS kernels compute tiles of 4 to
#: 16 rows, so a piece boundary inside a tile would cost a partial tile on both sides.
BLOCK = 16
#: Floating-point operations below which a piece is not worth handing to another thread
#: (~5 µs on one core; a hand-off costs ~1 µs).
MIN_PIECE_FLOPS = 1 << 18
#: Each library call packs the operand every piece reads whole (B for pieces of rows, A
#: for pieces of columns) again, where a library's own threads pack it once between them:
#: pieces hold at least ``MIN_PIECE`` rows (or columns), and ``MIN_SHARED_PIECE`` where
#: that operand is larger than ``SHARED_BYTES``. On the 2-core Intel Xeon (MKL, 2
#: threads), pieces of 64 rows left products at 0.69-0.83x of torch's (1024 x 4096 x
#: 1024: 34 ms against 24), pieces of 128 no better, pieces of 256 or more at 0.94-1.03x.
#: On a 2-core AMD EPYC (Zen 4), pieces of 16 rows left products whose B fits in 1 MiB
#: at 0.83-0.88x (256^3: 264 µs against torch's 226), pieces of 64 rows at 1.0-1.1x
#: (214 µs).
MIN_PIECE = 64
SHARED_BYTES = 1 << 19
MIN_SHARED_PIECE = 256

# The words every trampoline's job starts with: the entry, its thread setters, the
# product's flags and sizes, the operands' addresses (filled per call).
_PRODUCT_WORDS = ("fn", "set_local", "omp_get", "omp_set", "trans_a", "trans_b", "m", "n", "k",
                  "lda", "ldb", "ldc", "a", "b", "c")
# The job of a product's pieces: whether they are of columns, the thread count MKL gets.
_WORDS = _PRODUCT_WORDS + ("columns", "threads")
_AT = {name: i for i, name in enumerate(_WORDS)}
_JOB = ctypes.c_int64 * len(_WORDS)
_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
_PTR = _I8.as_pointer()


@dataclass(frozen=True)
class NativeJob:
    """How native code runs a product without Python (a job step of the launcher,
    hologram/csrc/launcher.c): ``kernel(words, start, stop)`` over ``rows`` pieces of at
    least ``grain``, on a copy of ``words`` (int64s) with the operands' addresses written at
    word indices ``operands`` (A, B, C) and, where ``threads >= 0``, the thread count the
    library gets at word ``threads``: all of them when the step runs as one piece, else 1
    per piece. ``owner`` holds what the words point into."""

    kernel: int
    rows: int
    grain: int
    words: bytes
    operands: tuple[int, int, int]
    threads: int
    owner: object


def prepare(dtype: str, trans_a: bool, trans_b: bool, m: int, n: int, k: int, lda: int,
            ldb: int, ldc: int, library: str | None = None) -> Callable[[int, int, int], None]:
    """:func:`.blas.prepare` of ``C = op(A) @ op(B)`` (alpha 1, beta 0; ``library`` as
    there), run on the process's threads (:func:`threads.num_threads`) as pieces of C,
    each one single-threaded library call; checked once, like :func:`.blas.prepare`."""
    single = blas.prepare(dtype, trans_a, trans_b, m, n, k, 1.0, lda, ldb, 0.0, ldc, library)
    if dtype in blas.HALF:  # the library threads mixed-precision products itself
        return single
    blocks, grain = cut(dtype, m, n, k)
    if blocks == 0:  # empty
        return single
    found = blas.entry(dtype, max(m, n, k, lda, ldb, ldc), library)
    # MKL's products all get a native job (one piece with the calling thread's count, as
    # ``single``, or pieces of one thread each); OpenBLAS's thread count is the process's,
    # so its pieces hold a lock that only Python takes.
    mkl = found.abi == "fortran"
    if blocks < 2 * grain and not mkl:  # too small to share
        return single
    columns = n > m
    kernel = _trampoline(found.abi, found.int64, dtype)
    template = _template(_WORDS, found, trans_a, trans_b, m, n, k, lda, ldb, ldc,
                         columns=int(columns), threads=1)
    one_thread = None if mkl else _openblas_threads
    at_a, at_b, at_c = _AT["a"], _AT["b"], _AT["c"]

    def call(a: int, b: int, c: int) -> None:
        count = threads.num_threads()
        if count == 1 or blocks < 2 * grain:
            single(a, b, c)
            return
        if not (a and b and c):
            raise HologramError("gemm: A, B or C is a null address")
        job = _JOB.from_buffer_copy(template)  # a copy per call: calls may be concurrent
        job[at_a], job[at_b], job[at_c] = a, b, c
        if one_thread is None:  # MKL: the trampoline sets its threads' own count
            threads.run_kernel(kernel, job, blocks, grain)
            return
        with one_thread:
            threads.run_kernel(kernel, job, blocks, grain)

    if mkl:
        call.job = NativeJob(kernel, blocks, grain, bytes(template), (at_a, at_b, at_c),
                             _AT["threads"], call)
    return call


def prepare_batched(dtype: str, trans_a: bool, trans_b: bool, m: int, n: int, k: int,
                    lda: int, ldb: int, ldc: int, batch: tuple[int, ...],
                    a_strides: tuple[int, ...], b_strides: tuple[int, ...],
                    c_strides: tuple[int, ...]) -> Callable[[int, int, int], None]:
    """:func:`.blas.prepare_batched` (checked there), with the products on MKL run by a
    native loop over the batch on the worker pool, each piece of the batch calling the
    single-product entry on one thread: MKL has no batched mixed-precision entry (a
    Python loop over its single one cost ~3 µs a matrix, more than a 128 x 128 x 32
    product itself), and its ``cblas_?gemm_batch`` is reached from Python (~5 µs a call
    of filling address arrays, more than a 64-matrix batch of attention products takes
    in the loop). Products without MKL are :func:`.blas.prepare_batched`'s."""
    checked = blas.prepare_batched(dtype, trans_a, trans_b, m, n, k, lda, ldb, ldc, batch,
                                   a_strides, b_strides, c_strides)
    count = math.prod(batch)
    if not (batch and count and k):
        return checked
    largest = max(m, n, k, lda, ldb, ldc)
    if dtype in blas.HALF:
        found, kind, sizes = blas.half_entry(dtype, largest), "half", (2, 2, 4)
    else:
        found, kind = blas.entry(dtype, largest), dtype
        sizes = (4, 4, 4) if dtype == "f32" else (8, 8, 8)
        found = found if found.abi == "fortran" else None
    if found is None:
        return checked
    offsets = np.stack([blas.batch_offsets(batch, strides, size) for strides, size in
                        zip((a_strides, b_strides, c_strides), sizes)], axis=1)
    kernel = _batch_trampoline(kind)
    template = _template(_BATCH_WORDS, found, trans_a, trans_b, m, n, k, lda, ldb, ldc,
                         offsets=offsets.ctypes.data)
    grain = max(1, -(-MIN_PIECE_FLOPS // (2 * m * n * k)))
    at_a, at_b, at_c = (_BATCH_AT[x] for x in "abc")

    def call(a: int, b: int, c: int) -> None:
        if not (a and b and c):
            raise HologramError("gemm: A, B or C is a null address")
        job = _BATCH_JOB.from_buffer_copy(template)  # a copy per call: calls may be concurrent
        job[at_a], job[at_b], job[at_c] = a, b, c
        threads.run_kernel(kernel, job, count, grain)

    call.offsets = offsets  # kept alive with the call: the job holds their address
    call.job = NativeJob(kernel, count, grain, bytes(template), (at_a, at_b, at_c), -1, call)
    return call


def _template(names: tuple[str, ...], found: blas.Entry, trans_a: bool, trans_b: bool,
              m: int, n: int, k: int, lda: int, ldb: int, ldc: int, **rest: int):
    """A job's words ``names`` (an int64 array): ``found``'s entry and thread setters, the
    product's flags and sizes, null operands, and ``rest`` by name."""
    words = dict(fn=found.address, set_local=found.set_local_threads,
                 omp_get=found.openmp[0], omp_set=found.openmp[1], trans_a=int(trans_a),
                 trans_b=int(trans_b), m=m, n=n, k=k, lda=lda, ldb=ldb, ldc=ldc, a=0, b=0,
                 c=0, **rest)
    return (ctypes.c_int64 * len(names))(*(words[name] for name in names))


def cut(dtype: str, m: int, n: int, k: int) -> tuple[int, int]:
    """How :func:`prepare` cuts the ``m x n`` C of a product over ``k`` (no pieces where
    ``blocks < 2 * grain``): ``(blocks, grain)``, C's blocks of ``BLOCK`` rows (of columns
    when ``n > m``) and the fewest blocks a piece holds (``MIN_PIECE_FLOPS``,
    ``MIN_PIECE``, ``MIN_SHARED_PIECE``)."""
    extent, other = (n, m) if n > m else (m, n)
    work = 2 * BLOCK * other * k  # per block of rows (or columns)
    if work == 0:  # an empty product, or C set to 0
        return 0, 1
    grain = max(MIN_PIECE // BLOCK, -(-MIN_PIECE_FLOPS // work))
    if other * k * (8 if dtype == "f64" else 4) > SHARED_BYTES:
        grain = max(grain, MIN_SHARED_PIECE // BLOCK)
    return -(-extent // BLOCK), grain


class _OpenblasThreads:
    """OpenBLAS's thread count is the process's (its per-thread setting only reaches
    OpenMP builds): one while any caller runs pieces, then :func:`threads.num_threads`
    again, the count the cpu backend's other products set (and NumPy's matmul shares)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0

    def __enter__(self) -> None:
        with self._lock:
            if self._inside == 0:
                blas.set_openblas_threads(1)
            self._inside += 1

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._inside -= 1
            if self._inside == 0:
                blas.set_openblas_threads(threads.num_threads())


_openblas_threads = _OpenblasThreads()


@cache
def _trampoline(abi: str, int64: bool, dtype: str) -> int:
    """The address of the trampoline for one calling convention and dtype, compiled for
    this machine on first use, alone (a model uses one or two of the six) and at the quick
    tier, like the pool: the library call is the work."""
    host = targets.host()
    name = trampoline_name(abi, int64, dtype)
    obj = llvm.compile_ir(trampoline_ir(abi, int64, dtype, host.triple), host, allowed=(),
                          tier="quick")
    return llvm.load_object(obj, [name], allowed=(), target=host)[name]


# The batch loop's job: the address of the matrices' byte offsets (uint64 [count, 3]: A's,
# B's, C's) after the product's words.
_BATCH_WORDS = _PRODUCT_WORDS + ("offsets",)
_BATCH_AT = {name: i for i, name in enumerate(_BATCH_WORDS)}
_BATCH_JOB = ctypes.c_int64 * len(_BATCH_WORDS)
#: The batch loops: MKL's mixed-precision CBLAS entry (f16/bf16 into float32), and its
#: Fortran sgemm/dgemm.
BATCH_KINDS = ("half", "f32", "f64")


def batch_trampoline_name(kind: str) -> str:
    return f"hg_gemm_batch_{kind}"


@cache
def _batch_trampoline(kind: str) -> int:
    """The address of the batch loop of ``kind`` (:func:`batch_trampoline_ir`), compiled
    for this machine on first use, like :func:`_trampoline`."""
    host = targets.host()
    name = batch_trampoline_name(kind)
    obj = llvm.compile_ir(batch_trampoline_ir(host.triple, kind), host, allowed=(),
                          tier="quick")
    return llvm.load_object(obj, [name], allowed=(), target=host)[name]


def batch_trampoline_ir(triple: str, kind: str = "half") -> str:
    """``hg_gemm_batch_<kind>(job, start, stop)``: matrices ``[start, stop)`` of a batch of
    products, each one call of the job's entry (alpha 1, beta 0, 32-bit sizes) on one
    thread (:func:`_on_threads`): ``kind`` ``"half"``, MKL's row-major mixed-precision
    CBLAS entry (float32 scalars); ``"f32"``/``"f64"``, its Fortran sgemm/dgemm. It calls
    only the addresses the job holds: it compiles for any target."""
    module = ir.Module("hologram_gemm_batch")
    module.triple = triple
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_PTR.as_pointer(), _I64, _I64]),
                     batch_trampoline_name(kind))
    entry_block = fn.append_basic_block("entry")
    head, body, done = (fn.append_basic_block(x) for x in ("head", "body", "done"))
    b = ir.IRBuilder(entry_block)
    words = b.bitcast(fn.args[0], _I64.as_pointer())
    w = {name: b.load(b.gep(words, [ir.Constant(_I64, i)]), name=name)
         for i, name in enumerate(_BATCH_WORDS)}
    zero = ir.Constant(_I64, 0)
    trans_a = b.icmp_unsigned("!=", w["trans_a"], zero)
    trans_b = b.icmp_unsigned("!=", w["trans_b"], zero)
    small = {key: b.trunc(w[key], _I32) for key in ("m", "n", "k", "lda", "ldb", "ldc")}
    offsets = b.inttoptr(w["offsets"], _I64.as_pointer())
    restore = _on_threads(b, w, ir.Constant(_I32, 1))
    start_block = b.block
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(_I64)
    i.add_incoming(fn.args[1], start_block)
    b.cbranch(b.icmp_signed("<", i, fn.args[2]), body, done)
    b.position_at_end(body)
    row = b.mul(i, ir.Constant(_I64, 3))

    def address(base: str, column: int) -> ir.Value:
        offset = b.load(b.gep(offsets, [b.add(row, ir.Constant(_I64, column))]))
        return b.inttoptr(b.add(w[base], offset), _PTR)

    real = ir.DoubleType() if kind == "f64" else ir.FloatType()
    _product(b, "cblas" if kind == "half" else "fortran", w["fn"], real, trans_a, trans_b,
             small["m"], small["n"], small["k"], small["lda"], small["ldb"], small["ldc"],
             address("a", 0), address("b", 1), address("c", 2))
    i.add_incoming(b.add(i, ir.Constant(_I64, 1)), b.block)
    b.branch(head)
    b.position_at_end(done)
    restore()
    b.ret_void()
    return str(module)


def trampoline_name(abi: str, int64: bool, dtype: str) -> str:
    return f"hg_gemm_{abi}{64 if int64 else 32}_{dtype}"


def trampoline_ir(abi: str, int64: bool, dtype: str, triple: str) -> str:
    """The LLVM IR of the trampoline :func:`prepare` runs for entries of calling convention
    ``abi`` (:class:`.blas.Entry`) and ``dtype``, for ``triple``: it calls only the entry
    whose address the job holds, so it compiles for any target."""
    module = ir.Module("hologram_gemm_pieces")
    module.triple = triple
    _define(module, trampoline_name(abi, int64, dtype), abi, ir.IntType(64 if int64 else 32),
            ir.FloatType() if dtype == "f32" else ir.DoubleType(), 4 if dtype == "f32" else 8)
    return str(module)


def _define(module: ir.Module, name: str, abi: str, integer: ir.IntType, real: ir.Type,
            itemsize: int) -> None:
    """``name(job, start, stop)``: the product's blocks ``[start, stop)`` of rows (or
    columns) of C, in one call of the job's entry."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_PTR.as_pointer(), _I64, _I64]),
                     name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    words = b.bitcast(fn.args[0], _I64.as_pointer())
    w = {name: b.load(b.gep(words, [ir.Constant(_I64, i)]), name=name)
         for i, name in enumerate(_WORDS)}
    columns = b.icmp_unsigned("!=", w["columns"], ir.Constant(_I64, 0))
    extent = b.select(columns, w["n"], w["m"])
    first = b.mul(fn.args[1], ir.Constant(_I64, BLOCK))
    end = b.mul(fn.args[2], ir.Constant(_I64, BLOCK))
    end = b.select(b.icmp_signed("<", end, extent), end, extent)
    count = b.sub(end, first)
    zero = ir.Constant(_I64, 0)
    trans_a = b.icmp_unsigned("!=", w["trans_a"], zero)
    trans_b = b.icmp_unsigned("!=", w["trans_b"], zero)
    size = ir.Constant(_I64, itemsize)
    # A piece of rows starts `first` rows into A (a column, when A is stored transposed)
    # and into C; a piece of columns `first` columns into B (a row, when transposed) and C.
    a_skip = b.select(trans_a, first, b.mul(first, w["lda"]))
    b_skip = b.select(trans_b, b.mul(first, w["ldb"]), first)
    c_skip = b.select(columns, first, b.mul(first, w["ldc"]))
    a = b.add(w["a"], b.select(columns, zero, b.mul(a_skip, size)))
    b_ = b.add(w["b"], b.select(columns, b.mul(b_skip, size), zero))
    c = b.add(w["c"], b.mul(c_skip, size))
    m = b.select(columns, w["m"], count)
    n = b.select(columns, count, w["n"])
    ints = {key: b.trunc(w[key], integer) if integer.width < 64 else w[key]
            for key in ("k", "lda", "ldb", "ldc")}
    m, n = (b.trunc(v, integer) if integer.width < 64 else v for v in (m, n))
    pointers = [b.inttoptr(v, _PTR) for v in (a, b_, c)]
    restore = _on_threads(b, w, b.trunc(w["threads"], _I32)) if abi == "fortran" else None
    _product(b, abi, w["fn"], real, trans_a, trans_b, m, n, ints["k"], ints["lda"],
             ints["ldb"], ints["ldc"], *pointers)
    if restore is not None:  # MKL: the job's thread count (1 for a piece), here
        restore()
    b.ret_void()


def _product(b: ir.IRBuilder, abi: str, entry: ir.Value, real: ir.Type, trans_a: ir.Value,
             trans_b: ir.Value, m: ir.Value, n: ir.Value, k: ir.Value, lda: ir.Value,
             ldb: ir.Value, ldc: ir.Value, a: ir.Value, b_: ir.Value, c: ir.Value) -> None:
    """Emit one call of the gemm entry at address ``entry`` (an i64): ``C = op(A) @ op(B)``
    on row-major matrices (alpha 1, beta 0 of type ``real``), the sizes of the entry's
    integer type, ``trans_a``/``trans_b`` i1 flags, ``a``/``b_``/``c`` pointers. ``abi``:
    ``"cblas"`` (row-major CBLAS, by value) or ``"fortran"`` (column-major, every argument
    by reference)."""
    alpha, beta = ir.Constant(real, 1.0), ir.Constant(real, 0.0)
    integer = m.type
    if abi == "cblas":
        flag = {False: ir.Constant(_I32, blas.NO_TRANS), True: ir.Constant(_I32, blas.TRANS)}
        kind = ir.FunctionType(ir.VoidType(), [_I32, _I32, _I32, integer, integer, integer,
                                               real, _PTR, integer, _PTR, integer, real,
                                               _PTR, integer])
        b.call(b.inttoptr(entry, kind.as_pointer()),
               [ir.Constant(_I32, blas.ROW_MAJOR), b.select(trans_a, flag[True], flag[False]),
                b.select(trans_b, flag[True], flag[False]), m, n, k, alpha, a, lda, b_, ldb,
                beta, c, ldc])
        return

    # Column-major: row-major C = op(A) @ op(B) is C.T = op(B).T @ op(A).T, the same
    # memory with the operands swapped. Every argument by reference.
    def ref(value: ir.Value) -> ir.Value:
        slot = b.alloca(value.type)
        b.store(value, slot)
        return b.bitcast(slot, _PTR)

    letter = {False: ir.Constant(_I8, ord("N")), True: ir.Constant(_I8, ord("T"))}
    kind = ir.FunctionType(ir.VoidType(), [_PTR] * 13)
    b.call(b.inttoptr(entry, kind.as_pointer()),
           [ref(b.select(trans_b, letter[True], letter[False])),
            ref(b.select(trans_a, letter[True], letter[False])), ref(n), ref(m), ref(k),
            ref(alpha), b_, ref(ldb), a, ref(lda), ref(beta), c, ref(ldc)])


def _on_threads(b: ir.IRBuilder, w: dict[str, ir.Value], count: ir.Value
                ) -> Callable[[], None]:
    """Set the calling thread's MKL thread count to ``count`` (an i32) from the job's
    ``set_local``, and its OpenMP count too where the job has ``omp_get``/``omp_set``
    (MKL's mixed-precision products follow that one: :class:`.blas._Mkl`); returns what
    emits putting both back."""
    set_local = b.inttoptr(w["set_local"], ir.FunctionType(_I32, [_I32]).as_pointer())
    omp_get = b.inttoptr(w["omp_get"], ir.FunctionType(_I32, []).as_pointer())
    omp_set = b.inttoptr(w["omp_set"], ir.FunctionType(ir.VoidType(), [_I32]).as_pointer())
    openmp = b.icmp_unsigned("!=", w["omp_set"], ir.Constant(_I64, 0))
    saved = b.alloca(_I32)
    previous = b.call(set_local, [count])
    with b.if_then(openmp):
        b.store(b.call(omp_get, []), saved)
        b.call(omp_set, [count])

    def restore() -> None:
        b.call(set_local, [previous])
        with b.if_then(openmp):
            b.call(omp_set, [b.load(saved)])

    return restore
