"""ATen ops as Hologram graph builders: the table both the eager device and torch.compile use.

Each entry of :data:`LOWERINGS` is a pure function ``entry(g, *args, **kwargs)`` of a
:class:`hologram.frontend.graph.Graph`, the op's tensor arguments as graph tensors, and its
other ATen arguments as Python values (numbers, dims, ``keepdim``, torch dtypes, strings),
in the ATen schema's order and names. It returns the op's result(s) as graph tensors, in
the dtypes PyTorch gives them: PyTorch's type promotion, half types computed in float32
("opmath"), torch's NaN and signed-zero rules. Nothing here touches a torch tensor, launches
a kernel or checks a device.

    g = Graph("f")
    x = g.input("x", "f32", (4, 8))
    y = lower(torch.ops.aten.softmax.int, g, x, -1)     # a graph tensor, f32 (4, 8)

A Python number argument is promoted as PyTorch promotes a *wrapped number* (``x + 2.5``
keeps ``x``'s float dtype); a 0-d graph tensor as a 0-d tensor. A runtime number (a 0-d
input whose value changes between launches, as the eager device passes numbers) is a
:class:`Number`: a 0-d graph tensor promoted as a wrapped number.

An entry raises :class:`Unsupported` (or returns ``NotImplemented``, which :func:`lower`
turns into it) for argument combinations it does not lower, e.g. integer division or a
complex dtype; the eager device runs those through its CPU fallback.

The families: :mod:`.elementwise`, :mod:`.activation` (hardswish, hardsigmoid),
:mod:`.reduction`, :mod:`.nn`, :mod:`.norm` (batch norm), :mod:`.pool`, :mod:`.linalg`,
:mod:`.foreach` (addcmul/addcdiv/lerp and the optimizers' ``_foreach_*`` ops, on lists of
graph tensors), :mod:`.shape` (``cat``, the index ops, ``arange``), :mod:`.indexing`
(``tril``/``triu``), :mod:`.generate` (``linspace``, ``logspace``, ``eye``, ``flip``,
``roll``), :mod:`.views` (views,
``clone``, ``_to_copy``). Not in the table: the inherently eager ops (allocation, in-place
copies and fills, ``item``, ``as_strided``/``unfold``, random draws).
"""

from __future__ import annotations

from hologram_torch.lowering import (  # noqa: F401 (importing registers the entries)
    activation,
    conv,
    elementwise,
    foreach,
    generate,
    indexing,
    linalg,
    nn,
    norm,
    pool,
    reduction,
    shape,
    views,
)
from hologram_torch.lowering.common import (
    LOWERINGS,
    Lowering,
    Number,
    Unsupported,
    get,
    lower,
    register,
)

__all__ = ["LOWERINGS", "Lowering", "Number", "Unsupported", "get", "lower", "register"]
