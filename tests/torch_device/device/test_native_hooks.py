"""The torch device's native PrivateUse1 hooks (``hologram_torch.native``): built and
active wherever a C++ compiler is, pinned memory that is host memory and says so, one
build shared by processes importing at the same time, bounded waits on a lock, and the
Python hooks (with DDP's two options refused, naming the fix) where nothing can be built.
DDP training with those options is tested in tests/torch_device/distributed/test_distributed.py."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from util import errors_in_threads

import hologram_torch
from hologram.errors import CompileError
from hologram_torch import native


@pytest.fixture(autouse=True)
def _eager():
    """The front kernels launch eagerly; recorded execution (HOLOGRAM_LAZY=1) records
    every call in Python instead."""
    with hologram_torch.set_lazy(False):
        yield


ROOT = Path(__file__).resolve().parents[3]
TOOLS = shutil.which(os.environ.get("CXX", "c++")) and shutil.which("ninja")
needs_native = pytest.mark.skipif(
    not native.active(), reason=f"native hooks unavailable: {native.reason()} "
    "(test_native_hooks_active_wherever_they_can_be_built says whether that is right)")


def _env(extra: dict) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), **extra)


def _python(code: str, env: dict, warnings: str = "ignore") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", warnings, "-c", code], env=_env(env),
                          cwd=ROOT, capture_output=True, text=True, timeout=240)


def test_native_hooks_active_wherever_they_can_be_built():
    if TOOLS:
        assert native.active(), native.reason()
        assert native.reason() is None and native.library_path().is_file()
    else:
        assert not native.active() and "not found" in native.reason()


@needs_native
def test_the_device_guard_is_native():
    """Ops taking a device guard (a linear layer's: about 30 guard calls) never call into
    Python for it (torch's Python guard asks Python for the device type every time), and
    the guard answers as the Python one did: hologram:0, its default stream."""
    import cProfile
    import pstats

    x, w = torch.randn(4, 8, device="hologram"), torch.randn(3, 8, device="hologram")
    profile = cProfile.Profile()
    profile.enable()
    torch.nn.functional.linear(x, w).sum().item()
    profile.disable()
    called = {name for (_, _, name) in pstats.Stats(profile).stats}
    assert "type_" not in called
    assert torch.empty(1, device="hologram").device == torch.device("hologram", 0)
    with torch.device("hologram"):
        assert torch.zeros(1).device == torch.device("hologram", 0)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool,
                                   torch.bfloat16])
def test_pinned_memory_is_host_memory_that_says_so(dtype):
    ref = torch.testing.make_tensor(5, 7, dtype=dtype, device="cpu")
    pinned = torch.empty(5, 7, dtype=dtype, pin_memory=True)
    assert pinned.device.type == "cpu" and pinned.is_pinned()
    pinned.copy_(ref)
    # views of it too (is_pinned asks about the storage's pointer), and copies both ways
    assert pinned[1:].is_pinned() and pinned.t().is_pinned()
    on_device = pinned.to("hologram", non_blocking=True)
    assert on_device.device.type == "hologram" and not on_device.is_pinned()
    assert torch.equal(on_device.cpu(), ref)
    like = torch.empty_like(ref, pin_memory=True)
    assert like.is_pinned() and like.shape == ref.shape and like.dtype == dtype
    # ordinary CPU memory is not pinned, nor a copy of pinned memory
    assert not ref.is_pinned() and not pinned.clone().is_pinned()


@needs_native
def test_pinned_blocks_are_forgotten_when_freed():
    # a freed block leaves the allocator's table: a tensor that gets its address next is
    # not taken for pinned. Whether malloc hands the address out again depends on the
    # heap's state (an aligned allocation is cut from a larger chunk), so a tensor is put
    # at that address here: is_pinned() asks about the pointer only, nothing is read.
    for _ in range(50):
        pinned = torch.ones(1000, pin_memory=True)
        assert pinned.is_pinned() and pinned[500:].is_pinned()
        address = pinned.data_ptr()
        del pinned
        there = torch.frombuffer((ctypes.c_char * 4000).from_address(address),
                                 dtype=torch.uint8)
        assert there.data_ptr() == address and not there.is_pinned()
        assert not torch.ones(1000).is_pinned()
    empty = torch.empty(0, pin_memory=True)  # no block at all
    assert empty.device.type == "cpu" and empty.numel() == 0


_ALLOC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                          ctypes.c_uint)
_FREE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_libc = ctypes.CDLL(None)
_libc.malloc.restype, _libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
_libc.free.restype, _libc.free.argtypes = None, (ctypes.c_void_p,)


@needs_native
def test_on_a_gpu_pinned_memory_is_page_locked_through_the_drivers_functions():
    """On GPU memory the hooks' pinned memory comes from the driver (cuMemHostAlloc, with
    the driver's context made current on the allocating thread) and goes back to it
    (cuMemFreeHost): here stand-ins with the same C signatures, which record their calls."""
    calls, status = [], [0]

    def alloc(out, nbytes, flags):
        calls.append(("alloc", nbytes, flags))
        if status[0]:
            return status[0]
        out[0] = _libc.malloc(nbytes)
        return 0

    def free(address):
        calls.append(("free", address))
        _libc.free(address)
        return 0

    functions = (_ALLOC(alloc), _FREE(free), _FREE(lambda context: calls.append(
        ("current", context)) or 0))
    addresses = tuple(ctypes.cast(f, ctypes.c_void_p).value for f in functions)
    assert native.page_lock((*addresses, 0x5EED))
    try:
        pinned = torch.arange(1000.0).pin_memory()
        assert pinned.is_pinned() and pinned.tolist() == list(range(1000))
        assert ("current", 0x5EED) in calls and ("alloc", 4000, 1) in calls  # portable
        address = pinned.data_ptr()
        on_device = pinned.to("hologram", non_blocking=True)
        del pinned
        assert calls[-1] == ("free", address) and on_device.sum().item() == 499500
        status[0] = 2  # CUDA_ERROR_OUT_OF_MEMORY
        with pytest.raises(RuntimeError, match=r"could not page-lock 400 bytes .*CUresult 2"):
            torch.ones(100).pin_memory()
    finally:
        native.page_lock(None)
    count = len(calls)
    again = torch.ones(100).pin_memory()  # ordinary host memory again
    assert again.is_pinned() and len(calls) == count


@needs_native
def test_pinning_starts_the_devices_memory_first(monkeypatch):
    """The GPU (and with it the page-locking above) starts when the device's memory is
    first needed; pinned memory is such a need: pinned before, it would stay pageable."""
    from hologram_torch import memory

    started = []
    monkeypatch.setitem(memory._device, "resolve", lambda: started.append(True))
    assert torch.ones(3).pin_memory().is_pinned()
    assert started == [True] and memory._device["resolve"] is None


@needs_native
def test_processes_importing_together_share_one_build(tmp_path):
    """Three processes import with an empty extension directory: one builds (and says
    so), the others wait for it; all three get the native hooks."""
    code = ("import torch, hologram_torch; from hologram_torch import native; "
            "print('active', native.active(), native.reason())")
    env = _env({"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    procs = [subprocess.Popen([sys.executable, "-W", "ignore", "-c", code], env=env,
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0 and "active True None" in out, out + err
    assert sum("building the device's native hooks" in err for _, err in outputs) == 1
    (folder,) = tmp_path.iterdir()
    builds = (folder / ".ninja_log").read_text().count(".so")
    assert builds == 1 and not (folder / "hologram_build.lock").exists()


def test_a_build_in_progress_is_waited_for(tmp_path, monkeypatch):
    """A process that finds another's lock waits until it goes, then loads that result."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    path = native.library_path()
    path.parent.mkdir(parents=True)
    lock = path.parent / "hologram_build.lock"
    lock.touch()

    def other_build():
        time.sleep(0.5)
        path.write_bytes(b"built by the other process")
        lock.unlink()

    other = threading.Thread(target=other_build)
    other.start()
    start = time.monotonic()
    assert native.build() == path
    other.join()
    assert time.monotonic() - start >= 0.4 and path.read_bytes().startswith(b"built by")


def test_a_stale_lock_fails_the_build_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    path = native.library_path()
    path.parent.mkdir(parents=True)
    lock = path.parent / "hologram_build.lock"
    lock.touch()
    old = time.time() - 2 * native._LOCK_STALE_S
    os.utime(lock, (old, old))
    start = time.monotonic()
    with pytest.raises(CompileError, match="was interrupted; delete the file"):
        native.build()
    assert time.monotonic() - start < 5 and lock.exists()


def test_without_a_compiler_the_device_runs_on_python_hooks(tmp_path):
    """No compiler ($CXX names none) and nothing built: the import stays quiet, the device
    works, pinned allocations fail as torch fails them for a Python device, and DDP
    refuses find_unused_parameters and static_graph with the reason and the fix."""
    code = f"""
import datetime, torch, torch.distributed as dist
import hologram_torch
from hologram_torch import native
from torch.nn.parallel import DistributedDataParallel as DDP
assert not native.active(), "native hooks active without a compiler"
print("reason:", native.reason())
x = torch.arange(6.0, device="hologram")
assert torch.equal((x * 2 + 1).cpu(), torch.arange(6.0) * 2 + 1)
try:
    torch.empty(3, pin_memory=True)
except NotImplementedError as e:
    print("pinned refused:", "getPinnedMemoryAllocator" in str(e))
dist.init_process_group("hologram", init_method="file://{tmp_path}/store", rank=0,
                        world_size=1, timeout=datetime.timedelta(seconds=20))
plain = DDP(torch.nn.Linear(4, 4).to("hologram"))
plain(torch.ones(2, 4, device="hologram")).sum().backward()
print("plain DDP works:", plain.module.weight.grad.device)
for option in ("find_unused_parameters", "static_graph"):
    try:
        DDP(torch.nn.Linear(4, 4).to("hologram"), **{{option: True}})
    except hologram_torch.compat.UnsupportedError as e:
        print(option, "refused:", e)
dist.destroy_process_group()
"""
    extensions = tmp_path / "extensions"
    done = _python(code, {"CXX": str(tmp_path / "no-such-compiler"),
                          "TORCH_EXTENSIONS_DIR": str(extensions)})
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "no-such-compiler not found" in out and "apt-get install g++" in out, out
    assert "pinned refused: True" in out and "plain DDP works: hologram:0" in out, out
    for option in ("find_unused_parameters", "static_graph"):
        line = next(x for x in out.splitlines() if x.startswith(f"{option} refused:"))
        assert f"{option}=True" in line and "native hooks" in line, line
        assert "no-such-compiler not found" in line and "apt-get install g++" in line, line
    assert "building" not in done.stderr and not extensions.exists(), done.stderr


def test_a_failing_build_warns_once_and_the_device_still_works(tmp_path):
    """A compiler that exists but fails ($CXX=false): one warning with its log, then the
    Python hooks; the lock is released for the next attempt."""
    code = ("import torch, hologram_torch\nfrom hologram_torch import native\n"
            "assert not native.active()\n"
            "print(torch.ones(3, device='hologram').sum().item())")
    false = shutil.which("false")
    assert false is not None
    done = _python(code, {"CXX": false, "TORCH_EXTENSIONS_DIR": str(tmp_path)},
                   warnings="default")
    assert done.returncode == 0 and done.stdout.strip() == "3.0", done.stdout + done.stderr
    assert done.stderr.count("RuntimeWarning: hologram_torch runs on its Python device "
                             "hooks") == 1, done.stderr
    assert "failed (CalledProcessError)" in done.stderr and "--- log ---" in done.stderr
    assert not list(tmp_path.glob("*/hologram_build.lock"))


# --- front kernels (csrc/ops.cpp) ------------------------------------------------------

def _served(fn, *args):
    """``fn(*args)`` twice: the second call must be served by a front kernel. Returns the
    second result."""
    fn(*args)
    before = native.fast_stats()["hits"]
    result = fn(*args)
    assert native.fast_stats()["hits"] == before + 1, "not served by the front kernel"
    return result


def _on_device(*tensors):
    return [t.to("hologram") for t in tensors]


FRONT_CASES = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "add int": lambda a, b: a + 3, "mul float": lambda a, b: a * 2.5,
    "add bool": lambda a, b: a + True, "relu": lambda a, b: torch.relu(a),
    "exp": lambda a, b: torch.exp(a), "neg": lambda a, b: -a, "sum": lambda a, b: a.sum(),
    "mean": lambda a, b: a.mean(), "gelu": lambda a, b: torch.nn.functional.gelu(a),
    "sum dim": lambda a, b: a.sum(-1), "mean dim": lambda a, b: a.mean([-1], keepdim=True),
    "mul.Scalar": lambda a, b: torch.ops.aten.mul.Scalar(a, 0.5),
    "sub.Scalar": lambda a, b: torch.ops.aten.sub.Scalar(a, 3),
}


@needs_native
@pytest.mark.parametrize("case", FRONT_CASES)
@pytest.mark.parametrize("layout", ["flat", "broadcast", "transposed", "empty", "0-d"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32])
def test_front_kernels_serve_filed_calls_with_the_cpu_results(case, layout, dtype):
    fn = FRONT_CASES[case]
    if dtype is torch.int32 and case in ("exp", "mean", "mean dim", "gelu", "mul float",
                                         "add bool", "mul.Scalar"):
        return  # float-only ops (and int + bool, an int op: the int cases cover it)
    shapes = {"flat": ((1000,), (1000,)), "broadcast": ((7, 33), (33,)),
              "transposed": ((33, 7), (33, 7)), "empty": ((0, 5), (5,)), "0-d": ((), ())}
    a, b = (torch.testing.make_tensor(s, dtype=dtype, device="cpu", low=-9, high=9)
            for s in shapes[layout])
    # (PyTorch's vectorized CPU gelu gives NaN at +inf; the device gives the limit, inf)
    if dtype.is_floating_point and a.numel() >= 4 and case != "gelu":
        a.view(-1)[:4] = torch.tensor([float("nan"), float("inf"), -0.0, float("-inf")])
    if layout == "transposed":
        a, b = a.t(), b.t()
    if case == "div" and not dtype.is_floating_point:
        b = b.masked_fill(b == 0, 1)
    expected = fn(a, b)
    got = _served(fn, *_on_device(a, b))
    assert got.device.type == "hologram" and got.dtype == expected.dtype
    torch.testing.assert_close(got.cpu(), expected, equal_nan=True, rtol=1e-5, atol=1e-6)


INPLACE_NUMBER_CASES = {
    "add_ int": lambda a: a.add_(1), "mul_ float": lambda a: a.mul_(0.5),
    "sub_ float": lambda a: a.sub_(2.5), "div_ float": lambda a: a.div_(-4.0),
    "add_ bool": lambda a: a.add_(True),
}


@needs_native
@pytest.mark.parametrize("case", INPLACE_NUMBER_CASES)
@pytest.mark.parametrize("shape", [(), (7, 33), (0, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_front_kernels_serve_in_place_calls_with_numbers(case, shape, dtype):
    """``x.add_(1)`` (a batch-norm counter each step) and ``x.mul_(0.5)`` are filed after
    their first call and served from then on, into ``x``; an int tensor's float operand
    still raises PyTorch's error, every time."""
    fn = INPLACE_NUMBER_CASES[case]
    a = torch.testing.make_tensor(shape, dtype=dtype, device="cpu", low=-9, high=9)
    if dtype.is_floating_point and a.numel() >= 3:
        a.view(-1)[:3] = torch.tensor([float("nan"), float("-inf"), -0.0])
    d = a.to("hologram")
    if not dtype.is_floating_point and "float" in case:
        for _ in range(2):
            with pytest.raises(RuntimeError, match="can't be cast"):
                fn(d)
        return
    for _ in range(3):  # the device's first call files it, _served makes two more
        fn(a)
    address = d.data_ptr()
    fn(d)
    if d.numel():  # (an empty tensor launches nothing: there is nothing to serve)
        assert _served(fn, d).data_ptr() == address
    else:
        fn(d), fn(d)
    torch.testing.assert_close(d.cpu(), a, equal_nan=True, rtol=0, atol=0)


@needs_native
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_front_kernels_serve_convolutions(bias, layout):
    """A convolution is filed after its first call and served from then on, without bias
    too (an absent optional tensor reaches the front kernel as an undefined tensor, keyed
    as None); its result has the CPU's values and layout."""
    torch.manual_seed(3)
    x, w = torch.randn(2, 4, 7, 6), torch.randn(6, 2, 3, 3)
    b = torch.randn(6) if bias else None
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)

    def conv(x, w, b):
        return torch.nn.functional.conv2d(x, w, b, stride=(2, 1), padding=1, groups=2)

    expected = conv(x, w, b)
    got = _served(conv, x.to("hologram"), w.to("hologram"),
                  None if b is None else b.to("hologram"))
    assert got.stride() == expected.stride()
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)


@needs_native
@pytest.mark.parametrize("mask", [(True, True, False), (False, True, True),
                                  (True, False, False), (True, True, True)])
def test_front_kernels_serve_gradients_some_masked_off(mask):
    """A convolution's backward is filed with the gradients its mask asks for and served
    from then on, returning None for the others, as its Python kernel does."""
    torch.manual_seed(4)
    x, w = torch.randn(2, 4, 6, 5), torch.randn(6, 4, 3, 3)
    go = torch.randn(2, 6, 3, 5)

    def backward(go, x, w):
        return torch.ops.aten.convolution_backward(go, x, w, [6], [2, 1], [1, 1], [1, 1],
                                                   False, [0, 0], 1, list(mask))

    expected = backward(go, x, w)
    got = _served(backward, go.to("hologram"), x.to("hologram"), w.to("hologram"))
    for g, e, wanted in zip(got, expected, mask):
        assert (g is not None) == wanted
        if wanted:
            torch.testing.assert_close(g.cpu(), e, rtol=1e-5, atol=1e-5)


SCALAR_CASES = {
    "hardtanh": lambda g, x, lo, hi: torch.nn.functional.hardtanh(x, lo, hi),
    "hardtanh_backward": lambda g, x, lo, hi: torch.ops.aten.hardtanh_backward(g, x, lo, hi),
    "leaky_relu": lambda g, x, lo, hi: torch.nn.functional.leaky_relu(x, hi),
}


@needs_native
@pytest.mark.parametrize("case", SCALAR_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_front_kernels_serve_calls_with_scalar_arguments(case, dtype):
    """A kernel that launched with an op's Scalar arguments as runtime numbers is filed
    under their values and served from then on, each value its own entry: ReLU6's
    gradient (hardtanh_backward(g, x, 0, 6)) on every step without Python."""
    fn = SCALAR_CASES[case]
    g, x = (torch.testing.make_tensor((9, 13), dtype=dtype, device="cpu", low=-9, high=9)
            for _ in range(2))
    # (no NaN: PyTorch's CPU hardtanh_backward passes a NaN's gradient in its scalar loop
    # and drops it in its vectorized one, so its own answer depends on the position)
    x.view(-1)[:3] = torch.tensor([float("inf"), -0.0, float("-inf")])
    for lo, hi in ((0.0, 6.0), (-1.0, 1.0), (-2.5, 0.25)):
        expected = fn(g, x, lo, hi)
        got = _served(fn, *_on_device(g, x), lo, hi)
        torch.testing.assert_close(got.cpu(), expected, equal_nan=True, rtol=0, atol=0)


def _layer_norm(x, w, b):
    return torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, 1e-5)


def _layer_norm_backward(x, w, b, mask=(True, True, True)):
    out, mean, rstd = torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, 1e-5)
    return torch.ops.aten.native_layer_norm_backward(out.sin(), x, [x.shape[-1]], mean,
                                                     rstd, w, b, list(mask))


def _gru_cell(x, w, b):
    gates = torch.cat([x[:, :3], x[:, 3:6]], 1).repeat(1, 2)
    return torch.ops.aten._thnn_fused_gru_cell(gates[:, :6], gates[:, 6:], x[:, :2],
                                               b[:6], b[6:12])


def _gru_cell_backward(x, w, b):
    _, workspace = _gru_cell(x, w, b)
    return torch.ops.aten._thnn_fused_gru_cell_backward(x[:, :2].cos(), workspace, True)


def _lstm_cell(x, w, b):
    return torch.ops.aten._thnn_fused_lstm_cell(x[:, :8], x[:, 8:16], x[:, :2], b[:8],
                                                b[8:16])


def _lstm_cell_backward(x, w, b):
    hy, cy, workspace = _lstm_cell(x, w, b)
    return torch.ops.aten._thnn_fused_lstm_cell_backward_impl(
        hy.cos(), cy.sin(), x[:, :2], cy, workspace, True)


def _batch_norm_backward(x, w, b):
    x = x.reshape(2, 4, 3, 4)
    out, mean, invstd = torch.ops.aten.native_batch_norm(x, w[:4], b[:4], None, None, True,
                                                         0.1, 1e-5)
    return torch.ops.aten.native_batch_norm_backward(out.sin(), x, w[:4], None, None, mean,
                                                     invstd, True, 1e-5, [True] * 3)


MULTI_CASES = {"layer_norm": _layer_norm, "layer_norm_backward": _layer_norm_backward,
               "batch_norm_backward": _batch_norm_backward,
               "gru_cell": _gru_cell, "gru_cell_backward": _gru_cell_backward,
               "lstm_cell": _lstm_cell, "lstm_cell_backward": _lstm_cell_backward}


@needs_native
@pytest.mark.parametrize("case", MULTI_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_front_kernels_serve_ops_with_several_results(case, dtype):
    """Ops that return several tensors (layer norm and its gradients, the fused GRU/LSTM
    cells and theirs) are filed as one launch into all their results and served from
    then on without Python: every result fresh, each the CPU's (the CPU composes the
    cells; the recurrent cases compare with the device's own first, Python-run call)."""
    x = torch.testing.make_tensor((6, 16), dtype=dtype, device="cpu", low=-2, high=2)
    w, b = (torch.testing.make_tensor((16,), dtype=dtype, device="cpu", low=-2, high=2)
            for _ in range(2))
    fn = MULTI_CASES[case]
    first = [t.cpu() for t in fn(*_on_device(x, w, b))]
    hits = native.fast_stats()["hits"]
    got = fn(*_on_device(x, w, b))
    # the cells' backward cases run their forward first: every op of the case served
    assert native.fast_stats()["hits"] >= hits + (2 if "backward" in case else 1)
    ptrs = {t.data_ptr() for t in got}
    assert len(ptrs) == len(got), "results must not share memory"
    for g, f in zip(got, first):
        assert g.device.type == "hologram"
        torch.testing.assert_close(g.cpu(), f, rtol=0, atol=0)
    if "norm" in case:
        for g, e in zip(got, fn(x, w, b)):
            torch.testing.assert_close(g.cpu(), e, rtol=1e-5, atol=1e-6)


LOWERED_CASES = {
    "select_backward": lambda x: torch.ops.aten.select_backward(x, [3, *x.shape], 0, 1),
    "slice_backward": lambda x: torch.ops.aten.slice_backward(x, [x.shape[0] + 4, x.shape[1]],
                                                              0, 2, x.shape[0] + 2, 1),
    "tril": lambda x: torch.tril(x, -1), "triu_": lambda x: x.clone().triu_(1),
    "hardswish": torch.nn.functional.hardswish,
    "_safe_softmax": lambda x: torch.ops.aten._safe_softmax(x, -1),
    "flip": lambda x: torch.flip(x, [0, 1]), "roll": lambda x: torch.roll(x, 2, 1)}


@needs_native
@pytest.mark.parametrize("case", LOWERED_CASES)
def test_lowered_ops_are_served_natively(case):
    """The ops whose kernel is their lowering entry (``from_table.register``: list arguments,
    in-place forms included) are filed and served by the front kernels, with the CPU's
    results."""
    x = torch.testing.make_tensor((6, 7), dtype=torch.float32, device="cpu", low=-4, high=4)
    fn = LOWERED_CASES[case]
    got = _served(fn, *_on_device(x)) if case != "triu_" else None
    if case == "triu_":  # (clone, then the in-place op: two served calls)
        d = _on_device(x)[0]
        fn(d)
        hits = native.fast_stats()["hits"]
        got = fn(d)
        assert native.fast_stats()["hits"] == hits + 2
    torch.testing.assert_close(got.cpu(), fn(x), rtol=1e-6, atol=1e-6)


@needs_native
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_served_index_ops_check_every_calls_indices(index_dtype):
    """nll_loss (forward and backward) and embedding are served natively once filed; each
    call's indices are checked first (in range, or nll_loss's ignore_index), and a call
    that fails the check runs the Python kernel, which raises PyTorch's error: the same
    signature with a target out of range does not launch."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 5, generator=g, dtype=torch.float64).log_softmax(1)
    good = torch.tensor([0, 4, -100, 2, 1, 3])
    dx = x.to("hologram").requires_grad_()
    for _ in range(3):
        hits = native.fast_stats()["hits"]
        loss = torch.nn.functional.nll_loss(dx, good.to("hologram"))
        loss.backward()
        want = torch.nn.functional.nll_loss(x, good)
        torch.testing.assert_close(loss.cpu(), want)
    assert native.fast_stats()["hits"] >= hits + 2  # forward and backward served
    for bad in (5, -1, -101):
        target = good.clone()
        target[1] = bad
        with pytest.raises(IndexError, match="out of bounds"):
            torch.nn.functional.nll_loss(dx, target.to("hologram"))
    table = torch.randn(7, 3, generator=g)
    indices = torch.tensor([[0, 6], [3, 3]], dtype=index_dtype)
    dt = table.to("hologram")
    for _ in range(3):
        got = torch.nn.functional.embedding(indices.to("hologram"), dt)
        torch.testing.assert_close(got.cpu(), torch.nn.functional.embedding(indices, table))
    for bad in (7, -1):
        wrong = indices.clone()
        wrong[1, 0] = bad
        with pytest.raises(IndexError, match="index out of range"):
            torch.nn.functional.embedding(wrong.to("hologram"), dt)


@needs_native
def test_batch_norm_is_served_with_its_running_statistics_updated_in_place():
    """Batch norm in training launches one program into its three fresh results and over
    the running statistics (arguments, written in place): served from then on, each call
    returns fresh results and updates the running tensors as the CPU's does."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 6, 5, 5, generator=g, dtype=torch.float64)
    w, b = torch.randn(6, generator=g, dtype=torch.float64), torch.randn(6, generator=g,
                                                                          dtype=torch.float64)
    stats = [torch.zeros(6, dtype=torch.float64), torch.ones(6, dtype=torch.float64)]
    dx, dw, db = _on_device(x, w, b)
    dstats = _on_device(*stats)
    for i in range(4):
        want = torch.ops.aten.native_batch_norm(x, w, b, *stats, True, 0.1, 1e-5)
        misses = native.fast_stats()["misses"]
        got = torch.ops.aten.native_batch_norm(dx, dw, db, *dstats, True, 0.1, 1e-5)
        assert native.fast_stats()["misses"] == misses + (i == 0)  # served after the first
        assert len({t.data_ptr() for t in got}) == 3
        for a, e in zip(got, want):
            torch.testing.assert_close(a.cpu(), e)
        for a, e in zip(dstats, stats):
            torch.testing.assert_close(a.cpu(), e)


@needs_native
@pytest.mark.parametrize("case", ["layer_norm", "batch_norm"])
def test_a_call_whose_results_are_not_all_launched_is_served_with_none(case):
    """layer_norm_backward without a weight gradient (and batch norm's without an input
    gradient, a first layer's) returns None in its place: its launch made two results of
    three, and the front kernel serves the call with None there, as the Python kernel
    returns."""
    x, w, b = (torch.randn(s, dtype=torch.float64) for s in ((8, 12), (12,), (12,)))
    if case == "layer_norm":
        mask = (True, False, True)
        out, mean, rstd = torch.ops.aten.native_layer_norm(x, [12], w, b, 1e-5)
        args = (out.sin(), x, mean, rstd, w, b)

        def backward(g, x, mean, rstd, w, b):
            return torch.ops.aten.native_layer_norm_backward(g, x, [12], mean, rstd, w, b,
                                                             list(mask))
    else:
        mask = (False, True, True)
        x = x.reshape(2, 4, 3, 4)
        out, mean, invstd = torch.ops.aten.native_batch_norm(x, w[:4], b[:4], None, None,
                                                             True, 0.1, 1e-5)
        args = (out.sin(), x, mean, invstd, w[:4])

        def backward(g, x, mean, invstd, w):
            return torch.ops.aten.native_batch_norm_backward(g, x, w, None, None, mean, invstd,
                                                             True, 1e-5, list(mask))
    expected = backward(*args)
    on_device = _on_device(*args)
    backward(*on_device)
    for _ in range(3):
        misses = native.fast_stats()["misses"]
        got = backward(*on_device)
        assert native.fast_stats()["misses"] == misses  # served
        for g, e, wanted in zip(got, expected, mask):
            assert (g is not None) == wanted
            if wanted:
                torch.testing.assert_close(g.cpu(), e)


@needs_native
def test_front_kernels_write_in_place_and_refuse_partial_overlaps():
    a, b = torch.randn(64), torch.randn(64)
    x, y = _on_device(a, b)
    _served(torch.Tensor.add_, x, y)
    torch.testing.assert_close(x.cpu(), a + 2 * b)
    _served(torch.Tensor.mul_, x, x)  # the same tensor twice: element for element
    torch.testing.assert_close(x.cpu(), (a + 2 * b) ** 4)  # squared twice
    # Two views of one storage with the filed key's layout, overlapping by one element:
    # the Python kernel decides, which raises PyTorch's error as the CPU does.
    base = torch.randn(65, device="hologram")
    with pytest.raises(RuntimeError, match="memory location") as device_error:
        base[1:].add_(base[:-1])
    on_cpu = base.cpu()
    with pytest.raises(RuntimeError, match="memory location") as cpu_error:
        on_cpu[1:].add_(on_cpu[:-1])
    assert str(device_error.value).split("\n")[0] == str(cpu_error.value).split("\n")[0]


@needs_native
def test_front_kernel_results_train_and_free_their_memory():
    w_cpu = torch.randn(32, requires_grad=True)
    x_cpu = torch.randn(32)
    w = w_cpu.detach().to("hologram").requires_grad_()
    x = x_cpu.to("hologram")
    for _ in range(3):  # filed on the first pass, served after
        loss = torch.relu(w * x + 1).sum()
        loss.backward()
    loss_cpu = torch.relu(w_cpu * x_cpu + 1).sum()
    for _ in range(3):
        loss_cpu.backward(retain_graph=True)
    torch.testing.assert_close(loss.cpu(), loss_cpu.detach())
    torch.testing.assert_close(w.grad.cpu(), w_cpu.grad)
    torch.hologram.synchronize()
    before = torch.hologram.memory_allocated()
    results = [_served(torch.add, x, x) for _ in range(4)]
    assert torch.hologram.memory_allocated() > before
    del results
    assert torch.hologram.memory_allocated() == before


@needs_native
def test_front_kernels_at_the_memory_limit_raise_pytorchs_error():
    """A served signature whose result the pool refuses (its limit) goes to the Python
    kernel, which raises PyTorch's OutOfMemoryError (Hologram's too); nothing is launched
    or kept."""
    from hologram.errors import OutOfMemoryError
    from hologram_torch import memory

    a = torch.randn(4096, device="hologram")
    _served(torch.neg, a)
    torch.hologram.synchronize()
    before = torch.hologram.memory_allocated()
    memory.pool().set_memory_limit(before + 1024)
    try:
        misses = native.fast_stats()["misses"]
        with pytest.raises(torch.OutOfMemoryError, match="hologram:0 is out of memory") as e:
            torch.neg(a)
        assert isinstance(e.value, OutOfMemoryError) and "memory limit" in str(e.value)
        assert native.fast_stats()["misses"] == misses + 1
        assert torch.hologram.memory_allocated() == before
    finally:
        memory.pool().set_memory_limit(None)
    torch.testing.assert_close(_served(torch.neg, a).cpu(), -a.cpu())


@needs_native
def test_front_kernels_raise_pytorchs_errors_and_forget_a_previous_backend():
    ints = torch.arange(6, device="hologram")
    with pytest.raises(RuntimeError, match="alpha"):  # the Python kernel's CPU fallback
        torch.add(ints, ints, alpha=0.5)
    a = torch.randn(100, device="hologram")
    _served(torch.neg, a)
    assert native.fast_stats()["entries"] > 0
    try:
        hologram_torch.set_backend("interp")
        assert native.fast_stats()["entries"] == 0
        torch.testing.assert_close(torch.neg(a).cpu(), -a.cpu())
    finally:
        hologram_torch.set_backend("cpu")


@needs_native
def test_front_kernels_from_several_threads():
    tensors = [torch.randn(257) for _ in range(4)]
    on_device = _on_device(*tensors)

    def work(i):
        for _ in range(200):
            got = on_device[i] * on_device[(i + 1) % 4] + 1
            torch.testing.assert_close(got.cpu(), tensors[i] * tensors[(i + 1) % 4] + 1)

    errors = errors_in_threads(work, 4)
    assert not errors, errors


@needs_native
def test_views_are_served_from_native_code():
    """Metadata-only ops (views, set_) are the CPU's kernels called from csrc/ops.cpp
    (unboxed for the commonest views, redispatched for the rest), not from Python; their
    results view the device memory as before."""
    for op in ("aten::view", "aten::as_strided", "aten::_reshape_alias", "aten::alias",
               "aten::_unsafe_view", "aten::unfold", "aten::set_.source_Storage"):
        table = torch._C._dispatch_dump(op)
        assert any(line.startswith("PrivateUse1") and "ops.cpp" in line
                   for line in table.splitlines()), table
    x = torch.zeros(3, 4, device="hologram")
    v = x.t()
    assert v._base is x and v.device.type == "hologram" and v.stride() == (1, 4)
    x.view(12)[5] = -1.0
    assert v[1, 1].item() == -1.0
    y = torch.arange(24.0)
    for fn in (lambda t: t.as_strided((3, 2), (1, 5), 4), lambda t: t.unfold(0, 5, 3),
               lambda t: torch.ops.aten._unsafe_view(t, [4, 6]),
               lambda t: torch.ops.aten._reshape_alias(t, [6, 4], [4, 1]).t()):
        got = fn(y.to("hologram"))
        assert got.device.type == "hologram" and got.stride() == fn(y).stride()
        torch.testing.assert_close(got.cpu(), fn(y))


@needs_native
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "channels_last", "sliced"])
@pytest.mark.parametrize("memory_format", [None, torch.contiguous_format, torch.channels_last,
                                           torch.preserve_format])
def test_clones_are_served_natively_with_the_cpus_layout(layout, memory_format):
    """clone keeps the layout PyTorch gives (empty_like, or the format asked for) on every
    call, including those the front kernel serves, and never shares memory."""
    base = torch.randn(2, 3, 4, 6)
    ref = {"contiguous": base, "transposed": base.transpose(1, 3),
           "channels_last": base.contiguous(memory_format=torch.channels_last),
           "sliced": base[:, :, :, ::2]}[layout]
    x = ref.to("hologram") if layout != "sliced" else base.to("hologram")[:, :, :, ::2]
    kwargs = {} if memory_format is None else {"memory_format": memory_format}
    expected = ref.clone(**kwargs)
    before = native.fast_stats()["hits"]
    for _ in range(3):
        got = x.clone(**kwargs)
        assert got.stride() == expected.stride() and got.data_ptr() != x.data_ptr()
        assert torch.equal(got.cpu(), expected)
    if memory_format in (None, torch.preserve_format):
        assert native.fast_stats()["hits"] >= before + 2  # served without Python
