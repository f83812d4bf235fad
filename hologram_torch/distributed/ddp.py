"""DistributedDataParallel on the hologram device: the two options torch's C++ reducer
cannot serve for a Python-registered device are refused when the model is wrapped, with
the remedy, instead of failing inside the first ``backward()``.

With ``find_unused_parameters=True`` (and on the first step of ``static_graph=True``) the
reducer of torch 2.13 copies its map of used parameters to the device through a *pinned*
host buffer (``Reducer::all_reduce_local_used_map`` in ``reducer.cpp``), and a pinned
allocation asks the accelerator's hooks for an allocator: the hooks a Python device can
register (``torch._C._acc.PrivateUse1Hooks``) have no such method, so torch raises
"implement getPinnedMemoryAllocator" from the autograd engine. Everything else DDP does
(buckets, ``no_sync``, ``broadcast_buffers``, ``gradient_as_bucket_view``, comm hooks)
works unchanged.
"""

from __future__ import annotations

import functools

from torch.nn.parallel import DistributedDataParallel

from hologram_torch.compat import UnsupportedError
from hologram_torch.constants import NAME


def _refuse_unsupported_options(ddp: DistributedDataParallel) -> None:
    if ddp.device_type != NAME:
        return
    for option in ("find_unused_parameters", "static_graph"):
        if getattr(ddp, option, False):
            raise UnsupportedError(
                f"DistributedDataParallel({option}=True) on the {NAME} device: torch "
                f"2.13's reducer stages its map of used parameters in pinned memory, which "
                f"a device registered from Python cannot allocate. Leave {option}=False "
                "and let every parameter take part in each forward (for a branch not "
                "taken, add 0.0 * sum(p.sum() for p in branch.parameters()) to the "
                "output), or train that model on CPU tensors (the same process group "
                "serves them)")


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
