"""Split reductions on the webgpu backend (render.py ``split``): a long reduction of few
outputs runs as partial states of chunks of each row, one workgroup each, then their
combination in a second shader of the same launch. Checked against the interpreter bit
for bit (every reduction kind on every dtype, NaN, ±inf, -0.0, ties across chunks) and
against NumPy for whole sums past what one workgroup may loop on lavapipe (2^22 and 2^23
+ 7 terms). The split threshold is lowered for the kind x dtype table (the target string
then names it, so cached artifacts never mix) to keep its arrays small.

Run on Mesa's lavapipe here (a CPU emulation of Vulkan), not on a GPU. Where no adapter
exists these tests skip, except with ``HOLOGRAM_REQUIRE_WEBGPU=1`` (set by .ci/run)."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

import hologram
import hologram as hg
from hologram.backends.webgpu import backend as webgpu_backend
from hologram.backends.webgpu import render as render_module
from hologram.backends.webgpu.backend import WebGpuBackend
from hologram.backends.webgpu.render import (
    EMULATED_LOOP_LIMIT,
    MAX_CHUNK,
    SPLIT_WORK,
    WORKGROUP,
    split,
)
from hologram.compiler import pipeline
from hologram.frontend.graph import Graph
from hologram.isa import dtypes as dt

REQUIRED = os.environ.get("HOLOGRAM_REQUIRE_WEBGPU", "") not in ("", "0")
pytestmark = pytest.mark.skipif(not WebGpuBackend.is_available() and not REQUIRED,
                                reason="no WebGPU adapter (apt-get install mesa-vulkan-drivers "
                                       "libvulkan1, or a GPU driver)")

ROWS, TERMS = 4, 5000  # with SPLIT_WORK lowered to 64: 40 chunks of 128 terms per row
LATE = 4321  # an index in a late chunk (not the first invocation's, not the first chunk's)


@pytest.fixture(scope="module")
def ex():
    with hg.Executor("webgpu") as executor:
        yield executor


@pytest.fixture
def small_split(monkeypatch):
    monkeypatch.setattr(render_module, "SPLIT_WORK", 64)


def shaders(program) -> list[dict]:
    return hologram.build(program, backend="webgpu").metadata["kernels"]


def bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.kind == "f" else a


def assert_same(got: np.ndarray, want: np.ndarray, t: dt.DType) -> None:
    """The same bits, but any NaN for a NaN (the ISA fixes no NaN payload or sign)."""
    got, want = bits(got), bits(want)
    if t.is_float:
        width = {2: 16, 4: 32}[want.dtype.itemsize]
        exponent = {"f32": 0x7F800000, "f16": 0x7C00, "bf16": 0x7F80}[t.name]
        nan = (want & ((1 << width - 1) - 1)) > exponent
        np.testing.assert_array_equal((got & ((1 << width - 1) - 1)) > exponent, nan)
        got, want = got[~nan], want[~nan]
    np.testing.assert_array_equal(got, want)


def as_storage(values: np.ndarray, t: dt.DType) -> np.ndarray:
    """f32 ``values`` (exact in ``t``) as ``t``'s NumPy storage (bf16: its 16 bits)."""
    if t.name == "bf16":
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(t.storage)


