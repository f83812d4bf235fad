"""Registration of aten kernels for the hologram dispatch key (PrivateUse1)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from hologram_torch import fallback, memory, native
from hologram_torch.aten import runner

aten = torch.ops.aten
_lib = torch.library.Library("aten", "IMPL")
#: Every aten overload with a native kernel here (the conformance suite reads this).
NATIVE: set[str] = set()
#: Overloads whose hologram kernel composes other ops (device ops, or the CPU fallback of
#: an equivalent op): ops PyTorch's default kernel cannot serve for a PrivateUse1 device.
COMPOSED: set[str] = set()


def _register(name: str, fn: Callable, hot: bool) -> None:
    """Register ``fn`` for overload ``name``, behind a guard: operands no program of the
    device's backend takes (:class:`runner.Unsupported`: a dtype the backend lacks, such
    as f64 on webgpu) run the op through the CPU fallback. ``fn`` must raise it before it
    has run anything the CPU would run again: a kernel of several programs or one that
    draws random numbers checks first (:func:`runner.lacking`)."""
    op = overload(name)
    qualified = op._schema.name  # ("aten::add")
    devices = memory.DEVICES

    def kernel(*args, **kwargs):
        if len(devices) > 1:  # the operands' device is the results' (a device guard)
            with memory.on(memory.operands_device(qualified, args, kwargs)):
                return _guarded(op, fn, args, kwargs)
        try:  # (_guarded's body, inlined: one call less on every op of one device)
            return fn(*args, **kwargs)
        except runner.Unsupported:
            return fallback.run_on_cpu(op, *args, **kwargs)

    kernel.__name__ = kernel.__qualname__ = fn.__name__
    kernel.__doc__, kernel.__wrapped__ = fn.__doc__, fn
    if not (hot and native.register_fast(name, kernel, memory.pool().core)):
        _lib.impl(name, kernel, "PrivateUse1")


def _guarded(op, fn: Callable, args: tuple, kwargs: dict):
    try:
        return fn(*args, **kwargs)
    except runner.Unsupported:
        return fallback.run_on_cpu(op, *args, **kwargs)


def _registrar(names: tuple[str, ...], hot: bool, kind: set[str]) -> Callable:
    def register(fn: Callable) -> Callable:
        for name in names:
            _register(name, fn, hot)
            kind.add(name if "." in name else f"{name}.default")
        return fn

    return register


def impl(*names: str, hot: bool = False) -> Callable:
    """Register the decorated function as the hologram kernel of each overload ``names``
    (``"add.Tensor"``; a bare name means its ``.default`` overload). ``hot``: behind the
    native front kernel where the native library is loaded (:func:`native.register_fast`),
    for kernels that file their calls (``runner.remember``)."""
    return _registrar(names, hot, NATIVE)


def composed(*names: str, hot: bool = False) -> Callable:
    """Register the decorated function as the hologram kernel of each overload ``names``,
    a kernel that runs other ops rather than a program of its own (listed in
    :data:`COMPOSED`, not :data:`NATIVE`); or one program where it can, filed with the
    native front kernel (``hot``, as :func:`impl`'s)."""
    return _registrar(names, hot, COMPOSED)


def overload(name: str) -> torch._ops.OpOverload:
    op, _, variant = name.partition(".")
    return getattr(getattr(aten, op), variant or "default")


def _written(op: torch._ops.OpOverload) -> tuple[int | str, ...]:
    """The arguments ``op`` writes: positions (in-place ``self``) and names (``out=``)."""
    return tuple(a.name if a.kwarg_only else i for i, a in enumerate(op._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


def _unsafe(written: tuple, args: tuple, kwargs: dict) -> bool:
    """Does a written argument overlap itself or an input (:func:`memory.unsafe_write`)?
    A written list (``_foreach_*_``) is checked element by element against the same
    element of the other lists, as PyTorch checks each of its per-tensor ops."""
    inputs = (*args, *kwargs.values())
    for w in written:
        out = args[w] if isinstance(w, int) else kwargs.get(w)
        if isinstance(out, torch.Tensor):
            if memory.unsafe_write(out, inputs):
                return True
        elif isinstance(out, (list, tuple)):
            lists = [isinstance(x, (list, tuple)) and len(x) == len(out) for x in inputs]
            for i, o in enumerate(out):
                row = [x[i] if listed else x for x, listed in zip(inputs, lists)]
                if memory.unsafe_write(o, row):
                    return True
    return False


def native_or_cpu(*names: str, hot: bool = False, first: Callable | None = None) -> Callable:
    """Like :func:`impl`, for kernels that handle only some cases: when the kernel returns
    ``NotImplemented``, the call runs through the CPU fallback with its original arguments
    (so PyTorch's own kernel gives the result, or raises PyTorch's error). So does a call
    whose written tensor (in-place ``self``, ``out=``) overlaps itself or an input other
    than element for element (:func:`memory.unsafe_write`): PyTorch's memory-overlap
    errors, or its result where it computes one."""
    from hologram_torch.fallback import run_on_cpu

    def register(fn: Callable) -> Callable:
        for name in names:
            op = overload(name)
            written = _written(op)

            def kernel(*args, _fn=fn, _op=op, _written=written, **kwargs):
                if first is not None:  # a path that checks what it takes itself
                    result = first(*args, **kwargs)
                    if result is not NotImplemented:
                        return result
                if _written and _unsafe(_written, args, kwargs):
                    return run_on_cpu(_op, *args, **kwargs)
                result = _fn(*args, **kwargs)
                if result is NotImplemented:
                    return run_on_cpu(_op, *args, **kwargs)
                return result

            impl(name, hot=hot)(kernel)
        return fn

    return register
