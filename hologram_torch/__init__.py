"""``torch.device('hologram')``: a PyTorch device whose kernels Hologram compiles.

    import torch
    import hologram_torch                       # registers the device (see below)

    x = torch.randn(64, 128, device="hologram")
    model = torch.nn.Linear(128, 10).to("hologram")
    loss = model(x).relu().sum()
    loss.backward()                             # gradients on the device

``hologram_torch.functional`` and ``hologram_torch.nn`` (autograd functions and modules) run
Hologram kernels on CPU or hologram tensors, with autograd.

Importing this package renames PyTorch's PrivateUse1 dispatch key to ``hologram``, installs
``torch.hologram`` (a device module mirroring ``torch.cuda``), the device's hooks (native
ones where a C++ compiler can build them once: they give the device pinned memory, see
:mod:`hologram_torch.native`), aten kernels that run as Atlas programs compiled by
Hologram's backend (:mod:`hologram_torch.aten`), and a CPU fallback for every other op
(:func:`fallback_stats` tells which ran there). PyTorch also imports it on ``import torch``
through the ``torch.backends`` entry point when the package is installed
(``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` disables that).
"""

from __future__ import annotations

import hologram
from hologram_torch.constants import NAME
from hologram_torch.device import register

register()

# Parallel CPU kernels run on PyTorch's OpenMP threads rather than a second pool beside them
# (hologram/backends/cpu/workers.py); a pool loaded before torch was imported switches now.
from hologram.backends.cpu import workers as _workers  # noqa: E402

_workers.share_openmp()

# Kernels, fallback, compatibility patches and the torch.distributed backend register on
# import; functional and nn are the autograd API (examples/ and
# notebooks/pytorch_vs_hologram_torch.ipynb use them).
from hologram_torch import (  # noqa: E402,F401
    aten,
    autocast,
    compat,
    distributed,
    dlpack,
    fallback,
    functional,
    nn,
)
from hologram_torch.aten import runner  # noqa: E402
from hologram_torch.compile import compile_stats, reset_compile_stats  # noqa: E402,F401
from hologram_torch.custom_ops import custom_op  # noqa: E402
from hologram_torch.dlpack import from_dlpack  # noqa: E402
from hologram_torch.fallback import (  # noqa: E402
    FallbackWarning,
    fallback_stats,
    reset_fallback_stats,
)
from hologram_torch.lazy import connect as _connect_lazy  # noqa: E402
from hologram_torch.lazy import set_lazy  # noqa: E402

_connect_lazy()  # HOLOGRAM_LAZY=1: the native region, or a warning and op-by-op execution

#: The executor-first form ``hg.functional.add(exec, a, b)`` takes a Hologram executor.
Executor = hologram.Executor

__all__ = [
    "NAME", "Executor", "FallbackWarning", "custom_op", "fallback_stats", "from_dlpack",
    "functional", "get_backend",
    "is_available", "list_available_backends", "nn", "reset_fallback_stats", "set_backend",
    "set_lazy",
]


def is_available() -> bool:
    """Is the hologram device registered and usable? (Always, once imported.)"""
    return True


def get_backend() -> str:
    """The Hologram backend that compiles the device's kernels (e.g. ``"cpu"``)."""
    return runner.backend()


def set_backend(name: str) -> None:
    """Compile the device's kernels for backend ``name`` from now on (``"auto"``, ``"cpu"``,
    ``"interp"``, ``"cuda"``, ``"webgpu"``; :class:`hologram.DeviceError` names the
    available ones), before the first device tensor: the backend decides the device's
    memory (host memory, or the GPU's for cuda and webgpu), and tensors cannot move under
    torch's feet."""
    runner.set_backend(name)


def list_available_backends() -> list[str]:
    return hologram.backend.list_available_backends()