def data(t: dt.DType, kind: str, rng) -> np.ndarray:
    """Rows whose reduction is exact in any order (so any split gives the interpreter's
    bits), with the edge cases of ``t`` and ``kind`` in late chunks."""
    if t.is_bool:
        x = rng.integers(0, 2, (ROWS, TERMS)).astype(bool)
        x[1] = False
        x[1, LATE] = True
        x[2] = True
        return x
    if t.is_int:
        lo, hi = (t.min, t.max + 1) if kind in ("sum", "prod") else (-3, 4)  # wraps; ties
        if t.name == "u8":
            lo = max(lo, 0)
        x = rng.integers(lo, hi, (ROWS, TERMS), dtype=np.int64)
        x[1, LATE] = t.max  # the extremes in a late chunk
        x[2, LATE + 7] = t.min
        return x.astype(t.storage)
    if kind == "prod":  # powers of two with small exponents: exact, no overflow
        x = rng.choice(np.float32([1.0, -1.0]), (ROWS, TERMS))
        for row in x:
            row[rng.choice(TERMS, 20, replace=False)] = np.float32([2.0] * 10 + [0.5] * 10)
    elif kind in ("sum", "mean"):  # small integers: every partial sum is exact
        x = rng.integers(-8, 9, (ROWS, TERMS)).astype(np.float32)
    else:  # ties everywhere: the first index must win across chunks
        x = rng.integers(-3, 4, (ROWS, TERMS)).astype(np.float32)
    x[1, LATE] = np.nan  # NaN in a late chunk propagates (sum, prod) and wins max/min
    x[2] = np.where(rng.random(TERMS) < 0.5, np.float32(-0.0), np.float32(0.0))
    if kind in ("sum", "mean", "prod"):
        x[2] = -0.0  # a sum of -0.0 only is -0.0, the partials' too
    x[3, 3 * 64 + 5] = np.inf  # +inf and -inf in different chunks: sum NaN, max/min
    x[3, LATE + 300] = -np.inf
    return as_storage(x, t)


KINDS = ("sum", "prod", "max", "min", "argmax", "argmin", "mean")
CASES = [(t, kind) for t in ("f32", "f16", "bf16", "i32", "i16", "i8", "u8", "bool", "i64")
         for kind in KINDS
         if not (t == "bool" and kind in ("sum", "prod", "mean"))]  # the ISA refuses them


@pytest.mark.parametrize("dtype, kind", CASES)
def test_split_reductions_match_the_interpreter_bit_for_bit(small_split, dtype, kind):
    t = dt.dtype(dtype)
    g = Graph(f"split_{kind}_{dtype}")
    x = g.input("x", dtype, (ROWS, TERMS))
    g.output("y", g.mean(x, 1) if kind == "mean" else g.reduce(kind, x, 1))
    program = g.program()
    kernels = shaders(program)
    assert [k["name"] for k in kernels] == ["k0_part0", "k0"], kernels
    assert kernels[0]["points"] > ROWS and kernels[1]["points"] == ROWS
    x = data(t, kind, np.random.default_rng(CASES.index((dtype, kind))))
    got = np.asarray(hologram.compile(program, backend="webgpu")(x))
    want = np.asarray(hologram.compile(program, backend="interp")(x))
    assert_same(got, want, t if kind not in ("argmax", "argmin") else dt.int64)
    if kind in ("argmax", "argmin") and t.is_float:  # NaN wins; -0.0 < +0.0, first wins
        zeros = bits(x[2])
        assert list(got[1:3]) == [LATE, int(np.argmax(zeros == zeros[int(got[2])]))]


def test_split_float_sums_stay_within_the_float_sum_bound(ex):
    """Random normal rows of 2^20 + 3 terms (split) against float64 NumPy: the
    compensated partials and their compensated combination lose almost nothing."""
    x = np.random.default_rng(3).standard_normal((3, (1 << 20) + 3)).astype(np.float32)
    got = hg.ops.sum(ex.from_numpy(x), dim=1).to_numpy()
    want = x.astype(np.float64).sum(1)
    scale = np.abs(x).astype(np.float64).sum(1)
    assert np.all(np.abs(got - want) <= 4 * np.finfo(np.float32).eps * scale), got - want
    g = Graph("rows")
    g.output("y", g.sum(g.input("x", "f32", x.shape), 1))
    assert len(shaders(g.program())) == 2


