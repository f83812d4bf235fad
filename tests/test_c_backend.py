"""The c backend's own promises (docs/c.md); the conformance suite (tests/conformance) runs
every opcode, dtype, reduction and edge value on it against the interpreter by
registration alone.

Here: its place in the registry, the source it writes (strict C99 that the compiler
accepts with every warning an error, and free of undefined behaviour under UBSan), the
artifact (describe, the disk cache, reloading), the error that names the fix when there
is no C compiler, programs of several kernels with a temporary arena, a reduction that
the cpu backend hands to the interpreter, and the float sums' order (the cpu backend's
bit for bit).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import hologram
from hologram import backends
from hologram.backends.c import backend as cbackend
from hologram.backends.c import toolchain
from hologram.backends.c.backend import CBackend
from hologram.backends.hostmem import Pool
from hologram.backends.interp import interpreter
from hologram.compiler import pipeline
from hologram.errors import CompileError, DeviceError, HologramError
from hologram.isa import dtypes as dt
from hologram.isa.builder import ProgramBuilder

pytestmark = pytest.mark.skipif(not toolchain.available(), reason="no C compiler here")

# Compiled to an object, not -fsyntax-only: GCC reports unused functions after parsing.
STRICT = ("-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", "-O1", "-c")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HOLOGRAM_DISABLE_DISK_CACHE", raising=False)


def chain(m: int = 5, k: int = 7, n: int = 6, p: int = 4):
    """Two kernels through a temporary: ``y = tanh(x @ w.T) @ v.T``."""
    b = ProgramBuilder("chain")
    x, w = b.input("x", dt.float32, (m, k)), b.input("w", dt.float32, (n, k))
    v = b.input("v", dt.float32, (p, n))
    h, y = b.temp("h", dt.float32, (m, n)), b.output("y", dt.float32, (m, p))
    kb = b.kernel((m, n, k), "first")
    product = kb.contract(kb.load(x, (m, 1, k), 0, (k, 0, 1)),
                          kb.load(w, (1, n, k), 0, (0, k, 1)), 2)
    kb.store(h, kb.unary("tanh", product), 0, (n, 1, 0))
    kb = b.kernel((m, p, n), "second")
    kb.store(y, kb.contract(kb.load(h, (m, 1, n), 0, (n, 0, 1)),
                            kb.load(v, (1, p, n), 0, (0, n, 1)), 2), 0, (p, 1, 0))
    return b.build()


def every_dtype():
    """One kernel per dtype: a load, the unary and binary ops it takes, casts to every
    other dtype, a sum or an any, stored."""
    b = ProgramBuilder("every_dtype")
    n = 40
    for t in dt.ALL:
        x, z = b.input(f"x_{t.name}", t, (n,)), b.input(f"z_{t.name}", t, (n,))
        kb = b.kernel((n,), f"k_{t.name}")
        a, c = kb.load(x), kb.load(z)
        outs = [kb.binary("max", a, c), kb.binary("eq", a, c), kb.cast(a, dt.float16)]
        if t.is_float:
            outs += [kb.unary(op, a) for op in ("exp", "log1p", "sin", "tanh", "erf",
                                                "round", "rsqrt")]
            outs += [kb.binary("pow", a, c), kb.fma(a, c, a), kb.binary("mod", a, c)]
        if t.is_int:
            outs += [kb.binary(op, a, c) for op in ("add", "mul", "div", "mod", "xor")]
            outs += [kb.unary("abs", a), kb.unary("neg", a)]
        for u in dt.ALL:
            outs.append(kb.cast(a, u))
        for i, value in enumerate(outs):
            kb.store(b.output(f"o_{t.name}_{i}", value.dtype, (n,)), value)
    return b.build()


def reductions():
    b = ProgramBuilder("reductions")
    x = b.input("x", dt.float64, (3, 1500))
    kb = b.kernel((3, 1500), grid_rank=1)
    a = kb.load(x)
    for kind in ("sum", "prod", "max", "min", "argmax", "argmin"):
        value = kb.reduce(kind, kb.cast(a, dt.bfloat16) if kind == "sum" else a, 1)
        kb.store(b.output(kind, value.dtype, (3, 1)), value)
    return b.build()


def scatter_gather():
    """Rows gathered by index; values scattered (added, in index order) by index."""
    b = ProgramBuilder("scatter_gather")
    table, at = b.input("table", dt.float32, (10, 4)), b.input("at", dt.int64, (6,))
    values, acc = b.input("values", dt.float32, (6,)), b.buffer("acc", dt.float32, (10,), "inout")
    kb = b.kernel((6, 4), grid_rank=1)
    row = kb.binary("mul", kb.load(at, (6, 1), 0, (1, 0)), kb.const(4, dt.int64))
    kb.store(b.output("rows", dt.float32, (6, 4)), kb.gather(table, row, (6, 4), 0, (0, 1),
                                                              (0, 36)))
    kb = b.kernel((6,))
    kb.scatter(acc, kb.load(values), kb.load(at), "add")
    return b.build()


def run(program, backend: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    compiled = hologram.compile(program, backend=backend)
    arrays = [np.array(inputs.pop(0)) if p.kind != "out" else
              np.zeros(p.shape, p.dtype.storage) for p in program.params]
    out = compiled(*arrays)
    return list(out) if isinstance(out, tuple) else [out]


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """bf16 storage of ``values`` (float32 truncated to its high half)."""
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def random_inputs(program, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for p in program.params:
        if p.kind == "out":
            continue
        t = p.dtype
        if t.is_float:
            values = rng.standard_normal(p.shape) * 3
            arrays.append(bf16_bits(values) if t.name == "bf16" else values.astype(t.storage))
        else:
            high = 2 if t.is_bool else int(t.max) + 1
            arrays.append(rng.integers(int(t.min) if t.is_int else 0, high, p.shape,
                                       dtype=np.int64).astype(t.storage))
    return arrays


# --- registry -------------------------------------------------------------------------
def test_registered_after_cpu_and_never_taken_by_auto():
    names = backends.names()
    assert names.index("cpu") < names.index("c") < names.index("interp")
    assert "c" in backends.available()
    assert CBackend.auto_available() is False
    assert backends.resolve("auto") != "c"
    assert backends.validate_backend("C") == "c"


# --- the source -----------------------------------------------------------------------
@pytest.mark.parametrize("make", [every_dtype, reductions, chain, scatter_gather])
def test_source_is_strict_c99(make, tmp_path):
    artifact = hologram.build(make(), backend="c")
    source = cbackend.source(artifact.data)
    path = tmp_path / "program.c"
    path.write_text(source)
    done = subprocess.run([*toolchain.command(), *STRICT, str(path), "-o",
                           str(tmp_path / "program.o")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hologram_run" in source and "#include <math.h>" in source


def test_programs_agree_with_the_interpreter_bit_for_bit():
    program = every_dtype()
    inputs = random_inputs(program)
    got = run(program, "c", list(inputs))
    want = run(program, "interp", list(inputs))
    for name, g, w in zip([p.name for p in program.params if p.kind == "out"], got, want):
        if name.startswith(("o_f", "o_bf")) and int(name.rsplit("_", 1)[1]) in range(3, 11):
            continue  # transcendentals (and pow): within ulps, the conformance suite's
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8), err_msg=name)


UBSAN = textwrap.dedent("""
    import sys
    import numpy as np
    import hologram
    from hologram.backends.c import toolchain
    sys.path.insert(0, {tests!r})
    import test_c_backend as t
    toolchain.FLAGS = (*toolchain.FLAGS, *{sanitize!r}, "-fno-sanitize-recover=all")
    program = t.every_dtype()
    edges = {{"i8": (-128, 127, -1, 0), "i16": (-32768, 32767, -1, 0),
              "i32": (-2**31, 2**31 - 1, -1, 0), "i64": (-2**63, 2**63 - 1, -1, 0),
              "u8": (0, 255, 1, 0), "bool": (0, 1, 1, 0)}}
    inputs = []
    for p in program.params:
        if p.kind == "out":
            continue
        t_ = p.dtype
        if t_.is_float:
            values = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 3e9, -0.0, 1e-40] * 5)
            inputs.append(t.bf16_bits(values) if t_.name == "bf16" else
                          values.astype(t_.storage))
        else:
            base = np.array(edges[t_.name] * 10, dtype=t_.storage)
            inputs.append(base if p.name.startswith("x") else np.roll(base, 1))
    got = t.run(program, "c", list(inputs))
    want = t.run(program, "interp", list(inputs))
    bad = [p.name for p, g, w in zip([p for p in program.params if p.kind == "out"], got, want)
           if not p.dtype.is_float and not np.array_equal(g, w)]
    assert not bad, bad
    print("clean")
