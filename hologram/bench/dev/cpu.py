"""The ``cpu`` backend against PyTorch eager (and torch.compile for fused chains).

    python -m hologram.bench.dev.cpu [--quick] [--no-torch-compile] [--json PATH]

Every case is compiled once, checked against PyTorch on the same data (at each thread
count, before any timing), then timed in one process with Hologram and PyTorch calls
interleaved round by round, so drift on this shared machine hits both alike; the figures
are medians over rounds. Each sample loops enough calls to last about a millisecond, so
timer resolution does not matter at small sizes. Both sides allocate their outputs on
every call: Hologram's compiled program is called with its inputs only (outputs come from
``np.empty``), as PyTorch eager returns fresh tensors.

Thread counts: 1, and every core this process may use. Hologram's pool
(``threads.set_num_threads``), its BLAS (``blas.set_blas_threads``) and PyTorch
(``torch.set_num_threads``) are set together. With more than one thread, each sample is
preceded by untimed calls, so that neither library's still-spinning pool slows the other's
calls (see :func:`hologram.bench.stats.interleaved`), and the case waits briefly for other
processes to go idle; the cores other processes kept busy while it was timed are reported
(``other_load``).

``ratio`` is ``torch_us / hologram_us``: above 1 means Hologram was faster. Targets are the
CPU backend issue's. A result that disagrees with PyTorch is reported in the ``check``
column and counts as a missed target; it is never dropped.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hologram.bench import stats, sysinfo
from hologram.bench.runners import promote

ROW = 1000  # softmax / cross_entropy row length (the "rows of 1000")
# The directory holding the hologram package: child processes import it from there.
ROOT = Path(__file__).resolve().parents[3]

# --- settings --------------------------------------------------------------------------

FULL_SIZES = {
    "elementwise": (10**5, 10**6, 10**7),
    "transcendental": (10**4, 10**5, 10**6, 10**7),
    "fused": (10**6, 10**7),
    "reduction": (10**4, 10**5, 10**6, 10**7),
    "loss": (10**5, 10**6, 10**7),
    "matmul": (256, 512, 1024),
}
QUICK_SIZES = {
    "elementwise": (10**5, 10**6),
    "transcendental": (10**4, 10**6),
    "fused": (10**6,),
    "reduction": (10**4, 10**5, 10**6),
    "loss": (10**5, 10**6),
    "matmul": (256,),
}


@dataclass(frozen=True)
class Settings:
    quick: bool
    torch_compile: bool
    min_rounds: int
    max_rounds: int
    budget_s: float  # time aimed at per case and thread count; rounds shrink to fit it
    sample_s: float  # one sample loops calls until it lasts about this long
    compile_repeat: int  # distinct kernels / child processes for the compile-time rows
    quiet_wait_s: float  # longest wait for other processes to go idle before a parallel case

    @classmethod
    def make(cls, quick: bool, torch_compile: bool = True) -> Settings:
        if quick:
            return cls(quick, torch_compile, 3, 7, 0.25, 0.001, 3, 0.0)
        return cls(quick, torch_compile, 5, 21, 1.0, 0.002, 7, 1.5)

    @property
    def sizes(self) -> dict[str, tuple[int, ...]]:
        return QUICK_SIZES if self.quick else FULL_SIZES


def thread_counts() -> list[int]:
    """1 and all cores this process may run on (one entry on a single-core machine)."""
    return sorted({1, sysinfo.available_cores()})


# --- programs: hologram builders and the same computation in PyTorch --------------------

def _elementwise_program(op: str) -> Callable:
    def build(g, n):
        a = g.input("a", "f32", (n,))
        if op in ("add", "mul", "div"):
            b = g.input("b", "f32", (n,))
            g.output("y", g.binary(op, a, b))
        elif op == "relu":
            g.output("y", g.maximum(a, 0.0))
        else:
            g.output("y", g.unary(op, a))
    return build


def _reduction_program(op: str) -> Callable:
    def build(g, n):
        g.output("y", g.reduce(op, g.input("x", "f32", (n,))))
    return build


def _relu_mad(g, n):
    a, b, c = (g.input(name, "f32", (n,)) for name in "abc")
    g.output("y", g.maximum(a * b + c, 0.0))


def _gelu(g, n):
    from hologram.frontend import functional

    x, w, b = (g.input(name, "f32", (n,)) for name in "xwb")
    g.output("y", functional.gelu(x * w + b))  # the erf form, torch's default


def _softmax(g, n):
    from hologram.frontend import functional

    g.output("y", functional.softmax(g.input("x", "f32", (n // ROW, ROW)), 1))


def _mse(g, n):
    from hologram.frontend import functional

    x, t = g.input("x", "f32", (n,)), g.input("t", "f32", (n,))
    g.output("loss", functional.mse_loss(x, t))


def _cross_entropy(g, n):
    """Class indices, mean over rows: ``hologram.functional.cross_entropy`` builds it from
    graph ops (log-softmax from max/exp/sum/log; the target's log-probability gathered by
    an arange-compare-select-sum along the row; the mean)."""
    from hologram.frontend import functional

    rows = n // ROW
    x = g.input("x", "f32", (rows, ROW))
    g.output("loss", functional.cross_entropy(x, g.input("target", "i64", (rows,))))


def _matmul(g, n):
    a, b = g.input("a", "f32", (n, n)), g.input("b", "f32", (n, n))
    g.output("y", a @ b)


PROGRAMS: dict[str, Callable] = {
    "relu_mad": _relu_mad, "gelu": _gelu, "softmax": _softmax, "mse": _mse,
    "cross_entropy": _cross_entropy, "matmul": _matmul,
}


def build_program(name: str, n: int, variant: int = 0):
    """A Hologram program by name; ``variant`` > 0 adds ``+ variant`` at the output's end
    of ``relu_mad``, which makes a new kernel (another cache key) of the same cost."""
    from hologram.frontend.graph import Graph

    g = Graph(name)
    if name == "relu_mad" and variant:
        a, b, c = (g.input(x, "f32", (n,)) for x in "abc")
        g.output("y", g.maximum(a * b + c, 0.0) + float(variant))
    else:
        PROGRAMS[name](g, n)
    return g.program()


def _torch_fns(torch) -> dict[str, Callable]:
    functional = torch.nn.functional
    return {
        "add": torch.add, "mul": torch.mul, "div": torch.div, "neg": torch.neg,
        "abs": torch.abs, "relu": torch.relu, "exp": torch.exp, "log": torch.log,
        "sqrt": torch.sqrt, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
        "sum": torch.sum, "max": torch.max, "min": torch.min,
        "relu_mad": lambda a, b, c: torch.relu(a * b + c),
        "gelu": lambda x, w, b: functional.gelu(x * w + b),
        "softmax": lambda x: torch.softmax(x, 1),
        "mse": functional.mse_loss,
        "cross_entropy": functional.cross_entropy,
        "matmul": torch.matmul,
    }


# --- cases -----------------------------------------------------------------------------

EXACT = (0.0, 0.0)  # correctly rounded IEEE results: both sides must agree bit for bit
LOOSE = (1e-4, 1e-5)  # transcendentals and fused chains (rtol, atol)


@dataclass(frozen=True)
class Case:
    family: str
    op: str  # the key into PROGRAMS / _torch_fns, and the label in the table
    size: int
    build: Callable  # (graph, size) -> None
    inputs: Callable[[np.random.Generator, int], list[np.ndarray]]
    tolerance: tuple[float, float]
    target: float  # torch_us / hologram_us must reach this (vs eager)
    compile_target: float | None = None  # vs torch.compile, for fused chains
    label: str | None = None

    @property
    def name(self) -> str:
        return self.label or self.op


def _normal(count: int, scale: float = 1.0):
    def make(rng, n):
        return [(rng.standard_normal(n, dtype=np.float32) * np.float32(scale))
                for _ in range(count)]
    return make


def _uniform(count: int, low: float, high: float):
    def make(rng, n):
        return [_between(rng, low, high, n) for _ in range(count)]
    return make


def _between(rng, low: float, high: float, shape) -> np.ndarray:
    # Drawn in float32 directly: no 80 MB float64 temporary at 1e7.
    x = rng.random(shape, dtype=np.float32)
    x *= np.float32(high - low)
    x += np.float32(low)
    return x


def _div_inputs(rng, n):
    # Denominators away from zero: the comparison is about speed, not overflow.
    return [rng.standard_normal(n, dtype=np.float32), _between(rng, 0.5, 2.0, n)]


def _rows(rng, n):
    return [rng.standard_normal((n // ROW, ROW), dtype=np.float32)]


def _logits_and_targets(rng, n):
    rows = n // ROW
    return [rng.standard_normal((rows, ROW), dtype=np.float32),
            rng.integers(0, ROW, rows, dtype=np.int64)]


def _square(rng, n):
    return [_between(rng, -1.0, 1.0, (n, n)) for _ in range(2)]


def cases(sizes: dict[str, tuple[int, ...]]) -> Iterator[Case]:
    """Every case of the issue's target table, in report order."""
    inputs = {"add": _normal(2), "mul": _normal(2), "div": _div_inputs, "neg": _normal(1),
              "abs": _normal(1), "relu": _normal(1)}
    for op, make in inputs.items():
        for n in sizes["elementwise"]:
            yield Case("elementwise", op, n, _elementwise_program(op), make, EXACT,
                       1.5 if n >= 10**7 else 1.0)
    inputs = {"exp": _normal(1), "log": _uniform(1, 0.01, 100.0),
              "sqrt": _uniform(1, 0.0, 100.0), "tanh": _normal(1, 3.0),
              "sigmoid": _normal(1, 3.0)}
    for op, make in inputs.items():
        for n in sizes["transcendental"]:
            yield Case("transcendental", op, n, _elementwise_program(op), make, LOOSE,
                       1.2 if op in ("tanh", "sigmoid") else 1.0)
    for op, label in (("relu_mad", "relu(a*b+c)"), ("gelu", "gelu(x*w+b)")):
        for n in sizes["fused"]:
            yield Case("fused", op, n, PROGRAMS[op], _normal(3), LOOSE, 2.0, 1.2, label)
    for op in ("sum", "max", "min"):
        for n in sizes["reduction"]:
            # Positive inputs keep the float32 sum well conditioned, so the check tests
            # the implementation rather than cancellation luck; max/min are exact.
            tolerance = (1e-5, 0.0) if op == "sum" else EXACT
            yield Case("reduction", op, n, _reduction_program(op), _uniform(1, 0.0, 1.0),
                       tolerance, 2.0 if op != "sum" and n == 10**5 else 1.0)
    losses = (("softmax", _rows), ("mse", _normal(2)), ("cross_entropy", _logits_and_targets))
    for op, make in losses:
        for n in sizes["loss"]:
            yield Case("softmax/loss", op, n, PROGRAMS[op], make, LOOSE, 1.2)
    for n in sizes["matmul"]:
        # Both sides round float32 partial sums but block them differently: absolute
        # differences grow like sqrt(n) ulps of the largest entries (3e-5 at n = 1024,
        # entries up to ~50), so near-zero entries need an absolute tolerance.
        yield Case("matmul", "matmul", n, _matmul, _square, (1e-5, 1e-4), 0.9,
                   label=f"matmul {n}x{n}")


