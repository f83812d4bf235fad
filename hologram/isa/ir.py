"""The Atlas ISA: programs, buffers, kernels and typed SSA instructions.

A :class:`Program` is a list of *buffers* (flat typed memory; inputs, outputs and
temporaries) and an ordered list of *kernels*. A kernel runs over a rectangular index
space, its ``domain``. The first ``grid_rank`` dimensions of the domain are its parallel
index space (the grid: CPU threads, GPU blocks); the remaining dimensions are structured
inner loops that a backend runs sequentially or vectorized. Reductions run only over loop
dimensions, so every grid point is independent.

Every value in a kernel is a tensor over (part of) the domain: its shape has the domain's
rank and each extent is either the domain's extent (the value varies along that
dimension) or 1 (it is constant along it and broadcasts). Operations broadcast their
operands the same way. A reduction keeps the reduced dimensions with extent 1.

Instructions are SSA and refer to earlier instructions of the same kernel by position
(``args``), so two instruction lists are structurally equal exactly when they are equal
as tuples: equality and hashing are alpha-equivalence for free. Memory is reached only by
``load`` and ``store`` through an affine :class:`IndexMap`: element ``i`` (a multi-index
over the value's shape) lives at flat element ``offset + sum(i[d] * strides[d])`` of the
buffer. A stride of 0 broadcasts; negative strides walk backwards. ``gather`` is the one
data-dependent read: an integer operand, clamped to the instruction's bounds, is added to
its map's element offset (the bounds keep every element inside the buffer). ``scatter``
is its write: the same address, a value stored there or combined with what is there
(``add``, ``mul``, ``max``, ``min``), the writes made in index order.

The IR objects are immutable. Passes build new programs (``dataclasses.replace``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property

import numpy as np

from hologram.isa.dtypes import DType, round_bf16


# --- opcodes ---------------------------------------------------------------------------
class _StrEnum(str, Enum):
    """``enum.StrEnum`` (Python 3.11) for 3.10 too: ``str()`` and ``format()`` give the
    value, as the string itself would."""

    __str__ = str.__str__
    __format__ = str.__format__


class Opcode(_StrEnum):
    """The ISA's operations, in groups (:attr:`group`). Members are strings
    (``Opcode.ADD == "add"``, same hash), so code may compare an instruction's ``op``
    with either; ``repr`` is the string's, so program keys and fingerprints do not depend
    on which an instruction was built with. :class:`Instr` stores the member."""

    LOAD = "load"
    STORE = "store"
    GATHER = "gather"
    SCATTER = "scatter"
    CONST = "const"
    INDEX = "index"
    ABS = "abs"
    NEG = "neg"
    NOT = "not"
    SIGN = "sign"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    EXP = "exp"
    EXP2 = "exp2"
    EXPM1 = "expm1"
    LOG = "log"
    LOG2 = "log2"
    LOG1P = "log1p"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    ERF = "erf"
    SIN = "sin"
    COS = "cos"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"
    TRUNC = "trunc"
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MOD = "mod"
    MIN = "min"
    MAX = "max"
    POW = "pow"
    AND = "and"
    OR = "or"
    XOR = "xor"
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    FMA = "fma"
    SELECT = "select"
    CAST = "cast"
    REDUCE = "reduce"
    CONTRACT = "contract"

    def __repr__(self) -> str:
        return repr(self.value)

    @property
    def group(self) -> str:
        """``memory``, ``const``, ``index``, ``unary``, ``binary``, ``compare``, ``fma``,
        ``select``, ``cast``, ``reduce`` or ``contract``."""
        return _GROUPS[self]


#: The ops that reach memory, each with ``(buffer_index, IndexMap, ...)`` attrs; ``gather``
#: and ``scatter`` add a data-dependent element offset (an integer operand, clamped to
#: their third attribute's bounds) to their map's.
MEMORY_OPS = (Opcode.LOAD, Opcode.STORE, Opcode.GATHER, Opcode.SCATTER)
#: The ops that read memory into a value.
READ_OPS = (Opcode.LOAD, Opcode.GATHER)
#: The ops that write memory (they occupy a position but have no value).
WRITE_OPS = (Opcode.STORE, Opcode.SCATTER)
#: How a scatter writes each element: ``replace`` stores the value; the others store
#: ``op(element, value)`` with the binary op of that name (docs/isa.md).
SCATTER_MODES = ("replace", "add", "mul", "max", "min")
UNARY_OPS = tuple(Opcode(op) for op in (
    "abs", "neg", "not", "sign", "sqrt", "rsqrt", "exp", "exp2", "expm1", "log", "log2",
    "log1p", "tanh", "sigmoid", "erf", "sin", "cos", "floor", "ceil", "round", "trunc",
))
# Unary ops defined on floating-point types only.
FLOAT_UNARY_OPS = UNARY_OPS[4:]
BINARY_OPS = tuple(Opcode(op) for op in (
    "add", "sub", "mul", "div", "mod", "min", "max", "pow", "and", "or", "xor"))
COMPARE_OPS = tuple(Opcode(op) for op in ("eq", "ne", "lt", "le", "gt", "ge"))
COMMUTATIVE_OPS = frozenset(Opcode(op) for op in (
    "add", "mul", "min", "max", "and", "or", "xor", "eq", "ne"))
ALL_OPS = tuple(Opcode)
_GROUPS = {
    **{op: "memory" for op in MEMORY_OPS}, **{op: "unary" for op in UNARY_OPS},
    **{op: "binary" for op in BINARY_OPS}, **{op: "compare" for op in COMPARE_OPS},
    **{op: op.value for op in (Opcode.CONST, Opcode.INDEX, Opcode.FMA, Opcode.SELECT,
                               Opcode.CAST, Opcode.REDUCE, Opcode.CONTRACT)},
}
_OPCODES = {op.value: op for op in Opcode}
REDUCE_KINDS = ("sum", "prod", "max", "min", "argmax", "argmin")
BUFFER_KINDS = ("in", "out", "inout", "temp")


@dataclass(frozen=True, slots=True)
class IndexMap:
    """Affine map from a multi-index to a flat element offset in a buffer."""

    offset: int
    strides: tuple[int, ...]

    def extent(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """Lowest and highest element touched over ``shape``; ``(0, -1)`` when empty."""
        if any(n == 0 for n in shape):
            return 0, -1
        low = high = self.offset
        for n, s in zip(shape, self.strides):
            if s > 0:
                high += s * (n - 1)
            else:
                low += s * (n - 1)
        return low, high

    def is_injective(self, shape: tuple[int, ...]) -> bool:
        """Sufficient test that distinct indices reach distinct elements (no write races):
        sorted by stride, each dimension must step over the whole span of the smaller ones."""
        if any(n == 0 for n in shape):
            return True  # writes nothing
        span = 1
        for s, n in sorted((abs(s), n) for s, n in zip(self.strides, shape) if n > 1):
            if s < span:
                return False
            span = s * n
        return True

    @staticmethod
    def contiguous(shape: tuple[int, ...], offset: int = 0) -> IndexMap:
        """Row-major map over ``shape``; dimensions of extent 1 get stride 0."""
        strides, step = [], 1
        for n in reversed(shape):
            strides.append(step if n != 1 else 0)
            step *= n
        return IndexMap(offset, tuple(reversed(strides)))


@dataclass(frozen=True, slots=True)
class Instr:
    """One SSA instruction. ``args`` index earlier instructions of the same kernel.

    ``attrs`` by opcode:
      load / store: ``(buffer_index, IndexMap)``
      gather:       ``(buffer_index, IndexMap, (low, high))``: one integer operand, the
                    element offset added to the map's, clamped to ``low .. high``
      scatter:      ``(buffer_index, IndexMap, (low, high), mode)``: operands ``(value,
                    offset)``, the offset as a gather's; ``mode`` one of SCATTER_MODES
      const:        ``(value,)`` with floats encoded by ``float.hex`` (so that -0.0 and NaN
                    compare and hash exactly)
      index:        ``(axis,)``
      reduce:       ``(kind, axes)``
      contract:     ``(axes,)``
      others:       ``()``
    ``dtype``/``shape`` are the result type; for ``store`` and ``scatter`` they are the
    written value's dtype and the write's own shape.
    """

    op: Opcode
    dtype: DType
    shape: tuple[int, ...]
    args: tuple[int, ...] = ()
    attrs: tuple = ()

    def __post_init__(self) -> None:
        if type(self.op) is not Opcode and self.op in _OPCODES:  # given as a string
            object.__setattr__(self, "op", _OPCODES[self.op])  # (verify rejects unknown ones)

    def with_args(self, args: tuple[int, ...]) -> Instr:
        """This instruction with operands ``args``: itself when they are its own, else a
        new one (a few times cheaper than ``dataclasses.replace``, which introspects the
        fields on every call: the passes' most frequent rebuild)."""
        if args == self.args:
            return self
        return Instr(self.op, self.dtype, self.shape, args, self.attrs)

    # Convenience accessors; each is valid only for the opcodes named.
    @property
    def buffer(self) -> int:  # load, store, gather, scatter
        return self.attrs[0]

    @property
    def map(self) -> IndexMap:  # load, store, gather, scatter
        return self.attrs[1]

    @property
    def bounds(self) -> tuple[int, int]:  # gather, scatter: the offset operand's clamp
        return self.attrs[2]

    @property
    def mode(self) -> str:  # scatter
        return self.attrs[3]

    @property
    def value(self) -> bool | int | float:  # const
        return decode_const(self.dtype, self.attrs[0])

    @property
    def axes(self) -> tuple[int, ...]:  # reduce, contract
        return self.attrs[-1]

    @property
    def kind(self) -> str:  # reduce
        return self.attrs[0]

    @property
    def axis(self) -> int:  # index
        return self.attrs[0]


def scatter_disjoint(instr: Instr, domain: tuple[int, ...], dims: Iterable[int]) -> bool:
    """Do two points of scatter ``instr`` (in a kernel over ``domain``) that differ in
    their indices along ``dims`` always write different elements? Such dimensions may
    run in parallel (a kernel's grid): the writes to one element all come from one grid
    point, whose loops keep them in index order.

    A sufficient test: one grid point (its indices along ``dims`` fixed) reaches a range
    of ``C`` elements (the map's span over the other dimensions, widened by the offset's
    bounds), and the grid points' ranges must not overlap: the map restricted to
    ``dims``, with one more dimension of stride 1 and extent ``C``, must be injective
    (:meth:`IndexMap.is_injective`: sorted by stride, each dimension steps over the span
    of the smaller ones). A dimension of extent 1 is no obstacle; one the scatter is
    broadcast along (extent 1 in its shape, more in the domain) always is (every index
    along it makes the same writes again)."""
    shape, strides = instr.shape, instr.map.strides
    if 0 in shape:
        return True
    dims = [d for d in dims if domain[d] > 1]
    if any(shape[d] != domain[d] for d in dims):
        return False
    low, high = instr.bounds
    cell = 1 + (high - low) + sum(abs(s) * (n - 1) for e, (n, s) in
                                  enumerate(zip(shape, strides)) if e not in dims)
    grid = IndexMap(0, tuple(strides[d] for d in dims) + (1,))
    return grid.is_injective(tuple(shape[d] for d in dims) + (cell,))


@dataclass(frozen=True, slots=True)
class BufferDecl:
    """A program's declaration of a buffer: flat memory of ``prod(shape)`` elements.
    ``kind`` is in/out/inout/temp. (Not the memory itself: that is the runtime's
    :class:`hologram.Buffer`, which holds a device allocation.)

    ``offset`` is set by the scheduler on temporaries: their byte offset in the program's
    temporary arena (temporaries whose lifetimes do not overlap share bytes).
    """

    name: str
    dtype: DType
    shape: tuple[int, ...]
    kind: str = "in"
    offset: int | None = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def key(self) -> tuple:
        return (self.dtype.name, self.shape, self.kind, self.offset)


@dataclass(frozen=True)
class Kernel:
    """A loop nest over ``domain``; the first ``grid_rank`` dimensions run in parallel."""

    name: str
    domain: tuple[int, ...]
    body: tuple[Instr, ...]
    grid_rank: int = 0

    @property
    def grid(self) -> tuple[int, ...]:
        return self.domain[: self.grid_rank]

    @property
    def loops(self) -> tuple[int, ...]:
        return self.domain[self.grid_rank :]

    def key(self) -> tuple:
        return (self.domain, self.grid_rank, self.body)

    def evolve(self, *, name: str | None = None, domain: tuple[int, ...] | None = None,
               body: tuple[Instr, ...] | None = None, grid_rank: int | None = None) -> Kernel:
        """This kernel with the fields given changed (``dataclasses.replace``, without its
        introspection of the fields on every call: the passes rebuild kernels often)."""
        return Kernel(self.name if name is None else name,
                      self.domain if domain is None else domain,
                      self.body if body is None else body,
                      self.grid_rank if grid_rank is None else grid_rank)

    def reads(self) -> frozenset[int]:
        """Indices of the buffers this kernel loads or gathers from, or scatters into
        (what a scatter leaves in a buffer depends on what the buffer held)."""
        return self._accessed[0]

    def writes(self) -> frozenset[int]:
        """Indices of the buffers this kernel stores or scatters into."""
        return self._accessed[1]

    @cached_property
    def _accessed(self) -> tuple[frozenset[int], frozenset[int]]:
        return (frozenset(i.buffer for i in self.body if i.op in READ_OPS or i.op == "scatter"),
                frozenset(i.buffer for i in self.body if i.op in WRITE_OPS))


@dataclass(frozen=True, eq=False)
class Program:
    """Buffers and kernels, run in order. Parameters are the non-temp buffers, in order."""

    name: str
    buffers: tuple[BufferDecl, ...]
    kernels: tuple[Kernel, ...] = field(default=())

    # Programs are immutable and used as dictionary keys on hot paths: hash them once.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Program):
            return NotImplemented
        return self is other or (hash(self) == hash(other) and self._fields == other._fields)

    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _fields(self) -> tuple:
        return (self.name, self.buffers, self.kernels)

    @cached_property
    def _hash(self) -> int:
        return hash(self._fields)

    def evolve(self, *, name: str | None = None, buffers: tuple[BufferDecl, ...] | None = None,
               kernels: tuple[Kernel, ...] | None = None) -> Program:
        """This program with the fields given changed (see :meth:`Kernel.evolve`)."""
        return Program(self.name if name is None else name,
                       self.buffers if buffers is None else buffers,
                       self.kernels if kernels is None else kernels)

    @property
    def params(self) -> tuple[BufferDecl, ...]:
        return tuple(b for b in self.buffers if b.kind != "temp")

    @property
    def temps(self) -> tuple[BufferDecl, ...]:
        return tuple(b for b in self.buffers if b.kind == "temp")

    @property
    def arena_bytes(self) -> int:
        """Bytes of the temporary arena planned by the scheduler (0 before scheduling)."""
        ends = [b.offset + b.nbytes for b in self.temps if b.offset is not None]
        return max(ends, default=0)

    def lifetimes(self) -> dict[int, tuple[int, int]]:
        """First and last kernel touching each temporary (by buffer index): where the
        scheduler may, and the verifier checks it may, let temporaries share memory."""
        live: dict[int, tuple[int, int]] = {}
        for k, kernel in enumerate(self.kernels):
            for b in kernel.reads() | kernel.writes():
                if self.buffers[b].kind == "temp":
                    live[b] = (live.get(b, (k, k))[0], k)
        return live

    def key(self) -> tuple:
        """Structural identity: everything except the names of the program, its buffers
        and its kernels (SSA values are positional, so they have no names to ignore)."""
        return (
            tuple(b.key() for b in self.buffers),
            tuple(k.key() for k in self.kernels),
        )

    def structurally_equal(self, other: Program) -> bool:
        return self.key() == other.key()

    def fingerprint(self) -> str:
        """Stable hex digest of :meth:`key` (the same in every process and on every
        machine): the program part of a cache key."""
        return hashlib.sha256(repr(self.key()).encode()).hexdigest()

    def __str__(self) -> str:
        from hologram.isa.text import print_program  # lazy: the text form builds on this module

        return print_program(self)


# --- constants -------------------------------------------------------------------------
def encode_const(dtype: DType, value: object) -> bool | int | str:
    """Normalize ``value`` to ``dtype`` and encode it for ``Instr.attrs``.

    Floats are rounded to the dtype and stored as ``float.hex`` strings; all NaNs become
    one quiet NaN. Integers wrap to the dtype's width (two's complement).
    """
    if dtype.is_bool:
        return bool(value)
    if dtype.is_int:
        bits = dtype.bits
        v = int(value) & ((1 << bits) - 1)
        if dtype.kind == "i" and v >= 1 << (bits - 1):
            v -= 1 << bits
        return v
    v = float(value)
    if math.isnan(v):
        return "nan"
    if dtype.name == "bf16":
        v = float(round_bf16(np.float64(v)))
    elif dtype.bits < 64:
        with np.errstate(over="ignore"):
            v = float(dtype.storage.type(v))
    return float.hex(v)


def decode_const(dtype: DType, encoded: bool | int | str) -> bool | int | float:
    if dtype.is_float:
        return float.fromhex(encoded) if encoded != "nan" else math.nan
    return encoded
