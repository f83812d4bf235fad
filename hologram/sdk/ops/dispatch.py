"""How an SDK op runs: argument conventions, dtype promotion, compiled kernels and launches
(see :mod:`hologram.sdk.ops` for the user-facing rules).

Launches are kept in the process's launch cache (:func:`hologram.runtime.launch.launch_cache`)
under three kinds of key, each starting with the :class:`Op`:

- ``(op, backend, operand signatures, out dtype, options)`` -> :class:`CompiledOp`: the
  compiled kernel of a signature, shared by every executor of the backend;
- ``(op, *launch keys of the operands and out, executor token)`` -> the kernel's launch:
  an elementwise call with an out buffer already validated for these buffers' shapes,
  dtypes and executor (see ``elementwise._elementwise``), launched without the general
  path. The token keeps buffers of two executors from ever sharing a validated launch;
- ``(op, "alloc", options, *launch keys of the operands)`` -> ``(launch, shape, dtype)``: the
  allocating form (no out, no n, buffers only) validated for these operands, which
  allocates its result and launches without the general path (see :func:`run`).
"""

from __future__ import annotations

import builtins
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hologram._native import FastOp, file_pending
from hologram.backends.hostmem import Pool, address
from hologram.errors import DTypeError, HologramError, InvalidBufferError, ShapeError
from hologram.frontend.graph import Graph, Tensor
from hologram.isa import dtypes as dt
from hologram.runtime.buffer import Buffer
from hologram.runtime.executor import Executor
from hologram.runtime.launch import compile as compile_program
from hologram.runtime.launch import launch_cache
from hologram.sdk.jit import Traced, record

Scalar = bool | int | float

F32 = np.dtype(np.float32)
I64 = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)
_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2}
_LAUNCHES = launch_cache()
_recent = _LAUNCHES.recent


# --- the op table -----------------------------------------------------------------------

@dataclass(eq=False)
class Op:
    """An SDK operation: a builder on graph tensors and its compiled kernels.

    ``build(*operands, **options)`` gets graph tensors for buffers and, for Python numbers,
    0-d tensors (eager) or the numbers (traced), already promoted when ``promote`` is set.
    ``floating``: integer and bool inputs compute in float32. ``elementwise``: the result
    at an index depends only on the inputs at that index, so ``out`` may alias an input of
    the same shape and ``n`` is allowed.
    """

    name: str
    build: Callable[..., Tensor]
    promote: bool = True
    floating: bool = False
    elementwise: bool = False
    takes_n: bool = False
    casting: str = "same_kind"  # how the result may be converted to an out buffer's dtype
    #: Checks the operands' values on the host before each launch (``check(operands)``
    #: raises; class labels are data, the kernel could only clamp them). An op with one
    #: launches through :func:`run`, or natively when it declares ``index_ranges``.
    check: Callable[[tuple], None] | None = None
    #: What ``check`` checks, for the native path: ``(i, j, d)`` says that operand ``i``'s
    #: elements, where it holds integers, index dimension ``d`` of operand ``j``: each lies
    #: in ``[0, operands[j].shape[d])``. A call of such an op is filed with these ranges
    #: and, before each native launch, its index operands are read in C; a call with an
    #: index outside runs the general path, whose ``check`` raises. ``check`` must accept
    #: every call whose indices lie in these ranges.
    index_ranges: tuple[tuple[int, int, int], ...] = ()
    #: The same check inside hg.jit, on the trace's tensors (and Python numbers):
    #: ``trace_check(operands)`` gives ``(mask, values, error)`` triples; the jitted
    #: function raises ``error(v)`` after its launch, ``v`` the first of ``values`` where
    #: ``mask`` is set.
    trace_check: Callable[[tuple], list] | None = None
    #: The op's native callables (:func:`native_op`; ``sum`` and ``reduce_sum`` are one
    #: op), which allocating calls of its signatures are filed with once the general path
    #: has validated them.
    natives: tuple = ()

    @property
    def kernels(self) -> dict:
        """This op's compiled signatures in the launch cache (a snapshot, for tools)."""
        return {k: v for k, v in _LAUNCHES.items()
                if k[0] is self and type(v) is CompiledOp}


@dataclass(eq=False)
class CompiledOp:
    """One compiled signature of an op (what ``Op.kernels`` maps a signature to)."""

    compiled: object  # hologram.CompiledProgram
    by_address: Callable  # its launch: one handle per operand, then the out buffer's
    shape: tuple[int, ...]  # of the result
    dtype: np.dtype
    scalars: tuple[np.dtype | None, ...]  # per operand: the 0-d array dtype of a scalar

    @property
    def has_scalars(self) -> bool:
        return any(s is not None for s in self.scalars)


