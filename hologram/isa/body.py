"""A kernel body under construction: typed, hash-consed, with structural digests.

Every kernel body is built through :class:`Body`, by the compiler's passes and, through
:class:`~hologram.isa.builder.KernelBuilder`, by the front ends:

- instructions are typed by the verifier's rules (:func:`hologram.isa.verify.infer`), so a
  mistake fails at the call that makes it;
- identical instructions merge (hash-consing: building the same instruction twice returns
  the same index), so common subexpressions vanish for free;
- with ``canonical=True`` (the passes), every value gets a digest of its expression tree
  that is the same in every process, and commutative operands are put in digest order, so
  ``a + b`` and ``b + a`` are one instruction (canonicalization also orders loads and
  stores by digest). A digest is two halves: the first of the tree without its extents
  (no shapes, no index maps, no gather bounds: operation, dtype, buffer, constants, axes),
  the second of everything; sorting by both puts operands in an order that does not depend
  on the tensors' sizes wherever the first halves differ, so an operation on tensors of
  other shapes lowers to the same kernel (one LLVM compile, not one per shape), and stays
  canonical where they tie.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from hologram.errors import IRError
from hologram.isa import dtypes as dt
from hologram.isa.ir import COMMUTATIVE_OPS, MEMORY_OPS, WRITE_OPS, Instr, encode_const
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
        self._digests: list[bytes | None] = []  # made when first asked for (digest())
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
        """Append without interning or reordering."""
        self.instrs.append(instr)
        self._digests.append(None)
        return len(self.instrs) - 1

    def digest(self, i: int) -> bytes:
        """The structural digest of value ``i``: 8 bytes of its expression tree without
        extents, then 8 of all of it (made on first use, with its operands'; most values
        are never compared)."""
        digests = self._digests
        d = digests[i]
        if d is not None:
            return d
        stack = [i]  # post-order, iterative: chains can be thousands deep
        while stack:
            j = stack[-1]
            if digests[j] is not None:
                stack.pop()
                continue
            missing = [a for a in self.instrs[j].args if digests[a] is None]
            if missing:
                stack.extend(missing)
            else:
                digests[j] = self._digest(self.instrs[j])
                stack.pop()
        return digests[i]

    def _digest(self, instr: Instr) -> bytes:
        """:meth:`digest` of ``instr``, whose operands' digests are made."""
        digests, op, attrs = self._digests, instr.op, instr.attrs
        if op in MEMORY_OPS:  # (buffer, map, [bounds, [mode]]): buffer and mode only
            free = f"{op}|{instr.dtype.name}|{attrs[0]}|{attrs[3] if len(attrs) > 3 else ''}"
            extents = f"{instr.shape}|{attrs[1].offset}|{attrs[1].strides}|{attrs[2:3]}"
        else:
            free = f"{op}|{instr.dtype.name}|{attrs!r}"
            extents = f"{instr.shape}"
        args = instr.args
        head = hashlib.blake2b(free.encode() + b"".join([digests[a][:8] for a in args]),
                               digest_size=8).digest()
        return head + hashlib.blake2b(head + extents.encode() + b"".join(
            [digests[a][8:] for a in args]), digest_size=8).digest()

    def _ordered(self, instr: Instr) -> Instr:
        # fma(a, b, c) = a*b + c: only the two factors commute.
        n = 2 if instr.op == "fma" else len(instr.args)
        head = tuple(sorted(instr.args[:n], key=self.digest))
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

    def copy(self, instr: Instr, args: tuple[int, ...], source: Sequence[Instr]) -> int:
        """Add ``instr``, an instruction of the verified kernel body ``source`` over this
        body's domain and grid, with operands ``args`` (here) in place of its own: as it
        is where each operand has the type its own had (the typing rules would give the
        same result), else re-typed by :meth:`make` (an operand may now be narrower)."""
        instrs = self.instrs
        for new, old in zip(args, instr.args):
            have, had = instrs[new], source[old]
            if have.dtype is not had.dtype or have.shape != had.shape:
                return self.make(instr.op, args, instr.attrs, instr.dtype)
        return self.add(instr.with_args(args))

    def const(self, value: object, dtype: dt.DType) -> int:
        return self.make("const", (), (encode_const(dtype, value),), dtype)
