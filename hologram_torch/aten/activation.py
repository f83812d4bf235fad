"""``hardswish`` and ``hardsigmoid`` (functional and in-place) and their backward ops on
the device; the math is :mod:`hologram_torch.lowering.activation`."""

from __future__ import annotations

from hologram_torch.aten import from_table
from hologram_torch.lowering import activation  # noqa: F401  (registers the entries)

OPINFO = ("nn.functional.hardswish", "nn.functional.hardsigmoid")

for _name in ("hardswish", "hardsigmoid"):
    from_table.register(_name)
    from_table.register(f"{_name}_", _name)
    from_table.register(f"{_name}_backward")
