"""The webgpu backend on a real WebGPU adapter (Mesa's lavapipe in CI): the SDK, hg.jit,
hologram.compile and hologram.build, narrow dtypes packed in words, grids folded past
65535 workgroups, caching, memory, and the errors. The backend-conformance suite
(tests/conformance) checks every declared (op, dtype) against the interpreter.

Where no adapter exists these tests skip, except with ``HOLOGRAM_REQUIRE_WEBGPU=1``
(set by .ci/run): CI must run them, so there they fail instead."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conformance.numerics import ulp_distance

import hologram
import hologram as hg
from hologram import backends
from hologram.backends.webgpu import backend as webgpu_backend
from hologram.backends.webgpu import device as devices
from hologram.backends.webgpu import memory
from hologram.backends.webgpu.backend import WebGpuBackend
from hologram.backends.webgpu.render import (
    EMULATED_LOOP_LIMIT,
    GROUP_POINTS,
    MAX_GROUPS,
    WORKGROUP,
    render,
)
from hologram.compiler import pipeline
from hologram.errors import CompileError, DeviceError, DTypeError, OutOfMemoryError, ShapeError
from hologram.frontend.graph import Graph
from hologram.isa import dtypes as dt
from hologram.isa.builder import ProgramBuilder

REQUIRED = os.environ.get("HOLOGRAM_REQUIRE_WEBGPU", "") not in ("", "0")
AVAILABLE = WebGpuBackend.is_available()


def test_an_adapter_is_found_where_ci_requires_one():
    if not REQUIRED and not AVAILABLE:
        pytest.skip("no WebGPU adapter (apt-get install mesa-vulkan-drivers libvulkan1); "
                    "set HOLOGRAM_REQUIRE_WEBGPU=1 to make this a failure")
    assert AVAILABLE, "HOLOGRAM_REQUIRE_WEBGPU=1 but wgpu finds no adapter"
    assert "webgpu" in backends.available()
    dev = devices.get("webgpu")
    print("webgpu adapter:", dev.summary)
    if not dev.is_hardware:  # lavapipe: by name only, and the GPU aliases are not offered
        assert backends.resolve("auto") != "webgpu"
        assert "vulkan" not in backends.available() and "metal" not in backends.available()
    assert hg.backend.is_metal_available() == (dev.info.get("backend_type") == "Metal"
                                               and dev.is_hardware)


pytestmark = pytest.mark.skipif(not AVAILABLE and not REQUIRED,
                                reason="no WebGPU adapter (apt-get install mesa-vulkan-drivers "
                                       "libvulkan1, or a GPU driver)")


@pytest.fixture(scope="module")
def ex():
    with hg.Executor("webgpu") as executor:
        yield executor


def rand(shape, dtype=np.float32, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 3).astype(dtype)


# --- the SDK -------------------------------------------------------------------------------
def test_buffers_are_device_memory_copied_in_and_out(ex):
    x = rand(37)
    a = ex.from_numpy(x)
    assert not a.host_visible and a.device == "webgpu"
    np.testing.assert_array_equal(a.to_numpy(), x)
    with pytest.raises(hologram.HologramError):
        a.array()  # no host view of device memory
    z = ex.allocate((3, 5), np.int32)
    np.testing.assert_array_equal(z.to_numpy(), np.zeros((3, 5), np.int32))


@pytest.mark.parametrize("n", [1, 5, 1000])
def test_sdk_ops_match_numpy(ex, n):
    x, y = rand(n, seed=1), rand(n, seed=2)
    a, b = ex.from_numpy(x), ex.from_numpy(y)
    np.testing.assert_array_equal(hg.ops.vector_add(a, b).to_numpy(), x + y)
    np.testing.assert_array_equal(hg.ops.vector_mul(a, b).to_numpy(), x * y)
    np.testing.assert_array_equal(hg.ops.vector_max(a, b).to_numpy(), np.maximum(x, y))
    np.testing.assert_array_equal(hg.ops.relu(a).to_numpy(), np.maximum(x, 0))
    np.testing.assert_allclose(hg.ops.exp(a).to_numpy(), np.exp(x), rtol=2e-7)
    np.testing.assert_allclose(hg.ops.tanh(a).to_numpy(), np.tanh(x), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(hg.ops.sum(a).to_numpy(), x.sum(dtype=np.float64), rtol=1e-6)
    assert hg.ops.max(a).to_numpy() == x.max()
    out = ex.empty(n)
    hg.ops.vector_sub(ex, a, b, out)  # the explicit form, into a given buffer
    np.testing.assert_array_equal(out.to_numpy(), x - y)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_pow_matches_the_cpu_backend_within_one_ulp(ex, dtype):
    """``a ** b`` and scalar exponents through the SDK (f32: exp2(y log2|x|) in double-f32
    words, without f64; f16: computed in f32, rounded once): negative bases with integer
    exponents, special values, results past overflow and underflow. NaN where the cpu
    backend gives NaN, within 1 ulp of its result elsewhere (tests/test_webgpu_ulp.py
    measures the error itself)."""
    rng = np.random.default_rng(5)
    info = np.finfo(dtype)
    decades = (np.log10(float(info.smallest_subnormal)), np.log10(float(info.max)))
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0, -2.0, 0.5, -3.0, 1e-40]
    x = np.concatenate([np.repeat(specials, len(specials)), rng.uniform(-20, 20, 500),
                        10.0 ** rng.uniform(*decades, 500)]).astype(dtype)
    y = np.concatenate([np.tile(specials, len(specials)), rng.integers(-30, 30, 500),
                        rng.uniform(-12, 12, 500)]).astype(dtype)
    with hg.Executor("cpu") as cpu:
        for op in (lambda a, b: a ** b, lambda a, b: a ** 3, lambda a, b: 0.5 ** a):
            got = op(ex.from_numpy(x), ex.from_numpy(y)).to_numpy()
            want = op(cpu.from_numpy(x), cpu.from_numpy(y)).to_numpy()
            assert got.dtype == want.dtype == dtype
            nan = np.isnan(want)
            assert np.array_equal(np.isnan(got), nan)
            t = dt.float32 if dtype is np.float32 else dt.float16
            ulps = ulp_distance(got[~nan], want[~nan], t)
            assert int(ulps.max()) <= 1, (x[~nan][ulps.argmax()], y[~nan][ulps.argmax()])


@pytest.mark.parametrize("m, n", [(33, 9), (80, 64)])
def test_matmul_softmax_and_row_reductions(ex, m, n):
    g = Graph("mm")
    g.output("y", g.input("a", "f32", (m, 70)) @ g.input("b", "f32", (70, n)))
    (kernel,) = hologram.build(g.program(), backend="webgpu").metadata["kernels"]
    assert kernel["mode"] == "tiled" and kernel["points"] == -(-m // 8) * -(-n // 8)
    x, w = rand((m, 70), seed=3), rand((70, n), seed=4)
    a, b = ex.from_numpy(x), ex.from_numpy(w)
    np.testing.assert_allclose(hg.ops.matmul(a, b).to_numpy(), x @ w, rtol=1e-5, atol=1e-4)
    s = hg.ops.softmax(a).to_numpy()
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(s, e / e.sum(1, keepdims=True), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(hg.ops.sum(a, dim=0).to_numpy(), x.sum(0), rtol=1e-5, atol=1e-5)
    rows = rand((GROUP_POINTS + 3, 5), seed=11)  # many rows: one invocation each, no tree
    np.testing.assert_allclose(hg.ops.sum(ex.from_numpy(rows), dim=1).to_numpy(), rows.sum(1),
                               rtol=1e-6, atol=1e-6)


def test_jit_fuses_and_runs_on_webgpu(ex):
    @hg.jit
    def f(a, b, c):
        return hg.ops.relu(a * b + c)

    x, y, z = rand(513, seed=5), rand(513, seed=6), rand(513, seed=7)
    got = f(ex.from_numpy(x), ex.from_numpy(y), ex.from_numpy(z))
    assert got.device == "webgpu"
    np.testing.assert_array_equal(got.to_numpy(), np.maximum(x * y + z, 0))


@pytest.mark.parametrize("rows", [6, GROUP_POINTS + 1])  # a workgroup tree; one invocation
def test_argmax_and_argmin_give_i64_first_indices(ex, rows):
    g = Graph("arg")
    x = g.input("x", "f32", (rows, 300))
    g.output("amax", g.reduce("argmax", x, 1))
    g.output("amin", g.reduce("argmin", x, 1))
    data = np.random.default_rng(12).integers(-3, 4, (rows, 300)).astype(np.float32)
    data[0, 7] = np.nan  # NaN wins both
    data[1, :] = 0.0
    data[1, 5] = -0.0  # -0.0 < +0.0
    compiled = hologram.compile(g.program(), backend="webgpu")
    buffers = [ex.from_numpy(data), ex.empty(rows, np.int64), ex.empty(rows, np.int64)]
    compiled.launch(tuple(b.handle for b in buffers))
    amax, amin = (b.to_numpy() for b in buffers[1:])
    want = np.argmax(data, 1), np.argmin(data, 1)  # NumPy: first index, NaN wins
    np.testing.assert_array_equal(amax, want[0])
    assert amin[0] == 7 and amin[1] == 5
    np.testing.assert_array_equal(amin[2:], want[1][2:])


def test_buffers_of_another_executor_do_not_mix(ex):
    with hg.Executor("cpu") as cpu:
        a = cpu.from_numpy(rand(4))
        with pytest.raises(hologram.HologramError):
            hg.ops.vector_add(ex, a, a, ex.empty(4))


# --- compile, build, launch ---------------------------------------------------------------
def softmax_program():
    g = Graph("softmax")
    x = g.input("x", "f32", (64, 100))
    e = g.unary("exp", x - g.max(x, 1, keepdim=True))
    g.output("y", e / g.sum(e, 1, keepdim=True))
    return g.program()


def test_build_gives_wgsl_without_a_device(monkeypatch):
    def no_device(*args, **kwargs):
        raise AssertionError("build opened a device")

    monkeypatch.setattr(devices, "get", no_device)
    artifact = hologram.build(softmax_program(), backend="webgpu")
    meta = artifact.metadata
    assert meta["format"] == webgpu_backend.FORMAT and meta["interpreted"] == []
    (kernel,) = meta["kernels"]
    assert "@compute @workgroup_size" in kernel["wgsl"] and "workgroupBarrier" in kernel["wgsl"]
    assert kernel["mode"] == "group" and kernel["dispatch"] == [64, 1, 1]


def test_compiled_programs_called_on_numpy_arrays_copy_in_and_out():
    """NumPy arrays are host memory: a call copies them to the device and the outputs back
    (fresh ones, or into given arrays), inputs unchanged, empty parameters included."""
    g = Graph("numpy_call")
    x, y = g.input("x", "f32", (5, 3)), g.input("y", "f32", (3,))
    empty = g.input("z", "f32", (0, 2))
    g.output("s", g.sum(x * y + 1.0, 1))
    g.output("d", x - y)
    g.output("e", empty * 2.0)
    program = g.program()
    on_gpu, on_cpu = (hologram.compile(program, backend=b) for b in ("webgpu", "cpu"))
    a, b, z = rand((5, 3), seed=1), rand(3, seed=2), np.empty((0, 2), np.float32)
    before = a.copy()
    want = on_cpu(a, b, z)
    got = on_gpu(a, b, z)
    for w, r in zip(want, got):
        assert r.shape == w.shape and r.dtype == w.dtype
        np.testing.assert_allclose(r, w, rtol=1e-6)
    np.testing.assert_array_equal(a, before)
    outs = (np.full(5, np.nan, np.float32), np.full((5, 3), np.nan, np.float32),
            np.empty((0, 2), np.float32))
    on_gpu(a, b, z, *outs)
    for w, r in zip(want, outs):
        np.testing.assert_allclose(r, w, rtol=1e-6)


def test_compile_launches_on_executor_buffers_and_caches_pipelines(ex):
    program = softmax_program()
    compiled = hologram.compile(program, backend="webgpu")
    x = rand((64, 100), seed=8)
    a, y = ex.from_numpy(x), ex.empty((64, 100))
    for _ in range(3):
        compiled.launch((a.handle, y.handle))
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(y.to_numpy(), e / e.sum(1, keepdims=True), rtol=1e-6)
    run = compiled.executable
    assert len(run.pipelines) == 1 and [len(g) for g in run.bind_groups] == [1]


def test_grids_beyond_65535_workgroups_are_folded(ex):
    n = MAX_GROUPS * WORKGROUP + 77  # elementwise: one invocation per element
    x = np.arange(n, dtype=np.int32)
    got = hg.ops.vector_add(ex.from_numpy(x), ex.from_numpy(x)).to_numpy()
    np.testing.assert_array_equal(got, 2 * x)
    rows = MAX_GROUPS * 2 + 10  # row sums: one invocation per row (many rows)
    m = np.random.default_rng(9).integers(-9, 9, (rows, 3)).astype(np.float32)
    np.testing.assert_array_equal(hg.ops.sum(ex.from_numpy(m), dim=1).to_numpy(), m.sum(1))


def test_loops_past_an_emulated_adapters_limit_are_refused_not_wrong(ex):
    """lavapipe silently ends an invocation's loops after 65,535 iterations in all (a sum of
    2^22 ones in one workgroup came back as 131,070): the renderer counts each kernel's
    iterations per invocation (each loop's trips and its last test), and on a
    CPU-emulated adapter a kernel over the limit is refused. Long reductions of few rows
    are split over workgroups (tests/test_webgpu_split.py); many long rows (one
    invocation each) are not, nor is a scatter's walk."""
    rows = GROUP_POINTS  # one invocation per row; the rows are broadcast, not stored
    for n in (EMULATED_LOOP_LIMIT - 1, EMULATED_LOOP_LIMIT):
        g = Graph(f"outer_{n}")
        a, b = g.input("a", "f32", (rows, 1)), g.input("b", "f32", (1, n))
        g.output("y", g.sum(a + b, 1))
        (shader,) = hologram.build(g.program(), backend="webgpu").metadata["kernels"]
        assert shader["mode"] == "thread" and shader["iterations"] == n + 1
        args = np.ones((rows, 1), np.float32), np.ones((1, n), np.float32)
        if devices.get("webgpu").is_hardware or n + 1 <= EMULATED_LOOP_LIMIT:
            got = hologram.compile(g.program(), backend="webgpu")(*args)
            np.testing.assert_array_equal(got, np.full(rows, 2 * n, np.float32))  # exact
        else:
            with pytest.raises(CompileError, match=r"65535 in all.*cpu backend"):
                hologram.compile(g.program(), backend="webgpu")(*args)
    g = Graph("rows")  # nested loops: their trips multiply
    g.output("y", g.sum(g.input("x", "f32", (3, 100, 200)), axes=(1, 2)))
    caps = webgpu_backend.WebGpuBackend().capabilities()
    program = pipeline.for_target(g.program(), caps)
    assert render(program, program.kernels[0], caps)[-1]["iterations"] >= \
        -(-100 * 200 // WORKGROUP)
    b = ProgramBuilder("long_scatter")  # one grid point's writes, in index order
    dst = b.buffer("dst", "f32", (10,), "inout")
    k = b.kernel((EMULATED_LOOP_LIMIT + 1,))
    k.scatter(dst, k.const(1.0, "f32"), k.index(0, "i32"), "add")
    with pytest.raises(CompileError, match="more than the 65535"):
        hologram.compile(b.build(), backend="webgpu")


# --- dtypes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint8, np.int16, np.float16])
def test_narrow_dtypes_are_packed_without_clobbering_neighbours(ex, dtype):
    n = 1003  # not a whole number of words
    rng = np.random.default_rng(10)
    x = rng.integers(0, 2, n).astype(dtype) if dtype is np.bool_ else \
        (rng.standard_normal(n) * 50).astype(dtype)
    a = ex.from_numpy(x)
    np.testing.assert_array_equal(a.to_numpy(), x)
    b = ex.from_numpy(x[::-1].copy())
    got = hg.ops.vector_max(a, b).to_numpy()
    np.testing.assert_array_equal(got, np.maximum(x, x[::-1]))


@pytest.mark.parametrize("dtype", ["f16", "i8", "f32"])
def test_gathers_run_in_the_thread_and_group_modes(dtype):
    """Embedding lookups from packed narrow tables (one invocation per element, the
    epilogue fused) and sums of gathered rows (a workgroup per row): the scheduled
    kernels a front end builds, ids past both ends included, against the interpreter
    (the conformance suite's gathers are single-kernel programs)."""
    rng = np.random.default_rng(12)
    storage = dt.dtype(dtype).storage
    # Whole numbers: every row sum is exact, so any order of addition gives its bits.
    table = np.round(rng.standard_normal((1000, 96)) * 20).astype(storage)
    ids = rng.integers(-1000, 1000, 512).astype(np.int64)
    ids[:4] = [-2**40, 2**40, -1001, 1000]  # beyond the rows: clamped, still defined
    g = Graph(f"lookup_{dtype}")
    t, i = g.input("table", dtype, (1000, 96)), g.input("ids", "i64", (512,))
    rows = g.gather(t, (i.reshape(512, 1), 1), (512, 96))
    g.output("y", rows * g.input("scale", dtype, (96,)))
    g.output("s", g.sum(g.gather(t, (i[:8].reshape(8, 1), 1), (8, 96)), 1))
    program = g.program()
    modes = {k["mode"] for k in WebGpuBackend().describe(
        hologram.build(program, backend="webgpu").data)["kernels"]}
    assert {"thread", "group"} <= modes, modes
    scale = np.arange(96).astype(storage)
    got = hologram.compile(program, backend="webgpu")(table, ids, scale)
    want = hologram.compile(program, backend="interp")(table, ids, scale)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_unsupported_dtypes_raise_dtype_error_naming_backend_and_fix(ex):
    a = ex.from_numpy(np.arange(4, dtype=np.float64))
    with pytest.raises(DTypeError, match=r"(?s)'webgpu'.*f64.*(cast to f32|run it on)"):
        hg.ops.vector_add(a, a)


@pytest.mark.parametrize("op", ["div", "mod"])
def test_i64_division_and_remainder_match_the_interpreter_bit_for_bit(op):
    """i64 is two words on webgpu: C's quotient and remainder by a long division
    (bitlib.hg_divmod64), with the ISA's results at the edges (INT64_MIN / -1 wraps,
    x / 0 = 0, x % 0 = x) from the guards decompose puts around it; every pair of edge
    values, then random operands of every size."""
    rng = np.random.default_rng(3)
    edge = np.array([-2**63, 2**63 - 1, 0, 1, -1, 2, -2, 7, -7, 2**32, -2**32, 2**31,
                     -2**31 - 1, 2**32 - 1, 12345678901234, -98765432109876], np.int64)
    wide = rng.integers(-2**63, 2**63 - 1, 600, dtype=np.int64)
    a = np.concatenate([np.repeat(edge, len(edge)), wide, rng.integers(-999, 999, 600)])
    b = np.concatenate([np.tile(edge, len(edge)), wide[::-1] >> rng.integers(0, 63, 600),
                        rng.integers(-9, 9, 600)])
    g = Graph(f"i64_{op}")
    x, y = g.input("x", "i64", a.shape), g.input("y", "i64", b.shape)
    g.output("z", g.binary(op, x, y))
    program = g.program()
    got = hologram.compile(program, backend="webgpu")(a, b)
    np.testing.assert_array_equal(got, hologram.compile(program, backend="interp")(a, b))


def _updates(n: int, ring: bool):
    """One kernel updating n buffers in place from n others (a fused optimizer step over
    many parameters): p[i] -= 0.5 * g[i] + 0.25 * p[i + 1], each update reading its
    neighbour's old value (the last one's neighbour: p[0] in a ring, none otherwise)."""
    b = ProgramBuilder("ring" if ring else "chain")
    params = [b.buffer(f"p{i}", "f32", (16,), "inout") for i in range(n)]
    grads = [b.input(f"g{i}", "f32", (16,)) for i in range(n)]
    k = b.kernel((16,), grid_rank=1)
    loads = [k.load(p) for p in params]
    for i in range(n):
        step = k.mul(k.load(grads[i]), k.const(0.5, "f32"))
        if ring or i + 1 < n:
            step = k.add(step, k.mul(loads[(i + 1) % n], k.const(0.25, "f32")))
        k.store(params[i], k.sub(loads[i], step))
    return b.build()


def test_kernels_past_the_binding_limit_are_cut_by_their_stores_in_a_safe_order(monkeypatch):
    """24 buffers bound by one kernel, a limit of 8: cut into kernels of a few stores
    each, every buffer written only after each piece that reads it has run, so the
    results are the interpreter's, bit for bit. A ring of such reads (each piece would
    have to run first), or a single store needing more buffers than the limit, leaves
    the kernel whole."""
    from hologram.codegen import schedule

    program = _updates(12, ring=False)
    cut = schedule.fit_bindings(program, 8)
    assert len(cut.kernels) > 1 and all(len(x.reads() | x.writes()) <= 8 for x in cut.kernels)
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(16).astype(np.float32) for _ in range(24)]
    want = hologram.compile(program, backend="interp")(*[a.copy() for a in arrays])
    # an adapter allowing 10 storage buffers (8 left for a kernel's own): the backend cuts
    monkeypatch.setattr(WebGpuBackend, "binding_limit", lambda self: 10)
    kernels = WebGpuBackend().describe(WebGpuBackend().compile(program))["kernels"]
    assert len(kernels) > 1 and all(len(x["bindings"]) <= 8 for x in kernels)
    got = hologram.compile(program, backend="webgpu")(*[a.copy() for a in arrays])
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)
    ring = _updates(12, ring=True)
    assert schedule.fit_bindings(ring, 8) is ring
    one = ProgramBuilder("one_wide_store")
    ins = [one.input(f"x{i}", "f32", (4,)) for i in range(10)]
    out = one.output("y", "f32", (4,))
    k = one.kernel((4,), grid_rank=1)
    total = k.load(ins[0])
    for x in ins[1:]:
        total = k.add(total, k.load(x))
    k.store(out, total)
    wide = one.build()
    assert schedule.fit_bindings(wide, 8) is wide


