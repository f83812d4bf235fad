"""Bad input on the device raises PyTorch's errors: each case runs on the CPU and on the
device and must raise the same exception type with the CPU's message (the device may add
the op's name), or, where the CPU has no counterpart (device ordinals, other processes),
PyTorch's error for the same mistake on CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from util import assert_same_outcome

torch = pytest.importorskip("torch")
import hologram_torch  # noqa: E402, F401  (registers the device)

ROOT = Path(__file__).resolve().parents[3]
F = torch.nn.functional


def _raised(fn, device: str) -> Exception:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fallback and deprecation warnings
        try:
            fn(device)
        except Exception as exc:  # the error under test
            return exc
    pytest.fail(f"no error on {device}")


def same_error(fn) -> Exception:
    """``fn(device)`` raises on the CPU and the device alike; the device's exception."""
    expected, actual = _raised(fn, "cpu"), _raised(fn, "hologram")
    assert type(actual) is type(expected), f"{type(actual).__name__}: {actual}"
    assert str(expected).splitlines()[0] in str(actual), f"{actual} (CPU: {expected})"
    return actual


def _arange(device, dtype=torch.float32):
    return torch.arange(6, dtype=dtype, device=device)


def _overlapping_bitwise_and(b):
    return b[1:].bitwise_and_(b[:-1])


# --- memory overlap -----------------------------------------------------------------------

OVERLAPPING = {
    "exp out=": lambda a: torch.exp(a[:-1], out=a[1:]),
    "add out=": lambda a: torch.add(a[:-1], 1, out=a[1:]),
    "mul out=": lambda a: torch.mul(a[1:], a[:-1], out=a[:-1]),
    "sin out= (fallback op)": lambda a: torch.sin(a[:-1], out=a[1:]),
    "clamp out=": lambda a: torch.clamp(a[:-2], 0, 1, out=a[2:]),
    "where out=": lambda a: torch.where(a[:-1] > 2, a[:-1], a[:-1] * 0, out=a[1:]),
    "add_": lambda a: a[1:].add_(a[:-1]),
    "mul_ row": lambda a: a.view(2, 3).mul_(a[:3]),
    "addcmul_": lambda a: a[1:].addcmul_(a[:-1], a[:-1]),
    "lerp_": lambda a: a[1:].lerp_(a[:-1], 0.5),
    "eq_": lambda a: a[1:].eq_(a[:-1]),
    "bitwise_and_": lambda a: _overlapping_bitwise_and(a.long()),
}


# ops that also refuse an out= that is exactly an input (PyTorch's assert_no_overlap)
_INDEX = {"cat out=": lambda a: torch.cat([a[:2], a[2:4]], out=a[2:6]),
          "index_select out=": lambda a: torch.index_select(a, 0, _index(a), out=a[1:3]),
          "gather out=": lambda a: torch.gather(a, 0, _index(a), out=a[1:3]),
          "scatter_": lambda a: a.scatter_(0, _index(a), a),
          "index_add_": lambda a: a.index_add_(0, _index(a), a[2:4])}
OVERLAPPING.update(_INDEX)


def _index(a):
    return torch.tensor([0, 1], device=a.device)


@pytest.mark.parametrize("name", list(OVERLAPPING))
def test_partial_overlap_raises_torch_error(name):
    fn = OVERLAPPING[name]
    exc = same_error(lambda d: fn(_arange(d)))
    assert "some elements of the input tensor and the written-to tensor" in str(exc)


EXPANDED = {
    "add_": lambda x: x.add_(1), "mul_": lambda x: x.mul_(x), "exp_": lambda x: x.exp_(),
    "atan_ (fallback op)": lambda x: x.atan_(), "clamp_": lambda x: x.clamp_(0, 1),
    "relu_": lambda x: x.relu_(), "sigmoid_": lambda x: x.sigmoid_(),
    "copy_": lambda x: x.copy_(torch.ones(3, device=x.device)),
    "lerp_": lambda x: x.lerp_(torch.ones(3, device=x.device), 0.5),
    "exp out=": lambda x: torch.exp(torch.ones(3, device=x.device), out=x),
    "add out=": lambda x: torch.add(torch.ones(3, device=x.device), 1, out=x),
    "index_add_": lambda x: x.index_add_(0, torch.tensor([0], device=x.device),
                                         torch.ones(1, device=x.device)),
    "_foreach_add_": lambda x: torch._foreach_add_([x], 1),
    "uniform_": lambda x: x.uniform_(),
}


