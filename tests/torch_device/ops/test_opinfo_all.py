"""Conformance over PyTorch's whole OpInfo database: every entry of ``op_db`` runs on the
device (natively or through the CPU fallback) and is compared with the CPU — values in
float32 and in one integer dtype (int64, else int32) where the CPU supports them,
gradients in float32 where the op supports autograd.

Samples are made on the device, as PyTorch's device-generic tests make them (an entry
that wants an operand on the CPU, such as ``tensor_split``'s indices, keeps it there), and
the reference runs on CPU copies of them. A sample the CPU rejects must be rejected on the
device with the same exception type. To fit the CI budget only the first
``SAMPLES`` samples of each (entry, dtype) run, made from a fixed seed.
``tests/torch_device/ops/test_opinfo.py`` runs every sample of the entries with native kernels.

The only entries left out are in ``EXCLUDED``, each with its reason.
"""

from __future__ import annotations

import itertools
import warnings

import pytest

torch = pytest.importorskip("torch")
from torch.utils._pytree import tree_flatten  # noqa: E402

import hologram_torch  # noqa: E402, F401  (registers the device)

SAMPLES = 3
# torch's usual tolerances for float32 kernels; other dtypes: assert_close's defaults
TOLERANCE = {torch.float32: (1e-5, 1e-4)}
# Entry -> (atol, rtol) for its float32 gradients, each with its reason.
GRADIENT_TOLERANCE = {
    # normalizing over a dimension of size 1 (a sample): the exact gradient is 0, a
    # cancellation of terms ~1/|x| (up to ~80 here) that float32 leaves at ~1e-5
    "nn.functional.normalize": (1e-4, 1e-4),
}
# Entry -> why it cannot be compared with the CPU.
EXCLUDED: dict[str, str] = {}
# Entries whose results are uninitialized memory: only their metadata is compared.
UNINITIALIZED = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                 "new_empty_strided"}
# Entries the device rejects by design, with the error it raises (docs/torch.md).
UNSUPPORTED = {
    "to_sparse": (NotImplementedError, "sparse tensors are not supported"),
    "sparse.mm.reduce": (NotImplementedError, "sparse tensors are not supported"),
    "sparse.sampled_addmm": (NotImplementedError, "sparse tensors are not supported"),
}


def _key(op) -> str:
    return op.name if not op.variant_test_name else f"{op.name}.{op.variant_test_name}"


def _int_dtype(op):
    supported = op.supported_dtypes("cpu")
    return next((d for d in (torch.int64, torch.int32) if d in supported), None)


def _op_db():
    # Imported here, after hologram_torch: the database must see the device registered.
    from torch.testing._internal.common_methods_invocations import op_db
    return op_db


def cases() -> list:
    """(entry, dtype) pairs: float32 and the entry's integer dtype, where the CPU has them."""
    params = []
    for op in _op_db():
        key = _key(op)
        for dtype in (torch.float32, _int_dtype(op)):
            if dtype is None or dtype not in op.supported_dtypes("cpu"):
                continue
            marks = [pytest.mark.skip(reason=EXCLUDED[key])] if key in EXCLUDED else []
            params.append(pytest.param(op, dtype, id=f"{key}-{str(dtype)[6:]}", marks=marks))
    return params


def _to_cpu(x):
    """A CPU copy of a device tensor with the same layout over a copy of its whole storage
    (samples may be views reaching outside their own elements, as ``as_strided``'s)."""
    if not isinstance(x, torch.Tensor) or x.device.type != "hologram":
        return x
    if x.is_conj() or x.is_neg() or x.layout is not torch.strided:
        cpu = x.detach().cpu()
    else:
        storage = torch.UntypedStorage(x.untyped_storage().nbytes())
        storage.copy_(x.untyped_storage())
        cpu = torch.empty(0, dtype=x.dtype).set_(storage, x.storage_offset(), x.shape,
                                                  x.stride())
    return cpu.requires_grad_(x.requires_grad)


