"""``linspace``, ``logspace``, ``eye`` (their ``out=`` kernels, which the functional forms
and the tensor-bound overloads reach) and ``flip``, ``roll`` on the device; the math is
:mod:`hologram_torch.lowering.generate` (``linspace`` bit for bit as torch's CPU kernel).

Bounds are runtime values (new bounds of the same length never recompile); the length,
dtype and result shape are part of the kernel's key. Arguments torch rejects or converts
with an error (negative lengths, a bound out of the dtype's range, complex bounds or
dtypes, bool results) run through the CPU fallback, which raises PyTorch's own error.
"""

from __future__ import annotations

import torch

from hologram_torch.aten import from_table, runner
from hologram_torch.aten.registry import native_or_cpu
from hologram_torch.aten.runner import ISA
from hologram_torch.lowering.generate import eye_math, linspace_math, logspace_math

# (the ``tensor_overload`` entries pass CPU 0-d bounds with ``device="cpu"``: their results
# are CPU tensors; tests/torch_device/ops/test_generate.py runs the tensor overloads on the device)
OPINFO = ("flip", "fliplr", "flipud", "roll", "rot90", "linspace", "logspace", "eye")

#: logspace's native dtypes (see :func:`logspace_math`)
_LOGSPACE = (torch.float32, torch.float16, torch.bfloat16)

from_table.register("flip")
from_table.register("roll")


def _real(*numbers) -> bool:
    return all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers)


def _fits(dtype: torch.dtype, *numbers) -> bool:
    """Do the bounds convert to ``dtype`` as torch converts a Scalar (no overflow)?"""
    try:
        for x in numbers:
            torch.full((), x, dtype=dtype)
    except RuntimeError:
        return False
    return True


def _prepare(out: torch.Tensor, steps: int, *bounds) -> bool:
    """Resize ``out`` as torch does (only when its element count differs); False where the
    CPU kernel must run (it raises, or the dtype is not native)."""
    if (out.dtype not in ISA or out.dtype is torch.bool or not _real(*bounds)
            or not isinstance(steps, int) or steps < 0 or not _fits(out.dtype, *bounds[:2])):
        return False
    if out.numel() != steps:
        out.resize_((steps,))
    return True


def _linspace(g, start, end, steps, dtype, shape):
    return linspace_math(g, start, end, steps, dtype).reshape(*shape)


def _logspace(g, start, end, base, steps, dtype, shape):
    return logspace_math(g, start, end, steps, base, dtype).reshape(*shape)


def _eye(g, n, m, dtype):
    return eye_math(g, n, m, dtype)


@native_or_cpu("linspace.out")
def linspace_out(start, end, steps, *, out):
    if not _prepare(out, steps, start, end):
        return NotImplemented
    if steps:
        runner.run("linspace", _linspace, (start, end),
                    (steps, ISA[out.dtype], tuple(out.shape)), out=(out,))
    return out


@native_or_cpu("logspace.out")
def logspace_out(start, end, steps, base=10.0, *, out):
    if out.dtype not in _LOGSPACE or not _prepare(out, steps, start, end, base):
        return NotImplemented
    if steps:
        runner.run("logspace", _logspace, (start, end, float(base)),
                    (steps, ISA[out.dtype], tuple(out.shape)), out=(out,))
    return out


@native_or_cpu("eye.m_out")
def eye_m_out(n, m, *, out):
    if out.dtype not in ISA or n < 0 or m < 0:
        return NotImplemented
    out.resize_((n, m))
    if n and m:
        runner.run("eye", _eye, (), (int(n), int(m), ISA[out.dtype]), out=(out,))
    return out


@native_or_cpu("eye.out")
def eye_out(n, *, out):
    return eye_m_out(n, n, out=out)
