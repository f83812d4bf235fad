"""``addcmul``/``addcdiv``/``lerp`` and the ``_foreach_*`` ops of the optimizers.

The math is :mod:`hologram_torch.lowering.foreach`'s: the single-tensor ops run their
lowering entries; a foreach op runs the per-tensor math of its entry once per tensor of
the list (one compiled kernel per distinct shape). The first call of a signature (the
rows' dtypes, shapes, strides and number types) does so through :func:`runner.run`,
with every check, and files the rows' entries; later calls of it are recorded row by row
in one native call (recorded execution), or launched so (op by op): an optimizer's step
over small parameters paid ~7 µs of Python a tensor and op. Lists with a tensor the
device cannot compute natively go to the CPU fallback as a whole.
"""

from __future__ import annotations

import torch

from hologram_torch import lazy, memory
from hologram_torch.aten import from_table, runner
from hologram_torch.aten.elementwise import _check_inplace, _float, _pointwise, _spec
from hologram_torch.aten.registry import aten, native_or_cpu
from hologram_torch.lowering.foreach import MATH

OPINFO = ("addcmul", "addcdiv", "lerp")


# --- single-tensor ops: their lowerings (hologram_torch.lowering.foreach) ----------------

def _run(name, op, args, out=None):
    if not _float(*args) or any(isinstance(x, complex) for x in args):
        return NotImplemented
    if out is not None:
        result = torch.promote_types(torch.result_type(args[0], args[1]),
                                     torch.result_type(args[1], args[2]))
        _check_inplace(name, out, result, args[1],
                       args[2] if isinstance(args[2], torch.Tensor) else None)
    return from_table.run(op, args, out=None if out is None else (out,), name=name)


def _addc(name: str):
    """``name`` and ``name_`` (addcmul, addcdiv: ``self + value * (tensor1 op tensor2)``),
    registered; returned for the module's names."""
    op = getattr(aten, name).default

    def functional(self, tensor1, tensor2, *, value=1):
        return _run(name, op, (self, tensor1, tensor2, value))

    def inplace(self, tensor1, tensor2, *, value=1):
        return _run(f"{name}_", op, (self, tensor1, tensor2, value), self)

    return native_or_cpu(name)(functional), native_or_cpu(f"{name}_")(inplace)


addcmul, addcmul_ = _addc("addcmul")
addcdiv, addcdiv_ = _addc("addcdiv")


def _lerp_dtypes(self, end, weight) -> None:
    """PyTorch's dtype rule for lerp: ``end``, and a weight tensor that is not 0-d, in
    ``self``'s dtype. A mismatch raises its error, worded by its CPU kernel, run on
    stand-ins of the operands' dtypes and shapes (one element each, expanded)."""
    if end.dtype is not self.dtype or (isinstance(weight, torch.Tensor) and weight.dim()
                                       and weight.dtype is not self.dtype):
        torch.lerp(*(torch.zeros((), dtype=x.dtype).expand(x.shape)
                     if isinstance(x, torch.Tensor) else x for x in (self, end, weight)))


@native_or_cpu("lerp.Scalar", "lerp.Tensor")
def lerp(self, end, weight):
    _lerp_dtypes(self, end, weight)
    return _run("lerp", aten.lerp.Scalar, (self, end, weight))


@native_or_cpu("lerp_.Scalar", "lerp_.Tensor")
def lerp_(self, end, weight):
    _lerp_dtypes(self, end, weight)
    return _run("lerp_", aten.lerp.Scalar, (self, end, weight), self)


# --- foreach ----------------------------------------------------------------------------

#: Recorded execution: a number for each (name, in place) of the foreach kernels, which
#: the native region files their rows' entries under (see :func:`_filed`).
_OPS: dict[tuple, int] = {}


def _rows(self, others) -> tuple:
    """The rows ``self[i], *others[i]`` (others: lists, or one value for all)."""
    columns = [o if isinstance(o, (list, tuple)) else [o] * len(self) for o in others]
    return tuple(zip(self, *columns))


