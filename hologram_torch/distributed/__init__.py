"""torch.distributed on the hologram device: the ``hologram`` process-group backend.

    import torch.distributed as dist
    import hologram_torch                       # registers the backend

    dist.init_process_group("cpu:gloo,hologram:hologram")   # or backend="hologram"
    model = DistributedDataParallel(model.to("hologram"))

Importing :mod:`hologram_torch` registers the backend ``hologram`` for the ``hologram``
device (``torch.distributed.Backend.register_backend``). Its process group
(:class:`~hologram_torch.distributed.process_group.ProcessGroupHologram`) runs every
collective through gloo, PyTorch's CPU collective library (TCP between machines), on
zero-copy CPU views of device tensors: the device's memory is host memory. CPU tensors go
through the same group, so one process group serves a model on either device.
torch 2.13 infers no default backend for a custom device: name it in
``init_process_group``. docs/distributed.md is the user's guide.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from hologram_torch.constants import NAME

if dist.is_available():  # torch builds without distributed support have no ProcessGroup
    from hologram_torch.distributed import ddp
    from hologram_torch.distributed.operands import GLOO_DTYPES
    from hologram_torch.distributed.process_group import ProcessGroupHologram

__all__ = ["GLOO_DTYPES", "ProcessGroupHologram", "create_process_group", "register"]


def create_process_group(options, backend_options=None) -> ProcessGroupHologram:
    """The backend's factory (torch's extended API): an inner ``ProcessGroupGloo`` on the
    group's store, rank, size and timeout, wrapped in torch's collective checker when
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (as torch wraps its own backends: mismatched
    collectives across ranks then fail with torch's "Detected mismatch" error instead of
    gloo's size error or a timeout)."""
    store, rank, size = options.store, options.group_rank, options.group_size
    timeout: timedelta = options.timeout
    gloo = dist.ProcessGroupGloo(store, rank, size, timeout=timeout)
    gloo.options.global_ranks_in_group = list(options.global_ranks_in_group)
    gloo.options.group_name = options.group_id
    gloo._set_sequence_number_for_group()
    if dist.get_debug_level() == dist.DebugLevel.DETAIL:
        from torch.distributed.distributed_c10d import _create_process_group_wrapper

        gloo = _create_process_group_wrapper(
            wrapped_pg=gloo, store_prefix=f"{NAME}/{options.group_id}", store=store,
            rank=rank, world_size=size, timeout=timeout)
    return ProcessGroupHologram(gloo, rank, size)


def register() -> None:
    """Register the ``hologram`` backend with torch.distributed, and DDP's option checks
    (:mod:`~hologram_torch.distributed.ddp`) (idempotent)."""
    if not dist.is_available():
        return
    ddp.install()
    if NAME.upper() in dist.Backend._plugins:
        return
    # devices: the hologram device, and the CPU, whose tensors the same group serves.
    dist.Backend.register_backend(NAME, create_process_group, extended_api=True,
                                  devices=[NAME, "cpu"])


register()
