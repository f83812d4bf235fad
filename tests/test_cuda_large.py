"""The cuda backend's int64 indices (render.py, ``WIDE_INDICES``): a kernel whose index
arithmetic may reach 2**31 (a buffer of 2**31 elements or more, as many points, a split's
chunks) is rendered with int64 program ids and index tiles, every other kernel with int32
ones, as before. Nothing here allocates such a buffer: programs of 2**31 + 4096
elements are only rendered (and compiled for sm_90 with Triton's compiler, no GPU
needed), and the int64 kernels run emulated on small programs, every kernel forced wide
by a lowered ``WIDE_INDICES``. The GPU run of big buffers: docs/cuda.md, "int64
indices". Skipped where the ``cuda`` extra (triton) is not installed."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conformance.test_scatter import rows_program

import hologram
from hologram import backends
from hologram.backends.cuda import backend as cuda
from hologram.backends.cuda import render, triton_process
from hologram.frontend.graph import Graph
from hologram.isa import dtypes as dt
from hologram.isa.builder import ProgramBuilder

pytestmark = pytest.mark.skipif(not triton_process.triton_installed(),
                                reason="no triton: pip install 'hologram-tensor[cuda]'")
N = 2**31 + 4096
WIDE_PID = "tl.program_id(0).to(tl.int64)"


@pytest.fixture
def emulate(monkeypatch):
    monkeypatch.setenv("HOLOGRAM_CUDA_EMULATE", "1")
    monkeypatch.setenv("HOLOGRAM_DISABLE_DISK_CACHE", "1")
    yield


@pytest.fixture
def wide(emulate, monkeypatch):
    """Every kernel rendered with int64 indices (the backend's target string names it)."""
    monkeypatch.setattr(render, "WIDE_INDICES", 0)
    yield


def _described(program, target: str | None = None) -> dict:
    return backends.builder("cuda").describe(
        hologram.build(program, backend="cuda", target=target).data)


def _functions(program) -> dict[str, str]:
    """Each kernel's Triton function (its name -> its text), the prelude left out."""
    info = _described(program)
    return {k["name"]: "@triton.jit\ndef " + info["source"].split(f"def {k['name']}(")[1]
            .split("\n\n\n")[0] for k in info["kernels"]}


def _is_wide(text: str) -> bool:
    """int64 indices: the program id widened (one kernel never has both kinds)."""
    narrow = "tl.program_id(0)" in text.replace(WIDE_PID, "")
    assert (WIDE_PID in text) != narrow, text
    return WIDE_PID in text


def _add(n: int):
    g = Graph(f"add_{n}")
    g.output("z", g.input("x", "f32", (n,)) + g.input("y", "f32", (n,)))
    return g.program()


def test_buffers_from_2_31_elements_take_int64_indices_and_smaller_ones_int32(emulate):
    """The bound is the buffer's size: 2**31 - 1 elements keep int32 indices (the source
    as it always was), 2**31 and more take int64 ones, the program id and the tile
    widened before they are scaled and added."""
    (narrow,) = _functions(_add(2**31 - 1)).values()
    assert "x = tl.program_id(0) * 1024 + tl.arange(0, 1024)[:, None]\n" in narrow
    assert "int64" not in narrow
    for n in (2**31, N):
        (text,) = _functions(_add(n)).values()
        assert (f"x = {WIDE_PID} * 1024 + tl.arange(0, 1024)[:, None].to(tl.int64)\n"
                in text), text
        assert f"xmask = x < {n}" in text


def test_only_the_kernels_that_reach_2_31_are_wide(emulate):
    """Width is a kernel's: in a program with a big buffer, a kernel that touches only
    small ones keeps int32 indices; a kernel whose loop reaches 2**31 terms (a sum over a
    broadcast scalar) is wide without any big buffer."""
    g = Graph("mixed")
    g.output("big", g.input("x", "f32", (N,)) * 2.0)
    g.output("small", g.input("s", "f32", (100,)) + 1.0)
    widths = sorted(_is_wide(text) for text in _functions(g.program()).values())
    assert widths == [False, True]
    g = Graph("long_broadcast")
    g.output("s", g.sum(g.input("x", "f32", (1,)).broadcast_to((2**31 + 8,)), 0))
    (text,) = _functions(g.program()).values()
    assert _is_wide(text) and "tl.atomic_add" in text  # a split reduction


def test_split_reductions_of_a_big_buffer_index_in_int64(emulate):
    """A sum and an argmax of 2**31 + 4096 terms are split reductions (1023 chunks of
    about 2**21): each chunk's first index (``part * chunk``) is int64, the argmax's
    running index and its partial's scratch too (the row's first best index is past
    2**31 when the best is at the end)."""
    g = Graph("big_reductions")
    x = g.input("x", "f32", (N,))
    g.output("s", g.sum(x, 0))
    g.output("i", g.reduce("argmax", x, (0,), keepdim=False))
    info = _described(g.program())
    assert all(k["parts"] > 500 for k in info["kernels"]), info["kernels"]
    functions = _functions(g.program())
    for text in functions.values():
        assert _is_wide(text)
        assert re.search(r"f\d+ = part \* \d+ \+ r\d+ \+ tl\.arange\(0, \d+\)\[None, :\]"
                         r"\.to\(tl\.int64\)", text), text
    assert any(f", {N}, tl.int64)" in text for text in functions.values())  # argmax index
    header = json.loads(hologram.build(g.program(), backend="cuda").data)
    # scratch: the sum's value, argmax's key and index (int64 in a wide kernel), counters
    assert sorted(s["dtype"] for s in header["scratch"].values()) == \
        ["f4", "i4", "i4", "i4", "i8"]


def test_strided_views_gathers_scatters_and_matmuls_of_big_buffers(emulate):
    """Strided views (a negative stride from the last element, a slice at 2**31), a
    gather whose map starts at 2**31 + 5 (the constant and the strides written whole, the
    i32 operand widened, not wrapped to int32 as in small kernels), a scatter, and a
    matrix product with an operand of 2**31 + 4096 elements (rows, columns and k
    widened)."""
    g = Graph("big_views")
    x = g.input("x", "i8", (N,))
    g.output("rev", x[::-2] + 1)
    g.output("tail", x[2**31:])
    functions = _functions(g.program())
    assert all(_is_wide(text) for text in functions.values())
    text = "\n".join(functions.values())
    assert f"xzero + {N - 1} + t1 * -2" in text and "xzero + 2147483648 + t1 * 1" in text

    b = ProgramBuilder("big_gather")
    table = b.input("table", "f32", (N,))
    ids = b.input("ids", "i32", (4096,))
    y = b.output("y", "f32", (4096,))
    k = b.kernel((4096,), grid_rank=1)
    k.store(y, k.gather(table, k.load(ids), (4096,), 2**31 + 5, (0,), (-5, 4090)))
    (text,) = _functions(b.build()).values()
    assert _is_wide(text)
    assert "(tl.minimum(tl.maximum(t2, -5), 4090)).to(tl.int64)" in text, text
    assert "xzero + 2147483653 + t3" in text, text

    program = rows_program(dt.float32, dt.int64, N // 64, 64, 512, "add")
    assert all(_is_wide(text) for text in _functions(program).values())

    g = Graph("big_matmul")
    g.output("y", g.input("a", "f16", (N // 2048, 2048)) @ g.input("b", "f16", (2048, 16)))
    (text,) = _functions(g.program()).values()
    assert f"pid = {WIDE_PID}" in text
    assert "k0 + tl.arange(0, 64)[None, :].to(tl.int64)" in text
    assert "xzero = tl.zeros([128, 16], tl.int64)" in text


def test_big_kernels_compile_for_sm90_without_spills(emulate, monkeypatch, tmp_path):
    """Triton's compiler (no GPU needed) takes the int64 kernels of 2**31 + 4096-element
    programs: an elementwise op over a strided view, a split sum and argmax (the loop-
    carried index in int64), a gather, a matrix product; none spills, and their PTX
    does 64-bit index arithmetic."""
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path))  # really compile
    g = Graph("big_compiled")
    x = g.input("x", "f32", (N,))
    g.output("y", x[::-2] * 2.0)
    g.output("i", g.reduce("argmax", x, (0,), keepdim=False))
    g.output("s", g.sum(x, 0))
    g.output("m", g.input("a", "f16", (N // 2048, 2048)) @ g.input("b", "f16", (2048, 16)))
    artifact = hologram.build(g.program(), backend="cuda", target="sm_90")
    info = _described(g.program(), "sm_90")
    assert len(info["compiled"]) == len(info["kernels"]) >= 4
    for kernel, compiled in zip(info["kernels"], info["compiled"]):
        r = compiled["resources"]
        assert r["spill_stores"] == r["spill_loads"] == 0, (kernel["name"], r)
        ptx = cuda.ptx(artifact.data, kernel["name"])
        assert re.search(r"\b(mul|mad)\.(lo|wide)\.[su]64\b|\bmul\.wide\.[su]32\b", ptx)


def _check(program, inputs, want=None):
    """Run ``program`` emulated (every kernel wide: asserted) and on the interpreter;
    their outputs must agree bit for bit (``want``: NumPy's values instead)."""
    assert all(_is_wide(text) for text in _functions(program).values())
    got = hologram.compile(program, backend="cuda")(*[a.copy() for a in inputs])
    got = got if isinstance(got, tuple) else (got,)
    if want is None:  # (copies: in-out parameters are updated in place)
        want = hologram.compile(program, backend="interp")(*[a.copy() for a in inputs])
        want = want if isinstance(want, tuple) else (want,)
    for g_, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g_), np.asarray(w))


def test_int64_kernels_compute_elementwise_broadcast_and_strided_views(wide):
    rng = np.random.default_rng(0)
    xs = rng.integers(-50, 50, (40, 96)).astype(np.int32)
    vs = rng.standard_normal(96).astype(np.float32)
    g = Graph("wide_views")
    x = g.input("x", "i32", (40, 96))
    v = g.input("v", "f32", (96,))
    g.output("a", x[::-1, 1::3][5:25] * 3 + x[5:25, ::-3])
    g.output("b", g.cast(x, "f32") * v + v[::-1])
    g.output("c", x.T[2:, :7])
    _check(g.program(), [xs, vs], [xs[::-1, 1::3][5:25] * 3 + xs[5:25, ::-3],
                                   xs.astype(np.float32) * vs + vs[::-1], xs.T[2:, :7]])


def test_int64_kernels_compute_reductions_split_or_not(wide, monkeypatch):
    """Rows (a grid) and everything (a split reduction, the threshold lowered) of every
    kind, against the interpreter: argmax/argmin's first index among ties in different
    chunks, an int64 index in the partials."""
    monkeypatch.setattr(render, "SPLIT_WORK", 512)
    rng = np.random.default_rng(1)
    xs = rng.integers(-20, 20, (3, 2500)).astype(np.float32)
    xs[1, [7, 2400]] = 50.0  # ties across chunks
    g = Graph("wide_reductions")
    x = g.input("x", "f32", (3, 2500))
    for kind in ("sum", "max", "argmax", "argmin"):
        g.output(f"r_{kind}", g.reduce(kind, x, (1,), keepdim=False))
        g.output(f"c_{kind}", g.reduce(kind, x[:, ::-1], (0, 1), keepdim=False))
    program = g.program()
    assert sum(k["parts"] > 1 for k in _described(program)["kernels"]) >= 4
    _check(program, [xs])


def test_int64_kernels_compute_gathers_scatters_and_matmuls(wide, monkeypatch):
    """An embedding lookup (i32 and i64 ids, some out of range: clamped), scatter-add of
    rows with duplicate ids (rounds), and a matrix product split along k (the threshold
    lowered), against the interpreter."""
    monkeypatch.setattr(render, "SPLIT_K_WORK", 32)
    rng = np.random.default_rng(2)
    table = rng.standard_normal((50, 24)).astype(np.float32)
    ids = np.concatenate([rng.integers(0, 50, 60), [-1, 49, 0]]).astype(np.int64)
    g = Graph("wide_lookup")
    t = g.input("table", "f32", (50, 24))
    i64 = g.input("ids", "i64", (63,))
    i32 = g.input("ids32", "i32", (63,))
    g.output("y", g.gather(t, (i64.reshape(63, 1), 1), (63, 24)))
    g.output("z", g.gather(t, (i32.reshape(63, 1), 1), (63, 24)) * 2.0)
    _check(g.program(), [table, ids, ids.astype(np.int32)])

    program = rows_program(dt.float32, dt.int32, 20, 8, 64, "add")
    rows = np.concatenate([rng.integers(0, 20, 60), [0, 0, 19, 25]]).astype(np.int32)
    v = rng.integers(-4, 4, (64, 8)).astype(np.float32)
    dst = rng.integers(-4, 4, (20, 8)).astype(np.float32)
    _check(program, [dst, rows, v])

    a = rng.integers(-3, 3, (20, 256)).astype(np.float32)
    b = rng.integers(-3, 3, (256, 12)).astype(np.float32)
    g = Graph("wide_matmul")
    g.output("y", g.input("a", "f32", (20, 256)) @ g.input("b", "f32", (256, 12)))
    assert _described(g.program())["kernels"][0]["parts"] > 1
    _check(g.program(), [a, b], [a @ b])  # small integers: exact
