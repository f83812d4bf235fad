"""The CPU fallback: every aten op without a hologram kernel runs on the CPU.

One boxed kernel for the whole dispatch key. On host memory, inputs are passed to the
CPU kernel as CPU tensors *aliasing* it (no copy), and in-place results land directly in
device memory; on device memory (cuda) they are CPU copies of their storages, and the
storages of the arguments the op writes are copied back after it
(:func:`hologram_torch.memory.cpu_alias`). ``out=`` arguments (which the CPU kernel may
resize) go through ordinary CPU copies and are copied back, unless they overlap
themselves or an input: then the CPU kernel writes through an alias, sees the overlap
and raises PyTorch's error (or computes what PyTorch computes). New results are copied
to the device. View ops only build metadata, so they run as the CPU kernel on the device
tensor itself.

Each op warns once (:class:`FallbackWarning`); :func:`fallback_stats` counts every call.
"""

from __future__ import annotations

import threading
import warnings
from collections import Counter

import torch
from torch.utils._pytree import tree_flatten, tree_map

from hologram_torch import memory
from hologram_torch.constants import CPU_KEYS, NAME
from hologram_torch.memory import cpu_view

_CPU = torch.device("cpu")
_counts: Counter[str] = Counter()
_lacking: Counter[str] = Counter()  # the calls of _counts that ran for a dtype (lacked())
_lock = threading.Lock()
_local = threading.local()  # .lacking: see lacked()
_views: dict = {}  # op -> does it return a view (cached schema analysis)


class FallbackWarning(UserWarning):
    """An op ran on the CPU because the hologram device has no kernel for it."""


def fallback_stats(lacking: bool = True) -> dict[str, int]:
    """``{aten overload: calls}`` for every op that ran through the CPU fallback, most
    frequent first. ``lacking=False`` leaves out the calls that ran there because an
    operand's dtype is one the device's backend lacks (:func:`lacked`: f64, and i64
    products, on webgpu), as the backend declares, keeping the ops without a kernel."""
    with _lock:
        counts = _counts if lacking else _counts - _lacking
        return dict(counts.most_common())


def reset_fallback_stats() -> None:
    """Forget the counts (and warn again for the next fallback of each op)."""
    with _lock:
        _counts.clear()
        _lacking.clear()


def lacked() -> None:
    """Say that the next fallback on this thread runs because the backend lacks an
    operand's dtype (:class:`hologram_torch.aten.runner.Lacking` was raised), whichever
    kernel catches it: :func:`fallback_stats` counts it as such."""
    _local.lacking = True


def _is_device(x: object) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == NAME


def _returns_view(op) -> bool:
    view = _views.get(op)
    if view is None:
        view = _views[op] = any(r.alias_info is not None and not r.alias_info.is_write
                                for r in op._schema.returns)
    return view


_tensor_positions: dict = {}  # op -> positions of its Tensor arguments


def _rewrap_numbers(op, args: tuple) -> tuple:
    """Wrapped numbers (``x % 5`` passes 5 as a 0-d tensor) reach a boxed kernel as Python
    numbers; calling the op again needs them as tensors."""
    positions = _tensor_positions.get(op)
    if positions is None:
        positions = _tensor_positions[op] = frozenset(
            i for i, a in enumerate(op._schema.arguments) if str(a.type) == "Tensor")
    if not any(i in positions and isinstance(x, (bool, int, float, complex))
               for i, x in enumerate(args)):
        return args
    return tuple(torch.tensor(x) if i in positions and isinstance(x, (bool, int, float, complex))
                 else x for i, x in enumerate(args))


def run_on_cpu(op, *args, **kwargs):
    """The boxed fallback kernel registered for the hologram dispatch key."""
    if len(memory.DEVICES) > 1:  # new results go to the operands' device
        with memory.on(memory.operands_device(op._schema.name, args, kwargs)):
            if _returns_view(op):
                return op._handle.redispatch_boxed(CPU_KEYS, *args, **kwargs)
            return run_on_cpu_as(op, op, *args, **kwargs)
    if _returns_view(op):
        return op._handle.redispatch_boxed(CPU_KEYS, *args, **kwargs)
    return run_on_cpu_as(op, op, *args, **kwargs)


