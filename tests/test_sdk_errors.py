"""Bad input to the SDK: every case raises a HologramError subclass whose message names the
operation, the shapes and dtypes involved, and what to do; NaN-producing inputs follow IEEE;
nothing a user passes crashes the process."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import hologram as hg
from hologram.errors import (
    DeviceError,
    DTypeError,
    HologramError,
    InvalidBufferError,
    OutOfMemoryError,
    ShapeError,
)

ops = hg.ops
# Words with which a message tells the user what to do.
FIX = re.compile(r"\b(pass|use|allocate|reshape|give|convert|copy|create|free|raise|wrap|"
                 r"make|cast)\b", re.IGNORECASE)


def explains(info, cls, op: str, *parts: str) -> str:
    """Check the raised error: its class, and a message naming ``op``, every one of
    ``parts`` and a fix."""
    assert isinstance(info.value, cls), type(info.value)
    assert isinstance(info.value, HologramError)
    message = str(info.value)
    assert op in message, message
    for part in parts:
        assert part in message, (part, message)
    assert FIX.search(message), f"no fix suggested: {message}"
    return message


@pytest.fixture
def ex():
    with hg.Executor("cpu") as e:
        yield e


def f32(ex, *shape):
    return ex.from_numpy(np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape))


# --- shapes ------------------------------------------------------------------------------

def test_out_shape_mismatch(ex):
    a = f32(ex, 8)
    with pytest.raises(ShapeError) as info:
        ops.vector_add(ex, a, a, ex.allocate((3, 3)))
    explains(info, ShapeError, "vector_add", "[3, 3]", "[8]", "float32")


def test_elementwise_shape_mismatch_names_op_shapes_and_dtypes(ex):
    with pytest.raises(HologramError) as info:
        ops.vector_add(ex, f32(ex, 8), f32(ex, 7), ex.allocate(8))
    message = str(info.value)
    assert "vector_add" in message and "[8]" in message and "[7]" in message
    assert "float32" in message


def test_non_broadcastable_shapes_name_op_shapes_and_dtypes(ex):
    with pytest.raises(HologramError) as info:
        ops.vector_mul(f32(ex, 3, 4), f32(ex, 2, 4))
    message = str(info.value)
    assert "vector_mul" in message and "[3, 4]" in message and "[2, 4]" in message
    assert "float32" in message


def test_non_broadcastable_shapes_are_shape_errors_with_a_fix(ex):
    with pytest.raises(ShapeError) as info:
        ops.vector_mul(f32(ex, 3, 4), f32(ex, 2, 4))
    explains(info, ShapeError, "vector_mul", "[3, 4]", "[2, 4]", "float32")


def test_n_larger_than_the_buffers(ex):
    a, small = f32(ex, 8), f32(ex, 4)
    with pytest.raises(ShapeError) as info:
        ops.vector_add(ex, a, a, a, 9)
    explains(info, ShapeError, "vector_add", "n=9", "[8]")
    with pytest.raises(ShapeError) as info:
        ops.vector_add(ex, a, small, a, n=6)
    explains(info, ShapeError, "vector_add", "n=6", "[4]")
    with pytest.raises(ShapeError) as info:
        ops.vector_add(ex, a, a, a, 10**30)
    assert "vector_add" in str(info.value)
    for bad in (-1, "3", 2.5, [1]):
        with pytest.raises(ShapeError, match="vector_add: n"):
            ops.vector_add(ex, a, a, a, bad)


def test_gemm_dims_inconsistent_with_buffers(ex):
    a, b, c = f32(ex, 4, 4), f32(ex, 4, 4), ex.allocate((4, 4))
    with pytest.raises(ShapeError) as info:
        ops.gemm(ex, a, b, c, 4, 4, 5)
    explains(info, ShapeError, "gemm", "[4, 4]", "[4, 5]")
    with pytest.raises(ShapeError) as info:
        ops.gemm(ex, a, b, c, 10**6, 4, 4)
    explains(info, ShapeError, "gemm", "[4, 4]")
    with pytest.raises(ShapeError) as info:
        ops.gemm(ex, a, b, ex.allocate((2, 2)), 4, 4, 4)
    explains(info, ShapeError, "gemm", "[2, 2]", "[4, 4]")
    with pytest.raises(ShapeError, match="gemm"):
        ops.gemm(ex, a, b, c, -1, 4, 4)
    with pytest.raises(ShapeError, match="gemm"):
        ops.gemm(f32(ex, 8), f32(ex, 8))  # 1-D: the dims are needed


@pytest.mark.parametrize("shape", [-1, (4, -2), (-1,)])
def test_negative_sizes(ex, shape):
    for make in (ex.allocate, ex.empty):
        with pytest.raises(ShapeError) as info:
            make(shape)
        explains(info, ShapeError, "allocate", "negative")


@pytest.mark.parametrize("shape", [10**20, (10**10, 10**10), 2**62, (1 << 30, 1 << 30, 4)])
def test_absurd_sizes(ex, shape):
    with pytest.raises(OutOfMemoryError) as info:
        ex.allocate(shape)
    explains(info, OutOfMemoryError, "allocate", "float32", "bytes")
    assert ex.memory_stats()["allocated_bytes"] == 0


@pytest.mark.parametrize("shape", [1.5, "abc", None, [1, 2.5], object(), (1,) * 65])
def test_shapes_that_are_not_shapes(ex, shape):
    with pytest.raises(ShapeError, match="allocate"):
        ex.allocate(shape)


# --- dtypes ------------------------------------------------------------------------------

def test_float_result_into_int_out(ex):
    a, ints = f32(ex, 8), ex.allocate(8, dtype=np.int32)
    with pytest.raises(DTypeError) as info:
        ops.vector_add(ex, a, a, ints)
    explains(info, DTypeError, "vector_add", "float32", "int32", "[8]")
    with pytest.raises(DTypeError) as info:
        ops.vector_div(ex, ints, ints, ints)  # true division of ints is float32
    explains(info, DTypeError, "vector_div", "float32", "int32")
    with pytest.raises(DTypeError) as info:
        ops.exp(ex, ints, ints)
    explains(info, DTypeError, "exp", "float32", "int32")


@pytest.mark.parametrize("dtype", [np.complex64, np.uint16, object, "U4", "nonsense"])
def test_unsupported_dtypes_name_the_supported_ones(ex, dtype):
    with pytest.raises(DTypeError) as info:
        ex.allocate(4, dtype=dtype)
    explains(info, DTypeError, "allocate", "float32", "int64", "supported")


def test_scalar_that_does_not_fit(ex):
    small = ex.allocate(3, dtype=np.int8)
    with pytest.raises(DTypeError) as info:
        small.fill(1000)
    assert "fill" in str(info.value) and "int8" in str(info.value)
    with pytest.raises(DTypeError) as info:
        small.fill(float("nan"))
    assert "fill" in str(info.value)
    with pytest.raises(DTypeError) as info:
        ops.vector_add(small, 10**30)
    assert "int8" in str(info.value)


def test_scalar_that_does_not_fit_names_the_op(ex):
    with pytest.raises(DTypeError) as info:
        ops.vector_add(ex.allocate(3, dtype=np.int8), 10**30)
    explains(info, DTypeError, "vector_add", "int8")


# --- wrong kinds of values ---------------------------------------------------------------

@pytest.mark.parametrize("value", ["abc", None, [1, 2], {1: 2}, object(), 1j, b"x"])
def test_non_numeric_python_objects(ex, value):
    a = f32(ex, 4)
    with pytest.raises(DTypeError) as info:
        ops.vector_add(a, value)
    message = str(info.value)
    assert "vector_add" in message and type(value).__name__ in message and "Buffer" in message
    with pytest.raises(DTypeError, match="exp"):
        ops.exp(value)
    with pytest.raises(DTypeError, match="fill"):
        a.fill(value)


def test_non_numeric_python_objects_suggest_a_fix(ex):
    with pytest.raises(DTypeError) as info:
        ops.vector_add(f32(ex, 4), "abc")
    explains(info, DTypeError, "vector_add", "str")


@pytest.mark.parametrize("call", ["out", "fill"])
def test_numpy_array_as_buffer_argument_suggests_a_fix(ex, call):
    a, x = f32(ex, 4), np.ones(4, np.float32)
    op = "vector_add" if call == "out" else "fill"
    with pytest.raises(DTypeError) as info:
        ops.vector_add(ex, a, a, x) if call == "out" else ops.fill(x, 1.0)
    explains(info, DTypeError, op, "ndarray")


def test_numpy_arrays_where_buffers_are_expected(ex):
    import torch

    a, x = f32(ex, 4), np.ones(4, np.float32)
    for call, op in ((lambda: ops.vector_add(a, x), "vector_add"),
                     (lambda: ops.vector_add(x, x), "vector_add"),
                     (lambda: ops.exp(x), "exp"),
                     (lambda: ops.sum(x), "sum"),
                     (lambda: ops.gemm(x.reshape(2, 2), x.reshape(2, 2)), "gemm"),
                     (lambda: a.copy_from(x), "copy"),
                     (lambda: ops.vector_add(a, torch.ones(4)), "vector_add")):
        with pytest.raises(DTypeError) as info:
            call()
        message = explains(info, DTypeError, op)
        assert "ndarray" in message or "Tensor" in message


def test_unknown_backend():
    with pytest.raises(DeviceError) as info:
        hg.Executor(backend="tpu")
    explains(info, DeviceError, "tpu", "cpu", "interp")
    with pytest.raises(DeviceError) as info:
        hg.Executor(backend="cuda")
    explains(info, DeviceError, "cuda", "cpu", "interp")


def test_bad_array_likes_for_from_numpy(ex):
    for data in ([[1], [1, 2]], [object()], ["a", "b"], [2**80]):
        with pytest.raises(DTypeError) as info:
            ex.from_numpy(data)
        explains(info, DTypeError, "from_numpy")
    buf = ex.allocate(2)
    with pytest.raises(DTypeError, match="from_numpy"):
        buf.from_numpy([[1], [1, 2]])


def test_use_after_free_and_close_messages(ex):
    buf = f32(ex, 4)
    buf.free()
    with pytest.raises(InvalidBufferError) as info:
        ops.vector_add(buf, 1.0)
    explains(info, InvalidBufferError, "vector_add", "[4]", "float32", "free()")
    other = hg.Executor("cpu")
    b = other.allocate(4)
    other.close()
    with pytest.raises(InvalidBufferError) as info:
        b.to_numpy()
    explains(info, InvalidBufferError, "to_numpy", "[4]", "closed")


# --- IEEE results, not errors ------------------------------------------------------------

def test_nan_producing_inputs_follow_ieee(ex):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x = ex.from_numpy(np.array([-1.0, 0.0, 4.0], np.float32))
        log = ops.log(x).to_numpy()
        assert np.isnan(log[0]) and log[1] == -np.inf and log[2] == pytest.approx(np.log(4))
        sq = ops.sqrt(x).to_numpy()
        assert np.isnan(sq[0]) and sq[1] == 0 and sq[2] == 2
        zeros = ex.allocate(3)
        assert np.isnan(ops.vector_div(zeros, zeros).to_numpy()).all()
        q = ops.vector_div(x, zeros).to_numpy()
        assert q[0] == -np.inf and np.isnan(q[1]) and q[2] == np.inf
        ints = ex.allocate(2, dtype=np.int32)
        assert np.isnan(ops.vector_div(ints, ints).to_numpy()).all()
        f64 = ex.from_numpy(np.array([-1.0], np.float64))
        assert np.isnan(ops.sqrt(f64).to_numpy()).all()
        assert np.isnan(ops.log(f64).to_numpy()).all()


# --- nothing crashes the process ---------------------------------------------------------

HOSTILE = textwrap.dedent("""
    import gc, sys
    import numpy as np
    import torch
    import hologram as hg
    from hologram.errors import HologramError

    ops = hg.ops
    unexpected = []

    def attempt(name, fn):
        try:
            fn()
        except HologramError:
            pass
        except Exception as exc:  # a non-Hologram error is a finding, not a crash
            unexpected.append(f"{name}: {type(exc).__name__}: {exc}")

    ex = hg.Executor("cpu")
    a = ex.from_numpy(np.arange(16, dtype=np.float32))
    m = ex.from_numpy(np.ones((4, 4), np.float32))
    zero, zero2 = ex.allocate(0), ex.allocate((0, 3))

    # freed buffers, after the fast path has seen them
    freed = ex.allocate(16)
    for _ in range(3):
        ops.vector_add(ex, a, a, freed)
    view = freed.to_numpy()
    freed.free()
    for name, fn in [
        ("add freed", lambda: ops.vector_add(ex, a, a, freed)),
        ("add freed in", lambda: ops.vector_add(ex, freed, a, a)),
        ("exp freed", lambda: ops.exp(ex, freed, a)),
        ("sum freed", lambda: ops.sum(freed)),
        ("gemm freed", lambda: ops.gemm(freed, freed, m=4, n=4, k=4)),
        ("softmax freed", lambda: ops.softmax(freed)),
        ("fill freed", lambda: freed.fill(1)),
        ("numpy freed", lambda: np.from_dlpack(freed)),
        ("torch freed", lambda: torch.from_dlpack(freed)),
        ("reshape freed", lambda: freed.reshape(4, 4)),
        ("dlpack freed", lambda: hg.from_dlpack(freed)),
    ]:
        attempt(name, fn)
    view += 1  # views outlive free()

    # closed executors
    ex2 = hg.Executor("interp")
    c = ex2.allocate(16)
    r = c.reshape(4, 4)
    for _ in range(2):
        ops.vector_add(ex2, c, c, c)
    ex2.close()
    for name, fn in [
        ("closed add", lambda: ops.vector_add(ex2, c, c, c)),
        ("closed view", lambda: ops.vector_add(r, r)),
        ("closed alloc", lambda: ex2.allocate(4)),
        ("closed dlpack", lambda: ex2.from_dlpack(np.ones(3))),
        ("closed mix", lambda: ops.vector_add(a, c)),
        ("mixed", lambda: ops.vector_add(ex, a, a, ex2)),
    ]:
        attempt(name, fn)

    # huge and bad sizes
    for shape in (10**20, -1, 2**62, (10**10, 10**10), (1,) * 100, 1.5, "x", None,
                  (1 << 44,)):
        attempt(f"allocate {shape!r:.30}", lambda s=shape: ex.allocate(s, dtype=np.int8))
    for n in (10**30, -1, 17, "x", 2.5, True):
        attempt(f"n={n!r}", lambda n=n: ops.vector_add(ex, a, a, a, n))
    for dims in ((10**6, 4, 4), (4, 4, 5), (-1, 4, 4), (2**40, 2**40, 2**40), ("a", 1, 1)):
        attempt(f"gemm {dims}", lambda d=dims: ops.gemm(ex, m, m, m, *d))
    attempt("limit", lambda: hg.Executor(memory_limit=-5))
    attempt("limit str", lambda: hg.Executor(memory_limit="lots"))

    # wrong types
    for value in ("abc", None, [1, 2], object(), 1j, np.ones(16), torch.ones(16), ex,
                  10**40, float("nan"), b"bytes", {"a": 1}):
        attempt(f"add {type(value).__name__}", lambda v=value: ops.vector_add(a, v))
        attempt(f"add out {type(value).__name__}",
                lambda v=value: ops.vector_add(ex, a, a, v))
        attempt(f"fill {type(value).__name__}", lambda v=value: a.fill(v))
        attempt(f"exp {type(value).__name__}", lambda v=value: ops.exp(v))
        attempt(f"from_numpy {type(value).__name__}", lambda v=value: ex.from_numpy(v))
        attempt(f"buf.from_numpy {type(value).__name__}", lambda v=value: a.from_numpy(v))
        attempt(f"backend {type(value).__name__}", lambda v=value: hg.Executor(v))
        attempt(f"dtype {type(value).__name__}", lambda v=value: ex.allocate(3, dtype=v))
        attempt(f"reshape {type(value).__name__}", lambda v=value: a.reshape(v))

    # from_dlpack of weird objects
    class Raises:
        def __dlpack__(self, **kw):
            raise ZeroDivisionError("producer bug")
        def __dlpack_device__(self):
            return (1, 0)

    class NotACapsule:
        def __dlpack__(self, **kw):
            return 42
        def __dlpack_device__(self):
            return (1, 0)

    ro = np.ones(8, np.float32)
    ro.flags.writeable = False
    for obj in (None, 1, "s", [1.0], object(), Raises(), NotACapsule(),
                np.ones((4, 4)).T, np.arange(5.0)[::-1], np.ones(3, complex),
                np.ones(0), np.float32(1), torch.ones(3, requires_grad=True),
                torch.ones(3, dtype=torch.bfloat16), torch.empty(3, device="meta"),
                torch.eye(3).to_sparse(), torch.ones(4, 4).T, ro):
        attempt(f"from_dlpack {type(obj).__name__}", lambda o=obj: hg.from_dlpack(o))
    rob = ex.from_dlpack(ro)
    for _ in range(2):
        ops.vector_add(ex, ex.allocate(8), ex.allocate(8),
                       ex.from_dlpack(np.zeros(8, np.float32)))
    attempt("write read-only", lambda: ops.vector_add(ex, rob, rob, rob))
    attempt("fill read-only", lambda: rob.fill(0))
    assert (ro == 1).all(), "a read-only array was written"

    # buffers of size 0
    for name, fn in [
        ("add0", lambda: ops.vector_add(zero, zero)),
        ("add0 out", lambda: ops.vector_add(ex, zero, zero, zero)),
        ("exp0", lambda: ops.exp(zero2)),
        ("sum0", lambda: ops.sum(zero)),
        ("max0", lambda: ops.max(zero)),
        ("mean0", lambda: ops.mean(zero2, dim=1)),
        ("softmax0", lambda: ops.softmax(zero2)),
        ("gemm0", lambda: ops.gemm(ex.allocate((0, 3)), ex.allocate((3, 0)))),
        ("gemm k0", lambda: ops.gemm(ex.allocate((2, 0)), ex.allocate((0, 2)))),
        ("matvec0", lambda: ops.matvec(zero2, ex.allocate(3))),
        ("fill0", lambda: zero.fill(1)),
        ("copy0", lambda: zero.copy_from(zero)),
        ("mse0", lambda: ops.mse_loss(zero, zero)),
        ("numpy0", lambda: np.from_dlpack(zero)),
        ("torch0", lambda: torch.from_dlpack(zero2)),
        ("dlpack0", lambda: hg.from_dlpack(torch.ones(0))),
        ("n0", lambda: ops.vector_add(ex, a, a, a, 0)),
        ("reshape0", lambda: zero.reshape(0, 5)),
        ("broadcast0", lambda: ops.vector_add(zero2, ex.allocate(3))),
    ]:
        attempt(name, fn)
    ex.close()
    del view
    gc.collect()
    print("UNEXPECTED", len(unexpected))
    for line in unexpected:
        print(line)
    print("DONE")
