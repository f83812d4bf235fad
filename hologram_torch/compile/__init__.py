"""``torch.compile(model, backend="hologram")``: ATen graphs as fused Hologram programs.

    import torch
    model = torch.compile(model, backend="hologram", options={"threads": 1})

The backend itself (:mod:`.backend`, which imports dynamo) loads when torch.compile first
looks the name up, through the ``torch_dynamo_backends`` entry point; importing this
package only brings the counters (:func:`compile_stats`). Reference: docs/compile.md.
"""

from __future__ import annotations

from hologram_torch.compile.stats import compile_stats, reset_compile_stats

__all__ = ["compile_stats", "reset_compile_stats"]
