"""``hologram_torch.functional``: autograd functions whose forward and backward both run
Hologram kernels.

    import torch
    import hologram_torch as hg

    x = torch.randn(32, 128, requires_grad=True)          # CPU or device='hologram'
    y = hg.functional.relu(hg.functional.linear(x, w, b))
    hg.functional.mse_loss(y, target).backward()

Each op accepts the executor-first form of :mod:`hologram.ops` too (``add(exec, a, b)``).
An executor of a host backend (cpu, interp) changes nothing: the tensors' memory is used
in place. An executor of a device backend (webgpu, cuda) runs the op, and its backward,
on that backend: operands are copied to its memory and results back, as CPU tensors (or
hologram tensors, for hologram operands). Operands are CPU tensors, computed on
zero-copy, or hologram tensors; they must all be on one device. Every op is a
:class:`torch.autograd.Function` (checked with ``torch.autograd.gradcheck`` in float64).
"""

from __future__ import annotations

import contextvars
import functools

import torch

from hologram.errors import DeviceError, ShapeError
from hologram.frontend import functional as hf
from hologram.runtime.executor import Executor
from hologram_torch.aten import elementwise as ew
from hologram_torch.aten import runner
from hologram_torch.aten.runner import ISA, cast

__all__ = ["add", "gelu", "linear", "mse_loss", "mul", "relu", "sigmoid", "softmax", "sub",
           "tanh"]


# --- running a builder on the operands' device ------------------------------------------

#: The backend an executor-first call names, when the host cannot see its memory; None:
#: the tensors' own memory, in place.
_BACKEND: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "hologram_torch.functional.backend", default=None)


def _run(name: str, build, tensors: tuple, static: tuple = (), out=None):
    devices = {t.device.type for t in tensors if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        described = ", ".join(f"{list(t.shape)} {t.dtype} on {t.device}"
                              for t in tensors if isinstance(t, torch.Tensor))
        raise DeviceError(f"hologram_torch.functional.{name}: operands on different devices "
                          f"({described}); move them to one device with .to(...)")
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dtype not in ISA:
            raise DeviceError(f"hologram_torch.functional.{name}: dtype {t.dtype} is not "
                              "supported (float32/64, float16, bfloat16, integers, bool); "
                              "convert with .float()")
    backend = _BACKEND.get()
    if backend is None:
        try:
            return runner.run(f"F.{name}", build, tensors, static, out, host="cpu" in devices)
        except runner.Lacking:
            # A dtype the device's backend lacks (f64 on webgpu, counted in
            # fallback_stats()): computed on the host, as the device's own kernels are.
            backend = "cpu"
    result = runner.run_on(backend, f"F.{name}", build, tensors, static)
    if out is None:
        return result
    out[0].copy_(result)
    return out[0]


def _executor_first(op):
    """The op, also in the executor-first form: ``op(executor, *args)`` runs it on the
    executor's backend (see the module docstring)."""
    @functools.wraps(op)
    def call(*args, **kwargs):
        backend = None
        if args and isinstance(args[0], Executor):
            executor, args = args[0], args[1:]
            if executor.closed:
                raise DeviceError(f"hologram_torch.functional.{op.__name__}: the executor "
                                  "is closed")
            if not executor.allocator.host_visible:
                backend = executor.backend
        token = _BACKEND.set(backend)
        try:
            return op(*args, **kwargs)
        finally:
            _BACKEND.reset(token)
    return call


def _on_forward_backend(function):
    """An autograd function whose backward runs on the backend its forward ran on."""
    forward, backward = function.forward, function.backward

    def forward_on(ctx, *args):
        ctx.hologram_backend = _BACKEND.get()
        return forward(ctx, *args)

    def backward_on(ctx, *grads):
        token = _BACKEND.set(ctx.hologram_backend)
        try:
            return backward(ctx, *grads)
        finally:
            _BACKEND.reset(token)

    function.forward, function.backward = staticmethod(forward_on), staticmethod(backward_on)
    return function


def _promoted(name: str, *tensors):
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _as(g, x, dtype):
    return cast(x, ISA[dtype])


def _sum_to(g, grad, shape):
    """``grad`` summed over the dimensions broadcasting added to ``shape``."""
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                      if n == 1 and grad.shape[lead + i] != 1)
    if not axes:
        return grad
    return g.sum(grad, axes, keepdim=False).reshape(*shape) if shape else g.sum(grad, axes)


def _neg(g, x):
    return -x


def _reduce_grad(grad: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    return _run("sum_to", lambda g, x, s, d: _as(g, _sum_to(g, x, s), d), (grad,),
                (tuple(shape), dtype))


# --- elementwise arithmetic -------------------------------------------------------------

_ARITH = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}


def _binary_build(g, a, b, op, dtype):
    return _ARITH[op](_as(g, a, dtype), _as(g, b, dtype))


