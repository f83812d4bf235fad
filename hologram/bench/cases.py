"""The benchmark suite's operations: each :class:`OpSpec` pairs a PyTorch function with the
Hologram SDK function computing the same thing, an input generator, and the tolerances its
output is verified with.

Families: ``elementwise``, ``activations``, ``transcendentals``, ``reductions``, ``gemm``,
``losses`` and ``fused`` (a chain of ops: ``hg.jit`` against PyTorch eager and
``torch.compile``). ``size`` is a number of elements, except for GEMM where it is N of an
N×N×N product. Tolerances: the notebooks' rtol=1e-5, atol=1e-8 where both sides compute the
same rounded IEEE result (add, mul, div, neg, abs, relu, max, min); elsewhere rtol=1e-5
with an atol of a few float32 ulps of the output's scale; for sums, an atol that grows with
the number of terms summed (both libraries sum in float32 in different orders); matrix
products (``contraction``) within the forward error bound
:func:`~hologram.bench.verify.contraction_bound` of PyTorch's result.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import hologram as hg

FAMILIES = ("elementwise", "activations", "transcendentals", "reductions", "gemm", "losses",
            "fused")

F32_EPS = float(np.finfo(np.float32).eps)
Inputs = Callable[[np.random.Generator, int], tuple[np.ndarray, ...]]


@dataclass(frozen=True)
class OpSpec:
    """One benchmarked operation.

    ``torch_fn`` and ``hologram_fn`` take the inputs (torch tensors, Hologram buffers) made
    from ``inputs(rng, size)``; ``compiled`` (fused chains only) is the same function for
    ``torch.compile``. ``atol_per_term`` adds ``atol_per_term * sqrt(terms)`` to ``atol``
    for reductions over ``terms(size)`` values. ``contraction``: the output is the product of
    the first two inputs, verified within their
    :func:`~hologram.bench.verify.contraction_bound` (on top of ``rtol``/``atol``).
    """

    family: str
    name: str
    torch_fn: Callable
    hologram_fn: Callable
    inputs: Inputs
    rtol: float = 1e-5
    atol: float = 1e-8
    atol_per_term: float = 0.0
    terms: Callable[[int], int] = lambda size: size
    compiled: Callable | None = None
    contraction: bool = False

    def tolerances(self, size: int) -> tuple[float, float]:
        return self.rtol, self.atol + self.atol_per_term * math.sqrt(self.terms(size))


# --- inputs ---------------------------------------------------------------------------------
def _normal(count: int) -> Inputs:
    def make(rng: np.random.Generator, size: int) -> tuple[np.ndarray, ...]:
        return tuple(rng.standard_normal(size, dtype=np.float32) for _ in range(count))
    return make


def _uniform(low: float, high: float) -> Inputs:
    def make(rng: np.random.Generator, size: int) -> tuple[np.ndarray, ...]:
        return (rng.uniform(low, high, size).astype(np.float32),)
    return make


def _divide(rng: np.random.Generator, size: int) -> tuple[np.ndarray, ...]:
    # Divisors away from 0, so the quotient stays in a range where rtol means something.
    b = rng.uniform(0.5, 2.0, size).astype(np.float32) * rng.choice([-1, 1], size)
    return rng.standard_normal(size, dtype=np.float32), b.astype(np.float32)


ROW = 1024  # softmax and cross-entropy rows (classes)


def _rows(size: int) -> tuple[int, int]:
    cols = min(size, ROW)
    return (max(1, size // cols), cols)


def _matrix(rng: np.random.Generator, size: int) -> tuple[np.ndarray, ...]:
    return (rng.standard_normal(_rows(size), dtype=np.float32),)


def _square(rng: np.random.Generator, n: int) -> tuple[np.ndarray, ...]:
    return tuple(rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))


def _logits_targets(rng: np.random.Generator, size: int) -> tuple[np.ndarray, ...]:
    rows, classes = _rows(size)
    return (rng.standard_normal((rows, classes), dtype=np.float32),
            rng.integers(0, classes, rows).astype(np.int64))


# --- the registry ---------------------------------------------------------------------------
def _specs() -> list[OpSpec]:
    import torch
    import torch.nn.functional as F

    ops = hg.ops
    ulps = 4 * F32_EPS  # a few ulps of an O(1) result
    return [
        OpSpec("elementwise", "add", torch.add, ops.vector_add, _normal(2)),
        OpSpec("elementwise", "mul", torch.mul, ops.vector_mul, _normal(2)),
        OpSpec("elementwise", "div", torch.div, ops.vector_div, _divide),
        OpSpec("elementwise", "neg", torch.neg, ops.vector_neg, _normal(1)),
        OpSpec("elementwise", "abs", torch.abs, ops.vector_abs, _normal(1)),
        OpSpec("activations", "relu", torch.relu, ops.relu, _normal(1)),
        OpSpec("activations", "sigmoid", torch.sigmoid, ops.sigmoid, _normal(1), atol=ulps),
        OpSpec("activations", "tanh", torch.tanh, ops.tanh, _normal(1), atol=ulps),
        OpSpec("activations", "softmax", lambda x: torch.softmax(x, -1),
               lambda x: ops.softmax(x, dim=-1), _matrix, atol=ulps / ROW),
        # erf-based GELU: both sides' erf differ by a few ulps of x where gelu(x) ≈ 0.
        OpSpec("activations", "gelu", F.gelu, ops.gelu, _normal(1), atol=4 * ulps),
        OpSpec("transcendentals", "exp", torch.exp, ops.exp, _normal(1), atol=ulps),
        OpSpec("transcendentals", "log", torch.log, ops.log, _uniform(0.01, 100.0), atol=ulps),
        OpSpec("transcendentals", "sqrt", torch.sqrt, ops.sqrt, _uniform(0.0, 100.0)),
        OpSpec("transcendentals", "pow", lambda x: torch.pow(x, 2.5),
               lambda x: ops.pow(x, 2.5), _uniform(0.0, 4.0), atol=ulps),
        OpSpec("reductions", "sum", torch.sum, ops.sum, _normal(1), rtol=1e-4,
               atol_per_term=8 * F32_EPS),
        OpSpec("reductions", "max", torch.max, ops.max, _normal(1)),
        OpSpec("reductions", "min", torch.min, ops.min, _normal(1)),
        OpSpec("gemm", "gemm", torch.matmul,
               lambda a, b: ops.gemm(a, b, m=a.shape[0], n=b.shape[1], k=a.shape[1]),
               _square, rtol=0.0, atol=0.0, contraction=True),
        OpSpec("losses", "mse", F.mse_loss, ops.mse_loss, _normal(2), rtol=1e-4, atol=ulps),
        OpSpec("losses", "cross_entropy", F.cross_entropy, ops.cross_entropy_loss,
               _logits_targets, rtol=1e-4, atol=ulps),
        _chain("relu(a*b+c)", lambda a, b, c: torch.relu(a * b + c),
               lambda a, b, c: ops.relu(a * b + c)),
        _chain("sigmoid(a)*b+c", lambda a, b, c: torch.sigmoid(a) * b + c,
               lambda a, b, c: ops.sigmoid(a) * b + c, atol=ulps),
        _chain("exp(a-b)*c", lambda a, b, c: torch.exp(a - b) * c,
               lambda a, b, c: ops.exp(a - b) * c, atol=ulps),
    ]


def _chain(name: str, torch_fn: Callable, hologram_fn: Callable, atol: float = 1e-7) -> OpSpec:
    import torch

    # dynamic=False: one specialized graph per size, as hg.jit specializes per shape.
    compiled = torch.compile(torch_fn, dynamic=False)
    return OpSpec("fused", name, torch_fn, hg.jit(hologram_fn), _normal(3), atol=atol,
                  compiled=compiled)


_REGISTRY: list[OpSpec] | None = None


def registry() -> list[OpSpec]:
    """Every benchmarked operation, in report order (built on first use: imports torch)."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _specs()
    return _REGISTRY


def select(names: list[str] | None) -> list[OpSpec]:
    """The specs named (an op name like ``add`` or a family like ``reductions``); all of
    them for None. Unknown names raise ``ValueError`` listing the known ones."""
    specs = registry()
    if not names:
        return list(specs)
    known = {s.name for s in specs} | set(FAMILIES)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown ops {unknown}; known: families {list(FAMILIES)}, ops "
                         f"{[s.name for s in specs]}")
    wanted = set(names)
    return [s for s in specs if s.name in wanted or s.family in wanted]


def find_by_torch(torch_op: Callable) -> OpSpec | None:
    """The spec whose PyTorch function is ``torch_op`` (e.g. ``torch.abs``), if any."""
    for spec in registry():
        if spec.torch_fn is torch_op:
            return spec
    return None
