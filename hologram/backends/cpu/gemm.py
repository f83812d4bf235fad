"""The cpu backend's library calls: the GEMMs :mod:`hologram.compiler.passes.library_calls`
finds, for the operand dtypes :mod:`.blas` multiplies; :func:`step` makes one a program
step, run through :mod:`.blas`."""

from __future__ import annotations

from collections.abc import Callable

from hologram.backends.cpu import blas, parallel_gemm, threads
from hologram.compiler.passes import library_calls
from hologram.compiler.passes.library_calls import Gemm, Matrix
from hologram.isa.ir import Program

__all__ = ["DTYPES", "Gemm", "Matrix", "split", "step"]

#: The operand dtypes :mod:`.blas` multiplies: sgemm, dgemm, and f16/bf16 matrices into a
#: float32 one (MKL's mixed-precision entries, else widened copies). The choice does not
#: depend on the process (an artifact runs with or without MKL).
DTYPES = ("f32", "f64") + blas.HALF


def split(program: Program) -> tuple[Program, dict[int, list[Gemm]]]:
    """:func:`hologram.compiler.passes.library_calls.split` for the cpu backend's BLAS."""
    return library_calls.split(program, DTYPES)


def step(g: dict) -> Callable:
    """The program step of one GEMM (``Gemm.to_json()``): ``run(pointers, memory)`` computes
    ``C = A @ B`` from the buffers' addresses in ``pointers`` (``memory`` is unused), on the
    process's thread count: a batch in one call of :func:`.blas.prepare_batched` (of
    half-precision matrices: a native loop on the worker pool), a single product in
    pieces on the worker pool (:mod:`.parallel_gemm`). Sizes and strides are
    checked once, here."""
    size = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2}
    itemsize, out_size = size[g["dtype"]], size[g.get("out", g["dtype"])]
    (a, a_off, a_bs, a_t, lda), (b, b_off, b_bs, b_t, ldb), (c, c_off, c_bs, _, ldc) = (
        g["a"], g["b"], g["c"])
    if g["batch"]:
        product = parallel_gemm.prepare_batched(g["dtype"], a_t, b_t, g["m"], g["n"], g["k"],
                                                lda, ldb, ldc, tuple(g["batch"]), tuple(a_bs),
                                                tuple(b_bs), tuple(c_bs))
    else:
        product = parallel_gemm.prepare(g["dtype"], a_t, b_t, g["m"], g["n"], g["k"], lda,
                                        ldb, ldc)
    da, db, dc = a_off * itemsize, b_off * itemsize, c_off * out_size
    set_threads = blas.thread_setter()

    def at(a: int, b: int, c: int) -> None:  # the operands' first elements
        set_threads(threads.num_threads())
        product(a, b, c)

    def run(pointers, memory) -> None:
        at((pointers[a] or 0) + da, (pointers[b] or 0) + db, (pointers[c] or 0) + dc)

    # For a native launch of the program (backend.py, _Executable.native_plan): the
    # product's native job on each operand's pointer slot plus its byte offset, or, for
    # products without one, ``at`` called back on those addresses.
    job = getattr(product, "job", None)
    if job is None:
        run.call = (at, ((a, da), (b, db), (c, dc)))
    else:
        operands = tuple(zip((a, b, c), (da, db, dc), job.operands))
        run.call = (job.kernel, job.rows, job.grain,
                    (job.words, operands, job.threads, job.owner))
    return run