def _tensors(x) -> list[torch.Tensor]:
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def _compare(actual, expected, what: str, values: bool = True, tolerance=None,
             device: str = "hologram") -> None:
    a_leaves, a_spec = tree_flatten(actual)
    e_leaves, e_spec = tree_flatten(expected)
    assert len(a_leaves) == len(e_leaves), f"{what}: {a_spec} results, expected {e_spec}"
    for a, e in zip(a_leaves, e_leaves):
        if not isinstance(e, torch.Tensor):
            assert a == e or (a != a and e != e), f"{what}: {a!r} != {e!r}"
            continue
        assert isinstance(a, torch.Tensor), f"{what}: {type(a).__name__}, expected a tensor"
        assert a.device.type == device, f"{what}: result on {a.device}"
        if values is False:
            assert (a.shape, a.dtype, a.stride()) == (e.shape, e.dtype, e.stride()), what
            continue
        atol, rtol = tolerance or TOLERANCE.get(e.dtype, (None, None))
        torch.testing.assert_close(a.cpu() if a.device.type == "hologram" else a, e,
                                   atol=atol, rtol=rtol, equal_nan=True, check_device=False,
                                   check_layout=False, msg=lambda m: f"{what}: {m}")


def run_sample(op, sample, grads: bool, seed: int, what: str) -> None:
    """Run ``sample`` (made on the device) on the device and on CPU copies; raise
    AssertionError (or the device's exception) where they differ."""
    reference = sample.transform(_to_cpu)
    torch.manual_seed(seed)
    try:
        expected = op(reference.input, *reference.args, **reference.kwargs)
    except Exception as exc:  # the CPU rejects the sample: the device must too
        torch.manual_seed(seed)
        try:
            op(sample.input, *sample.args, **sample.kwargs)
        except type(exc):
            return
        raise AssertionError(f"{what}: the CPU raises {type(exc).__name__} ({exc}), the "
                             "device does not") from None
    torch.manual_seed(seed)
    actual = op(sample.input, *sample.args, **sample.kwargs)
    # a sample naming a device (zeros_like(x, device="cpu")) puts its result there
    _compare(actual, expected, what, _key(op) not in UNINITIALIZED,
             device=torch.device(sample.kwargs.get("device", "hologram")).type)
    if not grads:
        return
    pairs = [(a, e) for a, e in zip(_tensors(actual), _tensors(expected))
             if e.requires_grad and e.dtype.is_floating_point]
    leaves_e = [t for t in _tensors([reference.input, reference.args, reference.kwargs])
                if t.requires_grad]
    leaves_a = [t for t in _tensors([sample.input, sample.args, sample.kwargs])
                if t.requires_grad]
    if not pairs or not leaves_e:
        return
    cotangents = [torch.randn_like(e) for _, e in pairs]
    ge = torch.autograd.grad([e for _, e in pairs], leaves_e, cotangents, allow_unused=True)
    ga = torch.autograd.grad([a for a, _ in pairs], leaves_a,
                             [c.to(a.device) for c, (a, _) in zip(cotangents, pairs)],
                             allow_unused=True)
    for a, e in zip(ga, ge):
        assert (a is None) == (e is None), f"{what} (gradient): presence differs"
        if e is not None:
            _compare(a, e, f"{what} (gradient)", tolerance=GRADIENT_TOLERANCE.get(_key(op)))


def _samples(op, dtype, grads: bool):
    """The entry's sample inputs on the device. (``op.sample_inputs`` wraps them in an
    iterator that walks the call stack for every sample, to find a unittest method to
    report to: two thirds of this file's time under pytest.)"""
    return op.sample_inputs_func(op, "hologram", dtype, grads)


def run_unsupported(op, dtype) -> None:
    """Make the entry's first sample on the device and run it (for :data:`UNSUPPORTED`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sample = next(iter(_samples(op, dtype, False)))
        op(sample.input, *sample.args, **sample.kwargs)


def run_case(op, dtype) -> tuple[int, list[str]]:
    """Every chosen sample of (entry, dtype): (samples run, failure messages)."""
    grads = dtype is torch.float32 and op.supports_autograd
    failures, count = [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        try:
            samples = list(itertools.islice(_samples(op, dtype, grads), SAMPLES))
        except Exception as exc:  # making samples on the device is part of the test
            return 1, [f"sample inputs: {type(exc).__name__}: {str(exc)[:400]}"]
        for i, sample in enumerate(samples):
            count += 1
            what = f"{_key(op)} {dtype} sample {i}"
            try:
                run_sample(op, sample, grads, i, what)
            except Exception as exc:  # collect every failing sample
                failures.append(f"{what}: {type(exc).__name__}: {str(exc)[:400]}")
    return count, failures


@pytest.mark.parametrize("op, dtype", cases())
def test_opinfo_all(op, dtype):
    if _key(op) in UNSUPPORTED:
        error, message = UNSUPPORTED[_key(op)]
        with pytest.raises(error, match=message):
            run_unsupported(op, dtype)
        return
    count, failures = run_case(op, dtype)
    assert not failures, f"{len(failures)} of {count} samples failed:\n" + "\n".join(
        failures[:5])