@pytest.mark.parametrize("name", list(EXPANDED))
def test_writing_an_expanded_tensor_raises_torch_error(name):
    fn = EXPANDED[name]
    exc = same_error(lambda d: fn(torch.zeros(1, device=d).expand(3)))
    assert "more than one element of the written-to tensor" in str(exc)


EXPANDED_OK = {  # PyTorch writes these into an expanded tensor: so does the device
    "fill_": lambda x: x.fill_(2.5), "zero_": lambda x: x.zero_(),
    "masked_fill_": lambda x: x.masked_fill_(torch.tensor([False, True, True],
                                                          device=x.device), 2.0),
    "sum out=": lambda x: torch.sum(torch.ones(3, 3, device=x.device), 0, out=x),
    "mv out=": lambda x: torch.mv(torch.ones(3, 3, device=x.device),
                                  torch.arange(3.0, device=x.device), out=x),
    "diagonal copy_": lambda x: x.diagonal().copy_(torch.arange(3.0, device=x.device)),
}


def test_products_into_their_own_operands_compute_as_pytorch():
    # PyTorch computes these (in its own order): the device gives its result
    cases = [lambda a: torch.mm(a.view(2, 3)[:, :2], a.view(2, 3)[:, 1:], out=a[:4].view(2, 2)),
             lambda a: a[:4].view(2, 2).addmm_(a[:4].view(2, 2), a[2:6].view(2, 2)),
             lambda a: torch.sum(a.view(2, 3), 0, out=a[:3])]
    for case in cases:
        expected, actual = _arange("cpu"), _arange("hologram")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            case(expected)
            case(actual)
        assert torch.equal(actual.cpu(), expected)


@pytest.mark.parametrize("name", list(EXPANDED_OK))
def test_writes_pytorch_allows_into_shared_memory(name):
    fn = EXPANDED_OK[name]
    base = torch.zeros(1) if name != "diagonal copy_" else torch.zeros(3, 3)
    expected = base.clone().expand(3) if name != "diagonal copy_" else base.clone()
    actual = base.to("hologram").expand(3) if name != "diagonal copy_" else base.to("hologram")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn(expected)
        fn(actual)
    assert torch.equal(actual.cpu(), expected)


def test_disjoint_views_of_one_storage_are_not_an_overlap():
    a, b = _arange("cpu"), _arange("hologram")
    torch.exp(a[:3], out=a[3:])
    torch.exp(b[:3], out=b[3:])
    b[::2].add_(b[1::2])
    a[::2].add_(a[1::2])
    torch.testing.assert_close(b.cpu(), a)


# --- dtypes of results ----------------------------------------------------------------------

CASTS = {
    "add float into long": lambda d: torch.add(torch.ones(3, device=d), 1,
                                               out=torch.empty(3, dtype=torch.long, device=d)),
    "add float into int": lambda d: torch.add(torch.ones(3, device=d), torch.ones(3, device=d),
                                              out=torch.empty(3, dtype=torch.int32, device=d)),
    "mul float into bool": lambda d: torch.mul(torch.ones(3, device=d), 2,
                                               out=torch.empty(3, dtype=torch.bool, device=d)),
    "div ints into long": lambda d: torch.div(_arange(d, torch.long), 2,
                                              out=torch.empty(6, dtype=torch.long, device=d)),
    "exp into bool": lambda d: torch.exp(torch.ones(3, device=d),
                                         out=torch.empty(3, dtype=torch.bool, device=d)),
    "sqrt of ints into long": lambda d: torch.sqrt(_arange(d, torch.long),
                                                   out=_arange(d, torch.long)),
    "clamp into long": lambda d: torch.clamp(torch.ones(3, device=d), 0, 1,
                                             out=torch.empty(3, dtype=torch.long, device=d)),
    "where into long": lambda d: torch.where(torch.ones(3, dtype=torch.bool, device=d),
                                             torch.ones(3, device=d), torch.zeros(3, device=d),
                                             out=torch.empty(3, dtype=torch.long, device=d)),
    "add_ float into long": lambda d: _arange(d, torch.long).add_(0.5),
    "sin out= long (fallback op)": lambda d: torch.sin(
        torch.ones(3, device=d), out=torch.empty(3, dtype=torch.long, device=d)),
}


