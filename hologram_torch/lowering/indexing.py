"""Positional masks: ``tril`` and ``triu`` keep the elements on one side of a diagonal of
the last two dimensions (``column - row <= diagonal``, resp. ``>=``) and zero the others
(NaN included), for every dtype."""

from __future__ import annotations

from hologram_torch.lowering.common import Unsupported, aten, register


def _triangle(g, x, diagonal: int, lower: bool):
    if x.ndim < 2:
        raise Unsupported("tril/triu of fewer than 2 dimensions")  # torch raises
    rows, cols = x.shape[-2:]
    offset = g.arange(cols).reshape(1, cols) - g.arange(rows).reshape(rows, 1)
    keep = g.binary("le" if lower else "ge", offset, int(diagonal))
    return g.where(keep, x, False if x.dtype.is_bool else 0)


@register(aten.tril.default)
def tril(g, self, diagonal=0):
    return _triangle(g, self, diagonal, True)


@register(aten.triu.default)
def triu(g, self, diagonal=0):
    return _triangle(g, self, diagonal, False)
