"""The cpu backend on every CPU target (``HOLOGRAM_CPU_TARGET``), not only on this host.

The target matrix: for each target of :data:`hologram.backends.cpu.target.TARGETS`, one
program per dtype exercises every opcode that accepts it (unary, binary, compares, select,
fma, the math library), one casts it to every dtype, one runs every reduction kind over
several axes, and one multiplies matrices in the generated loops. Targets this machine can
run (``target.runnable_targets()``, e.g. ``x86-64``, ``x86-64-v2`` and ``x86-64-v3`` on any
AVX2 host: no F16C, no FMA, no SSE4.1 among them) execute the programs and are compared
with the interpreter under test_cpu's tolerances. The others are compiled: object code is
emitted for them, and the check that refuses any runtime-library call must pass.

And the check itself: an object that calls a library function is refused, naming the
symbol, the function and the target; it never loads.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from conformance.numerics import fma_inputs
from test_cpu import (
    ALL,
    SINCOS_LIMIT,
    accepts,
    assert_close,
    cast_inputs,
    float_tolerance,
    fused_program,
    pairs,
    reduce_tolerance,
    run_cpu,
    run_interp,
    seed_of,
    storage,
    tie_values,
    values,
)
from util import random_array

import hologram
from hologram.backends.cpu import llvm, mathlib
from hologram.backends.cpu import target as targets
from hologram.backends.cpu.backend import CpuBackend
from hologram.backends.cpu.render import render
from hologram.compiler import pipeline
from hologram.compiler.options import CompileOptions
from hologram.errors import CompileError, DeviceError, HologramError
from hologram.frontend.graph import Graph
from hologram.isa import dtypes as dt
from hologram.isa.builder import ProgramBuilder
from hologram.isa.dtypes import DType
from hologram.isa.ir import BINARY_OPS, COMPARE_OPS, UNARY_OPS, Program
from hologram.runtime import launch

TARGETS = ["host", *targets.TARGETS]
RUNNABLE = set(targets.runnable_targets())
KINDS = ("sum", "prod", "max", "min", "argmax", "argmin")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "targets"))
    monkeypatch.delenv("HOLOGRAM_FAST_MATH", raising=False)


# --- the conformance programs ------------------------------------------------------------
def elementwise_case(t: DType) -> tuple[Program, list[np.ndarray], list[str]]:
    """Every unary, binary, compare op on ``t``, select and fma, in one program; returns it,
    its inputs and the op behind each output."""
    rng = np.random.default_rng(seed_of("targets", t.name))
    a, b = pairs(t, 300, rng)
    n = a.size
    # sin/cos inputs of their own (every finite magnitude: conformance.SINCOS_LIMIT)
    s = values(t, n, rng, limit=SINCOS_LIMIT)[-n:] if t.is_float else a
    inputs = [a, b, s]
    p = ProgramBuilder(f"ops_{t.name}")
    bufs = [p.input(name, t, (n,)) for name in ("a", "b", "s")]
    fma = t.is_float
    if fma:
        c = fma_inputs(t, rng)
        inputs += [np.resize(x, n) for x in c]
        bufs += [p.input(name, t, (n,)) for name in ("fa", "fb", "fc")]
    k = p.kernel((n,))
    x, y, small, *fabc = (k.load(buf) for buf in bufs)
    ops, results = [], []
    for op in UNARY_OPS:
        if accepts(op, [t]):
            ops.append(op)
            results.append(k.emit(op, (small if op in ("sin", "cos") else x,)))
    for op in (*BINARY_OPS, *COMPARE_OPS):
        if accepts(op, [t, t]):
            ops.append(op)
            results.append(k.emit(op, (x, y)))
    ops.append("select")
    results.append(k.select(k.emit("lt", (x, y)), x, y))
    if fma:
        ops.append("fma")
        results.append(k.emit("fma", tuple(fabc)))
    for i, value in enumerate(results):
        k.store(p.output(f"o{i}", value.dtype, (n,)), value)
    return p.build(), inputs, ops


def cast_case(t: DType) -> tuple[Program, list[np.ndarray], list[DType]]:
    x = cast_inputs(t, np.random.default_rng(seed_of("target casts", t.name)))
    p = ProgramBuilder(f"casts_{t.name}")
    buf = p.input("x", t, (x.size,))
    k = p.kernel((x.size,))
    value = k.load(buf)
    for d in ALL:
        k.store(p.output(f"to_{d.name}", d, (x.size,)), k.cast(value, d))
    return p.build(), [x], list(ALL)


# Each reduction is a kernel of its own (~50 ms of LLVM each): the middle axis, and the
# outer and inner ones together; test_cpu runs every axis set on the host.
REDUCE_SHAPE, REDUCE_AXES = (3, 5, 4), [(1,), (0, 2)]


def reduce_case(t: DType) -> tuple[Program, list[tuple[str, tuple]]]:
    g = Graph(f"reductions_{t.name}")
    x = g.input("x", t, REDUCE_SHAPE)
    outputs = []
    for kind in KINDS:
        if t.is_bool and kind in ("sum", "prod"):
            continue
        for axes in REDUCE_AXES:
            g.output(f"{kind}_{''.join(map(str, axes))}", g.reduce(kind, x, axes))
            outputs.append((kind, axes))
    return g.program(), outputs


def matmul_case(t: DType) -> Program:
    g = Graph("mm_" + t.name)
    a, b = g.input("a", t, (9, 40)), g.input("b", t, (40, 7))
    g.output("y", a @ b)
    return g.program()


def gather_case(t: DType) -> Program:
    """Rows of a table picked by i32 and by i64 indices (rows walked contiguously, so
    vectorized), and a strided column pick (not), summed where ``t`` has a sum."""
    g = Graph("gather_" + t.name)
    table = g.input("table", t, (37, 24))
    rows32, rows64 = g.input("r32", "i32", (19,)), g.input("r64", "i64", (5, 3))
    a = g.gather(table, (rows32.reshape(19, 1), 1), (19, 24))
    b = g.gather(table, (rows64.reshape(5, 3, 1), 2), (5, 3, 24))
    c = g.gather(table.T, (rows32.reshape(19, 1), 1), (19, 37))  # table[:, r].T
    g.output("a", a)
    g.output("b", b if t.is_bool else b + b)
    g.output("c", c)
    return g.program()


def scatter_case(t: DType) -> Program:
    """Rows written by i32 indices with duplicates (the last write wins, or combined in
    index order), a row's columns in parallel; add where ``t`` has one, else max."""
    g = Graph("scatter_" + t.name)
    table, rows = g.input("table", t, (37, 24)), g.input("r32", "i32", (19,))
    values = g.input("values", t, (19, 24))
    g.output("replaced", g.scatter(table, (rows.reshape(19, 1), 1), values, (19, 24)))
    g.output("combined", g.scatter(table, (rows.reshape(19, 1), 1), values, (19, 24),
                                   "max" if t.is_bool else "add"))
    return g.program()