def native_op(op: Op, general: Callable, arity: int) -> Callable:
    """``general`` (the op's Python function) as the op's native callable. A call of
    exactly ``arity`` operands, buffers or Python numbers (and any hashable keyword
    values), runs ``general`` the first time; once :func:`run` has validated and compiled
    it as an allocating call (no out, no n), later calls whose buffers have the same launch
    keys, whose numbers have the same types and whose keywords are the same allocate their
    result and launch in native code (``hologram/csrc/fastop.c``, about 1 us). Every
    other call is ``general(*args, **kwargs)``. Nothing is cached but the launch: every
    call allocates and computes, with its own numbers' values."""
    fast = FastOp(general, arity)
    fast.__name__ = fast.__qualname__ = general.__name__
    fast.__doc__ = general.__doc__
    fast.__module__ = general.__module__
    fast.__wrapped__ = general  # inspect.signature and help() read the Python function
    fast.op = op
    op.natives += (fast,)
    return fast


#: NumPy type characters of the 0-d values the native path makes of Python numbers
#: (float16 is left to the general path).
_NATIVE_SCALARS = frozenset("fd?bhilqBHILQ")


def file_native(op: Op, kernel: CompiledOp, operands: tuple, result: Buffer,
                into_out: bool = False) -> None:
    """Hand a validated call to the op's native callable that is running it, if one is
    (see :func:`native_op`): an allocating call, or with ``into_out`` an elementwise call
    into its out= buffer ``result`` (the native path checks per call that out overlaps no
    operand other than element for element). Python numbers are keyed by type: their
    values are the program's runtime arguments, converted per call as
    :func:`scalar_array` does. The op's ``index_ranges`` go with it, with this call's
    bounds (its shapes are the entry's)."""
    scalars = "".join("." if s is None else s.char for s in kernel.scalars)
    if not set(scalars) <= _NATIVE_SCALARS | {"."}:
        return
    ranges = []  # (operand, bound): the native path checks the operand's integers
    for i, j, d in op.index_ranges:
        shape = operands[j].shape if type(operands[j]) is Buffer else ()
        if not -len(shape) <= d < len(shape):
            return  # the general path's check decides
        ranges.append((i, shape[d]))
    file_pending(op.natives, tuple(x.launch_key if type(x) is Buffer else type(x)
                                   for x in operands),
                 result.signature[0], result.dtype, result.launch_key, result.nbytes,
                 kernel.by_address, scalars, into_out, tuple(ranges))


def result_dtype(op: Op, operands: tuple) -> np.dtype:
    """PyTorch-style promotion of NumPy dtypes and weak Python numbers (see the module
    docstring)."""
    arrays = [x for x in operands if not isinstance(x, (bool, int, float))]
    top = builtins.max((_CATEGORY[d.kind] for d in arrays), default=0)
    weak = builtins.max((2 if isinstance(x, float) else 0 if isinstance(x, bool) else 1
                for x in operands if isinstance(x, (bool, int, float))), default=0)
    if weak > top:
        result = F32 if weak == 2 else I64
    else:
        result = np.result_type(*(d for d in arrays if _CATEGORY[d.kind] == top))
    if op.floating and result.kind != "f":
        return F32
    return result


def isa(dtype: np.dtype) -> dt.DType:
    return dt.dtype(dtype)


# --- running ----------------------------------------------------------------------------

