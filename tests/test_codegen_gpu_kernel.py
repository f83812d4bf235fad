"""The GPU renderers' shared walk (hologram/codegen/gpu_kernel.py): a minimal renderer
built on it runs kernels right, and its address helpers say what docs/isa.md says."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from hologram.codegen.gpu_kernel import COMPARISONS, Clamp, KernelWriter, gather_clamp, row_major
from hologram.compiler import pipeline
from hologram.compiler.capabilities import Capabilities
from hologram.errors import CompileError
from hologram.frontend.graph import Graph
from hologram.isa import dtypes as dt


class PythonWriter(KernelWriter):
    """The smallest renderer: a Python function of one grid point ``g`` and the buffers
    ``b`` (lists), for elementwise kernels of integers. Everything else is the base's."""

    target = "python"

    def bind(self, expr: str) -> str:
        self.names += 1
        self.line(f"t{self.names} = {expr}")
        return f"t{self.names}"

    def render(self) -> str:
        for d, stride, n in row_major(self.kernel.domain, range(self.kernel.grid_rank)):
            self.index[d] = self.bind(f"(g // {stride}) % {n}")
        self.write_stores()
        return "def point(g, b):\n" + "\n".join(self.lines) + "\n"

    def address(self, instr) -> str:
        terms = [str(instr.map.offset)]
        return " + ".join(terms + [f"{i} * {s}" for i, s in self.index_strides(instr)])

    def load(self, instr, address=None) -> str:
        return self.bind(f"b[{instr.buffer}][{address or self.address(instr)}]")

    def store(self, instr) -> None:
        self.line(f"b[{instr.buffer}][{self.address(instr)}] = {self.value(instr.args[0])}")

    def constant(self, value, t) -> str:
        return self.bind(repr(value))

    def index_value(self, axis, t) -> str:
        return self.bind(self.index.get(axis, "0"))

    def compute(self, instr, a, args) -> str:
        return self.bind(self.apply(instr.op, args, a, instr.dtype))

    def store_nest(self, dims, stores) -> None:
        assert not dims, "elementwise kernels only"
        for s in stores:
            self.write(s)

    def op_add(self, args, a, t):
        return f"{args[0]} + {args[1]}"

    def op_mul(self, args, a, t):
        return f"{args[0]} * {args[1]}"

    def op_select(self, args, a, t):
        return f"{args[1]} if {args[0]} else {args[2]}"

    def compare(self, op, args, a):
        return f"{args[0]} {COMPARISONS[op]} {args[1]}"


def _run(program, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every kernel of ``program`` through :class:`PythonWriter`, one call per point."""
    memory = [list(inputs[b.name].ravel()) if b.name in inputs else [0] * b.size
              for b in program.buffers]
    for kernel in program.kernels:
        source = PythonWriter(program, kernel, Capabilities()).render()
        scope: dict = {}
        exec(source, scope)
        for g in range(int(np.prod(kernel.grid))):
            scope["point"](g, memory)
    return {b.name: np.array(memory[i]).reshape(b.shape)
            for i, b in enumerate(program.buffers) if b.kind == "out"}


def test_a_minimal_renderer_on_the_shared_walk_computes_an_elementwise_kernel():
    g = Graph("walk")
    x = g.input("x", "i32", (3, 4))
    y = g.input("y", "i32", (1, 4))  # broadcast: a zero stride along dimension 0
    s = g.binary("add", x, y)
    g.output("z", g.where(g.binary("lt", x, y), g.binary("mul", s, 3),
                          g.binary("and", s, 6)))
    program = pipeline.run(g.program())
    rng = np.random.default_rng(0)
    a, b = rng.integers(-9, 9, (3, 4)), rng.integers(-9, 9, (1, 4))
    out = _run(program, {"x": a, "y": b})["z"]
    np.testing.assert_array_equal(out, np.where(a < b, (a + b) * 3, (a + b) & 6))


def test_an_op_missing_from_the_table_is_a_compile_error_naming_the_target():
    g = Graph("missing")
    g.output("z", g.binary("sub", g.input("x", "i32", (4,)), 1))
    program = pipeline.run(g.program())
    with pytest.raises(CompileError, match=r"python: kernel .*no sub on i32"):
        _run(program, {"x": np.arange(4)})


@pytest.mark.parametrize("dims", [(0, 1, 2), (2, 0), (1,), (0, 2)])
def test_row_major_coordinates_are_numpys_unravel_index(dims):
    domain = (3, 1, 5)
    extents = [domain[d] for d in dims]
    coords = list(row_major(domain, dims))
    assert [d for d, _, _ in coords] == [d for d in reversed(dims) if domain[d] > 1]
    for flat in range(int(np.prod(extents))):
        want = dict(zip(dims, np.unravel_index(flat, extents)))
        got = {d: (flat // stride) % n for d, stride, n in coords}
        assert all(got.get(d, 0) == want[d] for d in dims)


def _gather(operand: str, bounds: tuple[int, int], offset: int = 10):
    kernel = SimpleNamespace(body=[SimpleNamespace(dtype=dt.dtype(operand))])
    return kernel, SimpleNamespace(args=(0,), bounds=bounds, map=SimpleNamespace(offset=offset))


@pytest.mark.parametrize("operand, bounds, want", [
    ("i32", (0, 99), Clamp(10, True, 0, 99)),
    ("u8", (0, 999), Clamp(10, True, None, None)),  # u8 passes neither bound
    ("i8", (-500, 5), Clamp(10, True, None, 5)),
    ("i64", (-2**63, 2**63 - 1), Clamp(10, True, None, None)),
    ("u8", (300, 400), Clamp(310, False, None, None)),  # every value clamps up to 300
    ("i8", (-900, -200), Clamp(-190, False, None, None)),  # ... down to -200
])
def test_gather_bounds_are_cut_to_the_operand_range(operand, bounds, want):
    assert gather_clamp(*_gather(operand, bounds)) == want


def test_a_clamp_gives_the_element_the_isa_defines_for_every_operand_value():
    for operand, (low, high) in itertools.product(
            ("i8", "u8"), [(0, 99), (-500, 5), (300, 400), (-900, -200), (-3, 3)]):
        t = dt.dtype(operand)
        clamp = gather_clamp(*_gather(operand, (low, high)))
        for k in range(int(t.min), int(t.max) + 1):
            if not clamp.operand:
                got = clamp.offset
            else:
                v = k if clamp.low is None else max(k, clamp.low)
                got = clamp.offset + (v if clamp.high is None else min(v, clamp.high))
            assert got == 10 + min(max(k, low), high), (operand, low, high, k)
