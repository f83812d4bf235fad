"""Random numbers and ``arange``.

The Python device interface cannot give the device its own generator, so random ops draw
from torch's CPU generator, *directly into device memory* (a CPU view aliasing it): the
same seed gives the same numbers as on the CPU, ``torch.manual_seed`` reproduces runs, and
no copy is made. ``arange`` is a Hologram program (the math of
:func:`hologram_torch.lowering.shape.arange`).
"""

from __future__ import annotations

import torch

from hologram_torch import memory
from hologram_torch.aten import runner
from hologram_torch.aten.registry import impl, native_or_cpu, overload
from hologram_torch.aten.runner import ISA
from hologram_torch.fallback import cpu_view
from hologram_torch.lowering.shape import arange_math

OPINFO = ("arange",)

_IN_PLACE = ("normal_", "uniform_", "bernoulli_.float", "bernoulli_.Tensor", "random_",
             "random_.from", "random_.to", "exponential_", "geometric_", "log_normal_",
             "cauchy_")


def _drawn_on_host(name: str) -> None:
    op = overload(name)

    def kernel(self, *args, **kwargs):
        args = [cpu_view(a) if isinstance(a, torch.Tensor) and not a.is_cpu else a
                for a in args]
        if self.numel():
            alias = cpu_view(self)
            op(alias, *args, **kwargs)
            memory.write_back(alias)
        return self

    impl(name)(kernel)


for _name in _IN_PLACE:
    _drawn_on_host(_name)


def _arange(g, start, step, n, compute):
    # start and step are runtime values: new bounds of the same length never recompile
    return arange_math(g, start, step, n, compute)


@native_or_cpu("arange.start_out")
def arange_out(start, end, step=1, *, out):
    if out.dtype not in ISA or out.dtype is torch.bool:
        return NotImplemented
    # torch's length rule, computed on the CPU for identical rounding and errors
    n = torch.arange(start, end, step, dtype=out.dtype, device="meta").numel()
    if tuple(out.shape) != (n,):
        out.resize_(n)
    if n:
        # (in f64, as the CPU does; in f32 where the backend lacks f64, as CUDA does)
        compute = (runner.NUMBER_TYPES[float] if out.dtype.is_floating_point
                   else ISA[torch.int64])
        runner.run("arange", _arange, (start, step), (n, compute), out=(out,))
    return out
