"""Building Atlas programs from Python.

    b = ProgramBuilder("axpy")
    x = b.input("x", "f32", (1024,))
    y = b.output("y", "f32", (1024,))
    k = b.kernel((1024,))
    k.store(y, k.add(k.mul(k.load(x), 2.0), 1.0))
    program = b.build()            # verified

A kernel's instructions go into a :class:`~hologram.isa.body.Body` (the one body builder,
shared with the compiler's passes); :class:`KernelBuilder` adds an API on :class:`Value`
handles. Instructions are hash-consed (building the same instruction twice returns the
same value, so a front end gets common subexpressions merged for free) and typed with the
verifier's rules, so mistakes fail at the call that makes them. Operands may be Python
numbers; they become constants of the other operand's dtype. Operand order is kept as
written (the passes canonicalize it).
"""

from __future__ import annotations

from typing import NamedTuple

from hologram.errors import IRError
from hologram.isa import dtypes as dt
from hologram.isa.body import Body
from hologram.isa.dtypes import DType
from hologram.isa.ir import (
    BINARY_OPS,
    COMPARE_OPS,
    UNARY_OPS,
    BufferDecl,
    IndexMap,
    Kernel,
    Program,
    encode_const,
)
from hologram.isa.verify import verify


class Value(NamedTuple):
    """A handle on an instruction result inside one :class:`KernelBuilder`."""

    index: int
    dtype: DType
    shape: tuple[int, ...]


Operand = Value | bool | int | float


class KernelBuilder:
    """One kernel of a :class:`ProgramBuilder`: methods that take and return :class:`Value`
    handles, over a :class:`~hologram.isa.body.Body` (operands in the order written)."""

    def __init__(self, program: ProgramBuilder, name: str, domain: tuple[int, ...],
                 grid_rank: int):
        self.program = program
        self.name = name
        self.body = Body(domain, grid_rank, canonical=False, name=name)

    @property
    def domain(self) -> tuple[int, ...]:
        return self.body.domain

    @property
    def grid_rank(self) -> int:
        return self.body.grid_rank

    # --- core -------------------------------------------------------------------------
    def emit(self, op: str, args: tuple[Value, ...] = (), attrs: tuple = (),
             dtype: DType | None = None, shape: tuple[int, ...] | None = None) -> Value:
        """Append (or reuse) one instruction, typed by the verifier's rules."""
        i = self.body.make(op, tuple(a.index for a in args), attrs, dtype, shape)
        instr = self.body.get(i)
        return Value(i, instr.dtype, instr.shape)

    def _operands(self, *xs: Operand) -> tuple[Value, ...]:
        like = next((x for x in xs if isinstance(x, Value)), None)
        if like is None:
            raise IRError(f"kernel {self.name}: at least one operand must be a Value")
        return tuple(x if isinstance(x, Value) else self.const(x, like.dtype) for x in xs)

    def _map(self, buffer: int, shape: tuple[int, ...] | None, offset: int,
             strides: tuple[int, ...] | None) -> tuple[BufferDecl, tuple[int, ...], IndexMap]:
        buf = self.program.buffers[buffer]
        if shape is None:
            shape = buf.shape
        shape = tuple(shape)
        if strides is None:
            if len(shape) != len(self.domain):
                raise IRError(f"kernel {self.name}: {buf.name} has rank {len(buf.shape)}, the "
                              f"domain {list(self.domain)} has rank {len(self.domain)}; "
                              "give shape= and strides= explicitly")
            strides = IndexMap.contiguous(shape).strides
        return buf, shape, IndexMap(offset, tuple(strides))

    # --- memory -----------------------------------------------------------------------
    def load(self, buffer: int, shape: tuple[int, ...] | None = None, offset: int = 0,
             strides: tuple[int, ...] | None = None) -> Value:
        """Load ``buffer`` as a value of ``shape`` (default: the buffer's own shape, which
        must then have the domain's rank) through ``offset`` and ``strides`` (default:
        row-major)."""
        buf, shape, imap = self._map(buffer, shape, offset, strides)
        return self.emit("load", (), (buffer, imap), buf.dtype, shape)

    def gather(self, buffer: int, at: Value, shape: tuple[int, ...] | None = None,
               offset: int = 0, strides: tuple[int, ...] | None = None,
               bounds: tuple[int, int] | None = None) -> Value:
        """Read ``buffer`` at data-dependent positions: element ``i`` is flat element
        ``offset + sum(i[d] * strides[d]) + clamp(at[i], *bounds)`` (docs/isa.md).
        ``shape`` defaults to ``at``'s and ``strides`` to zeros (``at`` holds whole flat
        positions); ``at`` is any integer value whose shape broadcasts to ``shape``.
        ``bounds`` default to the widest that keep every element inside the buffer."""
        shape = tuple(at.shape if shape is None else shape)
        imap = IndexMap(offset, (0,) * len(self.domain) if strides is None else tuple(strides))
        buf = self.program.buffers[buffer]
        if bounds is None:
            low, high = imap.extent(shape) if len(imap.strides) == len(shape) else (0, -1)
            bounds = (-low, buf.size - 1 - high) if high >= low else (0, 0)
        return self.emit("gather", (at,), (buffer, imap, tuple(bounds)), buf.dtype, shape)

    def scatter(self, buffer: int, value: Value, at: Value, mode: str = "replace",
                shape: tuple[int, ...] | None = None, offset: int = 0,
                strides: tuple[int, ...] | None = None,
                bounds: tuple[int, int] | None = None) -> None:
        """Write ``value`` to ``buffer`` at data-dependent positions: for every point
        ``i`` of ``shape``, in index order, flat element ``p = offset + sum(i[d] *
        strides[d]) + clamp(at[i], *bounds)`` becomes ``value[i]`` (``mode`` "replace")
        or ``mode(buffer[p], value[i])`` ("add", "mul", "max", "min": the binary ops);
        see docs/isa.md. ``shape`` defaults to the broadcast of ``value``'s and ``at``'s,
        ``strides`` to zeros, ``bounds`` to the widest that keep every element inside the
        buffer."""
        if shape is None:
            shape = tuple(max(a, b) for a, b in zip(value.shape, at.shape))
        shape = tuple(shape)
        imap = IndexMap(offset, (0,) * len(self.domain) if strides is None else tuple(strides))
        buf = self.program.buffers[buffer]
        if bounds is None:
            low, high = imap.extent(shape) if len(imap.strides) == len(shape) else (0, -1)
            bounds = (-low, buf.size - 1 - high) if high >= low else (0, 0)
        self.emit("scatter", (value, at), (buffer, imap, tuple(bounds), mode), shape=shape)

    def store(self, buffer: int, value: Value, offset: int = 0,
              strides: tuple[int, ...] | None = None,
              shape: tuple[int, ...] | None = None) -> None:
        """Store ``value`` broadcast to ``shape`` (default: the value's own shape)."""
        _, shape, imap = self._map(buffer, shape or value.shape, offset, strides)
        self.emit("store", (value,), (buffer, imap), shape=shape)

    # --- values -----------------------------------------------------------------------
    def const(self, value: bool | int | float, dtype: DType | str) -> Value:
        t = dt.dtype(dtype)
        return self.emit("const", (), (encode_const(t, value),), t)

    def index(self, axis: int, dtype: DType | str = dt.int64) -> Value:
        """The loop index along ``axis`` (0 .. domain[axis]-1)."""
        return self.emit("index", (), (axis,), dt.dtype(dtype))

    def unary(self, op: str, x: Value) -> Value:
        return self.emit(op, (x,))

    def binary(self, op: str, a: Operand, b: Operand) -> Value:
        return self.emit(op, self._operands(a, b))

    def fma(self, a: Operand, b: Operand, c: Operand) -> Value:
        """``a * b + c`` with a single rounding."""
        return self.emit("fma", self._operands(a, b, c))

    def select(self, cond: Value, a: Operand, b: Operand) -> Value:
        return self.emit("select", (cond, *self._operands(a, b)))

    def cast(self, x: Value, dtype: DType | str) -> Value:
        return self.emit("cast", (x,), (), dt.dtype(dtype))

    def reduce(self, kind: str, x: Value, axes: tuple[int, ...] | int) -> Value:
        axes = (axes,) if isinstance(axes, int) else tuple(sorted(axes))
        return self.emit("reduce", (x,), (kind, axes))

    def contract(self, a: Value, b: Value, axes: tuple[int, ...] | int) -> Value:
        """``sum(a * b)`` over ``axes`` (a matmul when a is [M,1,K], b is [1,N,K], axes=2)."""
        axes = (axes,) if isinstance(axes, int) else tuple(sorted(axes))
        return self.emit("contract", (a, b), (axes,))


