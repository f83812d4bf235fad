"""The backend's declaration (:meth:`Backend.supports`) and what it promises: unsupported
pairs are refused with a clear DTypeError at compile time, and work the backend hands
elsewhere is declared in its artifact, never silent."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import hologram
from hologram import backends
from hologram.backends.base import check_supported, unsupported_pairs
from hologram.compiler.capabilities import Capabilities
from hologram.errors import DTypeError, HologramError
from hologram.isa import dtypes as dt
from hologram.isa.builder import ProgramBuilder
from hologram.isa.ir import ALL_OPS, REDUCE_KINDS

from .numerics import assert_close, both, delegated, elementwise


def test_the_suite_knows_every_opcode():
    """A new opcode or reduction kind must get conformance tests (and an entry here)."""
    assert set(ALL_OPS) == {
        "load", "store", "gather", "scatter", "const", "index", "fma", "select", "cast",
        "reduce", "contract",
        "abs", "neg", "not", "sign", "sqrt", "rsqrt", "exp", "exp2", "expm1", "log", "log2",
        "log1p", "tanh", "sigmoid", "erf", "sin", "cos", "floor", "ceil", "round", "trunc",
        "add", "sub", "mul", "div", "mod", "min", "max", "pow", "and", "or", "xor",
        "eq", "ne", "lt", "le", "gt", "ge"}
    assert REDUCE_KINDS == ("sum", "prod", "max", "min", "argmax", "argmin")
    assert len(dt.ALL) == 10


def test_the_declaration_is_total(backend):
    """supports() answers every (opcode, dtype) pair with a bool."""
    impl = backends.get(backend)
    for op in ALL_OPS:
        for t in dt.ALL:
            assert impl.supports(op, t) in (True, False), (op, t)


def test_capabilities_are_declared_for_every_target_and_match_the_declaration(backend):
    """Backend.capabilities(): a Capabilities for the current target, an error naming the
    known targets for an unknown one, and no f64 arithmetic where f64 is not declared."""
    impl = backends.get(backend)
    caps = impl.capabilities()
    assert isinstance(caps, Capabilities)
    if not caps.f64:
        assert not any(impl.supports(op, dt.float64) for op in ("add", "mul", "div"))
    with pytest.raises(HologramError, match="no-such-target"):
        impl.capabilities("no-such-target")


def _restricted(backend: str):
    """The backend with f64 taken away, as a backend without f64 (WebGPU) declares."""
    base = backends.backend_class(backend)

    class NoF64(base):
        name = f"{backend}-without-f64"

        def supports(self, op, dtype):
            return dtype is not dt.float64 and super().supports(op, dtype)

    return NoF64()


def test_unsupported_pairs_are_refused_naming_backend_op_dtype_kernel_and_fix(backend):
    b = ProgramBuilder("uses_f64")
    x = b.input("x", "f32", (4,))
    y = b.output("y", "f32", (4,))
    k = b.kernel((4,), name="widen")
    k.store(y, k.cast(k.exp(k.cast(k.load(x), "f64")), "f32"))
    program = b.build()
    impl = _restricted(backend)
    assert unsupported_pairs(impl, program) == [("widen", "cast", dt.float64),
                                                ("widen", "exp", dt.float64)]
    with pytest.raises(DTypeError) as error:
        check_supported(impl, program, [backends.get("interp")])
    message = str(error.value)
    for words in (repr(impl.name), "exp on f64", "kernel widen", "uses_f64",
                  "run it on backend 'interp'", "cast to f32"):
        assert words in message, (words, message)
    if backends.get(backend).supports("exp", dt.float64):
        check_supported(backends.get(backend), program)  # the real backend declares f64


def test_delegation_is_declared_and_agrees(backend):
    """A kernel the backend cannot run itself (here a row of sums reduced again per grid
    point) may run elsewhere only if the artifact says so (and then the results still
    agree); the suite's run() catches undeclared interpreter calls."""
    b = ProgramBuilder("fallback")
    x = b.input("x", "f32", (4, 5, 6))
    m = b.output("m", "f32", (4,))
    k = b.kernel((4, 5, 6))
    rows = k.reduce("sum", k.mul(k.load(x), 2.0), 2)  # varies along a loop dimension
    k.store(m, k.reduce("max", k.mul(rows, rows), 1), strides=(1, 0, 0), shape=(4, 1, 1))
    program = b.build()
    x0 = np.random.default_rng(12).standard_normal(120).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a backend's once-per-reason fallback warning
        (got,), (want,) = both(program, backend, [x0], delegation_ok=True)
    moved = delegated(program, backend)
    if moved:
        print(f"{backend} runs kernels {moved} of {program.name} elsewhere (declared)")
    assert_close(got, want, dt.float32, ulps=64, what="max of squared row sums",
                 backend=backend)


def test_compile_checks_the_declaration(backend, monkeypatch):
    """hologram.compile refuses what the backend does not declare, before building."""
    impl = backends.get(backend)
    monkeypatch.setattr(impl, "supports", lambda op, t: op != "exp")
    program = elementwise("exp", [dt.float32], 3)
    with pytest.raises(DTypeError, match=f"(?s)backend {backend!r} .*exp on f32"):
        hologram.compile(program, backend=backend)
