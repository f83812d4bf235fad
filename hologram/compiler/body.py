"""A kernel body under construction: typed, hash-consed, with structural digests.

The passes build kernel bodies through :class:`Body`: identical instructions merge (common
subexpressions vanish), commutative operands are put in a fixed order, and every value gets
a digest of its expression tree that is the same in every process (so canonical orders
and cache keys do not depend on Python's per-process string hashing).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

from hologram.compiler.options import CompileOptions
from hologram.isa import dtypes as dt
from hologram.isa.ir import COMMUTATIVE_OPS, Instr, encode_const
from hologram.isa.verify import infer


class Body:
    """A kernel body under construction, with hash-consing and structural digests."""

    def __init__(self, domain: tuple[int, ...], grid_rank: int = 0,
                 options: CompileOptions | None = None):
        self.domain = domain
        self.grid_rank = grid_rank
        self.options = options or CompileOptions()
        self.instrs: list[Instr] = []
        self.digests: list[bytes] = []
        self.interned: dict[Instr, int] = {}

    def get(self, i: int) -> Instr:
        return self.instrs[i]

    def add(self, instr: Instr) -> int:
        """Append ``instr`` (or return the identical instruction already there)."""
        if instr.op in COMMUTATIVE_OPS or instr.op == "fma":
            instr = self._ordered(instr)
        if instr.op != "store" and instr in self.interned:
            return self.interned[instr]
        self.interned[instr] = self.push(instr)
        return self.interned[instr]

    def push(self, instr: Instr) -> int:
        """Append without interning or reordering, recording the structural digest."""
        self.instrs.append(instr)
        parts = (instr.op, instr.dtype.name, instr.shape, instr.attrs,
                 tuple(self.digests[a] for a in instr.args))
        self.digests.append(hashlib.blake2b(repr(parts).encode(), digest_size=16).digest())
        return len(self.instrs) - 1

    def _ordered(self, instr: Instr) -> Instr:
        # fma(a, b, c) = a*b + c: only the two factors commute.
        n = 2 if instr.op == "fma" else len(instr.args)
        head = tuple(sorted(instr.args[:n], key=lambda a: self.digests[a]))
        return replace(instr, args=head + instr.args[n:])

    def make(self, op: str, args: tuple[int, ...], attrs: tuple = (),
             dtype: dt.DType | None = None) -> int:
        """Build a new typed instruction from operands already in the body."""
        types = [(self.instrs[a].dtype, self.instrs[a].shape) for a in args]
        rtype, shape = infer(op, types, attrs, dtype, self.domain, self.grid_rank)
        return self.add(Instr(op, rtype, shape, args, attrs))

    def const(self, value: object, dtype: dt.DType) -> int:
        return self.make("const", (), (encode_const(dtype, value),), dtype)
