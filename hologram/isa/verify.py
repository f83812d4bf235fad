"""The Atlas verifier and the ISA's typing rules.

:func:`infer` gives the result type of one instruction from its operands' types; the
builder uses it to type what it builds and :func:`verify` uses it to check what it is
given, so the rules live in one place. Every failure is an :class:`IRError` that names the
kernel, the instruction (index and text) and the reason.
"""

from __future__ import annotations

import weakref

from hologram.errors import IRError
from hologram.isa import dtypes as dt
from hologram.isa.dtypes import DType
from hologram.isa.ir import (
    BINARY_OPS,
    BUFFER_KINDS,
    COMPARE_OPS,
    FLOAT_UNARY_OPS,
    MEMORY_OPS,
    REDUCE_KINDS,
    SCATTER_MODES,
    UNARY_OPS,
    WRITE_OPS,
    IndexMap,
    Instr,
    Kernel,
    Program,
    decode_const,
    encode_const,
    scatter_disjoint,
)

Type = tuple[DType, tuple[int, ...]]

_ATTR_COUNT = {"load": 2, "store": 2, "gather": 3, "scatter": 4, "const": 1, "index": 1,
               "reduce": 2, "contract": 1}
_ARITY = {
    **{op: 1 for op in UNARY_OPS},
    **{op: 2 for op in BINARY_OPS + COMPARE_OPS},
    "load": 0, "gather": 1, "scatter": 2, "const": 0, "index": 0, "store": 1, "cast": 1,
    "reduce": 1, "contract": 2, "fma": 3, "select": 3,
}


def broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """Broadcast equal-rank shapes (each extent equal, or 1)."""
    out = list(shapes[0])
    for shape in shapes[1:]:
        if len(shape) != len(out):
            raise IRError(f"operand ranks differ: {shapes}")
        for d, n in enumerate(shape):
            if out[d] == 1:
                out[d] = n
            elif n not in (1, out[d]):
                raise IRError(f"operand shapes do not broadcast: {shapes}")
    return tuple(out)


def _check_axes(axes: object, rank: int, grid_rank: int) -> tuple[int, ...]:
    if not isinstance(axes, tuple) or not axes or not all(isinstance(a, int) for a in axes):
        raise IRError(f"axes must be a non-empty tuple of ints, got {axes!r}")
    if list(axes) != sorted(set(axes)):
        raise IRError(f"axes must be sorted and distinct, got {axes}")
    if axes[0] < grid_rank or axes[-1] >= rank:
        raise IRError(
            f"axes {axes} out of range: reductions run over loop dimensions "
            f"{grid_rank}..{rank - 1} (the first {grid_rank} are the parallel grid)"
        )
    return axes