def run_on_cpu_as(op, cpu_fn, *args, **kwargs):
    """Run ``cpu_fn(*args, **kwargs)`` on CPU tensors aliasing the device operands, counted
    and warned about as a fallback of ``op``. For ops whose CPU kernel is a different op
    (``convolution_overrideable``: the CPU has ``convolution``)."""
    name = str(op)
    lacking, _local.lacking = getattr(_local, "lacking", False), False
    with _lock:
        first = name not in _counts
        _counts[name] += 1
        _lacking[name] += lacking
    if first:
        warnings.warn(f"{name} runs on the CPU: the hologram device has no kernel for it "
                      "(or for these operands); new results are copied to the device. "
                      "hologram_torch.fallback_stats() counts these calls.",
                      FallbackWarning, stacklevel=3)
    written = [a.alias_info is not None and a.alias_info.is_write
               for a in op._schema.arguments]
    out_args = {a.name for a, w in zip(op._schema.arguments, written) if a.kwarg_only and w}
    aliases: dict[int, torch.Tensor] = {}  # id(CPU tensor) -> the device tensor it stands for
    copies: list[tuple] = []  # out= (CPU copy, device tensor, the copy's first strides)

    storages: dict = {}  # one CPU storage per device storage (CPU kernels check overlaps)

    def to_cpu(x):
        if _is_device(x):
            c = cpu_view(x, storages)
            aliases[id(c)] = x
            return c
        if isinstance(x, torch.device) and x.type == NAME:
            return _CPU
        return x

    def out_to_cpu(x):
        if _is_device(x) and memory.unsafe_write(x, inputs):
            return to_cpu(x)  # the CPU kernel sees the aliasing (and raises as PyTorch)
        if _is_device(x):
            # in x's layout when dense: the CPU kernel keeps or restrides it as it would x
            dense = memory.dense(x.shape, x.stride())
            c = (torch.empty_strided(x.shape, x.stride(), dtype=x.dtype) if dense
                 else torch.empty(x.shape, dtype=x.dtype))
            if x.numel():
                c.copy_(cpu_view(x))
            copies.append((c, x, c.stride()))
            aliases[id(c)] = x
            return c
        return x

    args = _rewrap_numbers(op, args)
    inputs = (tree_flatten((args, [v for k, v in kwargs.items() if k not in out_args]))[0]
              if out_args else ())
    cargs = tree_map(to_cpu, args)
    ckwargs = {k: tree_map(out_to_cpu if k in out_args else to_cpu, v)
               for k, v in kwargs.items()}
    result = cpu_fn(*cargs, **ckwargs)
    if not memory.host_memory():  # the written arguments' shadows go back to the device
        memory.write_back(*(c for c in tree_flatten(
            ([a for a, w in zip(cargs, written) if w], [ckwargs[k] for k in out_args
                                                        if k in ckwargs]))[0]
            if isinstance(c, torch.Tensor) and id(c) in aliases))
    for c, x, first in copies:  # write out= results back (resizing the device tensor)
        if x.shape != c.shape:
            x.resize_(c.shape)
        if c.stride() != first and x.stride() != c.stride() and memory.dense(c.shape,
                                                                              c.stride()):
            # the CPU kernel restrided its out= (a channels_last result): so does the device
            # tensor, whose memory holds the same number of elements
            memory.point_at(x, x.untyped_storage(), x.storage_offset(), c.shape, c.stride())
        if x.numel():
            memory.upload(x, c)

    def to_device(x):
        if isinstance(x, torch.Tensor):
            original = aliases.get(id(x))
            if original is not None:
                return original
            if x.device.type == "cpu":
                if x.layout is not torch.strided:
                    raise NotImplementedError(f"{name}: {memory.SPARSE_UNSUPPORTED}")
                if x.is_quantized:
                    raise NotImplementedError(f"{name}: {memory.QUANTIZED_UNSUPPORTED}")
                return memory.from_cpu(x)
        return x

    return tree_map(to_device, result)


def refuse_sparse(op, *args, **kwargs):
    """The boxed kernel of the device's sparse dispatch keys: a clear error."""
    raise NotImplementedError(f"{op}: {memory.SPARSE_UNSUPPORTED}")


def refuse_quantized(op, *args, **kwargs):
    """The boxed kernel of the device's quantized dispatch key: a clear error."""
    raise NotImplementedError(f"{op}: {memory.QUANTIZED_UNSUPPORTED}")


_library = torch.library.Library("_", "IMPL")
_library.fallback(run_on_cpu, dispatch_key="PrivateUse1")
for _key in ("SparsePrivateUse1", "SparseCsrPrivateUse1"):
    _library.fallback(refuse_sparse, dispatch_key=_key)
_library.fallback(refuse_quantized, dispatch_key="QuantizedPrivateUse1")