def _filed(name, self, *others, inplace):
    """The path of a call whose signature (every row's operands' dtypes, shapes and
    strides, numbers' types) :func:`_each` ran before: its rows' entries are recorded
    (:mod:`hologram_torch.lazy`) or launched (op by op, on host memory) straight away, the
    checks and lookups of that call holding for all of them (native code checks written
    tensors' overlaps itself); NotImplemented otherwise."""
    recorded = lazy.active()
    if not recorded and not (runner.FRONT and runner.host_memory()):
        return NotImplemented
    rows = _rows(self, others)
    entries = lazy.rows_entries(_OPS.setdefault((name, inplace), len(_OPS)), rows)
    if entries is None:
        return NotImplemented
    outs = (tuple(row[0] for row in rows) if inplace else
            tuple(memory.new(*entry.layouts[0]) for entry in entries))
    done = (lazy.record_rows if recorded else lazy.launch_rows)(entries, rows, outs, inplace)
    if not done:
        return NotImplemented
    return None if inplace else list(outs)


def _each(name, self, *others, inplace):
    """``_foreach_<name>``'s per-tensor math (:data:`lowering.foreach.MATH`) on
    ``self[i], *others[i]`` for each i (others: lists, or one value for all)."""
    fn = MATH[name]
    rows = _rows(self, others)
    if not all(_float(*row) for row in rows):
        return NotImplemented
    # (before any row runs: a row done in place would be done again by the CPU fallback)
    if runner.lacking(*(x for row in rows for x in row if isinstance(x, torch.Tensor))):
        return NotImplemented
    if name == "lerp":  # PyTorch checks each tensor as its lerp does
        for row in rows:
            _lerp_dtypes(*row)
    results = []
    for x, *rest in rows:
        if inplace:
            _pointwise(name, fn, (x, *rest), x.dtype, out=(x,))
        else:
            results.append(_pointwise(name, fn, (x, *rest), x.dtype))
    if lazy.active() or runner.FRONT:  # file the rows' entries for _filed
        entries = tuple(runner.used_entry(name, (_spec(fn, row[0].dtype),), row,
                                           (row[0],) if inplace else None) for row in rows)
        if all(e is not None and e.launch is not None for e in entries):
            lazy.file_rows(_OPS.setdefault((name, inplace), len(_OPS)), rows, entries)
    return None if inplace else results


def _kernel(name, alpha, inplace, each=_each):
    """A ``_foreach_<name>`` kernel running ``each`` (an ``alpha`` argument or not)."""
    if alpha:
        def kernel(self, other, alpha=1):
            return each(name, self, other, alpha, inplace=inplace)
    else:
        def kernel(self, *others):
            return each(name, self, *others, inplace=inplace)
    return kernel


def _foreach(name, overloads, *, alpha=False):
    """Register ``_foreach_<name>`` and ``_foreach_<name>_`` for the overload names."""
    for suffix in overloads:
        dotted = f".{suffix}" if suffix else ""
        for inplace in (False, True):
            native_or_cpu(f"_foreach_{name}{'_' if inplace else ''}{dotted}",
                          first=_kernel(name, alpha, inplace, _filed))(
                _kernel(name, alpha, inplace))


_foreach("add", ("List", "Tensor"), alpha=True)
_foreach("add", ("Scalar", "ScalarList"))
_foreach("sub", ("List",), alpha=True)
_foreach("sub", ("Scalar", "ScalarList"))
_foreach("mul", ("Scalar", "List", "ScalarList", "Tensor"))
_foreach("div", ("Scalar", "List", "ScalarList", "Tensor"))
_foreach("maximum", ("List", "Scalar", "ScalarList"))
_foreach("sqrt", ("",))
_foreach("neg", ("",))
_foreach("lerp", ("Scalar", "List", "ScalarList"))


def _foreach_ternary(name):
    def kernel(inplace, each=_each):
        def ternary(self, tensor1, tensor2, value=1):
            return each(name, self, tensor1, tensor2, _values(value, self), inplace=inplace)
        return ternary

    for suffix in ("Scalar", "ScalarList", "Tensor"):
        for inplace in (False, True):
            native_or_cpu(f"_foreach_{name}{'_' if inplace else ''}.{suffix}",
                          first=kernel(inplace, _filed))(kernel(inplace))


def _values(value, tensors):
    """A ScalarList as given; a 1-D CPU tensor of scalars (the .Tensor overloads) as
    numbers; one scalar for every tensor."""
    if isinstance(value, torch.Tensor):
        return value.tolist() if value.dim() else value
    return value


_foreach_ternary("addcmul")
_foreach_ternary("addcdiv")


@native_or_cpu("_foreach_zero_")
def _foreach_zero_(self):
    for x in self:
        x.zero_()


@native_or_cpu("_foreach_copy_")
def _foreach_copy_(self, src, non_blocking=False):
    for x, s in zip(self, src):
        x.copy_(s)


__all__ = ["addcdiv", "addcmul", "lerp"]