NUMERIC = [t for t in ALL if not t.is_bool]


def conformance_programs() -> list[Program]:
    programs = []
    for t in ALL:
        programs += [elementwise_case(t)[0], cast_case(t)[0], reduce_case(t)[0],
                     gather_case(t), scatter_case(t)]
        if not t.is_bool:
            programs.append(matmul_case(t))
    return programs


# --- executed ------------------------------------------------------------------------------
def _use(monkeypatch, name: str) -> targets.Target:
    monkeypatch.setenv("HOLOGRAM_CPU_TARGET", name)
    return targets.current()


# test_cpu covers the host; the targets this machine cannot run are compiled below.
EXECUTED = [name for name in TARGETS if name != "host" and name in RUNNABLE]


@pytest.mark.parametrize("name", [t.name for t in ALL])
@pytest.mark.parametrize("target", EXECUTED)
def test_every_op_on_every_runnable_target(monkeypatch, target, name):
    _use(monkeypatch, target)
    t = dt.dtype(name)
    program, inputs, ops = elementwise_case(t)
    got, want = run_cpu(program, inputs), run_interp(program, inputs)
    outputs = [p for p in program.params if p.kind == "out"]
    for op, g, w, out in zip(ops, got, want, outputs):
        rt = out.dtype
        ulps, atol = float_tolerance(op, rt, w) if rt.is_float else (0, 0.0)
        if (op, t) == ("fma", dt.bfloat16):  # rounds twice today (test_cpu.test_fma)
            ulps = 1
        assert_close(g, w, rt, ulps, atol, inputs[:2], f"{op} {name} on {target}")