@pytest.mark.parametrize("n", [1 << 22, (1 << 23) + 7])
def test_whole_sums_past_one_workgroups_loop_limit_are_split_and_exact(ex, n):
    """A whole sum of 2^22 terms was refused on lavapipe (65,536 iterations for one
    workgroup's invocations); split, each shader stays under the limit. Whole numbers
    keep every partial exact, so the sum is NumPy's exactly; mean and max ride along."""
    g = Graph(f"sum_{n}")
    g.output("y", g.sum(g.input("x", "f32", (n,))))
    caps = WebGpuBackend().capabilities()
    program = pipeline.for_target(g.program(), caps)
    parts, chunk = split(program.kernels[0], caps)
    assert parts >= 2 and chunk % WORKGROUP == 0 and (parts - 1) * chunk < n <= parts * chunk
    kernels = shaders(g.program())
    assert len(kernels) == 2
    assert all(k["iterations"] <= EMULATED_LOOP_LIMIT for k in kernels)
    rng = np.random.default_rng(n % 1000)
    x = rng.integers(-3, 4, n).astype(np.float32)
    x[-1] = 5.0  # the last term, in the last (ragged) chunk, is the one maximum
    a = ex.from_numpy(x)
    total = int(x.astype(np.int64).sum())
    assert hg.ops.sum(a).to_numpy() == total
    assert hg.ops.mean(a).to_numpy() == np.float32(np.float32(total) / np.float32(n))
    assert hg.ops.max(a).to_numpy() == 5.0
    ints = rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)
    total = hg.ops.sum(ex.from_numpy(ints)).to_numpy()  # in i64 (two words), as torch does
    assert total.dtype == np.int64 and int(total) == int(ints.astype(np.int64).sum())


@pytest.mark.parametrize("shape, axes", [((3000, 2), (0,)), ((3, 40, 60), (1, 2)),
                                         ((2, 70, 3, 50), (1, 3))])
@pytest.mark.parametrize("kind", ["sum", "argmax", "argmin", "prod"])
def test_split_rows_of_any_axes_match_the_interpreter(small_split, shape, axes, kind):
    """Reduced axes that are not the last ones, or not contiguous: a chunk's terms are
    a range of the flat index over the reduced axes, each workgroup's row its own."""
    g = Graph(f"split_axes_{kind}")
    x = g.input("x", "f32", shape)
    g.output("y", g.reduce(kind, x, axes))
    program = g.program()
    assert len(shaders(program)) == 2
    rng = np.random.default_rng(len(shape) * 10 + KINDS.index(kind))
    data = rng.integers(-3, 4, shape).astype(np.float32)
    if kind == "prod":
        data = np.where(data > 0, np.float32(1.0), np.float32(-1.0))
    data.reshape(-1)[-5] = np.nan  # in the last row's last chunk
    got = np.asarray(hologram.compile(program, backend="webgpu")(data))
    want = np.asarray(hologram.compile(program, backend="interp")(data))
    assert_same(got, want, dt.int64 if kind.startswith("arg") else dt.float32)


@pytest.mark.parametrize("rows, terms", [(1, MAX_CHUNK), (1, MAX_CHUNK + 1), (1, 1 << 30),
                                         (7, 3 * MAX_CHUNK + 5), (4095, 70_000),
                                         (1, 2 * SPLIT_WORK - 1), (300, 2 * SPLIT_WORK)])
def test_split_chunks_cover_rows_within_the_loop_limit(rows, terms):
    """The split's arithmetic, without a device: as many workgroups per row as the
    thresholds say, chunks short enough for the loop limit however long the row."""
    g = Graph("shape")
    g.output("y", g.sum(g.input("x", "f32", (rows, terms)), 1))
    kernels = shaders(g.program())
    if terms < 2 * SPLIT_WORK or (rows * 2 > render_module.SPLIT_GROUPS
                                  and terms <= MAX_CHUNK):
        assert len(kernels) == 1  # short rows, or enough of them
    else:
        assert len(kernels) == 2 and kernels[0]["points"] % rows == 0
        parts = kernels[0]["points"] // rows
        assert parts >= 2 and parts * MAX_CHUNK >= terms
    assert all(k["iterations"] <= EMULATED_LOOP_LIMIT for k in kernels)


