"""Registration of aten kernels for the hologram dispatch key (PrivateUse1)."""

from __future__ import annotations

from collections.abc import Callable

import torch

aten = torch.ops.aten
_lib = torch.library.Library("aten", "IMPL")
#: Every aten overload with a native kernel here (the conformance suite reads this).
NATIVE: set[str] = set()


def impl(*names: str) -> Callable:
    """Register the decorated function as the hologram kernel of each overload ``names``
    (``"add.Tensor"``; a bare name means its ``.default`` overload)."""

    def register(fn: Callable) -> Callable:
        for name in names:
            _lib.impl(name, fn, "PrivateUse1")
            NATIVE.add(name if "." in name else f"{name}.default")
        return fn

    return register


def overload(name: str) -> torch._ops.OpOverload:
    op, _, variant = name.partition(".")
    return getattr(getattr(aten, op), variant or "default")