def run(op: Op, ex: Executor | None, operands: tuple, out: Buffer | None, n: int | None,
         options: tuple = ()) -> Buffer | Traced:
    """Run ``op`` eagerly (or record it when any operand is traced)."""
    if out is None is n:
        # The allocating form's hot path: operands whose launch keys (shape, dtype,
        # executor; freed buffers have none) the general path below validated and filed
        # with the kernel (the launch cache's third kind of key). Python numbers and traced
        # values have no launch key and take the general path.
        try:
            hit = _recent((op, "alloc", options, *[x.launch_key for x in operands]))
        except AttributeError:
            hit = None
        if hit is not None:
            owner = operands[0].executor
            if ex is None or ex is owner:
                by_address, shape, dtype = hit
                result = owner.new_buffer(shape, dtype)
                by_address((*[x.handle for x in operands], result.handle))
                return result
    for x in operands:
        if type(x) is Traced:
            if out is not None:
                raise HologramError(f"{op.name}: an out= buffer cannot be written inside "
                                    "hg.jit; return the result instead")
            if n is not None:
                operands = traced_first_n(op, operands, n)
            return record(op, operands, options, build)
    operands = tuple(scalar(op, x) if not isinstance(x, Buffer) else x for x in operands)
    ex = executor_of(op, ex, operands, out)
    given = out  # what the call returns when it has an out buffer (not its n-view)
    if n is not None:
        operands, out = first_n(op, operands, out, n)
    key = (op, ex.backend, tuple(x.signature if type(x) is Buffer else type(x)
                                 for x in operands),
           out.signature[1] if out is not None else None, options)
    kernel = _LAUNCHES.get(key)
    if kernel is None:
        kernel = _LAUNCHES.put(key, compile_op(op, ex.backend, operands, out, options))
    if op.check is not None and math.prod(kernel.shape):
        op.check(operands)
    if out is None:
        out = result = ex.new_buffer(kernel.shape, kernel.dtype)
        if (n is None and math.prod(kernel.shape)
                and not any(x.foreign for x in operands if type(x) is Buffer)):
            if not kernel.has_scalars and op.check is None:
                _LAUNCHES.put((op, "alloc", options, *(x.launch_key for x in operands)),
                              (kernel.by_address, kernel.shape, kernel.dtype))
            if op.natives and type(ex.allocator) is Pool and natively_checked(op):
                file_native(op, kernel, operands, result)
    else:
        result = given
        fitted = fit_out(op, kernel, out)
        if math.prod(kernel.shape) == 0:  # nothing to compute (and nothing to launch)
            return result
        if overlaps(op, operands, fitted):
            staged = ex.new_buffer(kernel.shape, fitted.dtype)
            launch(kernel, operands, staged)
            fitted.write(staged.to_numpy())
            staged.free()
            return result
        # Foreign (DLPack) memory may alias pool buffers: such calls always take this path.
        if (op.elementwise and n is None and fitted is out
                and not any(x.foreign for x in (*operands, out) if type(x) is Buffer)):
            if not kernel.has_scalars and op.check is None:
                _LAUNCHES.put((op, *(x.launch_key for x in operands), out.launch_key,
                               ex.token), kernel.by_address)
            if op.natives and type(ex.allocator) is Pool and natively_checked(op):
                file_native(op, kernel, operands, out, into_out=True)
        out = fitted
    if math.prod(kernel.shape) == 0:
        return result
    launch(kernel, operands, out)
    return result


def natively_checked(op: Op) -> bool:
    """Whether calls of ``op`` may be filed for the native path: it has no check, or one
    the native path makes (``Op.index_ranges``). The launch cache's keys, which skip
    every check, serve only ops without one."""
    return op.check is None or bool(op.index_ranges)


def launch(kernel: CompiledOp, operands: tuple, out: Buffer) -> None:
    if kernel.has_scalars:  # Python numbers travel as 0-d values of their promoted dtype
        name = kernel.compiled.program.name
        ex = out.executor
        # Host memory: a 0-d NumPy array; elsewhere a 0-d buffer the number is copied into.
        # Either stays referenced here until the launch returns.
        operands = tuple(x if s is None else scalar_array(x, s, name)
                         if ex.allocator.host_visible else scalar_buffer(ex, x, s, name)
                         for x, s in zip(operands, kernel.scalars))
        kernel.by_address(tuple(x.handle if type(x) is Buffer else address(x)
                                for x in operands) + (out.handle,))
        return
    kernel.by_address(tuple(x.handle for x in operands) + (out.handle,))


def scalar_buffer(ex: Executor, value: Scalar, dtype: np.dtype, name: str) -> Buffer:
    """``value`` as a 0-d buffer of ``dtype`` in ``ex``'s memory, for one launch."""
    buf = ex.new_buffer((), dtype)
    buf.write(scalar_array(value, dtype, name))
    return buf


def scalar_array(value: Scalar, dtype: np.dtype, name: str) -> np.ndarray:
    try:
        return np.array(value, dtype)
    except (OverflowError, ValueError) as exc:
        raise DTypeError(f"{name}: the number {value!r} does not fit the operation's dtype "
                         f"{dtype} ({exc}); use a wider buffer dtype") from None