@pytest.mark.parametrize("name", [t.name for t in ALL])
@pytest.mark.parametrize("target", EXECUTED)
def test_every_cast_on_every_runnable_target(monkeypatch, target, name):
    _use(monkeypatch, target)
    program, inputs, dsts = cast_case(dt.dtype(name))
    got, want = run_cpu(program, inputs), run_interp(program, inputs)
    for d, g, w in zip(dsts, got, want):
        ulps = 1 if (name, d.name) == ("i64", "bf16") else 0  # test_cpu.DOUBLE_ROUNDING_CASTS
        assert_close(g, w, d, ulps, inputs=inputs, what=f"cast {name} -> {d.name} on {target}")


@pytest.mark.parametrize("name", [t.name for t in ALL])
@pytest.mark.parametrize("target", EXECUTED)
def test_reductions_and_matmul_loops_on_every_runnable_target(monkeypatch, target, name):
    _use(monkeypatch, target)
    t = dt.dtype(name)
    rng = np.random.default_rng(seed_of("target reductions", name))
    program, outputs = reduce_case(t)
    (param,) = [p for p in program.params if p.kind == "in"]
    for inputs in ([random_array(param, rng)], [tie_values(t, param.size, rng)]):
        got, want = run_cpu(program, inputs), run_interp(program, inputs)
        for (kind, axes), g, w in zip(outputs, got, want):
            rt = dt.int64 if kind.startswith("arg") else t
            ulps, atol = reduce_tolerance(kind, t, w, inputs[0], REDUCE_SHAPE, axes)
            assert_close(g, w, rt, ulps, atol, what=f"{kind} {axes} {name} on {target}")
    if t.is_bool:
        return
    program = matmul_case(t)
    inputs = [random_array(p, rng, edges=False) for p in program.params if p.kind == "in"]
    (got,), (want,) = run_cpu(program, inputs), run_interp(program, inputs)
    # f32/f64 go through BLAS (forward error bound); bf16 sums round twice (test_cpu)
    if t in (dt.float32, dt.float64):
        a, b = (x.astype(np.float64).reshape(s) for x, s in zip(inputs, [(9, 40), (40, 7)]))
        bound = 40 * np.finfo(t.storage).eps * (np.abs(a) @ np.abs(b)).reshape(-1)
        assert_close(got, want, t, 0, bound, what=f"matmul {name} on {target}")
    else:
        assert_close(got, want, t, 1 if t is dt.bfloat16 else 0, what=f"matmul {name}")


@pytest.mark.parametrize("name", [t.name for t in ALL])
@pytest.mark.parametrize("target", EXECUTED)
def test_gathers_on_every_runnable_target(monkeypatch, target, name):
    _use(monkeypatch, target)
    t = dt.dtype(name)
    program = gather_case(t)
    rng = np.random.default_rng(seed_of("target gathers", name))
    table = random_array(program.params[0], rng)
    # In range, negative (counted from the end) and beyond both ends (the ISA's clamp).
    r32 = rng.integers(-40, 41, 19).astype(np.int32)
    r64 = np.array([-2**63, 2**63 - 1, 0, 36, -37, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14])
    inputs = [table, r32, r64.reshape(5, 3)]
    for g, w in zip(run_cpu(program, inputs), run_interp(program, inputs)):
        assert_close(g, w, t, 0, what=f"gather {name} on {target}")


@pytest.mark.parametrize("name", [t.name for t in ALL])
@pytest.mark.parametrize("target", EXECUTED)
def test_scatters_on_every_runnable_target(monkeypatch, target, name):
    _use(monkeypatch, target)
    t = dt.dtype(name)
    program = scatter_case(t)
    rng = np.random.default_rng(seed_of("target scatters", name))
    table, _, values = (random_array(p, rng) for p in program.params if p.kind == "in")
    # duplicates, negative (counted from the end) and beyond both ends (the ISA's clamp)
    rows = np.array([3, 3, -1, 36, 0, -37, 40, -50, 3, 12, 12, 5, 6, 7, 8, 9, 10, 11, 3],
                    np.int32)
    inputs = [table, rows, values]
    for g, w in zip(run_cpu(program, inputs), run_interp(program, inputs)):
        assert_close(g, w, t, 0, what=f"scatter {name} on {target}")