""")


def test_hostile_calls_do_not_crash_the_process(tmp_path):
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=str(tmp_path),
                          env={**__import__("os").environ,
                               "PYTHONPATH": str(__import__("pathlib").Path(__file__)
                                                 .resolve().parents[1])})
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.rstrip().endswith("DONE"), proc.stdout + proc.stderr
    assert "UNEXPECTED 0" in proc.stdout, proc.stdout


# --- empty shapes with extents no array can address (issue 16, part 6) -------------------

@pytest.mark.parametrize("shape", [(2**62, 2**62, 0), (0, 2**62, 4), (2**60, 0)])
def test_empty_shapes_with_unaddressable_extents(ex, shape):
    for make in (ex.allocate, ex.empty):
        with pytest.raises(ShapeError) as info:
            make(shape)
        explains(info, ShapeError, "allocate", str(list(shape)))
    empty = ex.allocate(0)
    with pytest.raises(ShapeError) as info:
        empty.reshape(shape)
    explains(info, ShapeError, "reshape", str(list(shape)))
    assert ex.memory_stats()["allocated_bytes"] == 0


def test_torch_refuses_unaddressable_empty_shapes_too():
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError, match="overflow"):
        torch.empty(2**62, 2**62, 0)


@pytest.mark.parametrize("backend", hg.backend.list_available_backends())
def test_empty_shapes_with_large_extents_work(backend):
    with hg.Executor(backend) as ex:
        wide = ex.allocate((2**60 - 1, 0))  # the largest extents an empty buffer may have
        tall = ex.allocate((0, 2**60 - 1))
        assert wide.size == 0 and wide.nbytes == 0
        assert ops.vector_add(wide, wide).shape == (2**60 - 1, 0)
        assert float(ops.sum(wide).to_numpy()) == 0.0
        assert ops.sum(tall, dim=1).shape == (0,)
        assert ops.softmax(wide).shape == (2**60 - 1, 0)
        assert ex.allocate(0).reshape(2**60 - 1, 0).shape == (2**60 - 1, 0)