def test_numbers_take_no_binding_of_their_own(monkeypatch):
    """A kernel reading 40 one-element buffers (a recorded optimizer step's learning rate,
    betas, bias corrections...) and 2 arrays under a limit of 10 bindings: the numbers of
    32 and 64 bits reach it through hg_n, copied there at each launch, so it stays one
    kernel of 2 bindings plus hg_n, and each launch sees its own values, even from
    offsets into larger allocations. A written one-element buffer, a gathered one or a
    narrow one keeps its own binding."""
    g = Graph("numbers")
    total = g.input("x", "f32", (8,))
    kinds = ["f32" if i % 4 else "i64" for i in range(40)]
    for i, kind in enumerate(kinds):
        s = g.input(f"s{i}", kind, ())
        total = total + (s if kind == "f32" else g.cast(s, "f32"))
    g.output("y", total + g.cast(g.input("tiny", "i8", ()), "f32"))
    program = pipeline.run(g.program())  # fused: one kernel
    assert len(program.kernels) == 1
    monkeypatch.setattr(WebGpuBackend, "binding_limit", lambda self: 10)
    backend = WebGpuBackend()
    [kernel] = backend.describe(backend.compile(program))["kernels"]
    assert kernel["packed"] and len(kernel["bindings"]) == 3  # x, tiny, y
    run = hologram.compile(program, backend="webgpu")
    rng = np.random.default_rng(11)
    for _ in range(2):
        args = [rng.standard_normal(8).astype(np.float32)]
        args += [np.array(rng.integers(-2**40, 2**40), np.int64) if kind == "i64" else
                 np.array(rng.standard_normal(), np.float32) for kind in kinds]
        args.append(np.array(-3, np.int8))
        want = hologram.compile(program, backend="interp")(*args)
        np.testing.assert_array_equal(run(*args), want)
    # numbers at offsets into one allocation (the torch device's 0-d views): each launch
    # copies the values its handles point at
    g = Graph("two_numbers")
    v, a, c = g.input("v", "f32", (4,)), g.input("a", "f32", ()), g.input("c", "f32", ())
    g.output("w", v * a + c)
    compiled = hg.compile(g.program(), "webgpu")
    alloc = memory.WebGpuAllocator()
    data, out = alloc.alloc((16,), np.float32), alloc.alloc((4,), np.float32)
    alloc.copy_in(data, np.arange(16, dtype=np.float32))
    got = np.empty(4, np.float32)
    for i, j in ((5, 9), (12, 3)):
        compiled.launch((alloc.handle(data), alloc.handle(data) + 4 * i,
                         alloc.handle(data) + 4 * j, alloc.handle(out)))
        alloc.copy_out(out, got)
        np.testing.assert_array_equal(got, np.arange(4, dtype=np.float32) * i + j)


