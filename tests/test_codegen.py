"""The device-neutral loop plan (hologram/codegen/loops.py): placement of values, store
nests, split reductions and accumulators chosen from a target's capabilities."""

from __future__ import annotations

import itertools
import math

import pytest

from hologram.backends.cpu.target import CAPABILITIES as CPU
from hologram.codegen import loops
from hologram.compiler import pipeline
from hologram.compiler.capabilities import Capabilities
from hologram.frontend.graph import Graph


def _kernels(build) -> list:
    g = Graph("plan")
    build(g)
    return list(pipeline.run(g.program()).kernels)


def test_softmax_rows_plan_a_grid_point_with_reductions_and_one_store_nest():
    def softmax(g):
        x = g.input("x", "f32", (8, 1000))
        e = g.unary("exp", x - g.max(x, 1, keepdim=True))
        g.output("y", e / g.sum(e, 1, keepdim=True))

    (kernel,) = _kernels(softmax)
    plan = loops.plan(kernel)
    assert plan.grid == (8,) and plan.loops == (1000,) and plan.parts == 0
    reductions = [a.kind for a in plan.accumulators]
    assert reductions == ["max", "sum"]
    assert all(plan.placement[a.position] == "point" for a in plan.accumulators)
    assert [dims for dims, _ in plan.store_nests] == [(1,)]
    total = plan.accumulators[1]
    assert (total.blocked, total.dtype, total.outer, total.compensated) == \
        (True, "f32", "f64", False)


def test_accumulators_follow_the_target_capabilities():
    def reductions(g):
        x = g.input("x", "f32", (4, 300))
        h = g.input("h", "f16", (4, 300))
        d = g.input("d", "f64", (4, 300))
        g.output("s", g.sum(x, 1))
        g.output("sh", g.sum(h, 1))
        g.output("sd", g.sum(d, 1))
        g.output("p", g.reduce("prod", x, 1))
        g.output("a", g.reduce("argmax", x, 1))

    def by_kind(caps):
        found = {}
        for kernel in _kernels(reductions):
            for a in loops.plan(kernel, caps).accumulators:
                found[(a.kind, a.operand)] = a
        return found

    cpu, gpu = by_kind(CPU), by_kind(Capabilities(f64=False, i64=False))
    assert cpu[("sum", "f16")].dtype == "f32" and cpu[("sum", "f16")].outer == "f64"
    assert cpu[("sum", "f64")].compensated and not cpu[("sum", "f32")].compensated
    assert gpu[("sum", "f32")].outer == "f32" and gpu[("sum", "f32")].compensated
    assert cpu[("argmax", "f32")].index == "i64" and gpu[("argmax", "f32")].index == "i32"
    assert cpu[("prod", "f32")].dtype == "f64" and gpu[("prod", "f32")].dtype == "f32"


def test_whole_array_sums_are_split_and_the_dump_says_so():
    def big(g):
        g.output("s", g.sum(g.input("x", "f32", (4 * loops.PART_WORK,))))

    (kernel,) = _kernels(big)
    assert loops.split_parts(kernel) == 4
    text = loops.plan(kernel).dump()
    assert "split 4 partials" in text
    assert f"x{loops.LANES} lanes per block of {loops.BLOCK}" in text


@pytest.mark.parametrize("case, tiled", [
    ("rows of a matrix", True), ("a batch of rows, per feature", True),
    ("per batch entry", True), ("two sums of one read", True),
    ("along the contiguous axis", False), ("two passes", False), ("int", False),
    ("f64", False), ("few columns", False)])