@pytest.mark.parametrize("name", list(CASTS))
def test_result_dtype_that_cannot_be_cast_raises_torch_error(name):
    same_error(CASTS[name])  # "result type Float can't be cast ..." (clamp, where: others)


def test_comparison_into_a_float_out_is_allowed():
    out = torch.empty(3, device="hologram")
    torch.lt(torch.arange(3.0, device="hologram"), 1, out=out)
    assert out.cpu().tolist() == [1.0, 0.0, 0.0]


# --- values torch checks --------------------------------------------------------------------

BCE = {
    "target above 1": (0.5, 2.0), "target below 0": (0.5, -0.5), "target NaN": (0.5, "nan"),
    "input above 1": (1.5, 0.5), "input below 0": (-0.1, 0.5),
}


@pytest.mark.parametrize("name", list(BCE))
def test_binary_cross_entropy_out_of_range_raises_torch_error(name):
    x, t = (float(v) for v in BCE[name])
    exc = same_error(lambda d: F.binary_cross_entropy(
        torch.tensor([0.25, x], device=d), torch.tensor([0.5, t], device=d)))
    assert "should be between 0 and 1" in str(exc)


# --- devices, sizes, layouts ----------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: torch.ones(2, device="hologram:1"),
    lambda: torch.empty(2, 3, device=torch.device("hologram", 3)),
    lambda: torch.zeros(2).to("hologram:1"),
    lambda: torch.empty_strided((2,), (1,), device="hologram:1"),
], ids=["ones", "empty", "to", "empty_strided"])
def test_a_device_index_other_than_0_raises(make):
    # CUDA raises RuntimeError "CUDA error: invalid device ordinal" for a missing GPU
    with pytest.raises(RuntimeError, match=r"invalid device ordinal.*one hologram device"):
        make()


def test_device_index_0_works():
    assert torch.ones(2, device="hologram:0").device == torch.device("hologram", 0)


@pytest.mark.parametrize("size", [(-1,), (2, -3)])
def test_negative_size_raises_torch_error(size):
    same_error(lambda d: torch.empty(size, device=d))
    same_error(lambda d: torch.empty_strided(size, (1,) * len(size), device=d))


@pytest.mark.parametrize("case", ["cat", "mm", "index_select"])
def test_operands_on_two_devices_raise_torch_error(case):
    x, c = torch.ones(2, 2, device="hologram"), torch.ones(2, 2)
    call = {"cat": lambda: torch.cat([x, c]), "mm": lambda: torch.mm(x, c),
            "index_select": lambda: torch.index_select(x, 0, c.long())}[case]
    # PyTorch's message for CUDA and CPU operands
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, "
                                           "but found at least two devices, hologram:0 and cpu"):
        call()


@pytest.mark.parametrize("case", ["add", "radd", "where", "clamp", "maximum", "mul_"])
def test_a_cpu_tensor_mixed_into_an_elementwise_op_raises(case):
    x = torch.zeros(3, device="hologram")
    call = {"add": lambda c: x + c, "radd": lambda c: c + x,
            "where": lambda c: torch.where(x > 0, x, c), "clamp": lambda c: x.clamp(c),
            "maximum": lambda c: torch.maximum(x, c), "mul_": lambda c: x.mul_(c)}[case]
    # a 0-d CPU tensor is a scalar (as on CUDA); its kernel must not serve a larger one
    assert call(torch.tensor(2.0)).device.type == "hologram"
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, "
                                           "but found at least two devices, hologram:0 and cpu"):
        call(torch.tensor([5.0, 6.0, 7.0]))


