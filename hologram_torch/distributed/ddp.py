"""DistributedDataParallel on the hologram device: the two options that need the device's
native hooks are refused when the model is wrapped, if those hooks are missing, with the
remedy, instead of failing inside the first ``backward()``.

With ``find_unused_parameters=True`` (and on the first step of ``static_graph=True``) the
reducer of torch 2.13 copies its map of used parameters to the device through a *pinned*
host buffer (``Reducer::all_reduce_local_used_map`` in ``reducer.cpp``), and a pinned
allocation asks the accelerator's hooks for an allocator. The native hooks
(:mod:`hologram_torch.native`) provide one; the Python hooks, which serve where the native
ones could not be built (no C++ compiler), have no such method, so torch would raise
"implement getPinnedMemoryAllocator" from the autograd engine. Everything else DDP does
(buckets, ``no_sync``, ``broadcast_buffers``, ``gradient_as_bucket_view``, comm hooks)
works with either.
"""

from __future__ import annotations

import functools

from torch.nn.parallel import DistributedDataParallel

from hologram_torch import native
from hologram_torch.compat import UnsupportedError
from hologram_torch.constants import NAME


def _refuse_unsupported_options(ddp: DistributedDataParallel) -> None:
    if ddp.device_type != NAME or native.active():
        return
    for option in ("find_unused_parameters", "static_graph"):
        if getattr(ddp, option, False):
            raise UnsupportedError(
                f"DistributedDataParallel({option}=True) on the {NAME} device needs the "
                f"device's native hooks: torch 2.13's reducer stages its map of used "
                f"parameters in pinned memory, which only they can allocate, and this "
                f"process runs without them: {native.reason()}. Until then, leave "
                f"{option}=False and let every "
                "parameter take part in each forward (for a branch not taken, add "
                "0.0 * sum(p.sum() for p in branch.parameters()) to the output), or train "
                "that model on CPU tensors (the same process group serves them)")


def install() -> None:
    """Check DDP's options on every ``DistributedDataParallel`` construction
    (idempotent)."""
    init = DistributedDataParallel.__init__
    if getattr(init, "_hologram_checks", False):
        return

    @functools.wraps(init)
    def checked_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _refuse_unsupported_options(self)

    checked_init._hologram_checks = True
    DistributedDataParallel.__init__ = checked_init