def compile_op(op: Op, backend: str, operands: tuple, out: Buffer | None,
             options: tuple) -> CompiledOp:
    g = Graph(op.name)
    tensors, scalars = [], []
    common = result_dtype(op, tuple(x.dtype if isinstance(x, Buffer) else x
                                     for x in operands)) if op.promote else None
    for i, x in enumerate(operands):
        if isinstance(x, Buffer):
            tensors.append(g.input(f"x{i}", isa(x.dtype), x.shape))
            scalars.append(None)
        else:  # a Python number: a 0-d runtime input of the promoted (or its own) dtype
            sdt = common if common is not None else out.dtype if out is not None else (
                F32 if isinstance(x, float) else BOOL if isinstance(x, bool) else I64)
            tensors.append(g.input(f"x{i}", isa(sdt), ()))
            scalars.append(sdt)
    result = build(op, tensors, options)
    if out is not None and out.dtype != result.dtype.storage:
        if not np.can_cast(result.dtype.storage, out.dtype, op.casting):
            raise DTypeError(f"{op.name}: the result is {result.dtype.storage}, which cannot be "
                             f"written into a {out.dtype} out buffer {list(out.shape)} "
                             "(same_kind casting); pass an out buffer of the result's dtype")
        result = g.cast(result, isa(out.dtype))
    g.output("out", result)
    compiled = compile_program(g.program(), backend)
    return CompiledOp(compiled, compiled.launch, result.shape,
                      result.dtype.storage, tuple(scalars))


def build(op: Op, tensors: list, options: tuple) -> Tensor:
    """Promote ``tensors`` (graph tensors and, when traced, Python numbers) and build."""
    if op.promote:
        common = isa(result_dtype(op, tuple(
            t if isinstance(t, (bool, int, float)) else t.dtype.storage for t in tensors)))
        tensors = [t.graph.cast(t, common) if isinstance(t, Tensor) and t.dtype is not common
                   else t for t in tensors]
    try:
        return op.build(*tensors, **dict(options))
    except HologramError as exc:
        shapes = ", ".join(f"{list(t.shape)} {t.dtype.storage}" if isinstance(t, Tensor)
                           else repr(t) for t in tensors)
        message = str(exc)
        raise type(exc)(message if message.startswith(op.name)
                        else f"{op.name}({shapes}): {message}") from None


_BUFFER_HINT = ("pass a number, or wrap arrays with ex.from_numpy(x) (a copy) or "
                "hg.from_dlpack(x) (zero-copy)")


def scalar(op: Op, x: object) -> Scalar:
    if isinstance(x, (bool, int, float)):
        return x
    if isinstance(x, np.generic) and x.dtype.kind in "biuf":
        return x.item()
    if isinstance(x, numbers.Real):
        return float(x)
    raise DTypeError(f"{op.name}: operands are hologram Buffers or Python numbers, got "
                     f"{type(x).__name__}; {_BUFFER_HINT}")


def executor_of(op: Op, ex: Executor | None, operands: tuple, out: Buffer | None) -> Executor:
    buffers = [x for x in operands if type(x) is Buffer]
    if out is not None:
        if type(out) is not Buffer:
            raise DTypeError(f"{op.name}: out must be a hologram Buffer, got "
                             f"{type(out).__name__}; {_BUFFER_HINT}")
        buffers.append(out)
    if not buffers:
        raise DTypeError(f"{op.name}: needs at least one hologram Buffer operand")
    ex = ex if ex is not None else buffers[0].executor
    for b in buffers:
        b.check_live(op.name)
        if b.executor is not ex:
            owner = b.executor
            raise InvalidBufferError(
                f"{op.name}: buffer {list(b.shape)} {b.dtype} belongs to another executor "
                f"({owner.backend}, {'closed' if owner.closed else 'open'}); "
                "copy it with ex.from_numpy(buf.to_numpy()) to use it here")
    if ex.closed:
        raise InvalidBufferError(f"{op.name}: executor ({ex.backend}) is closed")
    if out is not None:
        out.check_writable(op.name)
    return ex


def checked_n(op: Op, n: object) -> int:
    """``n`` as an element count, or a ShapeError (the op takes none, or it is no count)."""
    if not op.takes_n:
        raise ShapeError(f"{op.name}: n= applies to elementwise ops, reductions, copy and "
                         "fill; pass buffers of the shapes to compute")
    if not is_index(n) or n < 0:
        raise ShapeError(f"{op.name}: n must be a non-negative int, got {n!r}")
    return int(n)


def first_n(op: Op, operands: tuple, out: Buffer | None, n: object):
    n = checked_n(op, n)
    # Elementwise ops write the first n elements of out; a reduction's out holds its
    # result (reduce_sum(ex, x, out, n) with a one-element out).
    if not op.elementwise:
        out_n, out = out, None
    for b in (*operands, out):
        if type(b) is Buffer and b.size < n:
            raise ShapeError(f"{op.name}: n={n} is larger than buffer {list(b.shape)} "
                             f"({b.size} elements); pass n <= {b.size}")

    def first(b):
        return b.prefix(n) if type(b) is Buffer else b

    if not op.elementwise:
        return tuple(first(b) for b in operands), out_n
    return tuple(first(b) for b in operands), first(out) if out is not None else None