""")


def _sanitizer_flags(tmp_path) -> tuple[str, ...] | None:
    """UBSan's flags for a shared library this process can load (Clang links its runtime
    into a library only with -shared-libsan), or None."""
    probe = tmp_path / "probe.c"
    probe.write_text("int f(int a) { return a + 1; }\n")
    for extra in ((), ("-shared-libsan",)):
        flags = ("-fsanitize=undefined,float-cast-overflow", *extra)
        library = tmp_path / f"probe{len(extra)}.so"
        done = subprocess.run([*toolchain.command(), *flags, "-shared", "-fPIC", "-o",
                               str(library), str(probe)], capture_output=True)
        if done.returncode == 0:
            loaded = subprocess.run([sys.executable, "-c", "import ctypes, sys; "
                                     "ctypes.CDLL(sys.argv[1])", str(library)],
                                    capture_output=True)
            if loaded.returncode == 0:
                return flags
    return None


def test_edge_values_run_free_of_undefined_behaviour(tmp_path):
    """Integer overflow, INT_MIN / -1, shifts, float-to-int casts of NaN, inf and huge
    values, every dtype: compiled with UBSan (aborting on the first report) and compared
    with the interpreter; in a child process, which UBSan would end."""
    sanitize = _sanitizer_flags(tmp_path)
    if sanitize is None:
        pytest.skip("the C compiler makes no loadable library with -fsanitize=undefined")
    code = UBSAN.format(tests=os.path.dirname(__file__), sanitize=sanitize)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "HOLOGRAM_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0 and "clean" in done.stdout, done.stderr[-4000:]


# --- the artifact ---------------------------------------------------------------------
def test_describe():
    artifact = hologram.build(chain(), backend="c")
    info = CBackend().describe(artifact.data)
    assert info["format"] == "C99 source and shared library"
    assert info["kernels"] == ["k0", "k1"] and info["arena"] >= 5 * 6 * 4
    assert info["entry"] == "hologram_run" and info["threads"] == 1
    assert "-ffp-contract=off" in info["flags"] and info["library_bytes"] > 0
    assert info["compiler"] == CBackend().target() == artifact.target
    assert toolchain.command()[0] in info["compiler"]


def test_artifacts_are_cached_and_reload(monkeypatch):
    calls = []
    compile_source = toolchain.compile_source
    monkeypatch.setattr(toolchain, "compile_source",
                        lambda *a: calls.append(a) or compile_source(*a))
    program = chain()
    first = hologram.build(program, backend="c")
    second = hologram.build(program, backend="c")
    assert len(calls) == 1 and first.data == second.data
    x, w, v = (np.random.default_rng(1).standard_normal(s).astype(np.float32)
               for s in ((5, 7), (6, 7), (4, 6)))
    want = np.tanh(x.astype(np.float64) @ w.T) @ v.T
    # a fresh backend object loads the bytes read back from disk
    executable = CBackend().load(second.data)
    pool = Pool()
    arrays = [pool.empty(a.shape, np.float32) for a in (x, w, v)] + \
        [pool.empty((5, 4), np.float32)]
    for array, value in zip(arrays, (x, w, v)):
        array[...] = value
    executable.launch(tuple(a.ctypes.data for a in arrays))
    np.testing.assert_allclose(arrays[3], want, rtol=1e-5, atol=1e-6)


def test_the_same_program_gives_the_same_artifact():
    program = pipeline.lower(chain())
    assert CBackend().compile(program) == CBackend().compile(program)


def test_a_damaged_artifact_is_refused():
    with pytest.raises(CompileError, match="damaged"):
        CBackend().load(b"not an artifact")
    data = hologram.build(chain(), backend="c").data
    with pytest.raises(CompileError, match="damaged"):
        CBackend().load(data[:6])


def test_targets():
    c = CBackend()
    assert c.target("host") == c.target()
    with pytest.raises(HologramError, match="one target, 'host'"):
        c.target("neoverse-v1")
    caps = c.capabilities()
    assert caps.gather and caps.scatter and caps.f64 and caps.i64
    assert caps.row_split is None and not caps.fission  # one thread: nothing to split


# --- the compiler ---------------------------------------------------------------------
def test_no_compiler_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    assert not CBackend.is_available() and "c" not in backends.available()
    with pytest.raises(toolchain.CCompilerNotFoundError) as error:
        CBackend().compile(chain())
    assert isinstance(error.value, DeviceError)
    for word in ("C99 compiler", "gcc", "clang", "apt install gcc", "set CC"):
        assert word in str(error.value)
    assert "apt install gcc" in CBackend.unavailable_reason()
    with pytest.raises(DeviceError, match="apt install gcc"):
        backends.validate_backend("c")


def test_cc_is_honoured(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "no-such-compiler --flag")
    with pytest.raises(toolchain.CCompilerNotFoundError, match="no-such-compiler"):
        CBackend().target()
    real = shutil.which("gcc") or shutil.which("cc")
    monkeypatch.setenv("CC", f"{real} -O1")
    assert toolchain.command() == [real, "-O1"]
    assert CBackend().target().startswith(f"{real} -O1 (")


def test_a_failing_compile_reports_the_compiler_and_the_source(monkeypatch):
    monkeypatch.setattr(toolchain, "FLAGS", (*toolchain.FLAGS, "-fno-such-option-here"))
    with pytest.raises(CompileError) as error:
        CBackend().compile(chain())
    text = str(error.value)
    assert "-fno-such-option-here" in text and "hologram_run" in text  # the log, the source


# --- programs -------------------------------------------------------------------------
def test_several_kernels_and_a_temporary_arena_run_concurrently():
    program = chain(8, 33, 17, 5)
    lowered = pipeline.lower(program)
    assert len(lowered.kernels) == 2 and lowered.temps and lowered.arena_bytes
    compiled = hologram.compile(program, backend="c")
    rng = np.random.default_rng(2)
    cases = [[rng.standard_normal(s).astype(np.float32) for s in ((8, 33), (17, 33), (5, 17))]
             for _ in range(4)]
    want = [run(program, "interp", list(case))[0] for case in cases]
    got: list = [None] * len(cases)

    def call(i: int) -> None:
        for _ in range(20):  # each call takes its own arena
            got[i] = compiled(*cases[i], np.zeros((8, 5), np.float32))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(cases))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-6)


def test_a_reduction_varying_along_a_loop_runs_natively():
    """A sum whose result varies along a loop dimension (the cpu backend interprets such
    kernels): recomputed inside its user's loop."""
    b = ProgramBuilder("loop_varying_sum")
    x, y = b.input("x", dt.float32, (3, 4, 5)), b.output("y", dt.float32, (3, 4))
    kb = b.kernel((3, 4, 5), grid_rank=1)
    total = kb.reduce("sum", kb.load(x), 2)
    kb.store(y, kb.binary("mul", total, kb.load(x, (3, 4, 1), 0, (20, 5, 0))), 0, (4, 1, 0))
    program = b.build()
    c = CBackend()
    artifact = c.compile(program)
    assert c.delegated(artifact) == []
    data = np.random.default_rng(3).integers(-8, 8, (3, 4, 5)).astype(np.float32)  # exact
    arrays = [data.copy(), np.zeros((3, 4), np.float32)]
    calls = []
    original = interpreter.execute
    interpreter.execute = lambda *a, **k: calls.append(a) or original(*a, **k)
    try:
        c.load(artifact).launch(tuple(a.ctypes.data for a in arrays))
    finally:
        interpreter.execute = original
    assert not calls
    np.testing.assert_array_equal(arrays[1], data.sum(2) * data[:, :, 0])


