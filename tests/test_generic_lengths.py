"""Elementwise programs compile once for every length (hologram.compiler.generic): which
programs qualify, that a template's code runs right at other lengths on the cpu backend
(against the interpreter, every dtype, edge values, odd and long lengths), that the
renderer's code for them does not depend on the length, and promotions of the template."""

from __future__ import annotations

import numpy as np
import pytest
from util import execute, inputs_for, same_bits

import hologram
from hologram.backends.cpu import backend as cpu
from hologram.backends.cpu import target as targets
from hologram.backends.cpu.render import render
from hologram.compiler import generic, pipeline
from hologram.frontend.graph import Graph

pytestmark = pytest.mark.skipif("cpu" not in hologram.backends.available(),
                                reason="the cpu backend cannot run here")


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path / "cache"))
    hologram.clear_cache()
    yield tmp_path / "cache"
    hologram.clear_cache()


def lerp(shape, dtype="f32"):
    g = Graph("lerp")
    a, b = g.input("a", dtype, shape), g.input("b", dtype, shape)
    w = g.input("w", "f64", ())
    g.output("o", a + (b - a) * g.cast(w, dtype))
    return g.program()


def chain(shape, dtype):
    """Arithmetic, compares, selects and casts of one dtype with a scalar operand."""
    g = Graph("chain")
    x, y, s = g.input("x", dtype, shape), g.input("y", dtype, shape), g.input("s", dtype, ())
    big = g.maximum(x, y)
    g.output("o", g.where(g.binary("lt", x, y), big * s, x - s))
    g.output("m", g.binary("eq", x, y))
    g.output("c", g.cast(x, "f32") * 0.5)
    return g.program()


def canonical(program):
    return pipeline.canonical_form(program)


# --- which programs qualify -------------------------------------------------------------

def test_elementwise_programs_have_a_shape():
    """As the graph builder makes them (what hologram.compile looks at) and canonical."""
    for program in (lerp((192, 64)), lerp((7,)), chain((5, 3), "i8")):
        shape = program.buffers[0].shape
        assert generic.elementwise_shape(program) == shape
        assert generic.elementwise_shape(canonical(program)) == shape


def _broadcast_row():
    g = Graph("row")
    x, r = g.input("x", "f32", (8, 4)), g.input("r", "f32", (4,))
    g.output("o", x + r)
    return g.program()


def _transposed():
    g = Graph("t")
    x = g.input("x", "f32", (8, 4))
    g.output("o", x.permute(1, 0) * 2.0)
    return g.program()


def _sum():
    g = Graph("s")
    x = g.input("x", "f32", (8, 4))
    g.output("o", g.sum(x, 1))
    return g.program()


def _single():
    g = Graph("one")
    x = g.input("x", "f32", (1,))
    g.output("o", x * 2.0)
    return g.program()


@pytest.mark.parametrize("make", [_broadcast_row, _transposed, _sum, _single])
def test_programs_that_are_not_elementwise_over_one_length_do_not(make):
    assert generic.elementwise_shape(canonical(make())) is None


def test_a_template_is_the_program_at_another_length():
    """resize states the program over a flat length: on the interpreter, the template at
    the program's own length computes the program's bits."""
    program = canonical(lerp((6, 5), "bf16"))
    shape = generic.elementwise_shape(program)
    flat = generic.resize(program, shape, 30)
    inputs = inputs_for(program, seed=3)
    for want, got in zip(execute(program, inputs), execute(flat, inputs)):
        assert same_bits(want, got)
    assert generic.elementwise_shape(flat) == (30,)


# --- the cpu backend --------------------------------------------------------------------