def test_column_sums_are_tiled_where_the_grid_is_contiguous(case, tiled):
    """Float sums whose values are contiguous along the last grid dimension and strided
    along the reduced one are column sums (rendered a tile of grid points at a time);
    sums along the contiguous axis, sums of terms that need another sum, integer and f64
    sums, and grids of fewer than MIN_COLUMNS points are not."""
    def build(g):
        dtype = {"int": "i32", "f64": "f64"}.get(case, "f32")
        x = g.input("x", dtype, (3, 40, 5 if case == "few columns" else 24))
        if case in ("rows of a matrix", "int", "f64", "few columns"):
            g.output("y", g.sum(x, 1))
        elif case == "a batch of rows, per feature":
            g.output("y", g.sum(x, (0, 1)))
        elif case == "per batch entry":
            g.output("y", g.sum(g.input("z", "f32", (3, 40, 24)) * x, 1) / 40.0)
        elif case == "two sums of one read":
            g.output("y", g.sum(x * x, (0, 1)))
            g.output("z", g.sum(x, (0, 1)))
        elif case == "along the contiguous axis":
            g.output("y", g.sum(x, 2))
        else:
            g.output("y", g.sum(x - g.sum(x, 1, keepdim=True), 1))

    kernels = _kernels(build)
    tiles = [loops.plan(k, CPU).columns for k in kernels]
    assert any(tiles) == tiled, [str(k) for k in kernels]
    assert set(tiles) <= {0, loops.COLUMN_TILE}
    if tiled:
        text = loops.plan(kernels[tiles.index(loops.COLUMN_TILE)], CPU).dump()
        assert f"column sums in tiles of {loops.COLUMN_TILE}" in text
        assert f"blocks of {loops.SHORT_ROW} rows, blocks in f64" in text
    gpu = Capabilities(f64=False, i64=False)  # float32 block sums: not these
    assert not any(loops.plan(k, gpu).columns for k in kernels)


def test_values_invariant_along_inner_grid_dimensions_are_hoisted():
    def broadcast(g):
        x = g.input("x", "f32", (64, 1))
        y = g.input("y", "f32", (64, 32))
        g.output("z", y * g.unary("exp", x))

    plans = [loops.plan(k) for k in _kernels(broadcast)]
    assert any("hoist 1" in plan.placement for plan in plans), [p.dump() for p in plans]


def test_the_placement_as_data_agrees_with_its_text():
    def mixed(g):
        x = g.input("x", "f32", (4, 1, 1))
        y = g.input("y", "f32", (4, 8, 1))
        z = g.input("z", "f32", (4, 8, 16))
        g.output("o", z * g.unary("exp", y) + g.unary("log", x))
        g.output("r", g.sum(z * g.unary("exp", y), 2))

    for kernel in _kernels(mixed):
        plan = loops.plan(kernel)
        for i, where in enumerate(plan.placement):
            if plan.hoist[i] is not None:
                assert where == f"hoist {plan.hoist[i]}" and i in plan.hoisted_at(plan.hoist[i])
            elif plan.in_nest(i) or kernel.body[i].op == "store":
                assert where == f"nest {list(plan.varying[i])}"
            else:
                assert where == "point"
        for a in plan.accumulators:
            assert plan.accumulator(a.position) is a
    hoisted = {d for k in _kernels(mixed) for d in loops.plan(k).hoist if d is not None}
    assert hoisted == {1, 2}


@pytest.mark.parametrize("domain", [(2 * loops.PART_WORK,), (1_000_000,), (10_000_019,),
                                    (loops.MAX_PARTS * loops.PART_WORK * 3 + 7,),
                                    (1000, 1000), (200, 3, 5000)])
def test_split_reduction_partials_cover_the_row_and_keep_its_blocks(domain):
    """Partials of a 1-D split sum start on block boundaries (aligned loads, the lanes of
    the unsplit row); other domains divide dimension 0 evenly. None is empty."""
    n = domain[0]
    parts = min(loops.MAX_PARTS, n, math.prod(domain) // loops.PART_WORK)
    base, extra = loops.part_bounds(domain, parts)
    bounds = [min(q * base + min(q, extra), n) for q in range(parts + 1)]
    assert bounds[0] == 0 and bounds[-1] == n
    assert all(lo < hi for lo, hi in itertools.pairwise(bounds))
    if len(domain) == 1:
        assert all(b % loops.BLOCK == 0 for b in bounds[:-1])
    else:
        sizes = [hi - lo for lo, hi in itertools.pairwise(bounds)]
        assert max(sizes) - min(sizes) <= 1