@pytest.mark.parametrize("make", [
    lambda: torch.eye(3, device="hologram").to_sparse(),
    lambda: torch.eye(3, device="hologram").to_sparse_csr(),
    lambda: torch.eye(3).to_sparse().to("hologram"),
    lambda: torch.sparse_coo_tensor([[0]], [1.0], (2,), device="hologram"),
    lambda: torch.empty(2, layout=torch.sparse_coo, device="hologram"),
    # a compressed layout moves with its CPU kernel; every op on it refuses
    lambda: torch.eye(3).to_sparse_csr().to("hologram").to_dense(),
], ids=["to_sparse", "to_sparse_csr", "coo to device", "sparse_coo_tensor", "empty",
        "csr op"])
def test_sparse_tensors_are_not_supported(make):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(NotImplementedError, match=r"sparse tensors are not supported on "
                                                      r"the hologram device.*cpu"):
            make()


# --- other processes ------------------------------------------------------------------------

_QUEUE = """
import torch, hologram_torch, torch.multiprocessing as mp

def child(inbox, outbox):
    # a list, not a tensor: a tensor's shared memory must outlive its sender
    outbox.put((inbox.get(timeout=60).to("hologram") * 2).tolist())

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    for item in (torch.ones(2, device="hologram"),
                 {"model": [torch.nn.Linear(2, 2).to("hologram")]}):
        try:
            inbox.put(item)
        except RuntimeError as exc:
            print("raised:", exc)
    p = ctx.Process(target=child, args=(inbox, outbox))
    p.start()
    inbox.put(torch.ones(2, device="hologram").cpu())
    print("received:", outbox.get(timeout=60))
    p.join(60)
    print("exit:", p.exitcode)
"""


