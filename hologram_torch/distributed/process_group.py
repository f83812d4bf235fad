"""``ProcessGroupHologram``: torch.distributed collectives on hologram (and CPU) tensors,
run by gloo on zero-copy CPU views.

A Python subclass of ``torch.distributed.ProcessGroup``: torch calls its methods both from
Python (``dist.all_reduce`` and friends call ``group.allreduce(...)``) and from C++ (DDP's
reducer and ``_broadcast_coalesced`` reach the overrides through torch's ``PyProcessGroup``
trampoline). Each method hands the operands to an inner ``ProcessGroupGloo`` as CPU
tensors (:class:`~hologram_torch.distributed.operands.Staging`) and returns gloo's
``Work`` itself when gloo saw the caller's own tensors, or else a :class:`HologramWork`
that waits for gloo's, runs the staging's finishing steps, and reports the caller's
tensors (DDP's reducer reads its gradient buckets from the ``Work``'s future, and needs
them on the device they came from).

torch keeps only this object when a backend's factory returns a ``ProcessGroup``, so it
serves CPU tensors too: ``backend="hologram"`` and ``"cpu:gloo,hologram:hologram"`` both
give every collective, on either device, to this class. The inner gloo backend is
registered for both devices, so ``group_name``, object collectives, ``barrier`` and
``init_process_group(device_id=...)`` find a backend as they would on a gloo group.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    ReduceOptions,
    ReduceScatterOptions,
)
from torch.distributed import ReduceOp

from hologram_torch.compat import UnsupportedError
from hologram_torch.constants import NAME
from hologram_torch.distributed.operands import Staging

_CPU = torch.device("cpu")


def _sum_instead_of_avg(opts, cls):
    """A copy of reduction options ``opts`` whose AVG is a SUM (gloo has no AVG: the
    division by the group size happens after gloo's sum)."""
    new = cls()
    new.reduceOp = ReduceOp.SUM
    new.timeout = opts.timeout
    new.asyncOp = opts.asyncOp
    for name in ("rootRank", "rootTensor"):
        if hasattr(opts, name):
            setattr(new, name, getattr(opts, name))
    return new


def _gloo_op(opts) -> ReduceOp.RedOpType:
    """The op gloo runs for reduction options ``opts``: AVG is a SUM, then a division."""
    op = opts.reduceOp.op
    return ReduceOp.SUM if op == ReduceOp.AVG else op


def _averaging(opts, cls, outputs, size: int, staging: Staging):
    """``opts`` for gloo: for AVG, a copy with SUM, and the division of ``outputs`` (the
    CPU tensors gloo writes) scheduled in ``staging``."""
    if opts.reduceOp.op != ReduceOp.AVG:
        return opts
    _then_divide(outputs, size, staging)
    return _sum_instead_of_avg(opts, cls)


def _then_divide(tensors, size: int, staging: Staging) -> None:
    """Schedule the division that turns gloo's sum into an average, on the CPU views
    (integer averages are refused: torch defines AVG for floating types only)."""
    for t in tensors:
        if not (t.is_floating_point() or t.is_complex()):
            raise UnsupportedError(f"torch.distributed on {NAME}: ReduceOp.AVG of a "
                                   f"{t.dtype} tensor; use SUM and divide")
    staging.needed = True
    staging.after.append(lambda: [t.div_(size) for t in tensors])


# gloo Works a later call may drop: [work, when a call first saw it completed (or None)].
_KEPT: list[list] = []
_KEPT_LOCK = threading.Lock()  # DDP's reducer calls from the autograd engine's thread
# How long after a call first finds a Work completed it stays kept: gloo's thread lets go
# of it microseconds after completing it; this is the margin for that thread being
# descheduled in between. (The memory kept that way is at most what gloo moved in that
# time: the calls run in turn.)
_KEEP_AFTER_S = 0.1


def _keep(works) -> None:
    """Keep gloo's ``works`` referenced from Python until a later call, at least
    :data:`_KEEP_AFTER_S` after one first found them completed, lets go of them.

    Why: a gloo call's tensors (the CPU views made for it, or the caller's tensors) have
    Python objects, and torch 2.13 takes the GIL when a C++ reference to such a tensor
    goes and leaves it with one. gloo's thread drops its reference to a call after
    completing it; were that the last reference, the call's tensors would go there, taking
    the GIL. A group's destructor waits for that thread with the GIL held (its last
    reference is often DDP's reducer, freed by Python), so a group torn down in that
    window hung the process for good. Kept here (not by the group, whose Python object may
    go before its C++ one), a call is let go on a Python thread, after gloo's."""
    now = time.monotonic()
    with _KEPT_LOCK:
        kept = []
        for entry in _KEPT:
            if entry[1] is None and entry[0].is_completed():
                entry[1] = now
            if entry[1] is None or now - entry[1] < _KEEP_AFTER_S:
                kept.append(entry)
        kept.extend([work, None] for work in works)
        _KEPT[:] = kept


def _flatten(lists) -> list[torch.Tensor]:
    return [t for inner in lists for t in inner]


class ProcessGroupHologram(dist.ProcessGroup):
    """Collectives for hologram and CPU tensors over an inner gloo backend.

    ``gloo`` is the ``ProcessGroupGloo`` of the same store, rank and size (or torch's
    debug wrapper around it). Every method takes the arguments torch's own
    ``ProcessGroup`` methods take, and returns a ``Work``."""

    def __init__(self, gloo, rank: int, size: int):
        super().__init__(rank, size)
        self._gloo = gloo
        self._coalesced: list | None = None  # works issued inside _start/_end_coalescing
        # gloo is this group's backend for both devices as torch sees them: the CPU one
        # for object collectives and barrier, the device's for init_process_group's
        # device_id (torch asks it whether it can split); every collective still comes
        # through the methods below.
        self._register_backend(_CPU, dist.ProcessGroup.BackendType.GLOO, gloo)
        self._register_backend(torch.device(NAME), dist.ProcessGroup.BackendType.GLOO, gloo)
        self._set_default_backend(dist.ProcessGroup.BackendType.GLOO)

    def getBackendName(self) -> str:  # the C++ name the trampoline calls
        return NAME

    def __repr__(self) -> str:
        return f"ProcessGroupHologram(rank={self.rank()}, size={self.size()})"

    # --- the Work a call returns ------------------------------------------------------

    def _work(self, work, staging: Staging, result: list[torch.Tensor]):
        """``work`` (gloo's) as the caller's ``Work`` (see the module's docstring)."""
        if not staging.needed:
            return self._track(work)
        return self._track(HologramWork([work], result, staging.finish))

    def _track(self, work):
        """``work`` (gloo's, or a :class:`HologramWork` of gloo's), kept (:func:`_keep`)
        and counted for :meth:`_end_coalescing`."""
        if self._coalesced is not None:
            self._coalesced.append(work)
        _keep(work._works if isinstance(work, HologramWork) else [work])
        return work

    # --- reductions --------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        opts = opts or AllreduceOptions()
        staging = Staging()
        wire = [staging.reduced(t, _gloo_op(opts)) for t in tensors]
        opts = _averaging(opts, AllreduceOptions, wire, self.size(), staging)
        return self._work(self._gloo.allreduce(wire, opts), staging, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        """All-reduce of several tensors in one call per dtype (gloo's coalesced
        all-reduce takes one dtype; ``_coalescing_manager`` may mix them)."""
        opts = opts or AllreduceCoalescedOptions()
        staging = Staging()
        wire = [staging.reduced(t, _gloo_op(opts)) for t in tensors]
        opts = _averaging(opts, AllreduceCoalescedOptions, wire, self.size(), staging)
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in wire:
            by_dtype.setdefault(t.dtype, []).append(t)
        works = [self._gloo.allreduce_coalesced(same, opts) for same in by_dtype.values()]
        if len(works) == 1:
            return self._work(works[0], staging, tensors)
        return self._track(HologramWork(works, tensors, staging.finish))

    def reduce(self, tensors, opts=None):
        opts = opts or ReduceOptions()
        staging = Staging()
        wire = [staging.reduced(t, _gloo_op(opts)) for t in tensors]
        root = self.rank() == opts.rootRank  # only the root's result is defined
        opts = _averaging(opts, ReduceOptions, wire if root else [], self.size(), staging)
        return self._work(self._gloo.reduce(wire, opts), staging, tensors)

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        opts = opts or ReduceScatterOptions()
        staging = Staging()
        op = _gloo_op(opts)
        outputs = [staging.reduced(t, op) for t in output_tensors]
        inputs = [[staging.reduced(t, op, output=False) for t in inner]
                  for inner in input_lists]
        opts = _averaging(opts, ReduceScatterOptions, outputs, self.size(), staging)
        work = self._gloo.reduce_scatter(outputs, inputs, opts)
        return self._work(work, staging, output_tensors)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts or ReduceScatterOptions()
        staging = Staging()
        wire_out = staging.reduced(output, _gloo_op(opts))
        wire_in = staging.reduced(input, _gloo_op(opts), output=False)
        opts = _averaging(opts, ReduceScatterOptions, [wire_out], self.size(), staging)
        work = self._gloo._reduce_scatter_base(wire_out, wire_in, opts)
        return self._work(work, staging, [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self._pairwise(self.reduce_scatter_single, outputs, inputs, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # --- data movement -----------------------------------------------------------------

    def broadcast(self, tensors, opts=None):
        staging = Staging()
        wire = [staging.moved(t) for t in tensors]
        work = self._gloo.broadcast(wire, opts) if opts else self._gloo.broadcast(wire)
        return self._work(work, staging, tensors)

    def allgather(self, output_lists, input_tensors, opts=None):
        return self._gathered(self._gloo.allgather, output_lists, input_tensors,
                              opts or AllgatherOptions())

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        return self._gathered(self._gloo.allgather_coalesced, output_lists, input_tensors,
                              opts or AllgatherOptions())

    def all_gather_single(self, output, input, opts=None):
        opts = opts or AllgatherOptions()
        staging = Staging()
        work = self._gloo._allgather_base(staging.moved(output),
                                          staging.moved(input, output=False), opts)
        return self._work(work, staging, [output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._pairwise(self.all_gather_single, outputs, inputs, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_lists, input_tensors, opts):
        return self._gathered(self._gloo.gather, output_lists, input_tensors, opts)

    def scatter(self, output_tensors, input_lists, opts):
        staging = Staging()
        outputs = [staging.moved(t) for t in output_tensors]
        inputs = [[staging.moved(t, output=False) for t in inner] for inner in input_lists]
        work = self._gloo.scatter(outputs, inputs, opts)
        return self._work(work, staging, output_tensors)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts):
        staging = Staging()
        work = self._gloo.alltoall_base(staging.moved(output), staging.moved(input, output=False),
                                        output_split_sizes, input_split_sizes, opts)
        return self._work(work, staging, [output])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts):
        staging = Staging()
        outputs = [staging.moved(t) for t in output_tensors]
        inputs = [staging.moved(t, output=False) for t in input_tensors]
        work = self._gloo.alltoall(outputs, inputs, opts)
        return self._work(work, staging, output_tensors)

    def barrier(self, opts=None):
        return self._track(self._gloo.barrier(opts) if opts else self._gloo.barrier())

    # --- point to point ----------------------------------------------------------------
    # gloo's own Work is returned even for device tensors (nobody reads a send's or
    # recv's future), except for a receive into a view with gaps: its data is copied in
    # when its Work is waited for, and that Work reports the source rank as gloo's does.

    def send(self, tensors, dst_rank, tag):
        staging = Staging()
        return self._track(self._gloo.send([staging.moved(t, output=False)
                                            for t in tensors], dst_rank, tag))

    def recv(self, tensors, src_rank, tag):
        staging = Staging()
        work = self._gloo.recv([staging.moved(t) for t in tensors], src_rank, tag)
        return self._work(work, staging, tensors)

    def recv_anysource(self, tensors, tag):
        staging = Staging()
        work = self._gloo.recv_anysource([staging.moved(t) for t in tensors], tag)
        return self._work(work, staging, tensors)

    # --- coalescing --------------------------------------------------------------------
    # _coalescing_manager(group, device) brackets ordinary calls with these two; gloo
    # runs each call as issued, so the end only has to wait for all of them.

    def _start_coalescing(self, device):
        if self._coalesced is not None:
            raise RuntimeError("ProcessGroupHologram: _start_coalescing called twice "
                               "without _end_coalescing")
        self._coalesced = []

    def _end_coalescing(self, device):
        works, self._coalesced = self._coalesced, None
        if works is None:
            raise RuntimeError("ProcessGroupHologram: _end_coalescing without "
                               "_start_coalescing")
        return self._all(works, [])

    # --- helpers -----------------------------------------------------------------------

    def _all(self, works, result):
        """One ``Work`` that completes when every one of ``works`` has."""
        return HologramWork(works, result)

    def _pairwise(self, single, outputs, inputs, opts):
        """A coalesced op: ``single`` (this group's) on each output and its input, as one
        ``Work``."""
        return self._all([single(o, i, opts) for o, i in zip(outputs, inputs)], outputs)

    def _gathered(self, collective, output_lists, input_tensors, opts):
        """``collective`` (gloo's) from a list of inputs into lists of outputs, staged."""
        staging = Staging()
        outputs = [[staging.moved(t) for t in inner] for inner in output_lists]
        inputs = [staging.moved(t, output=False) for t in input_tensors]
        work = collective(outputs, inputs, opts)
        return self._work(work, staging, _flatten(output_lists))


class HologramWork(dist.Work):
    """The ``Work`` of a call whose tensors gloo did not see as they are, or of several
    gloo calls: waits for gloo's ``Work`` objects (raising their errors), then runs
    ``finish`` once, and reports ``result``, the caller's tensors.

    (torch's ``_create_work_from_future`` would be shorter, but its ``wait()`` returns
    normally when the future failed: a rank that died or a collective gloo rejected would
    go unnoticed.)"""

    def __init__(self, works, result: list[torch.Tensor], finish=None):
        super().__init__()
        self._works = works
        self._result = result
        self._finish = finish
        # Reentrant: then() runs its callback at once on a finished future, and the
        # callback finishes under the same lock.
        self._lock = threading.RLock()
        self._finished = False
        self._future: torch.futures.Future | None = None

    def _finish_once(self) -> None:
        with self._lock:
            if not self._finished:
                self._finished = True
                if self._finish is not None:
                    self._finish()

    def wait(self, timeout: timedelta | None = None) -> bool:
        for work in self._works:
            # torch passes 0 for "the group's timeout", which bounds every gloo call
            if timeout:
                work.wait(timeout)
            else:
                work.wait()
        self._finish_once()
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)

    def _source_rank(self) -> int:
        """The sender of a ``recv_anysource`` (a receive into a view with gaps)."""
        return self._works[0]._source_rank()

    def result(self) -> list[torch.Tensor]:
        return self._result

    def get_future(self) -> torch.futures.Future:
        """A future of the result (DDP's reducer reads gradient buckets from it)."""
        with self._lock:
            if self._future is None:
                self._future = self._make_future()
            return self._future

    def _make_future(self) -> torch.futures.Future:
        try:
            futures = [work.get_future() for work in self._works]
        except RuntimeError:  # gloo's reduce_scatter and send/recv have none
            return self._future_from_thread()

        def done(fut):
            for f in (futures if len(futures) > 1 else [fut]):
                f.value()  # re-raises gloo's error
            self._finish_once()
            return self._result

        both = futures[0] if len(futures) == 1 else torch.futures.collect_all(futures)
        return both.then(done)

    def _future_from_thread(self) -> torch.futures.Future:
        future = torch.futures.Future()

        def wait_then_set():
            try:
                self.wait()
            except Exception as error:  # handed to the future's reader
                future.set_exception(error)
            else:
                future.set_result(self._result)

        threading.Thread(target=wait_then_set, daemon=True).start()
        return future
