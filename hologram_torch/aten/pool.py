"""Pooling on the device: ``max_pool{2,3}d_with_indices``, ``avg_pool{2,3}d`` and
``_adaptive_avg_pool{2,3}d`` with their backward ops (``F.max_pool1d``, ``avg_pool1d`` and
``adaptive_avg_pool1d`` reach the 2-d ops; ``adaptive_avg_pool*d`` to size 1 is ``mean``).

The math is :mod:`hologram_torch.lowering.pool` (strided window reductions). Arguments
torch rejects, and the cases the lowering leaves out, run through the CPU fallback, which
raises torch's error or computes them. So do large pooling backward passes and large
adaptive pools with windows of varying size, where the native formulation (scatters as
strided stores, masked sums) measured slower than the CPU kernel (:data:`WORK_LIMIT`).
"""

from __future__ import annotations

import math

from hologram_torch.aten import from_table
from hologram_torch.aten.registry import native_or_cpu, overload
from hologram_torch.lowering import Unsupported, pool  # (importing registers the entries)

OPINFO = ("nn.functional.max_pool1d", "nn.functional.max_pool2d", "nn.functional.max_pool3d",
          "max_pool2d_with_indices_backward", "nn.functional.avg_pool1d",
          "nn.functional.avg_pool2d", "nn.functional.avg_pool3d",
          "nn.functional.adaptive_avg_pool1d", "nn.functional.adaptive_avg_pool2d",
          "nn.functional.adaptive_avg_pool3d")


#: The most elements a scatter-shaped formulation (pooling backward, adaptive windows of
#: varying size) touches natively: beyond it PyTorch's CPU kernel, with its round trip,
#: measured faster (docs/torch.md).
WORK_LIMIT = 1 << 18


def _work(x, windows) -> int:
    """Elements a pooling backward's scatter touches (one layer per kernel offset where
    windows overlap)."""
    return x.numel() * (math.prod(w.kernel for w in windows) if pool.overlaps(windows) else 1)


def _cheaper(name: str, n: int, args) -> bool:
    """Is the native formulation measured cheaper than the CPU kernel for ``args``?"""
    try:
        if name.startswith("max_pool") and name.endswith("backward"):
            windows = pool.geometry(args[1], n, *args[2:7])
        elif name.startswith("avg_pool") and name.endswith("backward"):
            windows = pool.geometry(args[1], n, *args[2:5], (1,), args[5])
        elif name.startswith("_adaptive") and not name.endswith("backward"):
            x, out = args[0], tuple(args[1])
            if all(i % o == 0 for i, o in zip(x.shape[-n:], out)):
                return True  # an average pool
            return x.numel() * max(out) <= WORK_LIMIT
        else:
            return True
    except Unsupported:
        return True  # the lowering refuses it, the fallback runs it
    return _work(args[1], windows) <= WORK_LIMIT


def _register_pool(name: str, n: int) -> None:
    op = overload(name)

    def kernel(*args):
        if not _cheaper(name, n, args):
            return NotImplemented
        return from_table.call(op, *(from_table.static(a) for a in args), name=name)

    native_or_cpu(name)(kernel)


for _dims in (2, 3):
    for _name in ("max_pool{}d_with_indices", "max_pool{}d_with_indices_backward",
                  "avg_pool{}d", "avg_pool{}d_backward", "_adaptive_avg_pool{}d",
                  "_adaptive_avg_pool{}d_backward"):
        _register_pool(_name.format(_dims), _dims)
