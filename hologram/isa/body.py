"""A kernel body under construction: typed, hash-consed, with structural digests.

Every kernel body is built through :class:`Body`, by the compiler's passes and, through
:class:`~hologram.isa.builder.KernelBuilder`, by the front ends:

- instructions are typed by the verifier's rules (:func:`hologram.isa.verify.infer`), so a
  mistake fails at the call that makes it;
- identical instructions merge (hash-consing: building the same instruction twice returns
  the same index), so common subexpressions vanish for free;
- every value gets a digest of its expression tree that is the same in every process, so
  canonical orders and cache keys do not depend on Python's per-process string hashing;
- with ``canonical=True`` (the passes), commutative operands are put in digest order, so
  ``a + b`` and ``b + a`` are one instruction.
"""

from __future__ import annotations

import hashlib

from hologram.errors import IRError
from hologram.isa import dtypes as dt
from hologram.isa.ir import COMMUTATIVE_OPS, WRITE_OPS, Instr, encode_const
from hologram.isa.verify import infer


class Body:
    """A kernel body under construction over iteration ``domain`` (the first ``grid_rank``
    dimensions are the grid). ``options``: the compile options of the pass building it
    (:class:`hologram.compiler.options.CompileOptions`), which rewrite rules consult;
    ``name``: the kernel's, for error messages."""

    def __init__(self, domain: tuple[int, ...], grid_rank: int = 0, options: object = None, *,
                 canonical: bool = True, name: str | None = None):
        self.domain = tuple(domain)
        self.grid_rank = grid_rank
        self.options = options
        self.canonical = canonical
        self.name = name
        self.instrs: list[Instr] = []
        self.digests: list[bytes] = []
        self.interned: dict[Instr, int] = {}

    def get(self, i: int) -> Instr:
        return self.instrs[i]

    def add(self, instr: Instr) -> int:
        """Append ``instr`` (or return the identical instruction already there)."""
        if self.canonical and (instr.op in COMMUTATIVE_OPS or instr.op == "fma"):
            instr = self._ordered(instr)
        if instr.op not in WRITE_OPS and instr in self.interned:  # a write is never merged
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
        return instr.with_args(head + instr.args[n:])

    def make(self, op: str, args: tuple[int, ...], attrs: tuple = (),
             dtype: dt.DType | None = None, shape: tuple[int, ...] | None = None) -> int:
        """Build a new typed instruction from operands already in the body (``shape``
        overrides the inferred one: loads and stores through an index map)."""
        types = [(self.instrs[a].dtype, self.instrs[a].shape) for a in args]
        try:
            rtype, rshape = infer(op, types, attrs, dtype, self.domain, self.grid_rank)
        except IRError as err:
            if self.name is None:
                raise
            raise IRError(f"kernel {self.name}: {err}") from None
        return self.add(Instr(op, rtype, rshape if shape is None else shape, args, attrs))

    def const(self, value: object, dtype: dt.DType) -> int:
        return self.make("const", (), (encode_const(dtype, value),), dtype)
