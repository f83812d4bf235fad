"""``hg.jit``: trace a Python function of buffers into one Atlas program, compile it fused.

    @hg.jit
    def fused(a, b, c):
        return hg.ops.relu(a * b + c)          # one kernel after fusion

    y = fused(a, b, c)                         # traced and compiled on the first call

Arguments may be passed by position or by keyword, as to the function itself (they are
bound to its parameters, so ``fused(a, b, c=c)`` and ``fused(a, b, c)`` are one signature).
The first call with a new signature (each buffer argument's shape and dtype, the executor's
backend, and the values of every other argument) runs the function once on placeholders
(:class:`Traced`): each ``hg.ops`` call, and each operator on a placeholder, adds its
operation to a :class:`~hologram.frontend.graph.Graph` instead of running. The graph becomes one
program, which the compiler canonicalizes and fuses, and the backend compiles; later calls
with the same signature only allocate the outputs and launch it (the launch is kept in
the process's launch cache, :func:`hologram.runtime.launch.launch_cache`, under the
function's token, the backend and the signature).

Rules, as in other tracing JITs: the function must be pure in its buffer arguments (an
``out=`` buffer cannot be written while tracing, nor can ``fill``, ``copy_from`` or
``from_numpy`` change a buffer in place; return results instead); it may return a
buffer or a tuple or list of buffers; non-buffer arguments are compile-time constants (a
new value traces again); values cannot be read (``to_numpy``) while tracing; buffers that
are not arguments cannot be captured.

Ops whose eager form checks values on the host (``cross_entropy_loss``'s class indices)
are checked by the program instead: it also computes whether a value is bad and the first
such one, and the call raises the eager form's error after the launch.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hologram._native import FastOp, file_pending
from hologram.backends.hostmem import Pool
from hologram.errors import HologramError, InvalidBufferError
from hologram.frontend.graph import Graph, Tensor
from hologram.frontend.mixin import SdkOperators, reshaped
from hologram.isa import dtypes as dt
from hologram.isa.ir import Program
from hologram.runtime.buffer import Buffer
from hologram.runtime.launch import compile as compile_program
from hologram.runtime.launch import launch_cache

_tracing = threading.local()
_LAUNCHES = launch_cache()


class Traced(SdkOperators):
    """A placeholder for a buffer inside a function being traced by :func:`jit`. Its
    operators are the buffer's (:mod:`hologram.frontend.mixin`): the SDK's ops, which
    record themselves into the trace when an operand is traced."""

    __slots__ = ("tensor", "trace")

    def __init__(self, tensor: Tensor, trace: _Trace):
        self.tensor = tensor
        self.trace = trace

    @property
    def shape(self) -> tuple[int, ...]:
        return self.tensor.shape

    @property
    def dtype(self) -> np.dtype:
        return self.tensor.dtype.storage

    @property
    def ndim(self) -> int:
        return self.tensor.ndim

    @property
    def size(self) -> int:
        return int(np.prod(self.tensor.shape))

    def reshape(self, *shape: int) -> Traced:
        """As :meth:`hologram.Buffer.reshape` (one extent may be -1)."""
        return Traced(self.tensor.reshape(reshaped(shape, self.size, self.shape)), self.trace)

    def to_numpy(self, *args, **kwargs):
        raise HologramError("hg.jit: values are not known while tracing; return the buffer "
                            "and read it after the call")

    __array__ = numpy = to_numpy

    def fill(self, value, *args, **kwargs):
        raise in_place_error("fill", self)

    def copy_from(self, other, *args, **kwargs):
        raise in_place_error("copy_from", self)

    def from_numpy(self, data, *args, **kwargs):
        raise in_place_error("from_numpy", self)

    def __repr__(self) -> str:
        return f"<hologram traced value shape={list(self.shape)} dtype={self.dtype}>"


def in_place_error(op: str, x: Traced) -> HologramError:
    """The error for an in-place write (``fill``, ``copy_from``, ...) of a traced value."""
    return HologramError(
        f"{op}: writes buffer {list(x.shape)} {x.dtype} in place, which hg.jit does not "
        "support: a jitted function computes new buffers and never changes its arguments. "
        "Fill or copy into the buffer before calling the function (buf.fill(v); f(buf)), "
        "or use the value itself inside it (Python numbers broadcast in every op: x + 1.5, "
        "hg.ops.vector_max(x, 0.0)) and return the result")


@dataclass(eq=False)
class _Trace:
    graph: Graph
    executor: object
    #: (mask, values, error) of the recorded ops' value checks (``Op.trace_check``)
    checks: list = field(default_factory=list)


def record(op, operands: tuple, options: tuple, build: Callable) -> Traced:
    """Add ``op`` on ``operands`` (placeholders and Python numbers) to their trace."""
    traces = {x.trace for x in operands if type(x) is Traced}
    if len(traces) > 1:
        raise HologramError(f"{op.name}: operands come from different hg.jit traces")
    (trace,) = traces
    values = []
    for x in operands:
        if type(x) is Traced:
            values.append(x.tensor)
        elif isinstance(x, Buffer):
            raise HologramError(f"{op.name}: a buffer {list(x.shape)} that is not an argument "
                                "of the hg.jit function was captured; pass it as an argument")
        elif isinstance(x, np.generic):
            values.append(x.item())
        else:
            values.append(x)
    result = Traced(build(op, values, options), trace)
    if op.trace_check is not None:
        trace.checks += op.trace_check(tuple(values))
    return result


@dataclass(eq=False)
class _Entry:
    compiled: object
    by_address: Callable  # the compiled program's launch: inputs' handles, then outputs'
    outputs: tuple[tuple[tuple[int, ...], np.dtype], ...]
    structure: str  # "one", "tuple" or "list"
    #: Per pair of trailing 0-d outputs (a bool: a check failed; an int64: the first bad
    #: value), the function of that value giving the error raised.
    checks: tuple = ()


class JitFunction:
    """The callable :func:`jit` returns; see the module docstring."""

    def __init__(self, fn: Callable):
        # Only the name and docstring: copying fn's __dict__ would overwrite the attributes
        # below when fn has ones of the same names (another JitFunction, a callable object).
        functools.update_wrapper(self, fn, updated=())
        self.fn = fn
        # This function's identity in launch keys: equal to no other caller's key start,
        # and it does not keep the function alive.
        self._token = object()
        self._lock = threading.Lock()
        self._parameters: inspect.Signature | None = None
        # Calls of buffers only, whose signature a call has compiled into one fresh
        # result, allocate and launch in native code (see hologram.sdk.ops.dispatch.
        # native_op); every other call runs _call.
        self._native = FastOp(self._call, 0)

    def __call__(self, *args, **kwargs):
        return self._native(*args, **kwargs)

    def _call(self, *args, **kwargs):
        if kwargs:
            if any(type(a) is Traced for a in (*args, *kwargs.values())):
                return self.fn(*args, **kwargs)  # inlined into the trace of another function
            args, names = self._bind(args, kwargs)
        elif any(type(a) is Traced for a in args):  # called while tracing another function:
            return self.fn(*args)                    # inline it into that trace
        else:
            names = ()
        ex, key = self._signature(args, names)
        entry = _LAUNCHES.get(key)
        if entry is None:
            with self._lock:
                entry = _LAUNCHES.get(key) or self._compile(args, names, ex, key)
        buffers = [a for a in args if type(a) is Buffer]
        outs = [ex.new_buffer(shape, dtype) for shape, dtype in entry.outputs]
        if not all(o.size == 0 for o in outs):  # else nothing to compute (the cpu backend
            entry.by_address(tuple(b.handle for b in buffers + outs))  # fails on some)
            if entry.checks:
                outs = _checked(entry, outs)
            elif (entry.structure == "one" and not names and len(buffers) == len(args)
                    and type(ex.allocator) is Pool):
                out = outs[0]
                file_pending((self._native,), tuple(b.launch_key for b in buffers),
                             out.signature[0], out.dtype, out.launch_key, out.nbytes,
                             entry.by_address)
        if entry.structure == "one":
            return outs[0]
        return tuple(outs) if entry.structure == "tuple" else outs

    def trace(self, *args, **kwargs) -> Program:
        """The Atlas program this function traces to for these arguments (before
        compilation)."""
        args, names = self._bind(args, kwargs) if kwargs else (args, ())
        ex, _ = self._signature(args, names)
        return self._trace(args, names, ex)[0]

    def inline(self, graph: Graph, *args, **kwargs):
        """Trace this function onto ``graph``: ``args`` are graph tensors (in place of
        buffers; lists of them too) and constants. Returns the results as graph tensors,
        structured as the function returns them (one, a tuple or a list). Ops whose eager
        form checks values on the host (``cross_entropy_loss``'s class indices) are
        refused: nothing would read their checks."""
        trace = _Trace(graph, None)

        def placeholder(a):
            if isinstance(a, Tensor):
                return Traced(a, trace)
            if isinstance(a, (list, tuple)) and any(isinstance(x, Tensor) for x in a):
                return type(a)(placeholder(x) for x in a)
            return a

        result = self.fn(*map(placeholder, args),
                         **{k: placeholder(v) for k, v in kwargs.items()})
        if trace.checks:
            raise HologramError(f"{self.__name__}: uses an op that checks values on the "
                                "host (class indices), which an inlined trace cannot report")
        results = result if isinstance(result, (tuple, list)) else (result,)
        for i, r in enumerate(results):
            if type(r) is not Traced or r.trace is not trace:
                raise HologramError(f"{self.__name__}: result {i} is a {type(r).__name__}, not "
                                    "a value computed from the arguments")
        tensors = [r.tensor for r in results]
        return type(result)(tensors) if isinstance(result, (tuple, list)) else tensors[0]

    def _bind(self, args: tuple, kwargs: dict) -> tuple[tuple, tuple[str, ...]]:
        """The arguments bound to the function's parameters as it would bind them: every
        value in order, and the keyword names of the trailing ones (as in a vectorcall).
        An argument that could be positional becomes positional, so a call by keyword
        shares the compiled program of the same call by position."""
        if self._parameters is None:
            try:
                self._parameters = inspect.signature(self.fn)
            except (TypeError, ValueError):  # no signature to read: pass keywords through
                return (*args, *kwargs.values()), tuple(kwargs)
        try:
            bound = self._parameters.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.__name__}(): {exc}") from None
        return (*bound.args, *bound.kwargs.values()), tuple(bound.kwargs)

    def _signature(self, args: tuple, names: tuple[str, ...]):
        ex = None
        key = [names]
        for a in args:
            if type(a) is Buffer:
                a.check_live(self.__name__)
                if ex is None:
                    ex = a.executor
                elif a.executor is not ex:
                    raise InvalidBufferError(f"{self.__name__}: buffer arguments belong to "
                                             "different executors")
                key.append(a.signature)
            else:
                try:
                    hash(a)
                except TypeError:
                    raise HologramError(f"{self.__name__}: non-buffer arguments are "
                                        f"compile-time constants and must be hashable; got "
                                        f"{type(a).__name__}") from None
                key.append(_constant_key(a))
        if ex is None:
            raise HologramError(f"{self.__name__}: hg.jit functions take at least one buffer")
        return ex, (self._token, ex.backend, *key)

    def _trace(self, args: tuple, names: tuple[str, ...], ex) -> tuple[Program, str, tuple]:
        g = Graph(getattr(self.fn, "__name__", "jit").replace("<", "").replace(">", ""))
        trace = _Trace(g, ex)
        placeholders = [
            Traced(g.input(f"arg{i}", dt.dtype(a.dtype), a.shape), trace)
            if type(a) is Buffer else a for i, a in enumerate(args)
        ]
        split = len(placeholders) - len(names)
        result = self.fn(*placeholders[:split], **dict(zip(names, placeholders[split:])))
        structure = "tuple" if isinstance(result, tuple) else "list" if isinstance(
            result, list) else "one"
        results = result if structure != "one" else [result]
        if not results:
            raise HologramError(f"{self.__name__}: returned nothing; return the result buffers")
        for i, r in enumerate(results):
            if type(r) is not Traced or r.trace is not trace:
                raise HologramError(f"{self.__name__}: result {i} is a {type(r).__name__}, not "
                                    "a value computed from the arguments")
            g.output(f"out{i}", r.tensor)
        for j, (mask, values, _) in enumerate(trace.checks):
            flag, value = g.first_where(mask, values)
            g.output(f"check{j}", flag)
            g.output(f"check{j}_value", value if value.dtype is dt.int64
                     else g.cast(value, dt.int64))
        return g.program(), structure, tuple(error for *_, error in trace.checks)

    def _compile(self, args: tuple, names: tuple[str, ...], ex, key: tuple) -> _Entry:
        program, structure, checks = self._trace(args, names, ex)
        compiled = compile_program(program, ex.backend)
        outputs = tuple((p.shape, p.dtype.storage) for p in program.params if p.kind == "out")
        return _LAUNCHES.put(key, _Entry(compiled, compiled.launch, outputs, structure,
                                         checks))

    @property
    def compiled_signatures(self) -> int:
        """How many signatures of this function have a launch in the launch cache."""
        token = self._token
        return sum(1 for k, _ in _LAUNCHES.items() if k[0] is token)

    def __repr__(self) -> str:
        return f"<hologram.jit {self.__name__}: {self.compiled_signatures} compiled signatures>"


def _checked(entry: _Entry, outs: list[Buffer]) -> list[Buffer]:
    """``outs`` without the checks' trailing outputs (freed), or the first failed check's
    error (all of them freed)."""
    first = len(outs) - 2 * len(entry.checks)
    try:
        for j, error in enumerate(entry.checks):
            if outs[first + 2 * j].to_numpy().item():
                raise error(outs[first + 2 * j + 1].to_numpy().item())
    except BaseException:
        for o in outs:
            o.free()
        raise
    for o in outs[first:]:
        o.free()
    return outs[:first]


def _constant_key(value: object) -> tuple:
    """A non-buffer argument in a signature key: its type and value, with floats by their
    bits, since ``0.0 == -0.0`` (x * -0.0 differs from x * 0.0) and ``nan != nan``."""
    if isinstance(value, (float, np.floating)):
        return type(value), float(value).hex()
    if isinstance(value, tuple):
        return tuple, tuple(_constant_key(v) for v in value)
    return type(value), value


def jit(fn: Callable) -> JitFunction:
    """Trace ``fn`` (a function of buffers built from :mod:`hologram.sdk.ops` calls and buffer
    operators) into one fused program per signature; see the module docstring."""
    return JitFunction(fn)
