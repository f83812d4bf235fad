"""Running programs on a backend and on the interpreter, input values, and the tolerances
of the ISA (docs/isa.md, docs/mathlib.md).

Tolerances (the backend's result against the interpreter's):

- bit for bit (-0.0 differs from +0.0, any NaN equals any NaN) for integer and bool results
  and for exactly rounded float operations: ``add sub mul div mod sqrt fma min max abs neg
  sign floor ceil round trunc``, compares, ``select``, casts, loads and stores;
- ``rsqrt``: 1 ulp; transcendentals in f32 and f64: :data:`ULPS` (docs/mathlib.md), plus
  an absolute 1e-6 where the reference is below 1e-30 and for sin/cos near their zeros;
  f16 and bf16 results of inexact operations: 1 ulp of their own format;
- float reductions and contractions: :func:`reduction_tolerance` (the ISA's bound);
- NaN positions always match, infinities match (except where the bound allows an
  intermediate overflow), and where both results are zero their signs match.

One declared deviation: a backend whose ``flushes_subnormals()`` says so (webgpu on a
driver that flushes f32 subnormals to zero, as WGSL allows) is compared, element by
element, with the interpreter's result *or* the interpreter's result computed with
subnormal f32 and bf16 inputs and operation results taken as zeros of the same sign
(:func:`both`, :func:`forgive_flushing`). Every other backend, and webgpu on a driver that
keeps subnormals, is compared as above.

Outputs start as poison (0xFF bytes), so an element a backend forgets to write fails.
Every run also checks that the backend ran every kernel itself
(:meth:`~hologram.backends.base.Backend.delegated`).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import zlib

import numpy as np
import pytest
from util import random_array

import hologram
from hologram import backends
from hologram.backends.base import unsupported_pairs
from hologram.backends.interp import interpreter
from hologram.compiler.capabilities import MissingCapabilityError
from hologram.errors import DTypeError, IRError
from hologram.isa import dtypes as dt
from hologram.isa.builder import ProgramBuilder
from hologram.isa.dtypes import DType
from hologram.isa.ir import REDUCE_KINDS, Program
from hologram.isa.verify import infer

NAN, INF = math.nan, math.inf


def seed_of(*parts: object) -> int:
    """A per-case random seed that is the same in every process."""
    return zlib.crc32(" ".join(map(str, parts)).encode())


# --- known bugs ---------------------------------------------------------------------------
#: (backend, case) -> why the backend disagrees with the ISA today. Each is run as an
#: ``xfail(strict=True)``: fixing the bug makes the case pass and the suite fail until the
#: entry is removed.
KNOWN_BUGS: dict[tuple[str, str], str] = {}


def expect_known_bug(request, backend: str, case: str) -> None:
    """Mark the running test ``xfail(strict=True)`` if ``case`` is a known bug of
    ``backend`` (:data:`KNOWN_BUGS`)."""
    reason = KNOWN_BUGS.get((backend, case))
    if reason is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


# --- running ------------------------------------------------------------------------------
def delegated(program: Program, backend: str) -> list[int]:
    """Kernels of ``program`` that ``backend`` runs somewhere else (see
    :meth:`Backend.delegated`)."""
    artifact = hologram.build(program, backend=backend)
    return backends.get(backend).delegated(artifact.data)


def run(program: Program, backend: str, inputs: list[np.ndarray],
        delegation_ok: bool = False) -> list[np.ndarray]:
    """The program's out/inout arrays (flat) after a run on ``backend``, outputs starting
    as poison.

    Fails if the backend hands a kernel to another backend, unless ``delegation_ok`` (a
    backend's declared policy, e.g. for zero extents); even then, delegation must never
    be silent: the backend's artifact must list the kernels it moves
    (:meth:`Backend.delegated`). Work handed to the reference interpreter is also caught
    in the act: its entry points are counted while the backend runs."""
    missing = unsupported_pairs(backends.get(backend), program)
    if missing:  # refused as declared (Backend.supports): with a DTypeError, checked here
        with pytest.raises(DTypeError):
            hologram.compile(program, backend=backend)
        pairs = ", ".join(sorted({f"{op} on {t.name}" for _, op, t in missing}))
        pytest.skip(f"{backend} declares no {pairs} (refused with DTypeError, as declared)")
    compiled = hologram.compile(program, backend=backend)
    declared = [] if backend == "interp" else delegated(program, backend)
    given = iter(inputs)
    arrays = [np.array(next(given), copy=True) if p.kind != "out" else
              np.full(p.nbytes, 0xFF, dtype=np.uint8).view(p.dtype.storage).reshape(p.shape)
              for p in program.params]
    with _interpreter_calls(backend) as calls:
        if backends.get(backend).allocator().host_visible:
            out = compiled(*arrays)
        else:
            out = _run_on_device(compiled, backend, arrays)
    where = f"backend {backend!r} on program {program.name}"
    assert not calls or declared, (f"{where}: ran {len(calls)} kernel(s) on the reference "
                                   "interpreter without declaring it (Backend.delegated)")
    assert delegation_ok or not declared, f"{where}: runs kernels {declared} elsewhere"
    out = out if isinstance(out, tuple) else (out,)
    return [np.asarray(a).reshape(-1) for a in out]


def _run_on_device(compiled, backend: str, arrays: list[np.ndarray]) -> tuple:
    """Run on a backend whose memory the host cannot see: every parameter copied into an
    executor's buffer (outputs too, so they start as poison), launched on the handles,
    the out/inout buffers copied back."""
    import hologram as hg

    # bf16 storage (uint16) is not a buffer dtype: its bits travel as int16.
    def bits(a: np.ndarray) -> np.ndarray:
        return a.view(np.int16) if a.dtype == np.uint16 else a

    with hg.Executor(backend) as ex:
        buffers = [ex.from_numpy(bits(a)) for a in arrays]
        compiled.launch(tuple(b.handle for b in buffers))
        return tuple(b.to_numpy().view(a.dtype) for a, b, p in
                     zip(arrays, buffers, compiled.params) if p.kind != "in")


@contextlib.contextmanager
def _interpreter_calls(backend: str):
    """Count calls of the interpreter's entry points (none for the interpreter itself)."""
    calls: list[str] = []
    if backend == "interp":
        yield calls
        return
    with pytest.MonkeyPatch.context() as mp:
        for name in ("run", "execute", "run_kernel"):
            original = getattr(interpreter, name)

            def counted(*args, _original=original, _name=name, **kwargs):
                calls.append(_name)
                return _original(*args, **kwargs)

            mp.setattr(interpreter, name, counted)
        yield calls


def far_cases(offset: dt.DType, n: int, rng: np.random.Generator) -> list[tuple]:
    """Data-dependent accesses (gather, scatter) through operands of dtype ``offset``:
    ``(map offset, stride, bounds, buffer size, n operand values)`` for bounds a narrow
    operand cannot reach on either side (nothing to clamp), and maps 2**33 before or
    after a 300-element buffer brought back into it by bounds beyond the 32-bit range (an
    i64 operand near the bound, and the 64-bit extremes)."""
    lo, hi = int(offset.min), int(offset.max)
    cases = []
    if offset.bits <= 16:  # a buffer past both ends of the operand's range
        size = hi - lo + 7
        cases.append((3 - lo, 0, (lo - 3, hi + 3), size, values(offset, n, rng)[:n]))
    for sign in (1, -1):
        far = sign * 2**33
        at = values(offset, n, rng)[:n]
        if offset.name == "i64":  # around the bound, and the 64-bit extremes
            at = (-far + rng.integers(-50, 150, n)).astype(np.int64)
            at[:4] = [-2**63, 2**63 - 1, -far, 0]
        cases.append((far + 5, 1, (-far, -far + 300 - 5 - n), 300, at))
    return cases


def edge_offsets(op: str, offset: dt.DType) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The edge-offset case of a data-dependent access (``op``: gather, scatter) through
    operands of dtype ``offset``: ``(data, ids, positions)``: ``data`` 300 i32 elements,
    ``ids`` every edge value of the dtype (its own width's extremes included) and random
    ones, ``positions`` the element that the 1-d map ``5 + i`` (unit stride) reaches
    through ``ids[i]`` under the default bounds, which clamp the operand so that every
    ``i`` of the map stays inside the 300 elements."""
    data = np.arange(300, dtype=np.int32) * 3 - 7
    ids = values(offset, 200, np.random.default_rng(seed_of(f"{op} edges", offset.name)))
    n = ids.size
    positions = 5 + np.arange(n) + np.clip(ids.astype(np.int64), -5, 299 - 5 - (n - 1))
    return data, ids, positions


def declares(backend: str, capability: str) -> bool:
    """Whether the backend's current target declares ``capability`` (a field of
    :class:`~hologram.compiler.capabilities.Capabilities`, from
    :meth:`~hologram.backends.base.Backend.capabilities`)."""
    return getattr(backends.get(backend).capabilities(), capability)


def both_or_refused(program: Program, backend: str, inputs: list[np.ndarray],
                    capability: str, words: tuple[str, ...] = (),
                    delegation_ok: bool = False):
    """:func:`both` where the backend declares ``capability``; else the backend must refuse
    the program at compile time naming the capability, the program, the backends that
    run it and ``words`` (checked, then the test is skipped)."""
    if declares(backend, capability) or unsupported_pairs(backends.get(backend), program):
        # (both() skips a declared dtype refusal)
        return both(program, backend, inputs, delegation_ok)
    with pytest.raises(MissingCapabilityError) as error:
        hologram.compile(program, backend=backend)
    for word in (capability, program.name, "cpu or interp", *words):
        assert word in str(error.value), (word, str(error.value))
    pytest.skip(f"{backend} declares no {capability} capability (refused, as it must be)")

def both(program: Program, backend: str, inputs: list[np.ndarray],
         delegation_ok: bool = False) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(``backend``'s outputs, the interpreter's). On a backend that flushes subnormals
    (:func:`flushes_subnormals`), each element of the backend's outputs that equals the
    flushed reference (:func:`forgive_flushing`) is replaced by the interpreter's."""
    got = run(program, backend, inputs, delegation_ok)
    want = run(program, "interp", inputs, delegation_ok=True)
    if flushes_subnormals(backend):
        got = forgive_flushing(program, inputs, got, want)
    return got, want


# --- devices that flush subnormals ---------------------------------------------------------
#: The dtypes whose values include f32 subnormals: what a device that computes in f32 and
#: flushes its subnormals loses (f16's subnormals are normal f32 values).
FLUSHED = {"f32": (np.uint32, 0x7F800000, 0x80000000), "bf16": (np.uint16, 0x7F80, 0x8000)}


def flushes_subnormals(backend: str) -> bool:
    """Whether ``backend``'s device flushes f32 subnormals to zero
    (:meth:`hologram.backends.Backend.flushes_subnormals`; webgpu: a probe of the
    driver)."""
    return backends.get(backend).flushes_subnormals()


def flush(a: np.ndarray, t: DType) -> np.ndarray:
    """Storage array ``a`` of dtype ``t`` with its f32 subnormals (f32, bf16) replaced by
    zeros of the same sign; other dtypes unchanged."""
    if t.name not in FLUSHED:
        return a
    kind, exponent, sign = FLUSHED[t.name]
    a = np.array(a, copy=True)
    bits = a.view(kind)
    subnormal = (bits & exponent) == 0
    bits[subnormal] &= kind(sign)
    return a


def forgive_flushing(program: Program, inputs: list[np.ndarray], got: list[np.ndarray],
                     want: list[np.ndarray]) -> list[np.ndarray]:
    """``got`` (a backend's outputs, flat) where each element that equals, bit for bit
    (any NaN equal to any NaN) and with subnormals taken as zeros of the same sign, the
    interpreter's result *as a device that flushes computes it* is replaced by ``want``'s
    element. That result: subnormal f32 and bf16 inputs, and every f32 and bf16
    operation's result, taken as zeros of the same sign (:func:`flush`), so that a
    product that underflows and is scaled back up later is 0 there too. Any other
    difference stays, for the caller's comparison to find."""
    given = [p for p in program.params if p.kind != "out"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(interpreter, "evaluate", _flushing(interpreter.evaluate))
        flushed = run(program, "interp", [flush(x, p.dtype) for x, p in zip(inputs, given)],
                      delegation_ok=True)
    outs = [p for p in program.params if p.kind != "in"]
    forgiven = []
    for p, g, w, f in zip(outs, got, want, flushed):
        g2, f2 = flush(g, p.dtype), flush(f, p.dtype)
        if p.dtype.is_float:
            same = g2.view(f"u{g2.itemsize}") == f2.view(f"u{f2.itemsize}")
            same |= np.isnan(as_float(g2, p.dtype)) & np.isnan(as_float(f2, p.dtype))
        else:
            same = g2 == f2
        forgiven.append(np.where(same, w, g))
    return forgiven


def _flushing(evaluate):
    """The interpreter's ``evaluate`` with f32 and bf16 results flushed (their compute
    type is float32; bf16 values are bf16-exact float32)."""
    def flushed(instr, args, domain):
        result = evaluate(instr, args, domain)
        if instr.dtype.name in FLUSHED:
            result = flush(result.astype(np.float32, copy=False), dt.float32)
        return result

    return flushed


def supported(backend: str, op: str, *types: DType) -> bool:
    impl = backends.get(backend)
    return all(impl.supports(op, t) for t in types)


def accepts(op: str, types: list[DType], result: DType | None = None) -> bool:
    """Does the ISA's typing rule accept ``op`` on operands of ``types``?"""
    try:
        infer(op, [(t, (1,)) for t in types], (), result, (1,))
    except IRError:
        return False
    return True


def elementwise(op: str, types: list[DType], n: int, result: DType | None = None) -> Program:
    """``out = op(a0, a1, ...)`` over ``n`` elements (``cast`` to ``result``)."""
    b = ProgramBuilder(f"{op}_{'_'.join(t.name for t in types)}")
    buffers = [b.input(f"a{i}", t, (n,)) for i, t in enumerate(types)]
    k = b.kernel((n,))
    loaded = tuple(k.load(x) for x in buffers)
    value = k.cast(loaded[0], result) if op == "cast" else k.emit(op, loaded)
    out = b.output("out", value.dtype, (n,))
    k.store(out, value)
    return b.build()


def rmw_program(strided: bool, total: bool = False) -> Program:
    """``x = fma(x, 2, y)`` in place on an (8, 10) f32 inout ``x``: all of it, or
    (``strided``) every other column of rows 1..6, the rest untouched. With ``total``, a
    second kernel writes the row sums of the new ``x`` to an output ``total``."""
    b = ProgramBuilder("rmw")
    x = b.buffer("x", "f32", (8, 10), "inout")
    y = b.input("y", "f32", (8, 10))
    out = b.output("total", "f32", (8,)) if total else None
    if strided:
        shape, offset, strides = (6, 5), 10, (10, 2)
    else:
        shape, offset, strides = (8, 10), 0, (10, 1)
    k = b.kernel(shape)
    old = k.load(x, shape, offset, strides)
    k.store(x, k.fma(old, 2.0, k.load(y, shape, offset, strides)), offset, strides, shape)
    if total:
        k2 = b.kernel((8, 10))
        k2.store(out, k2.reduce("sum", k2.load(x), 1), strides=(1, 0), shape=(8, 1))
    return b.build()


# --- float bits ---------------------------------------------------------------------------
_BITS = {"f16": np.int16, "bf16": np.int16, "f32": np.int32, "f64": np.int64}
#: Unit roundoff of each float dtype.
UNIT_ROUNDOFF = {"f16": 2.0 ** -11, "bf16": 2.0 ** -8, "f32": 2.0 ** -24, "f64": 2.0 ** -53}


def as_float(raw: np.ndarray, t: DType) -> np.ndarray:
    """Storage values of a float dtype as float64 (exact)."""
    if t is dt.bfloat16:
        return dt.from_bf16_bits(raw).astype(np.float64)
    return np.asarray(raw).astype(np.float64)


def storage(values, t: DType) -> np.ndarray:
    """Float64 values rounded once to float dtype ``t``, as storage."""
    values = np.asarray(values, dtype=np.float64)
    if t is dt.bfloat16:
        return dt.to_bf16_bits(values)
    with np.errstate(over="ignore"):
        if t is dt.float16:  # through round-to-odd f32: one rounding
            return dt.round_to_odd_f32(values).astype(np.float16)
        return values.astype(t.storage)


def _ordered(raw: np.ndarray, t: DType) -> np.ndarray:
    kind = _BITS[t.name]
    bits = np.ascontiguousarray(raw).reshape(-1).view(kind).astype(np.int64)
    out = bits.copy()
    negative = bits < 0
    out[negative] = np.iinfo(kind).min - bits[negative]
    return out


def ulp_distance(a: np.ndarray, b: np.ndarray, t: DType) -> np.ndarray:
    """Representable values of ``t`` between ``a`` and ``b`` (storage arrays), as uint64."""
    x, y = _ordered(a, t), _ordered(b, t)
    return np.maximum(x, y).astype(np.uint64) - np.minimum(x, y).astype(np.uint64)


def _show(value, array, t: DType | None = None) -> str:
    if array.dtype == np.uint16 and (t is None or t is dt.bfloat16):
        return f"bf16 {float(dt.from_bf16_bits(np.uint16(value))):.9g} (0x{int(value):04x})"
    if array.dtype.kind == "f":
        return f"{float(value)!r}"
    return repr(value.item() if hasattr(value, "item") else value)


def _describe(bad, got, want, t: DType, inputs, backend: str, extra=None) -> str:
    lines = []
    for i in np.flatnonzero(bad)[:8]:
        args = ", ".join(_show(x[i] if x.size > 1 else x[0], x) for x in inputs)
        more = f" ({extra[i]} ulp)" if extra is not None else ""
        lines.append(f"  [{i}] inputs ({args}): {backend} {_show(got[i], got, t)}, "
                     f"interp {_show(want[i], want, t)}{more}")
    return f"{int(bad.sum())} of {bad.size} differ:\n" + "\n".join(lines)


def assert_close(got, want, t: DType, ulps: int = 0, atol=0.0, inputs=(), what: str = "",
                 backend: str = "backend") -> None:
    """``got`` agrees with the interpreter's ``want``: exact for non-floats; for floats
    equal NaN and infinity positions (an infinite ``atol`` waives the latter), equal signs
    of zeros, and otherwise within ``ulps`` or ``atol`` (a scalar or an array)."""
    got, want = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype,
                                                                 got.shape, want.shape)
    inputs = [np.asarray(x).reshape(-1) for x in inputs]
    if not t.is_float:
        bad = got != want
        assert not bad.any(), f"{what}: " + _describe(bad, got, want, t, inputs, backend)
        return
    g, w = as_float(got, t), as_float(want, t)
    nan_g, nan_w = np.isnan(g), np.isnan(w)
    distance = ulp_distance(got, want, t)
    atol = np.broadcast_to(np.asarray(atol, dtype=np.float64), g.shape)
    with np.errstate(invalid="ignore"):
        ok = (distance <= ulps) | (np.abs(g - w) <= atol)
    ok &= (np.isinf(g) == np.isinf(w)) | np.isinf(atol)
    zeros = (g == 0) & (w == 0)
    ok &= ~zeros | (np.signbit(g) == np.signbit(w))
    bad = (nan_g != nan_w) | (~nan_g & ~nan_w & ~ok)
    assert not bad.any(), f"{what}: " + _describe(bad, got, want, t, inputs, backend,
                                                   np.where(nan_g | nan_w, 0, distance))


# --- input values -------------------------------------------------------------------------
def _float_limits(t: DType) -> tuple[float, float, float]:
    """(smallest denormal, smallest normal, largest finite) of float dtype ``t``."""
    if t is dt.bfloat16:
        return 2.0 ** -133, 2.0 ** -126, float(dt.from_bf16_bits(np.uint16(0x7F7F)))
    info = np.finfo(t.storage)
    return float(info.smallest_subnormal), float(info.tiny), float(info.max)


def float_edges(t: DType, limit: float = INF) -> list[float]:
    """Zeros of both signs, infinities, NaN, denormals, the largest finite values, values
    around rounding ties and function thresholds."""
    sub, tiny, big = _float_limits(t)
    values = [0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 2.0, 3.0,
              -3.0, 10.0, -100.0, 1e-3, 0.1, math.pi, -math.pi / 2, 1e-40, -1e-40, sub, -sub,
              tiny, -tiny, big, -big, 88.75, -87.5, -104.0, 710.0, 1e30, -1e30, 65519.0,
              65520.0, -0.999]
    return [v for v in values if not abs(v) > limit or math.isinf(v)]


def float_random(n: int, rng: np.random.Generator, limit: float = INF) -> np.ndarray:
    """Half normal(0, 3), a quarter normal(0, 30), a quarter with magnitudes 1e-10..1e10."""
    normal = rng.standard_normal(n) * 3
    wide = rng.standard_normal(n) * 30
    top = min(10.0, math.log10(limit))
    magnitude = 10.0 ** rng.uniform(-10, top, n) * rng.choice([-1.0, 1.0], n)
    pick = rng.random(n)
    return np.where(pick < 0.5, normal, np.where(pick < 0.75, wide, magnitude))


def int_edges(t: DType) -> list[int]:
    """The dtype's min and max and their neighbours, 0, ±1, small values, 8-bit limits."""
    if t.is_bool:
        return [False, True]
    lo, hi = t.min, t.max
    values = [lo, lo + 1, -100, -7, -2, -1, 0, 1, 2, 3, 7, 100, 127, 128, 254, 255, hi - 1, hi]
    return sorted({v for v in values if lo <= v <= hi})


def values(t: DType, n: int, rng: np.random.Generator, limit: float = INF) -> np.ndarray:
    """Edge values of ``t`` followed by ``n`` random ones, as storage."""
    if t.is_float:
        return storage(np.concatenate([float_edges(t, limit), float_random(n, rng, limit)]), t)
    if t.is_bool:
        return np.concatenate([[False, True], rng.random(n) < 0.5])
    small = rng.integers(max(t.min, -50), min(t.max, 50), n, endpoint=True)
    full = rng.integers(t.min, t.max, n, endpoint=True,
                        dtype=np.int64 if t.kind == "i" else np.uint64)
    mixed = np.where(rng.random(n) < 0.5, small, full.astype(np.int64))
    return np.concatenate([np.array(int_edges(t), dtype=np.int64), mixed]).astype(t.storage)


def pairs(t: DType, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of edge values (division by zero, min / -1, ...), then ``n`` random
    pairs."""
    edges = storage(float_edges(t), t) if t.is_float else np.array(int_edges(t)).astype(t.storage)
    a = np.concatenate([np.repeat(edges, edges.size), values(t, n, rng)[-n:]])
    b = np.concatenate([np.tile(edges, edges.size), values(t, n, rng)[-n:]])
    return a, b


def fma_inputs(t: DType, rng: np.random.Generator) -> list[np.ndarray]:
    """``fma``'s three operands: every pair of edge values with an edge addend, random
    triples, and products that need every bit with an addend that cancels most of them."""
    edges = storage(float_edges(t), t)
    a, b = np.repeat(edges, edges.size), np.tile(edges, edges.size)
    c = rng.choice(edges, a.size)
    n = 1000
    rand = [storage(float_random(n, rng), t) for _ in range(3)]
    near = [storage(1 + rng.standard_normal(n) * 2.0 ** -8, t) for _ in range(2)]
    cancel = storage(-as_float(near[0], t) * as_float(near[1], t) * (1 + 2.0 ** -20), t)
    return [np.concatenate(parts) for parts in zip((a, b, c), rand, (*near, cancel))]


# --- tolerances ---------------------------------------------------------------------------
#: Transcendentals: max ulps in f32 and f64 (docs/mathlib.md); f16/bf16: 1 ulp.
ULPS = dict(exp=2, exp2=2, expm1=2, log=2, log2=2, log1p=2, tanh=4, sigmoid=4, erf=4, sin=4,
            cos=4, pow=4)
INEXACT = {**ULPS, "rsqrt": 1}
#: |x| of sin/cos inputs: the range docs/mathlib.md documents as accurate (every finite
#: argument, since sin and cos reduce huge ones with Payne-Hanek).
SINCOS_LIMIT = INF


def float_tolerance(op: str, t: DType, want: np.ndarray):
    """(ulps, atol) for elementwise ``op`` with result dtype ``t`` and reference ``want``."""
    if op not in INEXACT or not t.is_float:
        return 0, 0.0
    if t.bits == 16:
        return 1, 0.0
    w = np.abs(as_float(want, t))
    atol = np.where(w < 1e-30, 1e-6, 0.0) if op in ULPS else 0.0
    if op in ("sin", "cos"):
        near_zero = 1e-6 if t is dt.float32 else 1e-15
        atol = np.maximum(atol, np.where(w < 1e-2, near_zero, 0.0))
    return INEXACT[op], atol


def _accumulation(t: DType) -> float:
    """Unit roundoff of the narrowest accumulation the ISA allows for float dtype ``t``."""
    return UNIT_ROUNDOFF["f64" if t is dt.float64 else "f32"]


def reduction_tolerance(kind: str, t: DType, want: np.ndarray, terms: np.ndarray):
    """(ulps, atol) for a reduction of kind ``kind`` (``sum``, ``prod``, ..., ``contract``)
    with result dtype ``t``: ``want`` is the interpreter's result (flat, one per output
    element) and ``terms`` the float64 terms, shaped ``(len(want), n)`` (for ``contract``:
    the products).

    The bound is docs/isa.md's ("Float sums", the ``prod`` row): for ``n`` terms ``x_i``
    with exact result ``s``,

    - sum, contract: ``(ceil(log2 n) + 28) u sum|x_i| + u_r |s|``,
    - prod: ``gamma(n - 1) |s| + u_r |s|`` with ``gamma(k) = k u / (1 - k u)``,

    ``u`` the unit roundoff of the narrowest accumulation allowed (f32 for f16, bf16, f32;
    f64 for f64), ``u_r`` the result dtype's. The interpreter's exact-then-rounded result
    stands in for ``s`` (its error is inside ``u_r |s|``; 1 ulp covers the second rounding
    of f16/bf16 results, which the ISA allows). Where ``sum|x_i|`` (or the product's
    magnitude) passes the accumulation's largest finite value, an intermediate overflow
    is allowed: any result passes there. max, min, argmax, argmin and integer
    reductions are exact."""
    if kind not in ("sum", "prod", "contract") or not t.is_float:
        return 0, 0.0
    u, u_r = _accumulation(t), UNIT_ROUNDOFF[t.name]
    n = terms.shape[1] if terms.ndim == 2 else 1
    s = np.abs(as_float(want, t))
    magnitudes = np.abs(terms).reshape(len(s), -1)
    finite = np.isfinite(magnitudes).all(axis=1)  # else inf/NaN: the NaN and inf rules
    magnitudes = np.where(np.isfinite(magnitudes), magnitudes, 0.0)
    biggest = 3.4028234663852886e38 if u == UNIT_ROUNDOFF["f32"] else 1.7976931348623157e308
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if kind == "prod":
            k = max(n - 1, 0)
            atol = (k * u / (1 - k * u) + u_r) * s * (1 + u_r)
            # a partial product can pass the largest value only if the big factors can
            overflow = np.log(np.maximum(magnitudes, 1.0)).sum(axis=1) >= math.log(biggest)
        else:
            depth = math.ceil(math.log2(n)) if n > 1 else 0
            scale = magnitudes.sum(axis=1)
            atol = (depth + 28) * u * scale + u_r * s * (1 + u_r)
            overflow = scale >= biggest
    atol = np.where(finite, np.where(overflow, INF, atol), 0.0)
    return (1 if t.bits == 16 else 0), atol


# --- reductions ---------------------------------------------------------------------------
def axis_sets(rank: int) -> list[tuple[int, ...]]:
    """Every nonempty set of axes of a rank-``rank`` input; for rank 4 a sample: one, two
    inner, two outer, three, all."""
    if rank == 4:
        return [(1,), (2, 3), (0, 1), (0, 2, 3), (0, 1, 2, 3)]
    return [c for r in range(1, rank + 1) for c in itertools.combinations(range(rank), r)]


def kinds_for(backend: str, t: DType) -> list[str]:
    """The reduction kinds of the ISA on ``t`` that ``backend`` declares (arg*: with
    their i64 results)."""
    return [kind for kind in REDUCE_KINDS
            if not (t.is_bool and kind in ("sum", "prod"))
            and supported(backend, "reduce", t)
            and (not kind.startswith("arg") or supported(backend, "reduce", dt.int64))]


def tie_values(t: DType, n: int, rng: np.random.Generator) -> np.ndarray:
    """Few distinct values, so that extremes repeat (first-occurrence and NaN rules)."""
    if t.is_float:
        return storage(rng.choice([-0.0, 0.0, 1.0, -1.0, INF, -INF, NAN, 2.0], n,
                                  p=[.2, .2, .15, .15, .1, .1, .05, .05]), t)
    if t.is_bool:
        return rng.random(n) < 0.5
    return rng.choice(np.array([t.min, t.max, 0, 1], dtype=np.int64), n).astype(t.storage)


#: The input sets of the reduction tests, in the order they draw (:func:`reduction_inputs`).
REDUCTION_INPUTS = ("random", "edges", "ties")


def reduction_inputs(label: str, t: DType, params, rng: np.random.Generator
                     ) -> list[np.ndarray]:
    """Inputs of dtype ``t`` for the buffers ``params``: ``random`` (normal floats, small
    integers: :func:`util.random_array`), ``edges`` (the same sprinkled with edge values)
    or ``ties`` (:func:`tie_values`)."""
    if label == "ties":
        return [tie_values(t, p.size, rng) for p in params]
    assert label in ("random", "edges"), label
    return [random_array(p, rng, edges=label == "edges") for p in params]


def terms_of(x: np.ndarray, t: DType, shape, axes) -> np.ndarray:
    """The reduced terms as float64, one row per output element."""
    kept = [d for d in range(len(shape)) if d not in axes]
    n = math.prod(shape[a] for a in axes)
    x64 = as_float(x, t) if t.is_float else x.astype(np.float64)
    return np.transpose(x64.reshape(shape), kept + list(axes)).reshape(-1, n)


def assert_reduction_close(got, want, kind: str, t: DType, x: np.ndarray, shape, axes,
                           what: str, backend: str) -> None:
    """A reduction of kind ``kind`` of input ``x`` (storage of dtype ``t``, ``shape``)
    over ``axes``: ``got`` agrees with the interpreter's ``want`` within
    :func:`reduction_tolerance` (arg* results: int64, exact)."""
    rt = dt.int64 if kind.startswith("arg") else t
    ulps, atol = reduction_tolerance(kind, t, want, terms_of(x, t, shape, axes))
    assert_close(got, want, rt, ulps, atol, what=what, backend=backend)