def row_programs(shape):
    """Kernels whose reductions use each other's results, or whose stores run along the
    row: a shader per reduction, the last one also cut into the row's chunks."""
    g = Graph("center")  # one reduction, stores along the row
    x = g.input("x", "f32", shape)
    g.output("y", x - g.sum(x, 1, keepdim=True))
    yield g.program(), 1, True
    g = Graph("softmax")  # max, then the sum of exp(x - max), then the quotients
    x = g.input("x", "f32", shape)
    e = g.unary("exp", x - g.max(x, 1, keepdim=True))
    g.output("y", e / g.sum(e, 1, keepdim=True))
    yield g.program(), 2, True
    g = Graph("variance")  # the mean, then the mean of the squared deviations
    x = g.input("x", "f32", shape)
    d = x - g.mean(x, 1, keepdim=True)
    g.output("y", g.mean(d * d, 1))
    yield g.program(), 2, False
    g = Graph("logsumexp")
    x = g.input("x", "f32", shape)
    m = g.max(x, 1, keepdim=True)
    g.output("y", g.unary("log", g.sum(g.unary("exp", x - m), 1, keepdim=True)) + m)
    yield g.program(), 2, False


@pytest.mark.parametrize("fission", [True, False])
def test_dependent_reductions_and_row_stores_are_split(small_split, monkeypatch, fission):
    """Cut by fission (hologram.codegen.schedule: a kernel per reduction, each its
    partials' shader and their combination, and one over every element for stores along
    the row), or with fission off, split as one kernel: each partials' shader combines the
    partials of the reductions it uses (the same fold in every workgroup: the same bits),
    the last shader combines them all and, with stores along the row, stores its
    workgroup's chunk of it."""
    monkeypatch.setattr(webgpu_backend, "_CAPS", replace(webgpu_backend._CAPS, fission=fission))
    rng = np.random.default_rng(21)
    x = rng.integers(-8, 9, (ROWS, TERMS)).astype(np.float32)  # whole numbers: sums exact
    x[1, LATE] = np.nan
    x[2, 100] = np.inf
    for program, reductions, spread in row_programs((ROWS, TERMS)):
        kernels = shaders(program)
        names = [k["name"] for k in kernels]
        if fission and reductions > 1:
            assert len(kernels) == 2 * reductions + spread, names
            assert all(k["points"] > ROWS for k in kernels[0:2 * reductions:2]), names
            assert all(k["points"] == ROWS for k in kernels[1:2 * reductions:2]), names
            if spread:  # the stores along the rows: an invocation per element
                assert kernels[-1]["mode"] == "thread" and \
                    kernels[-1]["points"] == ROWS * TERMS, kernels[-1]
        else:
            assert len(kernels) == reductions + 1, names
            assert all(k["points"] > ROWS for k in kernels[:-1])
            assert (kernels[-1]["points"] > ROWS) == spread
        got = np.asarray(hologram.compile(program, backend="webgpu")(x))
        want = np.asarray(hologram.compile(program, backend="interp")(x))
        if program.name == "center":
            assert_same(got, want, dt.float32)
        else:  # exp and log: within a few ulp of the interpreter's
            np.testing.assert_allclose(got, want, rtol=4e-6, atol=1e-30)


def test_a_softmax_and_a_centring_of_long_rows_run_on_lavapipe(ex):
    """Rows of 2^21 (softmax) and 2^22 (x - sum(x)) terms: one workgroup per row ran
    more loop iterations than lavapipe allows; split, every shader is under the limit."""
    rng = np.random.default_rng(22)
    x = rng.standard_normal((2, 1 << 21)).astype(np.float32)
    programs = {p.name: p for p, _, _ in row_programs(x.shape)}
    kernels = shaders(programs["softmax"])  # cut by fission: 2 reductions, 2 shaders each
    assert len(kernels) == 5 and all(k["iterations"] <= EMULATED_LOOP_LIMIT for k in kernels)
    got = np.asarray(hologram.compile(programs["softmax"], backend="webgpu")(x))
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-12)
    whole = rng.integers(-3, 4, (1, 1 << 22)).astype(np.float32)
    program = next(p for p, _, _ in row_programs(whole.shape) if p.name == "center")
    got = np.asarray(hologram.compile(program, backend="webgpu")(whole))
    np.testing.assert_array_equal(got, whole - whole.astype(np.int64).sum())
