"""``torch.autocast('hologram')``: PyTorch's CPU autocast policy on the device.

    with torch.autocast("hologram", dtype=torch.bfloat16):
        y = model(x)            # products in bfloat16, losses and norms-like ops in float32

Inside an autocast region every op of PyTorch's CPU lists (``aten/src/ATen/autocast_mode.cpp``)
gets an ``AutocastPrivateUse1`` kernel that casts its floating-point ``hologram`` tensor
arguments as the CPU kernel casts CPU ones, then runs the op with autocast off for it:

* :data:`LOWER_PRECISION` (convolutions, ``mm``/``bmm``/``matmul``/``linear`` and the
  ``addmm`` family, ``prelu``, attention): float16/bfloat16/float32 arguments cast to the
  region's dtype;
* :data:`PROMOTE` (``cat``, ``stack``, ``index_copy``): to float32 if an argument is
  float32, else to the region's dtype (another half type raises, as on the CPU);
* every other op on the list (losses, ``prod``, 3-d pools, paddings, linear algebra,
  FFTs, ...): low-precision arguments cast to float32.

Ops on no list run as they are (the fallthrough :mod:`hologram_torch.compat` installs), so
elementwise ops follow their inputs' dtypes. float64 arguments are never cast. As in
PyTorch (``at::autocast::cached_cast``), the low-precision copy of a float32 leaf tensor
that requires grad (a weight) is kept for the rest of the region (unless
``cache_enabled=False``) and dropped when the outermost region exits; unlike PyTorch's,
a copy is made again if the weight was written in place since.
"""

from __future__ import annotations

import functools
import math
import threading
import weakref

import torch

from hologram_torch.aten import runner
from hologram_torch.aten.runner import cast, opmath

__all__ = ["CPU_POLICY_OPS", "LOWER_PRECISION", "PROMOTE", "install", "policy"]

#: Every op PyTorch's CPU autocast has a kernel for (torch 2.13; listed, as scanning the
#: dispatcher for them costs ~30 ms of every import: tests/torch_device/device/test_autocast.py
#: checks the list against the installed PyTorch).
CPU_POLICY_OPS = (
    "aten::_addmm_activation", "aten::_convolution.deprecated",
    "aten::_grid_sampler_2d_cpu_fallback", "aten::_lu_with_info",
    "aten::_native_multi_head_attention", "aten::adaptive_avg_pool3d",
    "aten::adaptive_max_pool3d", "aten::addbmm", "aten::addmm", "aten::avg_pool3d",
    "aten::baddbmm", "aten::binary_cross_entropy",
    "aten::binary_cross_entropy_with_logits", "aten::bmm", "aten::cat", "aten::cdist",
    "aten::cholesky", "aten::cholesky_inverse", "aten::cholesky_solve", "aten::conv1d",
    "aten::conv1d.padding", "aten::conv2d", "aten::conv2d.padding", "aten::conv3d",
    "aten::conv3d.padding", "aten::conv_tbc", "aten::conv_transpose1d",
    "aten::conv_transpose2d.input", "aten::conv_transpose3d.input",
    "aten::cosine_embedding_loss", "aten::cross_entropy_loss", "aten::ctc_loss.IntList",
    "aten::ctc_loss.Tensor", "aten::fake_quantize_per_tensor_affine", "aten::fft_fft",
    "aten::fft_fft2", "aten::fft_fftn", "aten::fft_hfft", "aten::fft_ifft",
    "aten::fft_ifft2", "aten::fft_ifftn", "aten::fft_ihfft", "aten::fft_irfft",
    "aten::fft_irfft2", "aten::fft_irfftn", "aten::fft_rfft", "aten::fft_rfft2",
    "aten::fft_rfftn", "aten::fractional_max_pool2d", "aten::fractional_max_pool3d",
    "aten::geqrf", "aten::grid_sampler", "aten::grid_sampler_2d",
    "aten::grid_sampler_3d", "aten::hinge_embedding_loss", "aten::huber_loss",
    "aten::index_copy", "aten::inverse", "aten::kl_div", "aten::l1_loss",
    "aten::linalg_cholesky", "aten::linalg_cholesky_ex", "aten::linalg_cond",
    "aten::linalg_cond.p_str", "aten::linalg_eig", "aten::linalg_eigh",
    "aten::linalg_eigvals", "aten::linalg_eigvalsh", "aten::linalg_householder_product",
    "aten::linalg_inv", "aten::linalg_inv_ex", "aten::linalg_lstsq",
    "aten::linalg_matrix_rank", "aten::linalg_matrix_rank.atol_rtol_float",
    "aten::linalg_matrix_rank.atol_rtol_tensor", "aten::linalg_matrix_rank.tol_tensor",
    "aten::linalg_qr", "aten::linalg_solve", "aten::linalg_svd", "aten::linalg_svdvals",
    "aten::linalg_tensorinv", "aten::linalg_tensorsolve", "aten::linalg_vecdot",
    "aten::linear", "aten::lu_solve", "aten::margin_ranking_loss", "aten::matmul",
    "aten::max_pool3d", "aten::max_unpool2d", "aten::max_unpool3d",
    "aten::mkldnn_rnn_layer", "aten::mm", "aten::mse_loss", "aten::multi_margin_loss",
    "aten::multilabel_margin_loss", "aten::multilabel_margin_loss_forward",
    "aten::nanquantile", "aten::nanquantile.scalar", "aten::nll_loss",
    "aten::nll_loss2d", "aten::orgqr", "aten::ormqr", "aten::pinverse",
    "aten::poisson_nll_loss", "aten::polar", "aten::prelu", "aten::prod",
    "aten::prod.dim_int", "aten::qr", "aten::quantile", "aten::quantile.scalar",
    "aten::reflection_pad1d", "aten::reflection_pad2d", "aten::replication_pad1d",
    "aten::replication_pad2d", "aten::replication_pad3d",
    "aten::scaled_dot_product_attention", "aten::smooth_l1_loss",
    "aten::soft_margin_loss", "aten::stack", "aten::stft", "aten::stft.center",
    "aten::svd", "aten::trace", "aten::triangular_solve", "aten::triplet_margin_loss",
    "aten::view_as_complex",
)
#: Ops computed in the region's low dtype (PyTorch's CPU ``lower_precision_fp`` list).
LOWER_PRECISION = frozenset({
    "aten::conv1d", "aten::conv1d.padding", "aten::conv2d", "aten::conv2d.padding",
    "aten::conv3d", "aten::conv3d.padding", "aten::bmm", "aten::mm", "aten::linalg_vecdot",
    "aten::baddbmm", "aten::addmm", "aten::addbmm", "aten::linear",
    "aten::_convolution.deprecated", "aten::matmul", "aten::conv_tbc",
    "aten::mkldnn_rnn_layer", "aten::conv_transpose1d", "aten::conv_transpose2d.input",
    "aten::conv_transpose3d.input", "aten::prelu", "aten::scaled_dot_product_attention",
    "aten::_native_multi_head_attention", "aten::_addmm_activation",
})
#: Ops whose floating arguments are cast to the widest of their dtypes.
PROMOTE = frozenset({"aten::cat", "aten::stack", "aten::index_copy"})