def test_allocator_keeps_bytes_after_a_partial_word_and_reuses_blocks():
    alloc = memory.WebGpuAllocator()
    block = alloc.alloc((7,), np.uint8)
    alloc.copy_in(block, np.arange(7, dtype=np.uint8))
    alloc.copy_in(block, np.full(5, 9, np.uint8))  # the first 5 bytes only
    out = np.empty(7, np.uint8)
    alloc.copy_out(block, out)
    assert out.tolist() == [9, 9, 9, 9, 9, 5, 6]
    buffer = block.buffer
    del block
    again = alloc.alloc((7,), np.uint8)
    assert again.buffer is buffer and alloc.stats()["pool_hits"] == 1


def test_handles_are_byte_addresses_copies_and_launches_work_at_any_offset():
    """A handle plus a byte offset stands for that byte of the buffer: reads, writes and
    copies at unaligned handles keep the neighbouring bytes, and a launch on handles
    inside allocations reads and writes from there (the torch device's views)."""
    alloc = memory.WebGpuAllocator()
    block = alloc.alloc((64,), np.uint8)
    base = alloc.handle(block)
    assert base >> memory.SHIFT == block.id and memory.locate(base + 5) == (block.block, 5)
    alloc.write(base, np.arange(64, dtype=np.uint8))
    alloc.write(base + 3, np.full(6, 200, np.uint8))  # partial words at both ends
    out = np.empty(10, np.uint8)
    alloc.read(base + 1, out)
    assert out.tolist() == [1, 2, 200, 200, 200, 200, 200, 200, 9, 10]
    other = alloc.alloc((64,), np.uint8)
    alloc.copy(base + 41, base + 2, 5)  # unaligned, one buffer: through the host
    alloc.copy(alloc.handle(other) + 8, base + 12, 8)  # whole words: on the queue
    alloc.copy(base + 48, alloc.handle(other) + 8, 8)
    whole = np.empty(64, np.uint8)
    alloc.read(base, whole)
    assert whole[41:46].tolist() == [2, 200, 200, 200, 200]
    assert whole[48:56].tolist() == list(range(12, 20)) and whole[46] == 46
    with pytest.raises(ShapeError, match="not in a webgpu buffer"):
        memory.locate((block.id + 10**6) << memory.SHIFT)
    for dtype in ("f32", "i64", "i8", "bf16"):
        g = Graph(f"offsets_{dtype}")
        x = g.input("x", dtype, (5,))
        g.output("y", g.binary("add", x, x))
        compiled = hg.compile(g.program(), "webgpu")
        storage = dt.dtype(dtype).storage
        data = alloc.alloc((16,), storage)
        values = np.arange(16).astype(storage)
        alloc.copy_in(data, values)
        size = np.dtype(storage).itemsize
        compiled.launch((alloc.handle(data) + 3 * size, alloc.handle(data) + 9 * size))
        got = np.empty(16, storage)
        alloc.copy_out(data, got)
        want = values.copy()
        want[9:14] = values[3:8] + values[3:8]
        assert got.tobytes() == want.tobytes(), dtype