def _scaled_build(g, grad, other, dtype):
    return _as(g, grad, dtype) * _as(g, other, dtype)


@_on_forward_backend
class _Binary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, a, b):
        dtype = _promoted(op, a, b)
        ctx.op, ctx.shapes, ctx.dtypes = op, (a.shape, b.shape), (a.dtype, b.dtype)
        if op == "mul":
            ctx.save_for_backward(a, b)
        return _run(op, _binary_build, (a, b), (op, dtype))

    @staticmethod
    def backward(ctx, grad):
        (sa, sb), (da, db) = ctx.shapes, ctx.dtypes
        if ctx.op == "mul":
            a, b = ctx.saved_tensors
            ga = _run("mul_grad", _scaled_build, (grad, b), (grad.dtype,))
            gb = _run("mul_grad", _scaled_build, (grad, a), (grad.dtype,))
        else:
            ga = grad
            gb = grad if ctx.op == "add" else _run("neg", _neg, (grad,))
        ga = _reduce_grad(ga, sa, da) if ctx.needs_input_grad[1] else None
        gb = _reduce_grad(gb, sb, db) if ctx.needs_input_grad[2] else None
        return None, ga, gb


@_executor_first
def add(a, b):
    """``a + b`` (broadcasting, torch's promotion of the two dtypes)."""
    return _Binary.apply("add", a, b)


@_executor_first
def sub(a, b):
    """``a - b``."""
    return _Binary.apply("sub", a, b)


@_executor_first
def mul(a, b):
    """``a * b``."""
    return _Binary.apply("mul", a, b)


# --- activations ------------------------------------------------------------------------

def _float_only(name: str, x: torch.Tensor) -> None:
    if not x.dtype.is_floating_point:
        raise DeviceError(f"hologram_torch.functional.{name}: needs a floating-point tensor, "
                          f"got {x.dtype} {list(x.shape)}; convert with .float()")


# The math is the device kernels' (hologram_torch.aten.elementwise); gradients come from
# the saved output y (relu, sigmoid, tanh) or the input x (gelu).
_ACTIVATION = {
    "relu": ew._relu,
    "sigmoid": lambda g, x: g.unary("sigmoid", x),
    "tanh": lambda g, x: g.unary("tanh", x),
}
_GRADIENT = {
    "relu": lambda g, grad, y: g.where(g.binary("gt", y, 0.0), grad, 0.0),
    "sigmoid": ew._sigmoid_backward,
    "tanh": ew._tanh_backward,
}


def _activation_build(g, x, name):
    compute = runner.opmath(x.dtype)
    return cast(_ACTIVATION[name](g, cast(x, compute)), x.dtype)


def _gradient_build(g, grad, saved, name):
    compute = runner.opmath(grad.dtype)
    return cast(_GRADIENT[name](g, cast(grad, compute), cast(saved, compute)), grad.dtype)


@_on_forward_backend
class _Activation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, x, inplace):
        ctx.name = name
        if inplace:
            ctx.mark_dirty(x)
            y = _run(name, _activation_build, (x,), (name,), out=(x,))
        else:
            y = _run(name, _activation_build, (x,), (name,))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return None, _run(f"{ctx.name}_grad", _gradient_build, (grad, y), (ctx.name,)), None


@_executor_first
def relu(x, inplace: bool = False):
    """``max(x, 0)`` (NaN and -0.0 kept, as torch); ``inplace`` overwrites ``x``."""
    _float_only("relu", x)
    return _Activation.apply("relu", x, inplace)


@_executor_first
def sigmoid(x):
    _float_only("sigmoid", x)
    return _Activation.apply("sigmoid", x, False)


@_executor_first
def tanh(x):
    _float_only("tanh", x)
    return _Activation.apply("tanh", x, False)


def _gelu_build(g, x, approximate):
    compute = runner.opmath(x.dtype)
    return cast(hf.gelu(cast(x, compute), approximate), x.dtype)


def _gelu_grad_build(g, grad, x, approximate):
    compute = runner.opmath(grad.dtype)
    return cast(ew._gelu_backward(g, cast(grad, compute), cast(x, compute), approximate),
                grad.dtype)


@_on_forward_backend
class _Gelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, approximate):
        ctx.approximate = approximate
        ctx.save_for_backward(x)
        return _run("gelu", _gelu_build, (x,), (approximate,))

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return _run("gelu_grad", _gelu_grad_build, (grad, x), (ctx.approximate,)), None


@_executor_first
def gelu(x, approximate: str = "none"):
    """``x Φ(x)``, exact (``"none"``) or with the tanh approximation."""
    _float_only("gelu", x)
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _Gelu.apply(x, approximate)


def _softmax_build(g, x, dim):
    compute = runner.opmath(x.dtype)
    return cast(hf.softmax(cast(x, compute), dim), x.dtype)