_DEVICE = "hologram"
_KEY = "AutocastPrivateUse1"
_libraries: list[torch.library.Library] = []
# This thread's kept low-precision copies, as PyTorch's cache is per thread: (id of the
# weight, dtype) -> (the weight, weakly; its version; the copy).
_kept = threading.local()


def policy(name: str) -> str:
    """``"lower_precision"``, ``"promote"`` or ``"fp32"`` for an op with a CPU autocast
    kernel (``"aten::mm"``, ``"aten::conv2d.padding"``)."""
    if name in LOWER_PRECISION:
        return "lower_precision"
    if name in PROMOTE:
        return "promote"
    return "fp32"


def cpu_autocast_ops() -> list[str]:
    """Every op PyTorch's CPU autocast has a kernel for, as ``"aten::name.overload"``."""
    return sorted(name for name in torch._C._dispatch_get_all_op_names()
                  if torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastCPU"))


def _eligible(x) -> bool:
    return (isinstance(x, torch.Tensor) and x.is_floating_point()
            and x.dtype is not torch.float64 and x.device.type == _DEVICE)


def _map(fn, value):
    """``fn`` applied to every tensor in ``value`` (tensors, lists and tuples of them)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map(fn, v) for v in value)
    return value


def _promoted(values, current: torch.dtype) -> torch.dtype:
    """The dtype a promote op casts to, as ``at::autocast::prioritize`` picks it: float32
    if any argument is float32, else the region's dtype; another half type is an error
    (float64 arguments are ignored)."""
    for v in values:
        if isinstance(v, (list, tuple)):
            current = _promoted(v, current)
        elif _eligible(v):
            low = torch.get_autocast_dtype(_DEVICE)
            if current is torch.float32 or v.dtype is torch.float32:
                current = torch.float32
            elif not (current is low and v.dtype is low):
                raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")
    return current


def _kernel(op, kind: str):
    exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

    def run(*args, **kwargs):
        if kind == "lower_precision":
            target = torch.get_autocast_dtype(_DEVICE)
        elif kind == "fp32":
            target = torch.float32
        else:
            target = _promoted((*args, *kwargs.values()), torch.get_autocast_dtype(_DEVICE))

        def cast(t):
            return _cast(t, target) if target is not None and _eligible(t) and (
                kind != "fp32" or t.dtype in (torch.float16, torch.bfloat16)) else t

        args = _map(cast, args)
        kwargs = {k: _map(cast, v) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(exclude):
            return op(*args, **kwargs)

    return run


def _cast(t: torch.Tensor, target: torch.dtype) -> torch.Tensor:
    """``t.to(target)``; for a weight cast to the region's low dtype, the copy kept since
    its first cast in the region (PyTorch's conditions: a float32 leaf that requires grad
    and is no view, with the autocast cache enabled)."""
    if t.dtype is target:
        return t
    if not (t.dtype is torch.float32 and target is torch.get_autocast_dtype(_DEVICE)
            and t.requires_grad and t.is_leaf and not t._is_view()
            and torch.is_autocast_cache_enabled()):
        return t.to(target)
    kept = _kept.__dict__.setdefault("casts", {})
    key = (id(t), target)
    entry = kept.get(key)
    if entry is not None and entry[0]() is t and entry[1] == t._version:
        return entry[2]
    copy = t.to(target)
    kept[key] = (weakref.ref(t), t._version, copy)
    return copy


def _clear_kept(clear):
    """``torch.clear_autocast_cache`` (which ``torch.autocast`` calls when its outermost
    region exits) clearing this thread's kept copies too."""
    @functools.wraps(clear)
    def clear_both() -> None:
        _kept.__dict__.pop("casts", None)
        clear()

    clear_both.hologram = True
    return clear_both


def _overload(name: str):
    """The OpOverload of ``"aten::name.overload"``."""
    qualified, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, qualified.split("::")[1])
    return getattr(packet, overload or "default")


