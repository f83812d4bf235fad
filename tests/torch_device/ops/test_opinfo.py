"""Conformance: PyTorch's OpInfo sample inputs for every op with a native hologram kernel,
run on the device and compared with the CPU — values for each dtype the op supports,
gradients in float32 and float64.

Each kernel module of :mod:`hologram_torch.aten` lists the OpInfo entries its kernels
serve in ``OPINFO``; a sample that fails here is a kernel bug (never skip it).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import warnings

import pytest

torch = pytest.importorskip("torch")
import hologram_torch  # noqa: E402
import hologram_torch.aten  # noqa: E402

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
          torch.int32, torch.uint8, torch.bool)
GRAD_DTYPES = (torch.float32, torch.float64)
TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.float64: (1e-7, 1e-7),
             torch.float16: (1e-3, 1e-3), torch.bfloat16: (1e-2, 1.6e-2)}
# (OpInfo entry, dtype) -> (atol, rtol), each with its reason.
OVERRIDES = {
    # torch's CPU nll_loss2d adds float16 values in float16, in its own grouping; the
    # kernel here adds in float32 (nearer the exact sum): 4-d sum/mean samples differ by a
    # few float16 steps.
    ("nn.functional.nll_loss", torch.float16): (2e-2, 1e-2),
}
# Entries whose samples each need kernels of their own (a new window, stride, padding and
# dilation is a new program, forward and backward): every 8th sample (16th in 3-d, whose
# programs compile slowest), which still meets every kind of configuration, keeps their
# compiles to a few CI minutes (all samples took ~20 min of CPU).
# tests/torch_device/ops/test_pool_norm.py covers their edge cases one by one.
# Dtypes other than float32 take every 4th of those (float64's gradients too): their
# programs differ from float32's in the element type alone, which a few configurations
# exercise.
EVERY_NTH_SAMPLE = {"nn.functional.max_pool1d": 8, "nn.functional.max_pool2d": 8,
                    "nn.functional.max_pool3d": 16, "max_pool2d_with_indices_backward": 8}
OTHER_DTYPES_FACTOR = 4


def _opinfo_names() -> list[str]:
    names = []
    for info in pkgutil.iter_modules(hologram_torch.aten.__path__):
        module = importlib.import_module(f"hologram_torch.aten.{info.name}")
        names.extend(getattr(module, "OPINFO", ()))
    return sorted(set(names))


def _key(op) -> str:
    return op.name if not op.variant_test_name else f"{op.name}.{op.variant_test_name}"


def _cases():
    # Imported here, after hologram_torch: the database must see the device registered.
    from torch.testing._internal.common_methods_invocations import op_db

    wanted = set(_opinfo_names())
    for op in op_db:
        key = _key(op)
        if key in wanted:
            for dtype in DTYPES:
                if dtype in op.supported_dtypes("cpu"):
                    yield pytest.param(op, dtype, id=f"{key}-{str(dtype)[6:]}")


def _to_device(x):
    if isinstance(x, torch.Tensor):
        d = x.detach().to("hologram")
        return d.requires_grad_(x.requires_grad)
    return x


def _flat_tensors(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _flat_tensors(y)]
    return []


@functools.cache  # the backend is chosen once per process
def _f32_sums() -> bool:
    """Does the device's backend add float32 terms in float32 (webgpu: no float64)? Its
    float32 sums then differ from the CPU's by up to about n u sum|terms| (docs/isa.md,
    "Float sums"), which for sums that cancel is more than the table's tolerance allows
    on the smaller results."""
    from hologram import backends

    return not backends.get(hologram_torch.get_backend()).capabilities().f64


def _close(actual, expected, dtype, what: str, override=None) -> None:
    atol, rtol = override or TOLERANCE.get(dtype, (0, 0))
    if dtype is torch.float32 and not override and _f32_sums() and expected.numel():
        # normwise: 16 u of the largest result (a conv_transpose3d gradient of 500
        # elements up to 239 in size had one of 0.055 off by 2e-5 on lavapipe)
        atol += 2e-6 * float(expected.detach().abs().nan_to_num(0, 0, 0).max())
    torch.testing.assert_close(actual.cpu() if isinstance(actual, torch.Tensor) else actual,
                               expected, atol=atol, rtol=rtol, equal_nan=True,
                               check_device=False, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("op, dtype", list(_cases()))
def test_opinfo(op, dtype):
    grads = dtype in GRAD_DTYPES and op.supports_autograd
    failures, count = [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = list(op.sample_inputs("cpu", dtype, requires_grad=grads))
    step = EVERY_NTH_SAMPLE.get(_key(op), 1)
    if step > 1 and dtype != torch.float32:
        step *= OTHER_DTYPES_FACTOR
    samples = samples[::step]
    for i, sample in enumerate(samples):
        count += 1
        what = f"{op.name} {dtype} sample {i}: {sample}"
        try:
            torch.manual_seed(i)
            expected = op(sample.input, *sample.args, **sample.kwargs)
            device = sample.transform(_to_device)
            torch.manual_seed(i)
            kwargs = dict(device.kwargs)
            if not _flat_tensors([device.input, *device.args]):  # a factory
                kwargs["device"] = "hologram"
            actual = op(device.input, *device.args, **kwargs)
            exact = None
            for j, (a, e) in enumerate(zip(_flat_tensors(actual), _flat_tensors(expected))):
                assert a.device.type == "hologram", f"{what}: result on {a.device}"
                try:
                    _close(a, e, e.dtype, what, OVERRIDES.get((_key(op), dtype)))
                except AssertionError:
                    if dtype not in (torch.float16, torch.bfloat16):
                        raise
                    # PyTorch's CPU adds some half-precision products in half precision
                    # on CPUs without AVX512-FP16 (float16 conv_transpose on an AMD EPYC:
                    # 2 steps off the exact sum): the device's result must then be the
                    # float64 computation's, rounded to the dtype.
                    if exact is None:
                        wide = sample.transform(lambda t: t.detach().double() if isinstance(
                            t, torch.Tensor) and t.is_floating_point() else t)
                        torch.manual_seed(i)
                        exact = _flat_tensors(op(wide.input, *wide.args, **wide.kwargs))
                    _close(a, exact[j].to(e.dtype), e.dtype, f"{what} (float64 reference)")
            if not grads:
                continue
            outs = [(a, e) for a, e in zip(_flat_tensors(actual), _flat_tensors(expected))
                    if e.requires_grad and e.dtype.is_floating_point]
            leaves_e = [t for t in _flat_tensors([sample.input, *sample.args])
                        if t.requires_grad]
            leaves_a = [t for t in _flat_tensors([device.input, *device.args])
                        if t.requires_grad]
            if not outs or not leaves_e:
                continue
            cotangents = [torch.randn_like(e) for _, e in outs]
            ge = torch.autograd.grad([e for _, e in outs], leaves_e, cotangents,
                                     allow_unused=True)
            ga = torch.autograd.grad([a for a, _ in outs], leaves_a,
                                     [c.to("hologram") for c in cotangents],
                                     allow_unused=True)
            for a, e in zip(ga, ge):
                assert (a is None) == (e is None), f"{what}: gradient presence differs"
                if e is not None:
                    _close(a, e, e.dtype, f"{what} (gradient)")
        except Exception as exc:  # collect every failing sample
            message = str(exc)  # the sample's text first, the reason at the end
            if len(message) > 800:
                message = f"{message[:300]} [...] {message[-500:]}"
            failures.append(f"{type(exc).__name__}: {message}")
    assert not failures, f"{len(failures)} of {count} samples failed:\n" + "\n".join(
        failures[:10])