# --- compiled --------------------------------------------------------------------------------
@pytest.mark.parametrize("target", [name for name in TARGETS if name not in RUNNABLE])
def test_every_target_compiles_without_library_calls(monkeypatch, target):
    """Object code for every conformance program, for every target this machine cannot run
    (the others compile the same programs to run them), calls nothing but libc's memory
    functions (compile_ir checks that; this asks again independently)."""
    tgt = _use(monkeypatch, target)
    options = CompileOptions.from_env()
    backend = CpuBackend()
    for program in conformance_programs():
        artifact = backend.compile(pipeline.lower(pipeline.canonical_form(program, options),
                                                  options))
        header_size = int.from_bytes(artifact[:4], "little")
        obj = artifact[4 + header_size:]
        foreign = set(llvm.undefined_symbols(obj)) - llvm.PROCESS_SYMBOLS - \
            {"_GLOBAL_OFFSET_TABLE_"}
        assert not foreign, f"{program.name} for {tgt.cpu} calls {foreign}"


def test_the_matrix_covers_half_precision_targets_both_ways():
    """Among the targets, some convert f16 in hardware and some in our own IR, some have
    FMA and some not: the matrix exercises both paths of every such choice."""
    chosen = [targets.named(n) for n in targets.TARGETS]
    for op, ty in [("f32_to_f16", ""), ("f64_to_f16", ""), ("fma", "double"),
                   ("floor", "float")]:
        answers = {llvm.lowers_natively(t, op, ty) for t in chosen}
        assert answers == {True, False}, op


# --- the symbol check ------------------------------------------------------------------------
LIBRARY_CALL = """
define void @hg_kernel(ptr %p, ptr %q) {
  %x = load double, ptr %p
  %h = fptrunc double %x to half
  store half %h, ptr %q
  ret void
}
"""


def test_an_object_calling_the_runtime_library_is_refused(monkeypatch):
    """LLVM lowers double -> half to ``__truncdfhf2`` without AVX512-FP16: the object is
    refused when compiled, and refused again when loaded (it may come from a disk cache),
    naming the symbol, the function and the target."""
    tgt = _use(monkeypatch, "x86-64-v3")
    with pytest.raises(CompileError, match=r"__truncdfhf2.*hg_kernel") as err:
        llvm.compile_ir(LIBRARY_CALL)
    assert "x86-64-v3" in str(err.value)
    module = llvm.optimize_ir(LIBRARY_CALL, tgt)
    obj = llvm._emitter(tgt).emit_object(module)
    assert "__truncdfhf2" in llvm.undefined_symbols(obj)
    with pytest.raises(CompileError, match="__truncdfhf2"):
        llvm.load_object(obj, ["hg_kernel"])


@pytest.mark.parametrize("triple, cpu", [("aarch64-unknown-linux-gnu", "neoverse-v1"),
                                         ("arm64-apple-macosx", "apple-m1")])
def test_the_check_reads_elf_and_mach_o(triple, cpu):
    """fmod is a library call everywhere; the check finds it in both object formats."""
    tgt = targets.Target("test", triple, cpu, "", frozenset())
    frem = "define float @hg_f(float %x, float %y) {\n%r = frem float %x, %y\nret float %r\n}"
    with pytest.raises(CompileError, match="fmodf"):
        llvm.compile_ir(frem, tgt)


def test_host_code_may_take_only_the_symbols_it_is_allowed():
    ir = ("declare i64 @syscall(i64, ...)\n"
          "define i64 @hg_f() {\n%r = call i64 (i64, ...) @syscall(i64 39)\nret i64 %r\n}")
    with pytest.raises(CompileError, match="syscall"):
        llvm.compile_ir(ir, targets.host())
    assert llvm.compile_ir(ir, targets.host(), allowed={"syscall"})


# --- choosing a target -------------------------------------------------------------------------
def test_an_unknown_target_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HOLOGRAM_CPU_TARGET", "pentium5")
    with pytest.raises(HologramError, match=r"pentium5.*host.*x86-64-v3"):
        targets.current()


def test_a_target_this_machine_cannot_run_is_refused_before_loading(monkeypatch):
    foreign = next(n for n in targets.TARGETS if n not in RUNNABLE)
    monkeypatch.setenv("HOLOGRAM_CPU_TARGET", foreign)
    g = Graph("not_here")
    g.output("y", g.input("x", "f32", (4,)) + 1.0)
    with pytest.raises(DeviceError, match=f"HOLOGRAM_CPU_TARGET={foreign}.*lacks"):
        hologram.compile(g.program(), backend="cpu")