@pytest.mark.skipif("cpu" not in backends.available(), reason="needs the cpu backend")
@pytest.mark.parametrize("shape", [(100_000,), (4, 5000), (3, 1023), (7, 17)])
def test_float_sums_add_in_the_cpu_backends_order(shape):
    """Lanes per block, the tree, block sums in float64: the same bits as the cpu backend
    (whose column tiles and split partials the c backend does not use; these shapes use
    neither)."""
    b = ProgramBuilder("row_sums")
    x = b.input("x", dt.float32, shape)
    kb = b.kernel(shape, grid_rank=len(shape) - 1)
    total = kb.reduce("sum", kb.load(x), len(shape) - 1)
    kb.store(b.output("y", dt.float32, (*shape[:-1], 1)), total)
    program = b.build()
    data = (np.random.default_rng(4).standard_normal(shape) * 1e3).astype(np.float32)
    got, want = run(program, "c", [data])[0], run(program, "cpu", [data])[0]
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_names_cannot_break_the_source():
    """Program and kernel names are any strings; they appear only in comments."""
    b = ProgramBuilder("end */ of comment ??/ trigraph \u00e9")
    x, y = b.input("x", dt.int32, (5,)), b.output("y", dt.int32, (5,))
    kb = b.kernel((5,), "k */ ??=")
    kb.store(y, kb.binary("add", kb.load(x), kb.const(2**31 - 1, dt.int32)))
    program = b.build()
    data = np.arange(5, dtype=np.int32)
    np.testing.assert_array_equal(run(program, "c", [data])[0],
                                  (data.astype(np.int64) + 2**31 - 1).astype(np.int32))