def infer(op: str, args: list[Type], attrs: tuple, dtype: DType | None,
          domain: tuple[int, ...], grid_rank: int = 0) -> Type:
    """Result type of ``op`` applied to operands of types ``args``.

    ``dtype`` is the declared result dtype; it is required for ``load``, ``gather``,
    ``const``, ``index`` and ``cast`` (which cannot infer it) and checked against the rule
    otherwise. A gather's shape is declared; the one returned is its operand's, which must
    broadcast to it. A store's and a scatter's dtype is their value's (``dtype`` None);
    the shape returned is their operands' broadcast, which must broadcast to the declared
    one.
    """
    if op not in _ARITY:
        raise IRError(f"unknown opcode {op!r}")
    if len(args) != _ARITY[op]:
        raise IRError(f"{op} takes {_ARITY[op]} operand(s), got {len(args)}")
    if not isinstance(attrs, tuple) or len(attrs) != _ATTR_COUNT.get(op, 0):
        raise IRError(f"{op} takes {_ATTR_COUNT.get(op, 0)} attribute(s), got {attrs!r}")
    rank = len(domain)
    ones = (1,) * rank
    kinds = [t.kind for t, _ in args]
    same = len({t for t, _ in args}) <= 1

    def need(cond: bool, why: str) -> None:
        if not cond:
            types = ", ".join(f"{t.name}{list(s)}" for t, s in args) or "no operands"
            raise IRError(f"{op}: {why} (operands: {types})")

    if op in ("load", "gather", "const", "index", "cast"):
        need(dtype is not None, "the result dtype must be given")
    if op == "load":
        return dtype, None  # a load's shape is declared; _check_memory checks its map
    if op == "gather":
        need(args[0][0].is_int, "the element offset must be an integer")
        return dtype, args[0][1]
    if op == "scatter":
        need(args[1][0].is_int, "the element offset (the second operand) must be an integer")
        mode = attrs[3]
        need(mode in SCATTER_MODES, f"unknown scatter mode {mode!r}; one of {SCATTER_MODES}")
        need(not (args[0][0].is_bool and mode in ("add", "mul")),
             f"scatter {mode} needs a numeric value (bool: max is or, min is and)")
        need(dtype is None or dtype is args[0][0], "the dtype is the value's")
        return args[0][0], broadcast([args[0][1], args[1][1]])
    if op == "const":
        return dtype, ones
    if op == "index":
        need(dtype.is_int, "index values are integers")
        axis = attrs[0]
        need(isinstance(axis, int) and 0 <= axis < rank, f"axis {axis} outside rank {rank}")
        return dtype, tuple(domain[d] if d == axis else 1 for d in range(rank))
    shape = broadcast([s for _, s in args]) if args else ones
    a = args[0][0] if args else None
    if op == "store":
        return a, shape
    if op == "cast":
        return dtype, shape
    if op in UNARY_OPS:
        if op in FLOAT_UNARY_OPS:
            need(a.is_float, "needs a floating-point operand")
        elif op == "not":
            need(not a.is_float, "needs a bool or integer operand")
        else:
            need(not a.is_bool, "needs a numeric operand")
        result = a
    elif op in BINARY_OPS:
        need(same, "operand dtypes must match (insert a cast)")
        if op in ("and", "or", "xor"):
            need(not a.is_float, "needs bool or integer operands")
        elif op == "pow":
            need(a.is_float, "needs floating-point operands")
        elif op not in ("min", "max"):  # bool min/max are and/or
            need(not a.is_bool, "needs numeric operands")
        result = a
    elif op in COMPARE_OPS:
        need(same, "operand dtypes must match (insert a cast)")
        result = dt.bool_
    elif op == "fma":
        need(same and a.is_float, "needs three floating-point operands of one dtype")
        result = a
    elif op == "select":
        need(kinds[0] == "b", "the condition must be bool")
        need(args[1][0] is args[2][0], "both branches must have one dtype")
        result = args[1][0]
    elif op == "reduce":
        kind, axes = attrs
        need(kind in REDUCE_KINDS, f"unknown reduction {kind!r}; one of {REDUCE_KINDS}")
        _check_axes(axes, rank, grid_rank)
        need(not (a.is_bool and kind in ("sum", "prod")), "sum/prod need numeric values")
        if kind in ("argmax", "argmin"):
            need(all(domain[x] != 0 for x in axes), "argmax/argmin over an empty axis")
        result = dt.int64 if kind.startswith("arg") else a
        shape = tuple(1 if d in axes else n for d, n in enumerate(shape))
    else:  # contract
        need(same and not a.is_bool, "needs two numeric operands of one dtype")
        axes = _check_axes(attrs[0], rank, grid_rank)
        shape = tuple(1 if d in axes else n for d, n in enumerate(shape))
        result = a
    if dtype is not None and dtype is not result:
        need(False, f"declared result dtype {dtype.name} but the rule gives {result.name}")
    return result, shape


_ATTR_SHAPES = {"load": "(buffer, IndexMap)", "store": "(buffer, IndexMap)",
                "gather": "(buffer, IndexMap, (low, high))",
                "scatter": "(buffer, IndexMap, (low, high), mode)"}


def _check_memory(program: Program, kernel: Kernel, instr: Instr) -> None:
    indexed = instr.op in ("gather", "scatter")  # a data-dependent offset, clamped
    if not (isinstance(instr.attrs, tuple) and len(instr.attrs) == _ATTR_COUNT[instr.op]
            and isinstance(instr.attrs[1], IndexMap)):
        raise IRError(f"{instr.op} attrs must be {_ATTR_SHAPES[instr.op]}, "
                      f"got {instr.attrs!r}")
    index, imap = instr.attrs[:2]
    if not (isinstance(index, int) and 0 <= index < len(program.buffers)):
        raise IRError(f"{instr.op} of unknown buffer #{index}")
    buf = program.buffers[index]
    if len(imap.strides) != len(kernel.domain):
        raise IRError(
            f"{instr.op} of {buf.name}: map has {len(imap.strides)} strides, "
            f"the domain has rank {len(kernel.domain)}"
        )
    if buf.dtype is not instr.dtype:
        raise IRError(f"{instr.op} of {buf.name}: buffer is {buf.dtype.name}, "
                      f"instruction is {instr.dtype.name}")
    low, high = imap.extent(instr.shape)
    if indexed:
        bounds = instr.attrs[2]
        if not (isinstance(bounds, tuple) and len(bounds) == 2
                and all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
                and bounds[0] <= bounds[1]):
            raise IRError(f"{instr.op} bounds must be two ints low <= high, got {bounds!r}")
        # The operand is clamped to the bounds: these are the elements it can reach.
        low, high = low + bounds[0], high + bounds[1]
    if high >= low and (low < 0 or high >= buf.size):
        raise IRError(
            f"{instr.op} of {buf.name}{list(buf.shape)} out of bounds: elements {low}..{high} "
            f"for shape {list(instr.shape)} with offset {imap.offset}, strides "
            f"{list(imap.strides)} (buffer has {buf.size} elements)"
        )
    if instr.op in WRITE_OPS and buf.kind == "in":
        raise IRError(f"{instr.op} to input buffer {buf.name} (declare it out or inout)")
    # A scatter's writes to one element are made in index order; the grid runs in
    # parallel, so it may hold only dimensions whose points never write the same element.
    if instr.op == "scatter" and not scatter_disjoint(instr, kernel.domain,
                                                      range(kernel.grid_rank)):
        raise IRError(f"scatter to {buf.name}: the grid {list(kernel.grid)} is not "
                          "proven disjoint (two grid points may write one element, whose "
                          "writes must stay in index order); make its dimensions loops")
    if instr.op == "store" and not imap.is_injective(instr.shape):
        raise IRError(f"store to {buf.name} writes one element more than once: "
                      f"strides {list(imap.strides)} over shape {list(instr.shape)}")