def test_multiprocessing_queue_refuses_device_tensors_at_put(tmp_path):
    script = tmp_path / "queue_case.py"
    script.write_text(_QUEUE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.run([sys.executable, "-W", "ignore", str(script)], capture_output=True,
                          text=True, env=env, timeout=150)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stderr[-2000:]
    raised = [line for line in lines if line.startswith("raised:")]
    assert len(raised) == 2, proc.stdout + proc.stderr[-2000:]
    assert all("hologram tensor cannot be sent to another process" in line and ".cpu()" in line
               for line in raised)
    assert "received: [2.0, 2.0]" in lines and "exit: 0" in lines


# --- shapes that do not broadcast -----------------------------------------------------------

def _o(*shape, device, dtype=torch.float32):
    return torch.ones(shape, dtype=dtype, device=device)


NOT_BROADCASTING = {
    "add": lambda d: _o(2, 3, device=d) + _o(2, 4, device=d),
    "sub": lambda d: _o(2, 3, device=d) - _o(2, 4, device=d),
    "mul": lambda d: _o(2, 3, device=d) * _o(2, 4, device=d),
    "div": lambda d: _o(2, 3, device=d) / _o(2, 4, device=d),
    "eq": lambda d: _o(2, 3, device=d) == _o(2, 4, device=d),
    "maximum": lambda d: torch.maximum(_o(2, 3, device=d), _o(2, 4, device=d)),
    "where": lambda d: torch.where(_o(5, 1, 1, device=d) > 0, _o(2, 3, device=d),
                                   _o(4, 3, device=d)),
    "addcmul": lambda d: torch.addcmul(_o(2, 1, device=d), _o(3, 1, device=d), _o(4, device=d)),
    "copy_": lambda d: _o(2, 3, device=d).copy_(_o(2, 4, device=d)),
    "copy_ transposed": lambda d: _o(3, 2, device=d).copy_(_o(2, 3, device=d)),
    "copy_ larger": lambda d: _o(3, device=d).copy_(_o(2, 3, device=d)),
    "add_": lambda d: _o(2, 3, device=d).add_(_o(2, 4, device=d)),
    "add_ larger": lambda d: _o(3, device=d, dtype=torch.int64).add_(_o(2, 3, device=d)),
    "add out=": lambda d: torch.add(_o(3, device=d), _o(2, 4, device=d),
                                    out=torch.empty(0, device=d)),
    "empty": lambda d: _o(0, 3, device=d) + _o(2, 3, device=d),
    "clamp": lambda d: torch.clamp(_o(3, device=d), _o(4, device=d)),
    "masked_fill": lambda d: _o(3, device=d).masked_fill(_o(4, device=d) > 0, 1),
    "masked_fill_": lambda d: _o(3, device=d).masked_fill_(_o(2, 3, device=d) > 0, 1),
    "lerp": lambda d: torch.lerp(_o(3, device=d), _o(3, device=d), _o(4, device=d)),
    "threshold_backward": lambda d: torch.ops.aten.threshold_backward(
        _o(3, device=d), _o(4, device=d), 0.0),
    "_foreach_add": lambda d: torch._foreach_add([_o(3, device=d)], [_o(4, device=d)]),
}


@pytest.mark.parametrize("name", list(NOT_BROADCASTING))
def test_shapes_that_do_not_broadcast_raise_torch_error(name):
    # PyTorch's RuntimeError with its exact message (not the SDK's ShapeError, a ValueError)
    fn = NOT_BROADCASTING[name]
    expected, actual = _raised(fn, "cpu"), _raised(fn, "hologram")
    assert type(actual) is type(expected) is RuntimeError, f"{type(actual).__name__}: {actual}"
    assert str(actual) == str(expected)


# --- copies within one storage, lerp's dtypes -----------------------------------------------

def _copy_within(dst, src):
    def fn(device):
        a = _arange(device)
        dst(a).copy_(src(a))
        return a
    return fn


COPIES_WITHIN = {  # PyTorch raises for partial overlaps of dense tensors, copies the rest
    "a[1:] <- a[:-1]": _copy_within(lambda a: a[1:], lambda a: a[:-1]),
    "a[:-1] <- a[1:]": _copy_within(lambda a: a[:-1], lambda a: a[1:]),
    "rows <- transposed": _copy_within(lambda a: a.view(2, 3), lambda a: a.view(3, 2).t()),
    "rows <- a broadcast row": _copy_within(lambda a: a.view(2, 3), lambda a: a.view(2, 3)[:1]),
    "columns <- columns": _copy_within(lambda a: a.view(2, 3)[:, :2],
                                       lambda a: a.view(2, 3)[:, 1:]),
    "evens <- odds": _copy_within(lambda a: a[::2], lambda a: a[1::2]),
    "a <- a": _copy_within(lambda a: a, lambda a: a),
    "a <- a as int32": _copy_within(lambda a: a.view(torch.int32), lambda a: a.view(torch.int32)),
    "a[1:4] <- a[0]": _copy_within(lambda a: a[1:4], lambda a: a[0]),
}


@pytest.mark.parametrize("name", list(COPIES_WITHIN))
def test_copies_within_one_storage_as_pytorch(name):
    assert_same_outcome(COPIES_WITHIN[name])


def _t(n, dtype, device):
    return torch.ones(n, dtype=dtype, device=device)


F32, F64, F16 = torch.float32, torch.float64, torch.float16
LERPS = {
    "end double": lambda d: torch.lerp(_t(3, F32, d), _t(3, F64, d), 0.5),
    "weight double": lambda d: torch.lerp(_t(3, F32, d), _t(3, F32, d), _t(3, F64, d)),
    "lerp_ end double": lambda d: _t(3, F32, d).lerp_(_t(3, F64, d), 0.5),
    "0-d end double": lambda d: torch.lerp(_t(3, F32, d), _t((), F64, d), 0.5),
    "half, end float": lambda d: torch.lerp(_t(3, F16, d), _t(3, F32, d), 0.5),
    "_foreach_lerp": lambda d: torch._foreach_lerp([_t(3, F32, d)], [_t(3, F64, d)], 0.5)[0],
    "0-d weight double": lambda d: torch.lerp(_t(3, F32, d), _t(3, F32, d), _t((), F64, d)),
    "out= double": lambda d: torch.lerp(_t(3, F32, d), _t(3, F32, d), 0.5,
                                        out=torch.empty(3, dtype=F64, device=d)),
}


@pytest.mark.parametrize("name", list(LERPS))
def test_lerp_operand_dtypes_as_pytorch(name):
    assert_same_outcome(LERPS[name])


# --- device indices: torch.hologram as torch.cuda on a machine with one GPU ----------------

BAD_INDICES = {
    "set_device(1)": lambda h: h.set_device(1),
    "set_device('hologram:1')": lambda h: h.set_device("hologram:1"),
    "set_device(-1)": lambda h: h.set_device(-1),
    "device(1)": lambda h: h.device(1),
    "synchronize(1)": lambda h: h.synchronize(1),
    "get_device_name(2)": lambda h: h.get_device_name(2),
    "get_device_properties(5)": lambda h: h.get_device_properties(5),
    "memory_allocated(5)": lambda h: h.memory_allocated(5),
    "memory_stats(1)": lambda h: h.memory_stats(1),
    "a tensor on hologram:1": lambda h: torch.ones(2, device="hologram:1"),
    "to('hologram:3')": lambda h: torch.ones(2).to("hologram:3"),
}


@pytest.mark.parametrize("name", list(BAD_INDICES))
def test_a_device_index_that_does_not_exist_raises_runtime_error(name):
    # CUDA: torch.cuda.set_device(1) with one GPU raises RuntimeError('CUDA error: invalid
    # device ordinal'); every entry point of the device says the same, as a RuntimeError
    # (and Hologram's DeviceError)
    from hologram.errors import DeviceError

    with pytest.raises(RuntimeError, match=r"invalid device ordinal: hologram:-?\d does not "
                                           r"exist; there is one hologram device") as info:
        BAD_INDICES[name](torch.hologram)
    assert isinstance(info.value, DeviceError)


def test_device_module_takes_index_0_and_refuses_other_device_types():
    h = torch.hologram
    h.set_device(0)
    h.set_device("hologram:0")
    props = h.get_device_properties(0)
    assert props.name == h.get_device_name() and props.total_memory >= 0
    assert props.multi_processor_count >= 1
    # torch.cuda.set_device('cpu') raises ValueError('Expected a cuda device, but got: cpu')
    with pytest.raises(ValueError, match="expected a hologram device, got cpu"):
        h.set_device("cpu")


# --- compressed sparse layouts ---------------------------------------------------------------

def _csr(layout="csr"):
    return getattr(torch.eye(4), f"to_sparse_{layout}")(*((2, 2),) if layout[0] == "b" else ())


COMPRESSED = {
    "csr + 1": lambda: _csr().to("hologram") + 1,
    "-csr": lambda: -_csr().to("hologram"),
    "csr.sin()": lambda: _csr().to("hologram").sin(),
    "csr.values()": lambda: _csr().to("hologram").values(),
    "csr.t()": lambda: _csr().to("hologram").t(),
    "csr.cpu()": lambda: _csr().to("hologram").cpu(),
    "csr.hologram()": lambda: _csr().hologram(),
    "csc.to": lambda: _csr("csc").to("hologram"),
    "bsr.to": lambda: _csr("bsr").to("hologram"),
    "bsc.to": lambda: _csr("bsc").to("hologram"),
    "sparse_csr_tensor": lambda: torch.sparse_csr_tensor([0, 1, 1], [0], [1.0], (2, 2),
                                                         device="hologram"),
    "sparse_csc_tensor": lambda: torch.sparse_csc_tensor([0, 1, 1], [0], [1.0], (2, 2),
                                                         device="hologram"),
    "sparse_compressed_tensor of device parts": lambda: torch.sparse_compressed_tensor(
        torch.tensor([0, 1, 1], device="hologram"), torch.tensor([0], device="hologram"),
        torch.tensor([1.0], device="hologram"), (2, 2), layout=torch.sparse_csr),
    "zeros(layout=sparse_csr)": lambda: torch.zeros(2, 2, layout=torch.sparse_csr,
                                                    device="hologram"),
    "to_sparse_csc": lambda: torch.eye(3, device="hologram").to_sparse_csc(),
}


@pytest.mark.parametrize("name", list(COMPRESSED))
def test_compressed_sparse_tensors_raise_not_implemented(name):
    # docs/torch.md: sparse tensors raise NotImplementedError on the device (a compressed
    # one reached the device and its ops raised RuntimeErrors from composite kernels)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(NotImplementedError, match=r"sparse tensors are not supported on "
                                                      r"the hologram device.*cpu"):
            COMPRESSED[name]()
    # the CPU's compressed tensors are untouched
    assert torch.equal((_csr() * 2).to_dense(), torch.eye(4) * 2)