@functools.cache
def install() -> None:
    """Register the policy's kernels for every op PyTorch's CPU autocast has one for
    (once per process)."""
    library = torch.library.Library("aten", "IMPL")
    for name in CPU_POLICY_OPS:
        op = _overload(name)
        library.impl(op, _kernel(op, policy(name)), _KEY)
    _libraries.append(library)
    if not getattr(torch.clear_autocast_cache, "hologram", False):
        torch.clear_autocast_cache = _clear_kept(torch.clear_autocast_cache)


# --- GradScaler's ops as device programs ----------------------------------------------

def _unscale_build(g, *args):
    """Every gradient times ``inv_scale``, and ``found_inf`` raised to 1 if any element
    of any gradient is NaN or infinite (checked before scaling, as PyTorch does)."""
    *grads, found, inv = args
    compute = [opmath(x.dtype) for x in grads]
    scaled = [cast(cast(x, c) * cast(inv, c), x.dtype) for x, c in zip(grads, compute)]
    flag = cast(found, found.dtype)
    for x in grads:
        if not math.prod(x.shape):
            continue
        diff = x - x  # NaN exactly where x is NaN or infinite
        bad = g.reduce("max", g.cast(g.binary("ne", diff, diff), found.dtype))
        flag = g.maximum(flag, bad)
    return (*scaled, flag)


def _amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale):
    for x in grads:
        if x.device.type != _DEVICE or not x.is_floating_point():
            raise RuntimeError("_amp_foreach_non_finite_check_and_unscale_: expects float "
                               f"tensors on {_DEVICE}, got {x.dtype} on {x.device}")
    if grads:
        runner.run("amp_unscale", _unscale_build, (*grads, found_inf, inv_scale),
                    out=(*grads, found_inf))


def _update_build(g, scale, tracker, found, growth, backoff, interval):
    """GradScaler's update (``aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp``)."""
    f = scale.dtype
    skipped = g.binary("ne", found, g.cast(g.arange(1) * 0, found.dtype).reshape())
    successful = tracker + 1
    grows = g.binary("eq", g.cast(successful, "i64"), interval)
    grown = scale * g.cast(growth, f)
    finite = g.binary("eq", grown - grown, grown - grown)  # not NaN nor infinite
    kept = g.where(g.binary("and", grows, finite), grown, scale)
    new_scale = g.where(skipped, scale * g.cast(backoff, f), kept)
    zero = successful * 0
    new_tracker = g.where(skipped, zero, g.where(grows, zero, successful))
    return new_scale, new_tracker


def _amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                       growth_interval):
    runner.run("amp_update_scale", _update_build,
                (scale, growth_tracker, found_inf, float(growth_factor),
                 float(backoff_factor), int(growth_interval)),
                out=(scale, growth_tracker))
    return scale


def _install_scaler_ops() -> None:
    library = torch.library.Library("aten", "IMPL")
    library.impl("_amp_foreach_non_finite_check_and_unscale_",
                 _amp_foreach_non_finite_check_and_unscale_, "PrivateUse1")
    library.impl("_amp_update_scale_", _amp_update_scale_, "PrivateUse1")
    _libraries.append(library)


install()
_install_scaler_ops()
