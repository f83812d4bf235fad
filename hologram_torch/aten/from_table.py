"""Eager kernels from the lowering table: an aten op's program is its
:mod:`hologram_torch.lowering` entry, built and launched through :func:`runner.run`.

``run(op, args, static, kwargs)`` computes ``entry(g, *args, *static, **kwargs)``: ``args``
are the launch's operands (device tensors, CPU 0-d tensors and Python numbers, which reach
the entry as :class:`~hologram_torch.lowering.Number` values, so new values never
recompile); ``static`` and ``kwargs`` are compile-time arguments (part of the kernel's key).
``call(op, *aten_args)`` takes the ATen argument list as it is: its tensors are the
operands, the rest compile-time.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hologram.errors import ShapeError
from hologram_torch.aten import layout, runner
from hologram_torch.aten.registry import native_or_cpu, overload
from hologram_torch.constants import NAME
from hologram_torch.lowering import Number, Unsupported, lower
from hologram_torch.lowering.common import broadcast_shapes


class _Slot:
    """Where a launch operand goes among an entry's positional arguments."""

    def __repr__(self) -> str:
        return "<operand>"


SLOT = _Slot()


def _build(g, *inputs):
    *inputs, (op, numbers, template, kwargs) = inputs
    if numbers:
        inputs = [Number.of(x) if i in numbers else x for i, x in enumerate(inputs)]
    operands = iter(inputs)
    args = [next(operands) if a is SLOT else a for a in template]
    result = lower(op, g, *args, **dict(kwargs))
    if isinstance(result, tuple):  # absent results (None: a masked-off gradient) are not
        result = tuple(r for r in result if r is not None)  # launched
    return result


def _frozen(a):
    return tuple(_frozen(x) for x in a) if isinstance(a, (list, tuple)) else a


_SLOTS = tuple((SLOT,) * n for n in range(16))


def spec(op: torch._ops.OpOverload, args: Sequence, static: tuple = (),
         kwargs: tuple = ()) -> tuple:
    """The static part of the kernel's key for :func:`run` (what :func:`runner.run` is
    given). ``static`` and ``kwargs`` must be hashable (tuples, not lists). This runs on
    every launch: kept to a few tuple operations."""
    numbers = ()
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            numbers += (i,)
    return ((op, numbers, _SLOTS[len(args)] + static if static else _SLOTS[len(args)],
             kwargs),)


def run(op: torch._ops.OpOverload, args: Sequence, static: tuple = (), kwargs: tuple = (),
        out: Sequence[torch.Tensor] | None = None, name: str | None = None,
        file: bool = False):
    """``op``'s lowering on ``args`` (see the module docstring) into fresh tensors or ``out``;
    NotImplemented when the lowering (or the operands' dtypes) is unsupported, for the
    caller to run the CPU fallback. ``file`` as :func:`call`'s."""
    launched = spec(op, args, static, kwargs)
    result = _launch(op, args, launched, out, name)
    if file:
        _file(op, name, launched, args, out, result)
    return result


def call(op: torch._ops.OpOverload, *args, kwargs: tuple = (),
         out: Sequence[torch.Tensor] | None = None, name: str | None = None,
         file: bool = False, checks: tuple = ()):
    """``op``'s lowering on its ATen positional arguments ``args``: the tensors among them
    are launch operands, everything else (numbers, lists, None) is compile-time (and must
    be hashable, lists aside). Absent results (None from the entry: a masked-off gradient)
    are left out of the results. NotImplemented as :func:`run`. ``file``: the launch (into
    its results, or ``out``) is filed with the front kernel running the call, if any
    (:func:`runner.file_front`), which serves the signature from then on if the kernel
    returns some of them as they are (or None), and its calls pass the index ``checks``
    (:func:`native.file_fast`)."""
    operands = []
    template = []
    for a in args:
        if isinstance(a, torch.Tensor):
            operands.append(a)
            template.append(SLOT)
        else:
            template.append(_frozen(a) if isinstance(a, list) else a)
    launched = ((op, (), tuple(template), kwargs),)
    result = _launch(op, operands, launched, out, name)
    if file:
        _file(op, name, launched, operands, out, result, checks)
    return result


def _file(op, name, launched: tuple, operands: Sequence, out, result,
          checks: tuple = ()) -> None:
    """File the launch just made (into its results, or ``out``) with the front kernel
    running the call, if any (:func:`runner.file_front`)."""
    if result is not NotImplemented:
        outs = tuple(out) if out is not None else (
            result if isinstance(result, tuple) else (result,))
        runner.file_front(name or op.__name__.partition(".")[0], launched, operands, outs,
                           out is not None, checks)


def _layout(args: Sequence, spec: tuple, shapes) -> list | None:
    """Fresh results are laid out as ``op``'s meta kernel lays them out (see
    :mod:`.layout`): its ATen arguments rebuilt from the operands and the template."""
    ((op, _, template, kwargs),) = spec
    operands = iter(args)
    aten_args = [next(operands) if a is SLOT else a for a in template]
    return layout.of_op(op, aten_args, dict(kwargs), shapes)


def _launch(op, args, spec, out, name):
    for a in args:
        # only 0-d CPU tensors (wrapped scalars) mix with device tensors; a kernel's key
        # holds just a CPU operand's dtype, so a larger one must be refused before the
        # lookup (it would find the scalar's kernel)
        if isinstance(a, torch.Tensor) and a.is_cpu and a.dim():
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at "
                               f"least two devices, {NAME}:0 and cpu! ({op})")
    try:
        return runner.run(name or op.__name__.partition(".")[0], _build, args, spec, out,
                           layout=_layout)
    except (Unsupported, runner.Unsupported):
        return NotImplemented
    except ShapeError:
        # Only a first call compiles (a kernel's key holds its operands' shapes), so the
        # graph's own broadcast check is the device's: operands that do not broadcast get
        # PyTorch's RuntimeError, as its TensorIterator folds them in argument order.
        broadcast_shapes(*(a.shape for a in args if isinstance(a, torch.Tensor)))
        raise


def static(a):
    """List arguments as tuples of ints (compile-time arguments are part of the kernel's
    key)."""
    return tuple(int(v) for v in a) if isinstance(a, (list, tuple)) else a


def register(name: str, functional: str | None = None) -> None:
    """Register ``name``'s kernel: its lowering on the device, else the CPU fallback (the
    dispatcher passes every argument of the schema, defaults filled in). With
    ``functional``, ``name`` is that op's in-place form: the functional op's result is
    written over the first argument (element for element, through its strides). Behind
    the native front kernel: the decision depends on the call's signature alone, so a
    launch is filed and the signature served natively from then on."""
    lowering = overload(functional or name)

    def kernel(*args):
        out = (args[0],) if functional else None
        r = call(lowering, *(static(a) for a in args), out=out, name=functional or name,
                 file=True)
        return args[0] if functional and r is not NotImplemented else r

    native_or_cpu(name, hot=True)(kernel)