def verify_kernel(program: Program, kernel: Kernel, typed: bool = False) -> None:
    """Check one kernel against ``program``'s buffers (what :func:`verify` does per kernel).

    ``typed``: the kernel's body was built through :class:`~hologram.isa.body.Body`, whose
    ``make`` types every instruction but the memory accesses by :func:`infer` as it is
    made (operands defined before use, shapes fitting the domain, dtypes by the rules), so
    only the memory accesses and the kernel-wide rules on accessed buffers are checked
    (fusion's legality test of the kernels it makes; the pipeline's final verification
    checks the whole program again)."""
    domain = kernel.domain
    if not all(isinstance(n, int) and n >= 0 for n in domain):
        raise IRError(f"kernel {kernel.name}: domain {domain} must be non-negative ints")
    if not 0 <= kernel.grid_rank <= len(domain):
        raise IRError(f"kernel {kernel.name}: grid_rank {kernel.grid_rank} outside "
                      f"0..{len(domain)}")
    stored: set[int] = set()
    for pos, instr in enumerate(kernel.body):
        if typed and instr.op not in MEMORY_OPS:
            continue
        try:
            for a in instr.args:
                if not 0 <= a < pos:
                    raise IRError(f"operand %{a} is used before it is defined")
                if kernel.body[a].op in WRITE_OPS:
                    raise IRError(f"operand %{a} is a {kernel.body[a].op}, which has no "
                                  "value")
            if not isinstance(instr.dtype, DType):
                raise IRError(f"dtype {instr.dtype!r} is not an Atlas dtype")
            if len(instr.shape) != len(domain) or any(
                n not in (1, m) for n, m in zip(instr.shape, domain)
            ):
                raise IRError(f"shape {list(instr.shape)} does not fit domain {list(domain)} "
                              "(each extent must be the domain's or 1)")
            args = [(kernel.body[a].dtype, kernel.body[a].shape) for a in instr.args]
            declared = None if instr.op in WRITE_OPS else instr.dtype
            dtype, shape = infer(instr.op, args, instr.attrs, declared, domain,
                                 kernel.grid_rank)
            if instr.op in MEMORY_OPS:
                _check_memory(program, kernel, instr)
                if instr.op in WRITE_OPS:
                    stored.add(instr.buffer)
            elif instr.op == "const":
                _check_const(instr)
            if instr.op in ("store", "gather", "scatter"):
                if broadcast([shape, instr.shape]) != instr.shape:
                    what = {"store": "stored value", "gather": "element offset",
                            "scatter": "value and element offset"}[instr.op]
                    raise IRError(f"{what} {list(shape)} does not broadcast to the "
                                  f"{instr.op}'s shape {list(instr.shape)}")
                if instr.op == "scatter" and instr.dtype is not dtype:
                    raise IRError(f"declared dtype {instr.dtype.name} but the value is "
                                  f"{dtype.name}")
            elif instr.op != "load" and (dtype, shape) != (instr.dtype, instr.shape):
                raise IRError(f"declared type {instr.dtype.name}{list(instr.shape)} but the "
                              f"operands give {dtype.name}{list(shape)}")
        except IRError as err:
            raise IRError(
                f"kernel {kernel.name}, instruction %{pos}: {err.args[0]}",
                instr=_render(program, kernel, pos),
            ) from None
    for buf in stored:
        # Reading and writing one buffer in a kernel is safe only point-to-point (x += 1):
        # any other overlap makes the result depend on the order grid points run in.
        accesses = [i for i in kernel.body if i.op in MEMORY_OPS and i.buffer == buf]
        if any(i.op == "scatter" for i in accesses) and len(accesses) > 1:
            # Where a scatter writes is data: any other access to its buffer in the kernel
            # (a load, a gather, a store, a second scatter) could meet its writes in an
            # order the grid does not define.
            raise IRError(f"kernel {kernel.name} scatters into {program.buffers[buf].name} "
                          "and also accesses it otherwise; split the kernel")
        if any(i.op == "gather" for i in accesses):
            # Which element a gather reads is known only when it runs: it could be one
            # another grid point writes.
            raise IRError(f"kernel {kernel.name} gathers from {program.buffers[buf].name}, "
                          "which it also stores; split the kernel")
        if len({(i.map, i.shape) for i in accesses}) > 1 or sum(
            i.op == "store" for i in accesses
        ) > 1:
            raise IRError(f"kernel {kernel.name} reads and writes {program.buffers[buf].name} "
                          "through different maps, or stores it twice; split the kernel")