# --- in-place leaky ReLU with a negative slope: its backward refuses -------------------------

IN_PLACE_NEGATIVE_SLOPES = {
    "leaky_relu_(-2)": lambda a: F.leaky_relu_(a.clone(), -2),
    "leaky_relu_(negative_slope=-0.1)": lambda a: F.leaky_relu_(a.clone(), negative_slope=-0.1),
    "rrelu_(-5, 1)": lambda a: F.rrelu_(a.clone(), -5.0, 1.0),
    "LeakyReLU(-0.1, inplace=True)": lambda a: torch.nn.LeakyReLU(-0.1, inplace=True)(a * 1),
}


@pytest.mark.parametrize("name", list(IN_PLACE_NEGATIVE_SLOPES))
def test_in_place_leaky_relu_with_a_negative_slope_refuses_backward(name):
    forward = IN_PLACE_NEGATIVE_SLOPES[name]

    def fn(device):
        a = torch.tensor([-1.0, 1.0, -3.0], device=device, requires_grad=True)
        forward(a).backward(torch.ones(3, device=device))

    exc = same_error(fn)
    assert "please call out-of-place version instead" in str(exc)


def test_leaky_relu_backward_with_slopes_pytorch_allows():
    for forward in (lambda a: F.leaky_relu(a.clone(), -2), lambda a: F.leaky_relu_(a.clone(), 0.1),
                    lambda a: F.rrelu_(a.clone(), -0.5, -0.5, training=True)):
        grads = []
        for device in ("cpu", "hologram"):
            a = torch.tensor([-1.0, 1.0, -3.0], device=device, requires_grad=True)
            forward(a).backward(torch.ones(3, device=device))
            grads.append(a.grad.cpu())
        torch.testing.assert_close(grads[1], grads[0])


def test_sub_and_alpha_refuse_what_the_cpu_refuses_in_its_words():
    """PyTorch's sub_check and alpha_check: a bool operand of sub (tensor or number), a
    bool alpha for a result that is not bool, a float alpha for integers."""
    m = torch.tensor([True, False], device="hologram")
    i8 = torch.tensor([1], dtype=torch.int8, device="hologram")
    for fn, words in ((lambda: m - m, "with two bool tensors is not supported"),
                      (lambda: 1 - m, "with a bool tensor is not supported"),
                      (lambda: m - 1, "with a bool tensor is not supported"),
                      (lambda: torch.sub(i8, i8, alpha=True), "Boolean alpha only supported"),
                      (lambda: torch.add(i8, i8, alpha=True), "Boolean alpha only supported"),
                      (lambda: torch.sub(i8, i8, alpha=1.0), "must not be a floating point")):
        with pytest.raises(RuntimeError, match=words):
            fn()
    assert torch.add(m, m, alpha=True).cpu().tolist() == [True, False]
    assert (m.to(torch.uint8) - 1).cpu().tolist() == [0, 255]
