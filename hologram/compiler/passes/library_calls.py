"""Library calls: contractions a backend hands to its BLAS (a compiler pass).

A kernel whose one contraction multiplies two loads over its last dimension — the form
``hologram.graph`` gives a (batched) matmul: domain ``[*batch, M, N, K]``, ``a`` read as
``[.., M, 1, K]``, ``b`` as ``[.., 1, N, K]`` — is a GEMM per batch index when both operands
are laid out as BLAS matrices (unit stride along one dimension; either may be transposed).
A float32 contraction of two float16 (or two bfloat16) loads widened by a ``cast`` — the
form a half-precision product takes once fusion folds its operands' casts into it
(PyTorch's ``mm`` in bfloat16 computes in float32 and rounds once) — is a GEMM of the
half-precision matrices into a float32 one, the mixed-precision product BLAS libraries
offer (``cblas_gemm_bf16bf16f32``). :func:`split` rewrites such kernels before rendering,
for the operand dtypes the backend's library takes (the cpu backend: f32, f64, bf16, f16):

- if the kernel only stores the product, and the output is a row-major matrix, BLAS writes
  straight into the output and the kernel disappears;
- otherwise BLAS writes a scratch block (a temporary placed after the arena) and the
  kernel keeps its epilogue (bias, activation, ...) with the product loaded from there.

Anything else stays with the generated loops. :func:`dump` is the pass's text form (the
``library_calls`` dump stage): which kernels became which calls.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hologram.isa import dtypes as dt
from hologram.isa.ir import BufferDecl, IndexMap, Instr, Kernel, Program

_ALIGN = 64


@dataclass(frozen=True)
class Matrix:
    """One operand: buffer, element offset, batch strides, and BLAS layout."""

    buffer: int
    offset: int
    batch_strides: tuple[int, ...]
    trans: bool
    ld: int


@dataclass(frozen=True)
class Gemm:
    """C = A @ B for every batch index; runs before kernel ``before`` (or instead of the
    kernel that was removed). ``dtype`` is the operands' dtype, ``out`` C's: the same, or
    f32 for f16/bf16 operands."""

    dtype: str
    batch: tuple[int, ...]
    m: int
    n: int
    k: int
    a: Matrix
    b: Matrix
    c: Matrix
    out: str = ""

    def __post_init__(self) -> None:
        if not self.out:
            object.__setattr__(self, "out", self.dtype)

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "out": self.out, "batch": list(self.batch), "m": self.m,
                "n": self.n, "k": self.k,
                **{name: [x.buffer, x.offset, list(x.batch_strides), x.trans, x.ld]
                   for name, x in (("a", self.a), ("b", self.b), ("c", self.c))}}


def _layout(rows: int, cols: int, s_row: int, s_col: int) -> tuple[bool, int] | None:
    """(transposed, leading dimension) of a rows x cols matrix with these element strides,
    as row-major BLAS wants it, or None."""
    if (cols == 1 or s_col == 1) and (rows == 1 or s_row >= max(1, cols)):
        return False, s_row if rows > 1 else max(1, cols)
    if (rows == 1 or s_row == 1) and (cols == 1 or s_col >= max(1, rows)):
        return True, s_col if cols > 1 else max(1, rows)
    return None


def _operand(instr: Instr, rows_dim: int, cols_dim: int, batch: int) -> Matrix | None:
    shape, strides = instr.shape, instr.map.strides
    layout = _layout(shape[rows_dim], shape[cols_dim], strides[rows_dim], strides[cols_dim])
    if layout is None:
        return None
    batch_strides = tuple(s if n > 1 else 0 for n, s in zip(shape[:batch], strides[:batch]))
    return Matrix(instr.buffer, instr.map.offset, batch_strides, *layout)


def _plan(kernel: Kernel) -> tuple[Gemm, int, int | None] | None:
    """(gemm with C unset, position of the contraction, position of the store that writes
    the product directly — or None) for a kernel BLAS can run, else None."""
    rank = len(kernel.domain)
    if rank < 3 or kernel.grid_rank != rank - 1:
        return None
    contracts = [i for i, ins in enumerate(kernel.body) if ins.op in ("contract", "reduce")]
    if len(contracts) != 1 or kernel.body[contracts[0]].op != "contract":
        return None
    pos = contracts[0]
    instr = kernel.body[pos]
    a, b = (_loaded(kernel, x) for x in instr.args)
    if instr.axes != (rank - 1,) or a is None or b is None or a.dtype != b.dtype:
        return None
    if instr.dtype not in (dt.float32, dt.float64) or 0 in kernel.domain:
        return None
    if a.dtype != instr.dtype and (a.dtype not in _HALF or instr.dtype != dt.float32):
        return None
    *batch, m, n, k = kernel.domain
    mdim, ndim, kdim = rank - 3, rank - 2, rank - 1
    # a must vary along M (unless M is 1) and K, never along N; b the other way round.
    if a.shape[ndim] != 1 or b.shape[mdim] != 1:
        return None
    if a.shape[mdim] != m or b.shape[ndim] != n or a.shape[kdim] != k or b.shape[kdim] != k:
        return None
    ma, mb = _operand(a, mdim, kdim, len(batch)), _operand(b, kdim, ndim, len(batch))
    if ma is None or mb is None:
        return None
    uses = [i for i, ins in enumerate(kernel.body) if pos in ins.args]
    direct = None
    if len(uses) == 1 and kernel.body[uses[0]].op == "store":
        direct = uses[0]
    gemm = Gemm(a.dtype.name, tuple(batch), m, n, k, ma, mb, ma, instr.dtype.name)
    return gemm, pos, direct


_HALF = (dt.float16, dt.bfloat16)


def _loaded(kernel: Kernel, x: int) -> Instr | None:
    """The load a contraction's operand ``x`` reads: the instruction itself, or the load a
    cast from f16/bf16 widens; None for anything else."""
    instr = kernel.body[x]
    if instr.op == "cast":
        instr = kernel.body[instr.args[0]]
        if instr.dtype not in _HALF:
            return None
    return instr if instr.op == "load" else None


def split(program: Program, dtypes: tuple[str, ...] = ("f32", "f64")
          ) -> tuple[Program, dict[int, list[Gemm]]]:
    """Move BLAS-able contractions whose operands are of ``dtypes`` out of their kernels.
    Returns the rewritten program and, by kernel index in it, the GEMMs to run (in order)
    before that kernel; an index equal to the number of kernels means "at the end"."""
    buffers = list(program.buffers)
    kernels: list[Kernel] = []
    gemms: dict[int, list[Gemm]] = {}
    arena = program.arena_bytes
    for kernel in program.kernels:
        planned = _plan(kernel)
        if planned is None or planned[0].dtype not in dtypes:
            kernels.append(kernel)
            continue
        gemm, pos, direct = planned
        rank = len(kernel.domain)
        if direct is not None:
            store = kernel.body[direct]
            out = _operand(store, rank - 3, rank - 2, len(gemm.batch))
            if out is not None and not out.trans and store.shape == kernel.body[pos].shape:
                gemms.setdefault(len(kernels), []).append(replace(gemm, c=out))
                continue  # BLAS writes the output; no kernel left
        # BLAS writes a scratch block; the kernel keeps the epilogue.
        shape = kernel.body[pos].shape
        offset = -(-arena // _ALIGN) * _ALIGN
        scratch = BufferDecl(f"gemm.{kernel.name}", kernel.body[pos].dtype,
                         gemm.batch + (gemm.m, gemm.n), "temp", offset)
        arena = offset + scratch.nbytes
        buffers.append(scratch)
        strides = IndexMap.contiguous(shape).strides
        load = Instr("load", scratch.dtype, shape, (), (len(buffers) - 1, IndexMap(0, strides)))
        body = list(kernel.body)
        body[pos] = load
        kernels.append(replace(kernel, body=tuple(body)))
        batch_strides = tuple(s if n > 1 else 0 for n, s in zip(gemm.batch, strides))
        c = Matrix(len(buffers) - 1, 0, batch_strides, False, max(1, gemm.n))
        gemms.setdefault(len(kernels) - 1, []).append(replace(gemm, c=c))
    rewritten = replace(program, buffers=tuple(buffers), kernels=tuple(kernels))
    return rewritten, gemms


def dump(program: Program, gemms: dict[int, list[Gemm]]) -> str:
    """The rewritten program's calls, one line each, where they run."""
    lines = []
    for index in range(len(program.kernels) + 1):
        where = f"before kernel {program.kernels[index].name}" \
            if index < len(program.kernels) else "at the end"
        for g in gemms.get(index, ()):
            names = [program.buffers[x.buffer].name for x in (g.a, g.b, g.c)]
            dtypes = g.dtype if g.out == g.dtype else f"{g.dtype}->{g.out}"
            lines.append(f"gemm {dtypes} batch {list(g.batch)} m {g.m} n {g.n} k {g.k}: "
                         f"@{names[2]} = @{names[0]}{'.T' if g.a.trans else ''} @ "
                         f"@{names[1]}{'.T' if g.b.trans else ''} {where}")
    return "\n".join(lines) + "\n" if lines else "no library calls\n"