def test_the_target_is_part_of_the_cache_key(monkeypatch):
    g = Graph("keyed")
    g.output("y", g.input("x", "f16", (4,)) * 3.0)
    keys = set()
    for name in ("x86-64", "x86-64-v3", "host"):
        monkeypatch.setenv("HOLOGRAM_CPU_TARGET", name)
        compiled = hologram.compile(g.program(), backend="cpu")
        keys.add(compiled.key)
        x = storage([1.0, -2.0, 0.1, 65504.0], dt.float16)
        np.testing.assert_array_equal(compiled(x), storage(x.astype(np.float64) * 3.0,
                                                           dt.float16))
    assert len(keys) == 3


def test_host_features_are_this_machines():
    host = targets.host()
    assert host.runnable_here() and "host" in RUNNABLE
    assert targets.named("x86-64").runnable_here() == (host.arch == "x86_64")


# --- the everyday float16 calls that crashed CPUs without AVX512-FP16 -------------------------
EVERYDAY_F16 = r"""
import numpy as np, torch
import hologram as hg, hologram_torch  # noqa: F401

ex = hg.Executor()
x = np.linspace(-3, 3, 24).astype(np.float16)
a, b = ex.from_numpy(x), ex.from_numpy(x[::-1].copy())
assert hg.ops.sum(a).to_numpy() == np.float16(x.astype(np.float64).sum())
for got, want in [(hg.ops.mean(a), x.astype(np.float64).mean()),
                  (hg.ops.mse_loss(a, b), ((x - x[::-1]).astype(np.float64) ** 2).mean())]:
    assert abs(float(got.to_numpy()) - want) <= 1e-3 * max(1, abs(want)), (got, want)
m = x.reshape(4, 6)
sm = hg.ops.softmax(ex.from_numpy(m)).to_numpy().astype(np.float64)
np.testing.assert_allclose(sm, torch.softmax(torch.tensor(m, dtype=torch.float64), -1),
                           rtol=2e-3, atol=1e-4)
mm = hg.ops.matmul(ex.from_numpy(m), ex.from_numpy(m.T.copy())).to_numpy()
np.testing.assert_allclose(mm, m.astype(np.float64) @ m.T.astype(np.float64), rtol=2e-3,
                           atol=2e-2)

dev = "hologram"
assert torch.ones(4, dtype=torch.float16, device=dev).cpu().tolist() == [1.0] * 4
assert torch.full((3,), 0.1, dtype=torch.float16, device=dev).cpu().equal(
    torch.full((3,), 0.1, dtype=torch.float16))
t = torch.randn(64, dtype=torch.float64)
assert t.to(dev).half().cpu().equal(t.half())
assert (t.half().to(dev) * 0.1).cpu().equal(t.half() * 0.1)
z = torch.zeros(5, dtype=torch.float16, device=dev).fill_(2.5)
assert z.cpu().tolist() == [2.5] * 5
w = torch.randn(10, 8, dtype=torch.float16)
emb = torch.nn.functional.embedding(torch.tensor([1, 3, 3]), w)
assert torch.nn.functional.embedding(torch.tensor([1, 3, 3], device=dev),
                                     w.to(dev)).cpu().equal(emb)
h = torch.randn(4, 8, dtype=torch.float16)
ln = torch.nn.functional.layer_norm(h.float(), (8,))
got = torch.nn.functional.layer_norm(h.to(dev), (8,)).cpu().float()
assert (got - ln).abs().max() < 1e-2
p = torch.randn(6, dtype=torch.float16, device=dev, requires_grad=True)
(p * p).sum().backward()
assert p.grad.cpu().equal((2 * p.detach().cpu().float()).half())
print("ok")
"""


@pytest.mark.needs_torch
@pytest.mark.parametrize("target", [n for n in ("x86-64", "x86-64-v3") if n in RUNNABLE])
def test_everyday_f16_calls_on_cpus_without_fp16_hardware(target, tmp_path):
    """The calls that crashed the interpreter, run where half conversions are ours
    (x86-64: no F16C) or partly ours (x86-64-v3: double -> half), in a child process so
    that a crash fails this test instead of the run."""
    env = {**os.environ, "HOLOGRAM_CPU_TARGET": target,
           "HOLOGRAM_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", EVERYDAY_F16], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), \
        f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"


