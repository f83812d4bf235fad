"""Float sums in C: the order docs/isa.md ("Float sums") states for the cpu backend.

Each row of the innermost reduced axis is cut into blocks of :data:`BLOCK` terms: term
``i`` of a block's whole groups of :data:`LANES` goes to lane ``i % LANES`` (in order),
the lanes are added as a balanced tree; a short block's further whole vectors of
:data:`VECTOR` terms go to ``VECTOR`` more lanes, added as a tree, its last ``< VECTOR``
terms to one sequential sum; these sums are added in order in the block-sum type (float64;
compensated, Neumaier's variant, for f64 operands). A row of at most :data:`SHORT_ROW`
terms is one sequential sum. The lanes are a C array per row; the result is the cpu
backend's bit for bit (which also has column tiles and split partials, not used here).
"""

from __future__ import annotations

from hologram.codegen.loops import BLOCK, LANES, SHORT_ROW, VECTOR, Accumulator
from hologram.isa.ir import Instr

#: The C type of each accumulator dtype.
_CTYPE = {"f32": "float", "f64": "double"}


def float_sum(r, instr: Instr, acc: Accumulator) -> tuple[str, str]:
    """A float sum or contraction of renderer ``r``'s kernel (``render._Kernel``), blocked
    in lanes (the module docstring): ``(the sum's name, its C type)``."""
    lane, wide = _CTYPE[acc.dtype], _CTYPE[acc.outer]
    total = r.var(wide, r.flit(-0.0, wide))
    error = r.var(wide, r.flit(0.0, wide)) if acc.compensated else None
    lanes = r.fresh("h")  # declared where a row is long enough to need them
    minus_zero = r.flit(-0.0, lane)

    def add(value: str) -> None:  # a block's sum into the block sums, in order
        value = r.bind(wide, f"({wide}){value}")
        if error is None:
            r.line(f"{total} = {total} + {value};")
            return
        s = r.bind(wide, total)
        r.line(f"{total} = {s} + {value};")
        r.line(f"{error} = {error} + (fabs({s}) >= fabs({value}) ? ({s} - {total}) + "
               f"{value} : ({value} - {total}) + {s});")

    def lanes_add(first: int, count: int, at: str) -> None:  # lane k += term(at + k)
        with r.loop(-2, count) as k:
            r.index[inner] = r.bind("int64_t", f"{at} + {k}")
            r.line(f"{lanes}[{first} + {k}] = {lanes}[{first} + {k}] + "
                   f"{r.term(instr, lane)};")

    def tree(first: int, count: int) -> None:  # lanes [first, +count) added pairwise
        r.line(f"for (int hg_half = {count // 2}; hg_half > 0; hg_half /= 2)")
        r.line(f"    for (int hg_k = 0; hg_k < hg_half; hg_k++) {lanes}[{first} + hg_k] "
               f"= {lanes}[{first} + hg_k] + {lanes}[{first} + hg_k + hg_half];")
        add(f"{lanes}[{first}]")

    def clear(first: int, count: int) -> None:
        r.line(f"for (int hg_k = 0; hg_k < {count}; hg_k++) {lanes}[{first} + hg_k] = "
               f"{minus_zero};")

    axes = list(instr.axes)
    inner, n = axes[-1], r.kernel.domain[axes[-1]]
    outside = r.index.get(inner)  # a user's loop over the same dimension
    with r.nest(axes[:-1]):
        if n <= SHORT_ROW:
            row = r.var(lane, minus_zero)
            with r.loop(inner, n):
                r.line(f"{row} = {row} + {r.term(instr, lane)};")
            add(row)
        else:
            r.line(f"{lane} {lanes}[{LANES + VECTOR}];")
            whole = n // BLOCK * BLOCK
            if whole:
                with r.loop(-4, whole, step=BLOCK) as start:
                    clear(0, LANES)
                    with r.loop(-3, f"{start} + {BLOCK}", start=start, step=LANES) as g:
                        lanes_add(0, LANES, g)
                    tree(0, LANES)
            size = n - whole
            full, vectors = whole + size // LANES * LANES, whole + size // VECTOR * VECTOR
            if size >= LANES:
                clear(0, LANES)
                with r.loop(-3, full, start=whole, step=LANES) as g:
                    lanes_add(0, LANES, g)
                tree(0, LANES)
            if vectors > full:
                clear(LANES, VECTOR)
                with r.loop(-3, vectors, start=full, step=VECTOR) as v:
                    lanes_add(LANES, VECTOR, v)
                tree(LANES, VECTOR)
            if n > vectors:
                tail = r.var(lane, minus_zero)
                with r.loop(inner, n, start=vectors):
                    r.line(f"{tail} = {tail} + {r.term(instr, lane)};")
                add(tail)
    r.index.pop(inner, None)
    if outside is not None:
        r.index[inner] = outside
    if error is None:
        return total, wide
    keep = f"{error} == 0 || ({total} - {total}) != ({total} - {total})"
    return r.bind(wide, f"{keep} ? {total} : {total} + {error}"), wide