# --- threads ---------------------------------------------------------------------------

@contextlib.contextmanager
def thread_setting(torch, n: int) -> Iterator[None]:
    """Run Hologram's pool, its BLAS and PyTorch with ``n`` threads; restore afterwards."""
    from hologram.backends.cpu import blas, threads

    saved_torch, saved_blas = torch.get_num_threads(), blas.blas_threads()
    threads.set_num_threads(n)
    blas.set_blas_threads(n)
    torch.set_num_threads(n)
    try:
        yield
    finally:
        threads.set_num_threads(None)
        blas.set_blas_threads(max(saved_blas, 1))
        torch.set_num_threads(saved_torch)


# --- checking --------------------------------------------------------------------------

def check(got, want: np.ndarray, tolerance: tuple[float, float]) -> str:
    """``"ok"``, or what disagreed (size, or the worst absolute and relative errors)."""
    got = np.asarray(got)
    if got.size != want.size:
        return f"MISMATCH: {got.size} elements, torch has {want.size}"
    got = got.reshape(want.shape)
    rtol, atol = tolerance
    if np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True):
        return "ok"
    g, w = got.astype(np.float64), want.astype(np.float64)
    error = np.abs(g - w)
    worst = int(np.nanargmax(error))
    relative = np.nanmax(error / np.maximum(np.abs(w), np.finfo(np.float32).tiny))
    return (f"MISMATCH: max abs err {np.nanmax(error):.3g} (element {worst}: {g.flat[worst]:.9g}"
            f" vs torch {w.flat[worst]:.9g}), max rel err {relative:.3g}, rtol={rtol}, "
            f"atol={atol}")