def _check_const(instr: Instr) -> None:
    value = instr.attrs[0] if len(instr.attrs) == 1 else None
    t = instr.dtype
    ok = (
        isinstance(value, bool) if t.is_bool
        else isinstance(value, int) and not isinstance(value, bool) and t.min <= value <= t.max
        if t.is_int
        else isinstance(value, str) and _is_canonical_float(t, value)
    )
    if not ok:
        raise IRError(f"const {value!r} is not an encoded {t.name} value "
                      "(build constants with hologram.isa.ir.encode_const)")


def _is_canonical_float(t: DType, text: str) -> bool:
    """Is ``text`` what encode_const gives (rounded to ``t``, one spelling per value)?"""
    try:
        return text == encode_const(t, decode_const(t, text))
    except ValueError:
        return False


def _render(program: Program, kernel: Kernel, pos: int) -> str:
    try:
        from hologram.isa.text import print_instr  # lazy: the text form imports this module

        return print_instr(program, kernel, pos)
    except Exception:  # the instruction may be too broken to print; show its fields
        return repr(kernel.body[pos])


def verify(program: Program) -> Program:
    """Check ``program`` and return it unchanged; raise :class:`IRError` if ill-formed.

    A program object checked before in this process is not checked again (programs are
    immutable): the graph builder verifies what it builds, and the pipeline's first stage
    then gets that same object. Only the object itself counts, not an equal one (equality
    does not see every difference the checks do: an attribute ``1`` equals ``True``)."""
    if not isinstance(program, Program):
        raise IRError(f"expected a Program, got {type(program).__name__}")
    if _VERIFIED.get(id(program), _gone)() is program:
        return program
    _verify(program)
    if type(program.buffers) is tuple and type(program.kernels) is tuple and all(
            type(k.body) is tuple for k in program.kernels):  # (not a list changed later)
        _remember(program)
    return program


def _gone() -> None:
    return None


# Programs verified in this process, by identity: id -> a weak reference to the program
# (an entry leaves with its program, so a later object at the same address is not taken
# for it). Races between threads can only lose an entry: the program is checked again.
_VERIFIED: dict[int, weakref.ref] = {}


def _remember(program: Program) -> None:
    key = id(program)

    def forget(ref: weakref.ref) -> None:
        if _VERIFIED.get(key) is ref:
            _VERIFIED.pop(key, None)

    _VERIFIED[key] = weakref.ref(program, forget)


def _verify(program: Program) -> None:
    names = set()
    for buf in program.buffers:
        if buf.kind not in BUFFER_KINDS:
            raise IRError(f"buffer {buf.name}: kind {buf.kind!r} is not one of {BUFFER_KINDS}")
        if buf.name in names:
            raise IRError(f"buffer name {buf.name} is declared twice")
        names.add(buf.name)
        if not all(isinstance(n, int) and n >= 0 for n in buf.shape):
            raise IRError(f"buffer {buf.name}: shape {buf.shape} must be non-negative ints")
        if buf.offset is not None and (buf.kind != "temp" or buf.offset < 0):
            raise IRError(f"buffer {buf.name}: only temporaries have an arena offset")
    kernel_names = set()
    for kernel in program.kernels:
        if kernel.name in kernel_names:
            raise IRError(f"kernel name {kernel.name} is declared twice")
        kernel_names.add(kernel.name)
        verify_kernel(program, kernel)
    _check_arena(program)


def _check_arena(program: Program) -> None:
    """Temporaries sharing arena bytes must never be live at the same time."""
    placed = [(i, b) for i, b in enumerate(program.buffers) if b.offset is not None]
    if not placed:
        return
    live = program.lifetimes()
    for x, (i, a) in enumerate(placed):
        for j, b in placed[x + 1:]:
            bytes_overlap = a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes
            la, lb = live.get(i), live.get(j)
            if bytes_overlap and la and lb and la[0] <= lb[1] and lb[0] <= la[1]:
                raise IRError(f"temporaries {a.name} and {b.name} share arena bytes while "
                              f"both are live (kernels {la} and {lb})")
