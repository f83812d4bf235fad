"""The benchmark suite that exists today: compiler and cache costs, and the reference
interpreter against NumPy eager on the same fused programs.

    python -m benchmarks.run [--out DIR] [--quick]

Measured in one process, interleaved, medians over repeated runs. Writes ``results.json``
and ``report.md`` to DIR (default ``bench-results/``). The interpreter is the executable
definition of the ISA, not a fast backend: the execution table shows what fusion alone
buys when every instruction is still a NumPy call, and it is reported as measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import hologram
from hologram import config
from hologram.compiler import pipeline
from hologram.graph import Graph


def _relu_mad(g, n):
    a, b, c = (g.input(name, "f32", (n,)) for name in "abc")
    g.output("y", g.maximum(a * b + c, 0.0))


def _softmax(g, n):
    x = g.input("x", "f32", (n // 1000, 1000))
    e = g.unary("exp", x - g.max(x, 1, keepdim=True))
    g.output("y", e / g.sum(e, 1, keepdim=True))


def _layer_norm(g, n):
    x = g.input("x", "f32", (n // 1000, 1000))
    d = x - g.mean(x, 1, keepdim=True)
    g.output("y", d * g.unary("rsqrt", g.mean(d * d, 1, keepdim=True) + 1e-5))


def _gelu(g, n):
    x, w, b = (g.input(name, "f32", (n,)) for name in "xwb")
    v = x * w + b
    g.output("y", v * 0.5 * (g.unary("erf", v * (1 / math.sqrt(2))) + 1.0))


def _mse(g, n):
    x, t = g.input("x", "f32", (n,)), g.input("t", "f32", (n,))
    d = x - t
    g.output("loss", g.mean(d * d))


def _numpy_reference(name):
    """The same computation in NumPy eager (None where NumPy lacks the function: erf)."""

    def softmax(x):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def layer_norm(x):
        d = x - x.mean(axis=1, keepdims=True)
        return d / np.sqrt((d * d).mean(axis=1, keepdims=True) + 1e-5)

    return {
        "relu_mad": lambda a, b, c: np.maximum(a * b + c, 0),
        "softmax": lambda x: softmax(x.reshape(-1, 1000)),
        "layer_norm": lambda x: layer_norm(x.reshape(-1, 1000)),
        "mse": lambda x, t: np.mean((x - t) ** 2),
    }.get(name)


PROGRAMS = {
    "relu_mad": _relu_mad, "softmax": _softmax, "layer_norm": _layer_norm, "gelu": _gelu,
    "mse": _mse,
}


def _once_us(fn, args=()) -> float:
    start = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - start) * 1e6


def _median_us(fn, repeat: int) -> float:
    return statistics.median(_once_us(fn) for _ in range(repeat))


def bench_compiler(n: int, repeat: int) -> list[dict]:
    rows = []
    for name, build in PROGRAMS.items():
        g = Graph(name)
        build(g, n)
        program = g.program()
        canonical = pipeline.canonical_form(program)
        lowered = pipeline.lower(canonical)
        hologram.clear_cache()
        start = time.perf_counter()
        hologram.compile(program)
        cold = (time.perf_counter() - start) * 1e6
        memo = _median_us(lambda program=program: hologram.compile(program), repeat)
        hologram.clear_cache(disk=False)  # in-process caches gone, disk entry kept
        start = time.perf_counter()
        hologram.compile(program)
        disk = (time.perf_counter() - start) * 1e6
        rows.append({
            "program": name,
            "kernels_before": len(program.kernels),
            "kernels_after": len(lowered.kernels),
            "temps_after": len(lowered.temps),
            "canonicalize_us": _median_us(lambda p=program: pipeline.canonical_form(p),
                                          repeat),
            "fuse_schedule_us": _median_us(lambda c=canonical: pipeline.lower(c), repeat),
            "cold_compile_us": cold,
            "memo_hit_us": memo,
            "disk_hit_us": disk,
        })
    return rows


def bench_new_process_disk_hit() -> float:
    """Milliseconds for a fresh process to compile a program already on disk (after
    importing hologram), measured inside that process."""
    code = (
        "import time, hologram; from benchmarks.run import PROGRAMS; "
        "from hologram.graph import Graph\n"
        "g = Graph('softmax'); PROGRAMS['softmax'](g, 100000); p = g.program()\n"
        "t = time.perf_counter(); hologram.compile(p); print((time.perf_counter() - t) * 1e3)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True)
    return float(out.stdout.strip())


def bench_execution(sizes: list[int], repeat: int) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for name, build in PROGRAMS.items():
        reference = _numpy_reference(name)
        if reference is None:
            continue
        for n in sizes:
            g = Graph(name)
            build(g, n)
            program = g.program()
            compiled = hologram.compile(program)
            inputs = [rng.standard_normal(p.size).astype(np.float32)
                      for p in program.params if p.kind == "in"]
            got = compiled(*inputs)
            want = reference(*inputs)
            np.testing.assert_allclose(np.asarray(got).reshape(np.shape(want)), want,
                                       rtol=1e-4, atol=1e-5)
            interp, numpy_eager = [], []
            for _ in range(repeat):  # interleaved, so drift hits both alike
                interp.append(_once_us(compiled, inputs))
                numpy_eager.append(_once_us(reference, inputs))
            rows.append({
                "program": name, "elements": n,
                "interp_us": statistics.median(interp),
                "numpy_us": statistics.median(numpy_eager),
                "numpy_over_interp": statistics.median(numpy_eager) / statistics.median(interp),
            })
    return rows


def _table(rows: list[dict], columns: list[str]) -> str:
    def cell(v):
        return f"{v:,.1f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench-results")
    parser.add_argument("--quick", action="store_true", default=config.get().bench_quick)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    repeat = 5 if args.quick else 15
    sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]

    with tempfile.TemporaryDirectory() as cache_dir:
        os.environ["HOLOGRAM_CACHE_DIR"] = cache_dir  # never touch the user's cache
        compiler_rows = bench_compiler(100_000, repeat)
        new_process_ms = bench_new_process_disk_hit()
        execution_rows = bench_execution(sizes, repeat)

    results = {
        "system": {"python": platform.python_version(), "numpy": np.__version__,
                   "hologram": hologram.__version__, "machine": platform.machine(),
                   "processor": platform.processor()},
        "compiler": compiler_rows,
        "new_process_disk_hit_ms": new_process_ms,
        "execution": execution_rows,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    report = "\n\n".join([
        "# Hologram benchmark report",
        "Backend: `interp` (the NumPy reference interpreter; the only backend so far). "
        "Medians; one process; interleaved.",
        "## Compiler and program cache (µs)",
        _table(compiler_rows, ["program", "kernels_before", "kernels_after", "temps_after",
                               "canonicalize_us", "fuse_schedule_us", "cold_compile_us",
                               "memo_hit_us", "disk_hit_us"]),
        f"A new process finds a compiled program on disk in {new_process_ms:.2f} ms "
        "(canonicalization included).",
        "## Fused programs on the interpreter vs NumPy eager",
        "`numpy_over_interp` > 1 means the interpreter was faster.",
        _table(execution_rows, ["program", "elements", "interp_us", "numpy_us",
                                "numpy_over_interp"]),
    ])
    (out / "report.md").write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