# --- one case --------------------------------------------------------------------------

def _row(case: Case, threads: int | None, baseline: str, times: tuple[float, float] | None,
         target: float, status: str, note: str = "", others: float | None = None) -> dict:
    hologram_us, torch_us = times or (None, None)
    ratio = torch_us / hologram_us if hologram_us and torch_us else None
    return {
        "family": case.family, "op": case.name, "size": case.size, "threads": threads,
        "baseline": baseline, "hologram_us": hologram_us, "torch_us": torch_us,
        "ratio": ratio, "target": target,
        "met": bool(ratio is not None and ratio >= target and status == "ok"),
        "check": status, "note": note, "other_load": others,
    }


def _compile_torch(torch, fn: Callable, args: tuple) -> tuple[Callable | None, str]:
    """torch.compile (Inductor) ``fn`` for these shapes and the current thread count, and a
    note with the seconds its first call took (or why it failed: Inductor needs a C++
    compiler). Inductor bakes the thread count into the code it generates, so this runs
    once per size and thread count, outside any timing."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, dynamic=False)
    start = time.perf_counter()
    try:
        compiled(*args)
    except Exception as err:
        return None, f"torch.compile failed: {type(err).__name__}: {str(err)[:200]}"
    return compiled, f"torch.compile took {time.perf_counter() - start:.2f} s (not timed)"


def _compile_hologram(case: Case):
    import hologram
    from hologram.frontend.graph import Graph

    g = Graph(case.op)
    case.build(g, case.size)
    return hologram.compile(g.program(), backend="cpu")


def run_case(case: Case, settings: Settings, torch, log: Callable[[str], None]) -> list[dict]:
    """Compile, check and time one case at every thread count; one row per thread count
    and baseline (a single row saying why, when Hologram cannot compile or run it)."""
    try:
        compiled = _compile_hologram(case)
    except Exception as err:  # an op the backend cannot compile yet: say so, go on
        return [_failed(case, "skipped: hologram cannot compile it", err, log)]
    rng = np.random.default_rng(zlib.crc32(f"{case.op} {case.size}".encode()))
    arrays = tuple(case.inputs(rng, case.size))
    tensors = tuple(torch.from_numpy(a) for a in arrays)  # the same memory, the same data
    # The full build, as `hologram bench` times: from a cold cache (main's) the first
    # calls run the quick build while the full one compiles on a core the samples need
    # (softmax over 1000 x 1000 on 1 thread measured 18.9 ms so, 0.5 ms after it).
    promote(lambda: compiled(*arrays))
    rows = []
    for n in thread_counts():
        try:
            new = _measure(case, n, settings, torch, compiled, arrays, tensors)
        except Exception as err:  # a crash is a result too: report it, keep going
            return rows + [_failed(case, f"error on {n} threads", err, log)]
        for row in new:
            log(format_row(row))
        rows += new
    return rows


def _failed(case: Case, what: str, err: Exception, log: Callable[[str], None]) -> dict:
    reason = f"{what}: {type(err).__name__}: {err}"
    log(f"  {case.name} {_size(case.size)}: {reason}")
    return _row(case, None, "eager", None, case.target, reason)


def _measure(case: Case, n: int, settings: Settings, torch, compiled, arrays: tuple,
             tensors: tuple) -> list[dict]:
    """Check, then time, Hologram against PyTorch eager (and Inductor) on ``n`` threads."""
    torch_fn = _torch_fns(torch)[case.op]
    with thread_setting(torch, n), torch.no_grad():
        status = check(compiled(*arrays), torch_fn(*tensors).numpy(), case.tolerance)
        contestants = [(compiled, arrays), (torch_fn, tensors)]
        inductor_note = None
        if case.compile_target is not None and settings.torch_compile:
            fused, inductor_note = _compile_torch(torch, torch_fn, tensors)
            if fused is not None:
                contestants.append((fused, tensors))
        if n > 1:
            sysinfo.wait_for_quiet(settings.quiet_wait_s)
        load = sysinfo.OtherLoad()
        times = stats.interleaved(contestants, settings, _warm_s(case, n))
        others = load.cores()
    note = _matmul_note(case, times) if case.family == "matmul" else ""
    rows = [_row(case, n, "eager", (times[0], times[1]), case.target, status, note, others)]
    if inductor_note is not None:
        inductor = (times[0], times[2]) if len(times) > 2 else None
        rows.append(_row(case, n, "torch.compile", inductor, case.compile_target, status,
                         inductor_note, others))
    return rows


def _warm_s(case: Case, threads: int) -> float:
    """Untimed warm-up before each sample (see :func:`hologram.bench.stats.interleaved`):
    none on one thread, where no pool spins; longer where OpenBLAS (matmul) may still be
    spinning."""
    if threads == 1:
        return 0.0
    return 0.15 if case.family == "matmul" else 0.05


def _matmul_note(case: Case, times: list[float]) -> str:
    flops = 2.0 * case.size**3
    return (f"GFLOP/s: hologram {flops / times[0] / 1e3:.0f}, "
            f"torch {flops / times[1] / 1e3:.0f}")


# --- compile and load times ------------------------------------------------------------

_CHILD = """
import sys, time
import hologram
from hologram import backends
from hologram.bench.dev.cpu import build_program
start = time.perf_counter()
backends.get("cpu")  # imports llvmlite and the backend: excluded from the measurement
imported = time.perf_counter()
program = build_program(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
start_compile = time.perf_counter()
hologram.compile(program, backend="cpu")
print((imported - start) * 1e3, (time.perf_counter() - start_compile) * 1e3)
"""


def _child_ms(name: str, n: int, variant: int, cache_dir: str) -> tuple[float, float]:
    """(ms importing the cpu backend, ms in ``hologram.compile``) in a fresh process."""
    env = dict(os.environ, HOLOGRAM_CACHE_DIR=cache_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-c", _CHILD, name, str(n), str(variant)],
                         check=True, capture_output=True, text=True, cwd=ROOT, env=env)
    imported, compiled = out.stdout.split()[-2:]
    return float(imported), float(compiled)


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    """Set one environment variable for the block (HOLOGRAM_* settings are read at call
    time, so a new cache directory takes effect at once)."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def bench_compile(settings: Settings, log: Callable[[str], None]) -> list[dict]:
    """Compile a new kernel in this process (fresh cache directory; canonicalize, fuse,
    LLVM O3, object code, disk write, JIT load), and load it from the disk cache in a new
    process, timed inside the child around ``hologram.compile`` only, after imports."""
    import hologram

    n, repeat = 10**6, settings.compile_repeat
    with tempfile.TemporaryDirectory() as cache_dir, _env("HOLOGRAM_CACHE_DIR", cache_dir):
        hologram.compile(build_program("relu_mad", n), backend="cpu")  # warm LLVM; on disk
        new_ms = []
        for variant in range(1, repeat + 1):  # each variant is a cache miss
            program = build_program("relu_mad", n, variant)
            start = time.perf_counter()
            hologram.compile(program, backend="cpu")
            new_ms.append((time.perf_counter() - start) * 1e3)
        loads = [_child_ms("relu_mad", n, 0, cache_dir) for _ in range(repeat)]
    firsts = []
    for _ in range(max(1, repeat // 2)):
        with tempfile.TemporaryDirectory() as empty:
            firsts.append(_child_ms("relu_mad", n, 0, empty))
    imports = statistics.median(i for i, _ in loads + firsts)
    rows = [
        _time_row("compile a new kernel: relu(a*b+c), 1e6", new_ms, 30.0),
        _time_row("load it from the disk cache in a new process", [c for _, c in loads], 1.0,
                  f"; importing the cpu backend first took {imports:.0f} ms (not counted)"),
        _time_row("first compile in a new process (LLVM start-up included)",
                  [c for _, c in firsts], None),
    ]
    for row in rows:
        log(format_row(row))
    return rows


def _time_row(label: str, values_ms: list[float], target_ms: float | None,
              extra: str = "") -> dict:
    ms = statistics.median(values_ms)
    return {
        "family": "compile", "op": label, "size": None, "threads": None, "baseline": "-",
        "hologram_us": ms * 1e3, "torch_us": None, "ratio": None, "target": target_ms,
        "met": None if target_ms is None else ms <= target_ms, "check": "ok",
        "note": f"median of {len(values_ms)}: "
                + ", ".join(f"{v:.2f}" for v in values_ms) + " ms" + extra,
        "other_load": None, "metric": "ms",
    }


# --- output ----------------------------------------------------------------------------

def _size(n: int) -> str:
    exponent = round(math.log10(n)) if n > 0 else 0
    return f"1e{exponent}" if n == 10**exponent else str(n)


def _us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


def _target(row: dict) -> str:
    if row["target"] is None:
        return "-"
    if row.get("metric") == "ms":
        return f"≤ {row['target']:g} ms"
    return f"≥ {row['target']:g}"


def _met(row: dict) -> str:
    if row["met"] is None:
        return "-"
    return "yes" if row["met"] else "NO"


NOISY = 0.5  # cores busy elsewhere from which a 2-thread row is mostly scheduling noise

COLUMNS = ["family", "op", "size", "threads", "vs", "hologram µs", "torch µs", "ratio",
           "target", "met", "others' load", "check / note"]


def cells(row: dict) -> list[str]:
    if row.get("metric") == "ms":
        measured = f"{row['hologram_us'] / 1e3:.2f} ms"
        return [row["family"], row["op"], "", "", "", measured, "", "", _target(row),
                _met(row), "", row["note"]]
    ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
    others = "" if row["other_load"] is None else f"{row['other_load']:.2f}"
    note = row["check"] if row["check"] != "ok" else row["note"]
    return [row["family"], row["op"], _size(row["size"]),
            "-" if row["threads"] is None else str(row["threads"]), row["baseline"],
            _us(row["hologram_us"]), _us(row["torch_us"]), ratio, _target(row), _met(row),
            others, note]


def format_row(row: dict) -> str:
    return "  " + " | ".join(cells(row))


def ratio_table(rows: list[dict]) -> str:
    """One line per case and baseline, thread counts side by side (µs of both sides, ratio,
    met); compile-time rows as they are. Checks that failed and skip reasons go in the
    last column, and so does other processes' load where it makes a row unreliable."""
    counts = sorted({r["threads"] for r in rows if r["threads"] is not None})
    header = ["family", "op", "size", "vs", "target"]
    for n in counts:
        header += [f"µs, {n} thr (holo / torch)", f"ratio {n} thr", f"met {n} thr"]
    header.append("check / note")
    grouped: dict[tuple, list[dict]] = {}
    for r in rows:
        grouped.setdefault((r["family"], r["op"], r["size"], r["baseline"]), []).append(r)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (family, op, size, baseline), group in grouped.items():
        line = [family, op, "" if size is None else _size(size), baseline, _target(group[0])]
        if group[0].get("metric") == "ms":
            cells_ = ["", "", ""] * len(counts)
            cells_[0] = f"{group[0]['hologram_us'] / 1e3:.2f} ms"
            cells_[2] = _met(group[0])
            line += cells_ + [group[0]["note"]]
        else:
            line += [c for n in counts for c in _thread_cells(group, n)] + [_notes(group)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in line) + " |")
    return "\n".join(lines)


def _thread_cells(group: list[dict], n: int) -> list[str]:
    row = next((r for r in group if r["threads"] == n), None)
    if row is None or row["ratio"] is None:
        return ["-", "-", "-" if row is None else _met(row)]
    return [f"{_us(row['hologram_us'])} / {_us(row['torch_us'])}", f"{row['ratio']:.2f}",
            _met(row)]


def _notes(group: list[dict]) -> str:
    notes = []
    for r in group:
        where = "" if r["threads"] is None else f"{r['threads']} thr: "
        if r["check"] != "ok":
            notes.append(where + r["check"])
        if (r["other_load"] or 0.0) >= NOISY:
            notes.append(f"{where}others used {r['other_load']:.1f} cores")
        if r["note"]:
            notes.append(where + r["note"])
    return "; ".join(dict.fromkeys(notes))


def summary(rows: list[dict]) -> str:
    judged = [r for r in rows if r["met"] is not None]
    quiet = [r for r in judged if (r["other_load"] or 0.0) < NOISY]
    skipped = sum(r["check"].startswith("skipped") for r in rows)
    mismatched = sum(r["check"].startswith("MISMATCH") for r in rows)
    return (f"{sum(r['met'] for r in judged)} of {len(judged)} targets met "
            f"({sum(r['met'] for r in quiet)} of the {len(quiet)} measured while other "
            f"processes kept less than {NOISY} cores busy); {skipped} cases skipped; "
            f"{mismatched} results disagreed with PyTorch.")


def environment(torch) -> dict:
    from llvmlite import binding

    from hologram.backends.cpu import blas, llvm

    return {
        "cpu": sysinfo.cpu_model(), "cores": thread_counts()[-1],
        "python": platform.python_version(), "numpy": np.__version__,
        "torch": torch.__version__, "llvmlite": importlib.metadata.version("llvmlite"),
        "llvm": ".".join(map(str, binding.llvm_version_info)),
        "llvm_host_cpu": llvm.host_cpu()[1], "blas": blas.describe(),
    }


# --- driver ----------------------------------------------------------------------------

def import_torch():
    """PyTorch, or None with the reason printed."""
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: the CPU backend vs PyTorch benchmark is skipped. "
              "`make bench` installs it (the bench extra, pinned by constraints.txt); or run "
              "`pip install -c constraints.txt torch`.", file=sys.stderr)
        return None
    return torch


def run(quick: bool = False, torch_compile: bool = True,
        log: Callable[[str], None] = print) -> dict:
    """Every case and the compile-time rows: ``{"environment": ..., "rows": [...]}``
    (no rows, and ``"skipped"`` saying why, without PyTorch)."""
    torch = import_torch()
    if torch is None:
        return {"environment": None, "rows": [], "skipped": "PyTorch is not installed"}
    settings = Settings.make(quick, torch_compile)
    env = environment(torch)
    log(f"CPU backend vs PyTorch {torch.__version__} eager"
        + (" and torch.compile" if torch_compile else "")
        + f" on {env['cpu']}, threads {thread_counts()}" + (" (quick)" if quick else ""))
    log("  " + " | ".join(COLUMNS))
    start = time.perf_counter()
    rows = []
    with contextlib.ExitStack() as stack:
        if settings.torch_compile:  # cold Inductor compiles, and nothing left behind
            inductor = stack.enter_context(tempfile.TemporaryDirectory())
            stack.enter_context(_env("TORCHINDUCTOR_CACHE_DIR", inductor))
        for case in cases(settings.sizes):
            rows += run_case(case, settings, torch, log)
            gc.collect()  # 1e7 cases hold hundreds of MB: free them before the next
        rows += bench_compile(settings, log)
    env["seconds"] = round(time.perf_counter() - start, 1)
    log(summary(rows) + f" ({env['seconds']:.0f} s)")
    return {"environment": env, "rows": rows}


def cli(doc: str) -> argparse.ArgumentParser:
    """The benchmark scripts' common options: ``--quick`` (default: HOLOGRAM_BENCH_QUICK)
    and ``--json PATH``; the first paragraph of ``doc`` describes the command."""
    from hologram import config

    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", default=config.get().bench_quick)
    parser.add_argument("--json", type=Path, help="also write the result here")
    return parser


def report(text: str, result: dict, path: Path | None) -> None:
    """Print a benchmark's table (``text``) and write ``result`` to ``path`` if given."""
    print(text)
    if path:
        path.write_text(json.dumps(result, indent=2))


def table_main(doc: str, run, table, argv: list[str] | None) -> None:
    """The command of a benchmark whose ``run(quick)`` gives ``{"threads", "rows"}``,
    printed by ``table(result)``."""
    args = cli(doc).parse_args(argv)
    result = run(args.quick)
    report(f"threads: {result['threads']}\n\n" + table(result), result, args.json)


def main(argv: list[str] | None = None) -> None:
    parser = cli(__doc__)
    parser.add_argument("--no-torch-compile", dest="torch_compile", action="store_false",
                        help="skip the torch.compile comparison (its compiles take seconds)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as cache_dir, _env("HOLOGRAM_CACHE_DIR", cache_dir):
        result = run(args.quick, args.torch_compile)
    report("\n" + ratio_table(result["rows"]), result, args.json)


if __name__ == "__main__":
    main()
