"""``tril`` and ``triu`` (functional and in-place) on the device, for every native dtype;
the math is :mod:`hologram_torch.lowering.indexing`."""

from __future__ import annotations

from hologram_torch.aten import lowered
from hologram_torch.lowering import indexing  # noqa: F401  (registers the entries)

OPINFO = ("tril", "triu")

for _name in ("tril", "triu"):
    lowered.register(_name)
    lowered.register(f"{_name}_", _name)