# --- compile tiers ---------------------------------------------------------------------------
# The launch path compiles at LLVM's quick tier first and at the full one once a program is
# hot (llvm.TIERS); the two must compute the same bits, or a result would change in the
# middle of a run. Checked here on the conformance programs (every opcode, cast and
# reduction kind per dtype, with edge values) and on fused programs, on this host and on
# the baseline x86-64 target (softfloat in place of F16C, FMA and SSE4.1 instructions).
# Bit for bit, except the sign and payload of a NaN result, which IEEE 754 and docs/isa.md
# leave open and LLVM does not keep (f64 sigmoid of NaN: -NaN quick, +NaN full); that a
# result is NaN is the same.
TIER_TARGETS = [name for name in ("host", "x86-64") if name == "host" or name in RUNNABLE]
TIER_FUSED = ("softmax_rows_1000", "log_softmax", "layer_norm", "gelu_erf", "relu_mad")


def _run_at_tier(monkeypatch, program: Program, inputs: list[np.ndarray], quick: bool):
    """(outputs, tier) of ``program`` compiled on the launch path with the quick tier
    allowed or not, never promoted. The quick builds get a cache of their own: the full
    build, once on disk, is what any lookup finds first."""
    if quick:
        monkeypatch.setenv("HOLOGRAM_CACHE_DIR", os.environ["HOLOGRAM_CACHE_DIR"] + "-quick")
    monkeypatch.setenv("HOLOGRAM_QUICK_COMPILE", "1" if quick else "0")
    monkeypatch.setenv("HOLOGRAM_PROMOTE_AFTER", str(1 << 40))
    launch.clear_memo()
    hologram.clear_cache(disk=False)  # the quick build is remembered under the full key
    outputs = run_cpu(program, inputs)
    return outputs, hologram.compile(program, backend="cpu").executable.tier


def _assert_same_bits_at_both_tiers(monkeypatch, program, inputs) -> str:
    directory = os.environ["HOLOGRAM_CACHE_DIR"]
    full, full_tier = _run_at_tier(monkeypatch, program, inputs, quick=False)
    quick, quick_tier = _run_at_tier(monkeypatch, program, inputs, quick=True)
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", directory)
    assert full_tier == "full"
    outputs = [p for p in program.params if p.kind != "in"]
    for i, (q, f, param) in enumerate(zip(quick, full, outputs)):
        what = f"{program.name} output {i} ({quick_tier})"
        if param.dtype.is_float:  # NaN sign and payload are left open (see above)
            nan = _is_nan(q, param.dtype)
            np.testing.assert_array_equal(nan, _is_nan(f, param.dtype), err_msg=what)
            q, f = q[~nan], f[~nan]
        np.testing.assert_array_equal(q.view(np.uint8), f.view(np.uint8), err_msg=what)
    return quick_tier


def _is_nan(bits: np.ndarray, t: DType) -> np.ndarray:
    if t is dt.bfloat16:
        return (bits.view(np.uint16) & 0x7FFF) > 0x7F80
    return np.isnan(bits.view(t.storage))


@pytest.mark.parametrize("name", [t.name for t in ALL])
@pytest.mark.parametrize("target", TIER_TARGETS)
def test_both_tiers_compute_the_same_bits(monkeypatch, target, name):
    _use(monkeypatch, target)
    t = dt.dtype(name)
    rng = np.random.default_rng(seed_of("tiers", name))
    program = reduce_case(t)[0]
    (param,) = [p for p in program.params if p.kind == "in"]
    cases = [elementwise_case(t)[:2], cast_case(t)[:2],
             (program, [random_array(param, rng)]),
             (program, [tie_values(t, param.size, rng)])]
    tiers = [_assert_same_bits_at_both_tiers(monkeypatch, p, x) for p, x in cases]
    # Float modules may carry flags (products accumulate with reassoc, f32 sigmoid's
    # reciprocal is an estimate) and then stay full; the others must really run quick.
    assert tiers[1] == "quick"
    if not t.is_float:
        assert tiers == ["quick"] * 4


def _mixed_sincos_case(op: str, t: DType) -> tuple[Program, list[np.ndarray]]:
    """``op`` of small arguments with a few large ones (and inf, NaN) in the vector loop,
    its epilogue and the scalar tail."""
    rng = np.random.default_rng(seed_of("mixed", op, t.name))
    x = rng.uniform(-10.0, 10.0, 1037)
    x[[0, 17, 300, 301, 1000, 1030, 1036]] = [1e20, -3e5, 1e10, 2.0 ** 50, -1e7, 3e38, 1e15]
    x[[500, 700]] = [np.inf, np.nan]
    g = Graph(f"mixed_{op}_{t.name}")
    g.output("y", g.unary(op, g.input("x", t, (x.size,))))
    return g.program(), [storage(x, t)]


