"""The walk every GPU renderer makes over one kernel's loop plan, written once.

A renderer (the cuda backend's Triton, the webgpu backend's WGSL) turns a scheduled
kernel into source text from its loop plan (:func:`hologram.codegen.loops.plan`): values
computed once per grid point are emitted before the loop nests that need them
(:meth:`KernelWriter.prepare`), the rest inside the nests, each at most once per scope
(:meth:`KernelWriter.value`); each store nest then makes its stores and scatters
(:meth:`KernelWriter.write_stores`). :class:`KernelWriter` holds that walk, the dispatch
of an instruction to what renders it (:meth:`KernelWriter.emit`, the ``op_*`` table), and
the parts of an element's address that do not depend on the language
(:meth:`KernelWriter.index_strides`, :func:`gather_clamp`, :func:`row_major`).

What the two languages share ends there: Triton computes tiles of grid points with masks
and has every storage type, WGSL one point per invocation over 32-bit words, so loads,
stores, reductions, the kernel's frame and the launch stay in each renderer.

A renderer subclasses :class:`KernelWriter` and supplies:

- ``indent`` (one level of its source's indentation) and ``target`` (the backend's name,
  which starts its error messages);
- ``load(instr, address=None)``: a load's value, or a gather's at ``address``;
  ``gather_address(instr)``; ``store(instr)``; ``scatter(instr)``;
- ``constant(value, dtype)``: a ``const`` instruction's value, bound to a name;
  ``index_value(axis, dtype)``: an ``index`` instruction's;
- ``compute(instr, a, args)``: any other instruction's value, from its operands' names
  (``a``: the first operand's dtype); most end in :meth:`KernelWriter.apply`, the
  ``op_*`` table (``op_name(args, a, t) -> expression``), which it fills in its own
  spelling; the comparisons come from :meth:`KernelWriter.compare`, through
  ``bool_number(x)`` (a bool as an unsigned number, for the ordered comparisons) and,
  where floats need more than the infix operator, ``compare_floats``;
- the steps of a cast (:meth:`KernelWriter.op_cast`): ``cast_to_bool(x, a)``,
  ``cast_from_bool(x, t)``, ``cast_to_float(x, a, t)``, ``round_narrow(value, t)``,
  ``saturate(x, t)`` (float to integer) and ``int_cast(x, a, t)``;
- ``point_reduction(i, instr)`` / ``nested_reduction(i, instr)``: a reduction computed
  once per grid point, or inside a loop nest (a renderer may refuse it);
- ``store_nest(dims, stores)``: the loop nest over ``dims`` around :meth:`write` of each
  of ``stores``.

Everything here is text generation: the same calls in the same order give the same
source, which the backends' caches key on.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from hologram.compiler.capabilities import Capabilities
from hologram.errors import CompileError
from hologram.isa.dtypes import DType
from hologram.isa.ir import Instr, Kernel, Program

from . import loops
from .mathlib import COMPARISONS


class KernelWriter:
    """One kernel being written: its source lines and the names of the values emitted so
    far (the module docstring says what a subclass supplies)."""

    indent = "    "
    target = ""

    def __init__(self, program: Program, kernel: Kernel, caps: Capabilities):
        self.program, self.kernel = program, kernel
        self.plan = loops.plan(kernel, caps)
        self.lines: list[str] = []
        self.depth = 1
        self.names = 0  # the last number given to a generated name
        self.index: dict[int, str] = {}  # domain dimension -> the name of its index here
        # Values by body position: those computed once per grid point, and those of the
        # current scope inside a loop nest (``local`` is ``point`` while preparing).
        self.point: dict[int, str] = {}
        self.local: dict[int, str] = {}

    def line(self, text: str) -> None:
        self.lines.append(self.indent * self.depth + text)

    # --- the walk -----------------------------------------------------------------------
    def write_stores(self) -> None:
        """Every store nest of the plan, in order: the values its stores need that vary
        along none of its dimensions first (once per grid point), then the nest."""
        body = self.kernel.body
        for dims, stores in self.plan.store_nests:
            for pos in stores:
                for arg in body[pos].args:  # a store's value; a scatter's, and its offset
                    self.prepare(arg)
            self.store_nest(list(dims), [body[p] for p in stores])

    def prepare(self, root: int) -> None:
        """Emit, per grid point, every value ``root`` needs that varies along no loop
        dimension (reductions included), so loop nests only recompute the rest."""
        for i in self.plan.point_values(self.kernel, root, self.point):
            if i not in self.point:
                self.local = self.point
                instr = self.kernel.body[i]
                if instr.op in ("reduce", "contract"):
                    self.point[i] = self.point_reduction(i, instr)
                else:
                    self.point[i] = self.emit(instr)

    def value(self, i: int) -> str:
        """The name of the value at body position ``i``, emitted first if this scope has
        not yet."""
        if i in self.point:
            return self.point[i]
        if i not in self.local:
            instr = self.kernel.body[i]
            if instr.op in ("reduce", "contract"):
                self.local[i] = self.nested_reduction(i, instr)
            else:
                self.local[i] = self.emit(instr)
        return self.local[i]

    def write(self, instr: Instr) -> None:
        if instr.op == "scatter":
            self.scatter(instr)
        else:
            self.store(instr)

    def emit(self, instr: Instr) -> str:
        """The value of a (non-reduction) instruction, bound to a name."""
        op = instr.op
        if op == "load":
            return self.load(instr)
        if op == "gather":
            return self.load(instr, self.gather_address(instr))
        if op == "const":
            return self.constant(instr.value, instr.dtype)
        if op == "index":
            return self.index_value(instr.axis, instr.dtype)
        a = self.kernel.body[instr.args[0]].dtype
        return self.compute(instr, a, [self.value(x) for x in instr.args])

    def apply(self, op: str, args: list[str], a: DType, t: DType) -> str:
        """The expression of ``op`` on ``args`` (operand dtype ``a``, result ``t``) from the
        ``op_*`` table. An op missing there is one the backend's ``supports`` should have
        refused."""
        handler = getattr(self, f"op_{op}", None)
        if handler is None:
            raise CompileError(f"{self.target}: kernel {self.kernel.name}: the renderer has no "
                               f"{op} on {a.name} (Backend.supports should have refused it)")
        return handler(args, a, t)

    # --- the op table: what both languages spell alike -------------------------------------
    def op_and(self, args, a, t):
        return f"{args[0]} & {args[1]}"

    def op_or(self, args, a, t):
        return f"{args[0]} | {args[1]}"

    def op_cast(self, args, a, t):
        """A cast from ``a`` to ``t`` by the ISA's rules (docs/isa.md), each step in the
        language's spelling: to bool, nonzero (NaN and subnormals are true); from bool, 0
        or 1; to a float, the value in ``t``'s register (for f16 and bf16 an f32, exact or
        rounded to odd, then rounded once to the narrow format); from a float to an
        integer, saturating, toward zero, NaN to 0; between integers, wrapping."""
        (x,) = args
        if a is t:
            return x
        if t.is_bool:
            return self.cast_to_bool(x, a)
        if a.is_bool:
            return self.cast_from_bool(x, t)
        if t.is_float:
            value = self.cast_to_float(x, a, t)
            return self.round_narrow(value, t) if t.name in ("f16", "bf16") else value
        if a.is_float:
            return self.saturate(x, t)
        return self.int_cast(x, a, t)

    # --- addresses ----------------------------------------------------------------------
    def index_strides(self, instr: Instr) -> list[tuple[str, int]]:
        """``(index, stride)`` of each dimension that moves a load's or store's element
        here: extent above 1, a nonzero stride, and an index bound (a dimension without one
        is at index 0 in this scope). The element is the map's offset plus their
        products."""
        return [(self.index[d], stride)
                for d, (n, stride) in enumerate(zip(instr.shape, instr.map.strides))
                if n > 1 and stride and d in self.index]


    def compare(self, op: str, args, a: DType) -> str:
        """``op`` (a key of :data:`COMPARISONS`) of two operands of dtype ``a``: the infix
        operator, bools ordered as numbers (``False < True``)."""
        x, y = args
        if a.is_bool and op not in ("eq", "ne"):
            x, y = self.bool_number(x), self.bool_number(y)
        if a.is_float:
            return self.compare_floats(op, x, y)
        return f"{x} {COMPARISONS[op]} {y}"

    def compare_floats(self, op: str, x: str, y: str) -> str:
        """Float ``x op y``: the infix operator, unless the language's is not IEEE's."""
        return f"{x} {COMPARISONS[op]} {y}"


for _op in COMPARISONS:
    setattr(KernelWriter, f"op_{_op}",
            lambda self, args, a, t, _op=_op: self.compare(_op, args, a))


@dataclass(frozen=True)
class Clamp:
    """How a gather's (or scatter's) operand enters its element (docs/isa.md): the
    element is ``offset`` plus the operand clamped to ``[low, high]`` plus the map's
    terms. The instruction's bounds are first cut to the operand dtype's range, so the
    clamp is exact in the operand's own width and skips a side the operand cannot pass
    (``low`` / ``high`` None); bounds wholly outside that range clamp every operand value
    to one bound, which is then folded into ``offset`` (``operand`` False)."""

    offset: int
    operand: bool
    low: int | None
    high: int | None


def gather_clamp(kernel: Kernel, instr: Instr) -> Clamp:
    """The :class:`Clamp` of a gather or scatter ``instr`` of ``kernel`` (its last
    operand is the offset)."""
    operand = kernel.body[instr.args[-1]].dtype
    low, high = instr.bounds
    kmin, kmax = operand.min, operand.max
    lo, hi = max(low, kmin), min(high, kmax)
    if lo >= hi:  # every operand value clamps to one bound
        return Clamp(instr.map.offset + (high if high <= kmin else low), False, None, None)
    return Clamp(instr.map.offset, True, lo if lo > kmin else None, hi if hi < kmax else None)


def row_major(domain: Sequence[int], dims: Sequence[int],
              stride: int = 1) -> Iterator[tuple[int, int, int]]:
    """``(dimension, stride, extent)`` of each of ``dims`` whose extent is above 1,
    innermost (last) first: the coordinate of a dimension in a flat row-major index over
    ``dims`` (counted in units of ``stride``) is ``(flat // stride) % extent``. A
    dimension of extent 1 has none: its index is 0."""
    for d in reversed(dims):
        n = domain[d]
        if n > 1:
            yield d, stride, n
        stride *= n