def traced_first_n(op: Op, operands: tuple, n: object) -> tuple:
    """Inside hg.jit: each traced operand's first ``n`` elements (as :func:`first_n`)."""
    n = checked_n(op, n)
    for x in operands:
        if type(x) is Traced and x.size < n:
            raise ShapeError(f"{op.name}: n={n} is larger than buffer {list(x.shape)} "
                             f"({x.size} elements); pass n <= {x.size}")
    return tuple(Traced(x.tensor.reshape(x.size)[:n], x.trace) if type(x) is Traced else x
                 for x in operands)


def fit_out(op: Op, kernel: CompiledOp, out: Buffer) -> Buffer:
    """``out`` viewed as the result's shape (see the module docstring), or ShapeError."""
    if out.signature[0] == kernel.shape:
        return out
    size = math.prod(kernel.shape)
    if out.ndim == 1 and out.size >= size:
        return out.prefix(size, kernel.shape)
    raise ShapeError(f"{op.name}: out buffer {list(out.shape)} does not fit the result "
                     f"{list(kernel.shape)} {kernel.dtype}; pass an out of shape "
                     f"{list(kernel.shape)} (or a 1-D one with >= {size} elements)")


def overlaps(op: Op, operands: tuple, out: Buffer) -> bool:
    """Does ``out`` share memory with an input in a way the kernel cannot handle in place?"""
    end = out.handle + out.nbytes
    for x in operands:
        if type(x) is not Buffer or not (x.handle < end and out.handle < x.handle + x.nbytes):
            continue
        in_place = (op.elementwise and x.handle == out.handle
                    and x.shape == out.shape and x.dtype.itemsize == out.dtype.itemsize)
        if not in_place:
            return True
    return False


def split(name: str, args: tuple, arity: int, out: Buffer | None, n: int | None):
    """``([executor,] *inputs, [out,] [n])`` -> (executor, inputs, out, n)."""
    ex = None
    if args and type(args[0]) is Executor:
        ex, args = args[0], args[1:]
    if len(args) < arity:
        raise ShapeError(f"{name}: takes {arity} input(s), got {len(args)}")
    inputs, rest = args[:arity], args[arity:]
    if rest:
        if out is not None:
            raise ShapeError(f"{name}: out given both by position and keyword")
        out, rest = rest[0], rest[1:]
    if rest:
        if n is not None or len(rest) > 1:
            raise ShapeError(f"{name}: too many arguments (after out, only n)")
        n = rest[0]
    return ex, inputs, out, n


def is_index(d: object) -> bool:
    return isinstance(d, (int, np.integer)) and not isinstance(d, bool)


def check_dim(name: str, x: object, dim: object) -> int:
    ndim = builtins.max(getattr(x, "ndim", 0), 1)
    if not is_index(dim) or not -ndim <= dim < ndim:
        raise ShapeError(f"{name}: dim {dim!r} out of range for shape "
                         f"{list(getattr(x, 'shape', ()))}")
    return int(dim)


def axes_of(name: str, x: object, dim: object) -> tuple[int, ...] | None:
    """``dim`` (None, an int or a sequence) as sorted non-negative axes of ``x``."""
    if dim is None:
        return None
    dims = tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)
    ndim = getattr(x, "ndim", 0)
    rank = builtins.max(ndim, 1)  # a 0-d value accepts dim 0 and -1, as in torch
    if not all(is_index(d) and -rank <= d < rank for d in dims):
        raise ShapeError(f"{name}: dim {dim!r} out of range for shape "
                         f"{list(getattr(x, 'shape', ()))}")
    axes = sorted({int(d) % rank for d in dims})
    if len(axes) != len(dims):
        raise ShapeError(f"{name}: dim {dim!r} repeats a dimension")
    return tuple(axes) if ndim else None


def convert(value: Scalar, dtype: np.dtype, where: str) -> Scalar:
    """``value`` as a Python number exactly representable in ``dtype`` (or an error)."""
    try:
        with np.errstate(all="ignore"):
            return np.array(value, dtype).item()
    except (OverflowError, ValueError) as exc:
        raise DTypeError(f"{where}: {value!r} cannot be converted to {dtype} ({exc})") from None