def _unary(op: str):
    def method(self: KernelBuilder, x: Value) -> Value:
        return self.unary(op, x)

    method.__name__ = method.__qualname__ = op
    method.__doc__ = f"Elementwise ``{op}``."
    return method


def _binary(op: str):
    def method(self: KernelBuilder, a: Operand, b: Operand) -> Value:
        return self.binary(op, a, b)

    method.__name__ = method.__qualname__ = op
    method.__doc__ = f"Elementwise ``{op}`` with broadcasting."
    return method


# One method per opcode (k.add, k.exp, k.lt, ...); `and`, `or`, `not` get a trailing "_".
for _op in UNARY_OPS:
    setattr(KernelBuilder, _op + "_" * (_op == "not"), _unary(_op))
for _op in BINARY_OPS + COMPARE_OPS:
    setattr(KernelBuilder, _op + "_" * (_op in ("and", "or")), _binary(_op))


class ProgramBuilder:
    def __init__(self, name: str = "main"):
        self.name = name
        self.buffers: list[BufferDecl] = []
        self.kernels: list[KernelBuilder] = []

    def buffer(self, name: str, dtype: DType | str, shape: tuple[int, ...],
               kind: str = "in") -> int:
        """Declare a buffer; returns its index (what load and store take)."""
        self.buffers.append(BufferDecl(name, dt.dtype(dtype), tuple(shape), kind))
        return len(self.buffers) - 1

    def input(self, name: str, dtype: DType | str, shape: tuple[int, ...]) -> int:
        return self.buffer(name, dtype, shape, "in")

    def output(self, name: str, dtype: DType | str, shape: tuple[int, ...]) -> int:
        return self.buffer(name, dtype, shape, "out")

    def temp(self, name: str, dtype: DType | str, shape: tuple[int, ...]) -> int:
        return self.buffer(name, dtype, shape, "temp")

    def kernel(self, domain: tuple[int, ...], name: str | None = None,
               grid_rank: int = 0) -> KernelBuilder:
        k = KernelBuilder(self, name or f"k{len(self.kernels)}", tuple(domain), grid_rank)
        self.kernels.append(k)
        return k

    def build(self, check: bool = True) -> Program:
        program = Program(
            self.name,
            tuple(self.buffers),
            tuple(Kernel(k.name, k.domain, tuple(k.body.instrs), k.grid_rank)
                  for k in self.kernels),
        )
        return verify(program) if check else program
