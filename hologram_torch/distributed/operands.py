"""The tensors gloo sees: zero-copy CPU views of hologram tensors, and what a dtype gloo
cannot handle becomes.

On host memory a hologram tensor is handed to gloo as a CPU tensor aliasing its bytes
(:func:`hologram_torch.memory.cpu_alias`): results land in device memory with no copy. On
device memory (cuda) gloo sees a host copy, and the results are copied back when the
call finishes. gloo (torch 2.13) accepts float32, float64, float16, bfloat16, int8,
uint8, int32, int64, bool and complex tensors. For the others:

- ops that only move data (broadcast, gathers, scatters, all-to-all, send/recv) take a
  view of the same bytes as a gloo dtype of the same width: still no copy, bit-exact;
- reductions widen int16/uint16 to int32 and uint32 to int64 (a copy each way; sums and
  products wrap on the way back as they would in the narrow type), and reduce uint64 as
  int64 for the ops whose bits do not depend on the sign (sum, product, bitwise);
- what is left (uint64 min/max, float8 reductions) raises
  :class:`hologram_torch.compat.UnsupportedError`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed import ReduceOp

from hologram_torch import memory
from hologram_torch.compat import UnsupportedError
from hologram_torch.constants import NAME

#: dtypes gloo handles natively (checked against torch 2.13's ProcessGroupGloo).
GLOO_DTYPES = frozenset({
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
    torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128,
})
# Same-width gloo dtypes to move other dtypes' bytes as.
_BIT_TWIN = {1: torch.uint8, 2: torch.float16, 4: torch.int32, 8: torch.int64}
# Reductions of these run in a wider integer type; values convert back exactly (min, max)
# or modulo 2**bits (sum, product, bitwise), which is what the narrow type would give.
_WIDER = {torch.int16: torch.int32, torch.uint16: torch.int32, torch.uint32: torch.int64}
# Ops whose result bits do not depend on signedness (two's complement).
_SIGN_FREE = frozenset({ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.BAND, ReduceOp.BOR,
                        ReduceOp.BXOR})


def is_device(t: torch.Tensor) -> bool:
    return t.device.type == NAME


def alias(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a CPU tensor: itself, or a zero-copy view of a hologram tensor."""
    return memory.cpu_alias(t) if is_device(t) else t


class Staging:
    """The CPU tensors of one call, and the steps to run once gloo has finished with
    them (copying widened results back, dividing for AVG). ``needed`` says whether the
    caller's tensors differ from what gloo saw (then the call's ``Work`` must report the
    caller's tensors, and run the steps)."""

    def __init__(self) -> None:
        self.after: list[Callable[[], None]] = []
        self.needed = False
        self.written: list[torch.Tensor] = []  # host stand-ins of written device tensors

    def _dense(self, c: torch.Tensor, output: bool) -> torch.Tensor:
        """``c``, or a contiguous copy of it that the call uses instead (copied back into
        ``c`` afterwards when the op writes it): gloo reads and writes ``numel`` elements
        from the first one, which for a view with gaps (a column, a slice with a step)
        would be the wrong elements, and memory outside the view."""
        if c.is_contiguous():
            return c
        self.needed = True
        staged = c.contiguous()
        if output:
            self.after.append(lambda: c.copy_(staged))
        return staged

    def _alias(self, t: torch.Tensor, output: bool) -> torch.Tensor:
        c = alias(t)
        if c is not t:
            self.needed = True
            if output:
                self.written.append(c)
        return c

    def moved(self, t: torch.Tensor, output: bool = True) -> torch.Tensor:
        """``t`` for an op that only moves its bytes (``output``: the op may write it)."""
        c = self._alias(t, output)
        c = self._dense(c, output)
        if c.dtype in GLOO_DTYPES:
            return c
        twin = _BIT_TWIN.get(c.element_size())
        if twin is None or c.is_complex():
            raise UnsupportedError(f"torch.distributed on {NAME}: cannot move {c.dtype} "
                                   "tensors through gloo")
        return c.view(twin)

    def reduced(self, t: torch.Tensor, op: ReduceOp.RedOpType, output: bool = True
                ) -> torch.Tensor:
        """``t`` for an op that reduces with ``op`` (``output``: the op writes it)."""
        c = self._alias(t, output)
        c = self._dense(c, output)
        if c.dtype in GLOO_DTYPES:
            return c
        if c.dtype == torch.uint64 and op in _SIGN_FREE:
            return c.view(torch.int64)
        wider = _WIDER.get(c.dtype)
        if wider is None:
            raise UnsupportedError(
                f"torch.distributed on {NAME}: gloo cannot reduce {c.dtype} tensors with "
                f"{op} (reductions take {', '.join(sorted(_names(GLOO_DTYPES)))}, and "
                f"{', '.join(sorted(_names(_WIDER)))} through a wider type)")
        self.needed = True
        wide = c.to(wider)
        if output:
            self.after.append(lambda: c.copy_(wide))
        return wide

    def finish(self) -> None:
        for step in self.after:
            step()
        memory.write_back(*self.written)  # on device memory, the results land there


def _names(dtypes) -> list[str]:
    return [str(d).removeprefix("torch.") for d in dtypes]