@pytest.mark.skipif("x86-64" not in RUNNABLE, reason="x86-64 code does not run here")
@pytest.mark.parametrize("op", ["sin", "cos"])
@pytest.mark.parametrize("name", ["f32", "f64"])
def test_sin_cos_branch_and_select_give_the_same_bits(monkeypatch, op, name):
    """Where vector fma, rint and floor are instructions, the large-argument reduction is
    out of line, called per vector that needs it (mathlib.rarely); x86-64 selects. Both
    give the same bits, at both tiers."""
    if not mathlib.branches_to_rare_paths(targets.host()):
        pytest.skip("the host selects too")
    program, inputs = _mixed_sincos_case(op, dt.dtype(name))
    results = []
    for target in ("host", "x86-64"):
        _use(monkeypatch, target)
        _assert_same_bits_at_both_tiers(monkeypatch, program, inputs)
        results.append(_run_at_tier(monkeypatch, program, inputs, quick=False)[0][0])
    np.testing.assert_array_equal(results[0].view(np.uint8), results[1].view(np.uint8))
    (want,) = run_interp(program, inputs)
    ulps, atol = float_tolerance(op, dt.dtype(name), want)
    assert_close(results[0], want, dt.dtype(name), ulps, atol, inputs, f"{op} {name}")


def test_sin_loops_test_each_vector_for_large_arguments(monkeypatch):
    """The vectorized loop inlines the vector variants: no call of one is left, and a
    mask of lanes is tested as an integer."""
    if not mathlib.branches_to_rare_paths(_use(monkeypatch, "host")):
        pytest.skip("the host selects")
    program, _ = _mixed_sincos_case("sin", dt.float32)
    lowered = pipeline.run(program)
    text = render(lowered, {k.name: f"k_{k.name}" for k in lowered.kernels})
    assert "vector-function-abi-variant" in text
    optimized = str(llvm.optimize_ir(text))
    assert re.search(r"<\d+ x float>", optimized), "the loop is not vectorized"
    assert not re.search(r"call .*@hg\.\S+\.v\d+\(", optimized), "a variant was not inlined"
    assert re.search(r"bitcast <\d+ x i1> \S+ to i\d+", optimized)


@pytest.mark.parametrize("name", TIER_FUSED)
@pytest.mark.parametrize("target", TIER_TARGETS)
def test_fused_programs_compute_the_same_bits_at_both_tiers(monkeypatch, target, name):
    _use(monkeypatch, target)
    program, inputs = fused_program(name)
    assert _assert_same_bits_at_both_tiers(monkeypatch, program, inputs) == "quick"


def test_flags_that_let_llvm_change_results_keep_a_module_at_the_full_tier():
    plain = "define float @f(float %x) {\n  %y = fadd float %x, 1.0\n  ret float %y\n}\n"
    assert llvm.same_bits_at_every_tier(plain)
    for flagged in ("fadd reassoc float", "fadd contract float", "fadd fast float",
                    "fadd nnan float", "add nsw i32"):
        assert not llvm.same_bits_at_every_tier(plain.replace("fadd float", flagged))
    # the max/min reductions' maxnum/minnum, exact after the renderer's fixup
    extremum = plain.replace("fadd float %x, 1.0",
                             "call nnan nsz float @\"llvm.maxnum.f32\"(float %x, float %x)")
    assert llvm.same_bits_at_every_tier(extremum)
    assert llvm.same_bits_at_every_tier(extremum.replace('"', "").replace("max", "min"))
    assert not llvm.same_bits_at_every_tier(extremum.replace("maxnum", "maximum"))
    flagged = "%z = fadd nnan float %y, 1.0\n  ret float %z"
    assert not llvm.same_bits_at_every_tier(extremum.replace("ret float %y", flagged))
    fused = plain.replace("fadd float %x, 1.0",
                          "call float @llvm.fmuladd.f32(float %x, float %x, float %x)")
    assert not llvm.same_bits_at_every_tier(fused)
    # and the quick tier compiles, checks and loads like the full one
    obj = llvm.compile_ir(plain, targets.host(), tier="quick")
    assert llvm.load_object(obj, ["f"])["f"]
    with pytest.raises(CompileError, match="unknown LLVM tier"):
        llvm.compile_ir(plain, targets.host(), tier="O2")