def _softmax_grad_build(g, grad, y, dim):
    compute = runner.opmath(grad.dtype)
    grad, y = cast(grad, compute), cast(y, compute)
    return y * (grad - g.sum(grad * y, dim, keepdim=True))


@_on_forward_backend
class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        y = _run("softmax", _softmax_build, (x,), (dim,))
        ctx.dim = dim
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return _run("softmax_grad", _softmax_grad_build, (grad, y), (ctx.dim,)), None


@_executor_first
def softmax(*args, dim: int | None = None):
    """Softmax along ``dim``; ``dim=None`` picks torch's legacy implicit dimension (0 for
    0-, 1- and 3-d inputs, else 1)."""
    x, dim = (args[0], args[1] if len(args) > 1 else dim)
    _float_only("softmax", x)
    if dim is None:
        dim = 0 if x.dim() in (0, 1, 3) else 1
    if x.dim() == 0:
        return _Softmax.apply(x.reshape(1), 0).reshape(())
    if not -x.dim() <= dim < x.dim():
        raise ShapeError(f"softmax: dim {dim} out of range for shape {list(x.shape)}")
    return _Softmax.apply(x, dim % x.dim())


# --- linear -----------------------------------------------------------------------------

def _linear_build(g, x, w, *bias):
    compute = runner.opmath(x.dtype)
    y = cast(x, compute) @ cast(w, compute).T
    if bias:
        y = y + cast(bias[0], compute)
    return cast(y, x.dtype)


def _matmul_build(g, a, b, transpose_a, transpose_b):
    a = a.T if transpose_a else a
    b = b.T if transpose_b else b
    return cast(cast(a, runner.opmath(a.dtype)) @ cast(b, runner.opmath(b.dtype)), a.dtype)


@_on_forward_backend
class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _run("linear", _linear_build, (x, weight) + ((bias,) if ctx.has_bias else ()))

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        features = weight.shape[1]
        g2 = grad.reshape(-1, weight.shape[0])
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _run("matmul", _matmul_build, (g2, weight), (False, False)).reshape(x.shape)
        if ctx.needs_input_grad[1]:
            gw = _run("matmul", _matmul_build, (g2, x.reshape(-1, features)), (True, False))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = _run("sum_rows", lambda g, t: g.sum(t, 0), (g2,))
        return gx, gw, gb


@_executor_first
def linear(*args, bias: torch.Tensor | None = None):
    """``x @ weight.T + bias`` for ``x [..., in]``, ``weight [out, in]``, ``bias [out]``."""
    x, weight = args[:2]
    bias = args[2] if len(args) > 2 else bias
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1] or (
            bias is not None and tuple(bias.shape) not in ((weight.shape[0],), ())):
        raise ShapeError(f"linear: input {list(x.shape)}, weight {list(weight.shape)} and "
                         f"bias {None if bias is None else list(bias.shape)} do not fit "
                         "(x [..., in], weight [out, in], bias [out])")
    return _Linear.apply(x, weight, bias)


# --- losses -----------------------------------------------------------------------------

def _mse_build(g, x, t, reduction):
    compute = runner.opmath(x.dtype)
    return cast(hf.mse_loss(cast(x, compute), cast(t, compute), reduction), x.dtype)


def _mse_grad_build(g, grad, x, t, scale):
    compute = runner.opmath(x.dtype)
    d = cast(x, compute) - cast(t, compute)
    return cast(d * cast(grad, compute) * scale, x.dtype)


@_on_forward_backend
class _MSELoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, target, reduction):
        ctx.save_for_backward(x, target)
        ctx.scale = 2.0 / max(x.numel(), 1) if reduction == "mean" else 2.0
        return _run("mse_loss", _mse_build, (x, target), (reduction,))

    @staticmethod
    def backward(ctx, grad):
        x, target = ctx.saved_tensors
        gx = _run("mse_grad", _mse_grad_build, (grad, x, target), (ctx.scale,))
        gt = _run("neg", _neg, (gx,)) if ctx.needs_input_grad[1] else None
        return gx, gt, None


@_executor_first
def mse_loss(*args, reduction: str = "mean"):
    """Mean squared error with ``reduction`` ``"mean"``, ``"sum"`` or ``"none"``."""
    x, target = args[:2]
    reduction = args[2] if len(args) > 2 else reduction
    if reduction not in hf.REDUCTIONS:
        raise ValueError(f"mse_loss: reduction must be one of {hf.REDUCTIONS}, got "
                         f"{reduction!r}")
    if x.shape != target.shape:
        raise ShapeError(f"mse_loss: input {list(x.shape)} and target "
                         f"{list(target.shape)} differ; pass tensors of one shape")
    return _MSELoss.apply(x, target, reduction)