def test_buffers_past_the_storage_binding_limit_are_refused():
    alloc = memory.WebGpuAllocator()
    limit = alloc.dev.limits["max-storage-buffer-binding-size"]
    with pytest.raises(OutOfMemoryError, match="max-storage-buffer-binding-size"):
        alloc.alloc((limit // 4 + 1,), np.float32)


# --- errors ------------------------------------------------------------------------------------
def test_a_shader_the_driver_rejects_is_a_compile_error_with_source_and_log():
    b = ProgramBuilder("neg")
    x = b.input("x", "f32", (4,))
    y = b.output("y", "f32", (4,))
    k = b.kernel((4,))
    k.store(y, k.neg(k.load(x)))
    impl = backends.get("webgpu")
    artifact = impl.compile(b.build()).replace(b"bitcast<f32>", b"bitcast<f99>")
    with pytest.raises(CompileError) as info:
        impl.load(artifact)
    assert "f99" in info.value.source and info.value.log


def test_no_adapter_is_a_device_error_naming_what_to_install(monkeypatch):
    wgpu = devices.wgpu_module()
    monkeypatch.setattr(devices, "_adapters", {})
    monkeypatch.setattr(wgpu.gpu, "request_adapter_sync", lambda **kw: None)
    with pytest.raises(DeviceError, match="mesa-vulkan-drivers"):
        devices.adapter("webgpu")


def test_torch_functional_runs_forward_and_backward_on_a_webgpu_executor(ex, monkeypatch):
    """hologram_torch.functional's executor-first form with a webgpu executor: every op
    and its backward compile for webgpu (the host path is taken away here) and give
    PyTorch's values and gradients."""
    torch = pytest.importorskip("torch")
    from hologram_torch import functional as F
    from hologram_torch.aten import runner

    def no_host_path(*args, **kwargs):
        raise AssertionError("ran on the host backend")

    monkeypatch.setattr(runner, "run", no_host_path)
    gen = torch.Generator().manual_seed(0)
    x, w, b, t = (torch.randn(*s, generator=gen, dtype=torch.float64).float()
                  for s in ((6, 16), (5, 16), (5,), (6, 5)))
    ours = [v.clone().requires_grad_() for v in (x, w, b)]
    theirs = [v.clone().requires_grad_() for v in (x, w, b)]
    y = F.linear(ex, *ours[:2], ours[2])
    h = F.mul(ex, F.gelu(ex, F.relu(ex, y)), F.sigmoid(ex, F.add(ex, y, torch.ones(5))))
    s = F.softmax(ex, F.sub(ex, F.tanh(ex, h), t), dim=1)
    F.mse_loss(ex, s, t).backward()
    yr = torch.nn.functional.linear(*theirs)
    hr = torch.nn.functional.gelu(torch.relu(yr)) * torch.sigmoid(yr + 1.0)
    sr = torch.softmax(torch.tanh(hr) - t, dim=1)
    torch.nn.functional.mse_loss(sr, t).backward()
    torch.testing.assert_close(s, sr, rtol=1e-5, atol=1e-6)
    for a, r in zip(ours, theirs):
        torch.testing.assert_close(a.grad, r.grad, rtol=1e-4, atol=1e-6)
    assert s.device.type == "cpu" and s.dtype == torch.float32