DTYPES = ["f32", "f64", "f16", "bf16", "i32", "i64", "i8", "u8"]
LENGTHS = [2, 3, 17, 64, 1000, 4099]


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_compile_serves_every_length(dtype):
    """Each length runs the template's code and computes the interpreter's bits (NaN,
    infinities, -0.0, subnormals and integer limits among the inputs)."""
    before = hologram.cache_info()["misses"]
    keys = set()
    for i, n in enumerate(LENGTHS):
        program = chain((n,) if i % 2 else (n, 1), dtype)
        compiled = hologram.compile(program, backend="cpu")
        keys.add(compiled.key)
        inputs = inputs_for(program, seed=n)
        for want, got in zip(execute(program, inputs), compiled(*inputs)):
            assert same_bits(want, got.reshape(-1)), (dtype, n)
    assert len(keys) == 1
    assert hologram.cache_info()["misses"] - before == 1


def test_lengths_beyond_the_template_run_on_the_worker_threads():
    n = generic.TEMPLATE_LENGTH * 2 + 13
    compiled = hologram.compile(lerp((n,)), backend="cpu")
    a = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    want = a + (b - a) * np.float32(0.25)
    assert same_bits(compiled(a, b, np.array(0.25)), want)
    plan = compiled.executable.native_plan()
    assert plan is False or any(len(call) == 3 for call in plan[2])  # split over threads


def test_the_renderer_never_states_the_length():
    """What :meth:`_Executable.resized` relies on: for every program whose header has a
    length, the LLVM IR rendered at another length is the same text."""
    target = targets.current()
    programs = [lerp((300,)), chain((300,), "f32"), chain((300,), "bf16"),
                chain((300,), "i8"), chain((300,), "f16")]
    for program in programs:
        c = canonical(program)
        shape = generic.elementwise_shape(c)
        texts = []
        for n in (300, 7, generic.TEMPLATE_LENGTH):
            lowered = pipeline.for_target(pipeline.lower(generic.resize(c, shape, n)),
                                          target.capabilities)
            assert cpu._generic_length(lowered, {}, False) == n
            symbols = {k.name: k.name for k in lowered.kernels}
            texts.append(render(lowered, symbols, target, name="kernels"))
        assert texts[0] == texts[1] == texts[2], program.name


def test_programs_that_use_the_index_compile_per_length():
    g = Graph("iota")
    x = g.input("x", "i64", (40,))
    g.output("o", x + g.arange(40, "i64"))
    program = g.program()
    c = canonical(program)
    assert generic.elementwise_shape(c) is None
    compiled = hologram.compile(program, backend="cpu")
    assert compiled.key.program == c.fingerprint()


def test_resized_programs_count_towards_and_share_the_templates_promotion(monkeypatch):
    monkeypatch.setenv("HOLOGRAM_PROMOTE_AFTER", "4")
    small = hologram.compile(lerp((10,)), backend="cpu")
    large = hologram.compile(lerp((5000,)), backend="cpu")
    assert small.executable.tier == large.executable.tier == "quick"
    data = {n: [np.linspace(-1, 1, n, dtype=np.float32), np.full(n, 3, np.float32)]
            for n in (10, 5000)}
    for _ in range(2):
        for n, compiled in ((10, small), (5000, large)):
            a, b = data[n]
            assert same_bits(compiled(a, b, np.array(0.5)), a + (b - a) * np.float32(0.5))
    assert cpu.wait_for_promotions(60)
    assert small.executable.tier == large.executable.tier == "full"
    assert small.executable.native_plan() is not False
    later = hologram.compile(lerp((77,)), backend="cpu")  # after the promotion: full
    assert later.executable.tier == "full" and later.executable.native_plan() is not False
    data[77] = [np.linspace(-2, 5, 77, dtype=np.float32), np.full(77, -1, np.float32)]
    for n, compiled in ((10, small), (5000, large), (77, later)):
        a, b = data[n]
        assert same_bits(compiled(a, b, np.array(0.5)), a + (b - a) * np.float32(0.5))
    assert cpu.promotion_stats()["failed"] == 0


def test_other_backends_compile_per_length():
    one = hologram.compile(lerp((10,)), backend="interp")
    two = hologram.compile(lerp((20,)), backend="interp")
    assert one.key != two.key
