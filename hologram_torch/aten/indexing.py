"""``tril`` and ``triu`` (functional and in-place), and the writes into a slice
(``slice_scatter``, ``select_scatter`` and autograd's ``slice_backward`` and
``select_backward``) on the device, for every native dtype. The math is their entries in
:mod:`hologram_torch.lowering.indexing` and :mod:`hologram_torch.lowering.shape`: the
backward ops are one elementwise program (the gradient among zeros) instead of a fill and
a copy into a view, so a recorded region runs them fused and never cuts at the view."""

from __future__ import annotations

from hologram_torch.aten import from_table
from hologram_torch.lowering import indexing  # noqa: F401  (registers the entries)

OPINFO = ("tril", "triu", "slice_scatter", "select_scatter")

for _name in ("tril", "triu"):
    from_table.register(_name)
    from_table.register(f"{_name}_", _name)
for _name in ("slice_scatter", "select_scatter", "slice_backward", "select_backward"):
    from_table.register(_name)
