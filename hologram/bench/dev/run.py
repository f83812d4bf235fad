"""The developer benchmark suite: the CPU backend against PyTorch
(:mod:`hologram.bench.dev.cpu`), the SDK's per-op costs and fusion
(:mod:`hologram.bench.dev.sdk`), the PyTorch device's per-op overhead and elementwise
ratios (:mod:`hologram.bench.dev.torch_device`), training steps on the device and with
``hologram_torch.nn`` (:mod:`hologram.bench.dev.training`), ``torch.distributed`` on
two local processes against gloo on CPU tensors (:mod:`hologram.bench.dev.distributed`),
compiler and program-cache costs, and a small check of the reference interpreter against
NumPy eager on the same fused programs.

    python -m hologram.bench.dev.run [--out DIR] [--quick] [--no-torch-compile]

Measured in one process, interleaved, medians over repeated runs, with a temporary
program cache (the distributed section's two processes measure among themselves). Writes
``results.json`` and ``report.md`` to DIR (default ``bench-results/``). Without PyTorch
the CPU, device, training and distributed sections are skipped with a message and the
rest runs. The interpreter is the executable definition of the ISA, not a
fast backend: its table shows what fusion alone buys when every instruction is still a
NumPy call.
"""

from __future__ import annotations

import argparse
import importlib.util
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
from hologram import backends, config
from hologram.bench import stats
from hologram.bench.dev import cpu, distributed, sdk, torch_device, training
from hologram.compiler import pipeline
from hologram.frontend.graph import Graph


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


def _median_us(fn, repeat: int) -> float:
    return statistics.median(stats.per_call_us(fn) for _ in range(repeat))


def bench_compiler(n: int, repeat: int, backend: str) -> list[dict]:
    rows = []
    for name, build in PROGRAMS.items():
        g = Graph(name)
        build(g, n)
        program = g.program()
        canonical = pipeline.canonical_form(program)
        lowered = pipeline.lower(canonical)
        hologram.clear_cache()
        start = time.perf_counter()
        hologram.compile(program, backend)
        cold = (time.perf_counter() - start) * 1e6
        memo = _median_us(lambda program=program: hologram.compile(program, backend), repeat)
        hologram.clear_cache(disk=False)  # in-process caches gone, disk entry kept
        start = time.perf_counter()
        hologram.compile(program, backend)
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


def bench_new_process_disk_hit(backend: str) -> float:
    """Milliseconds for a fresh process to compile a program already on disk (after
    importing hologram and the backend), measured inside that process."""
    code = (
        "import sys, time, hologram; from hologram.bench.dev.run import PROGRAMS; "
        "from hologram.frontend.graph import Graph; hologram.backends.get(sys.argv[1])\n"
        "g = Graph('softmax'); PROGRAMS['softmax'](g, 100000); p = g.program()\n"
        "t = time.perf_counter(); hologram.compile(p, sys.argv[1]); "
        "print((time.perf_counter() - t) * 1e3)"
    )
    command = [sys.executable, "-c", code, backend]
    subprocess.run(command, check=True, capture_output=True)
    out = subprocess.run(command, check=True, capture_output=True, text=True)
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
            compiled = hologram.compile(program, backend="interp")
            inputs = [rng.standard_normal(p.size).astype(np.float32)
                      for p in program.params if p.kind == "in"]
            got = compiled(*inputs)
            want = reference(*inputs)
            np.testing.assert_allclose(np.asarray(got).reshape(np.shape(want)), want,
                                       rtol=1e-4, atol=1e-5)
            interp, numpy_eager = [], []
            for _ in range(repeat):  # interleaved, so drift hits both alike
                interp.append(stats.per_call_us(compiled, inputs))
                numpy_eager.append(stats.per_call_us(reference, inputs))
            rows.append({
                "program": name, "elements": n,
                "interp_us": statistics.median(interp),
                "numpy_us": statistics.median(numpy_eager),
                "numpy_over_interp": statistics.median(numpy_eager) / statistics.median(interp),
            })
    return rows


def _table(rows: list[dict], columns: list[str]) -> str:
    def cell(v):
        if isinstance(v, float):  # ratios below 10 keep three digits: 0.043, not 0.0
            return f"{v:.3g}" if abs(v) < 10 else f"{v:,.1f}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _cpu_section(cpu_result: dict) -> list[str]:
    """The report's CPU-vs-PyTorch part: where it ran, the summary, the table."""
    if not cpu_result["rows"]:
        return ["## CPU backend vs PyTorch", f"Skipped: {cpu_result['skipped']}."]
    env = cpu_result["environment"]
    return [
        "## CPU backend vs PyTorch",
        f"{env['cpu']} ({env['cores']} cores usable), PyTorch {env['torch']}, NumPy "
        f"{env['numpy']}, llvmlite {env['llvmlite']} (LLVM {env['llvm']}, host CPU "
        f"`{env['llvm_host_cpu']}`), BLAS: {env['blas']}. Took {env['seconds']:.0f} s.",
        "Medians of interleaved rounds in one process; both sides allocate their outputs. "
        "`ratio` = torch µs / hologram µs (> 1: Hologram faster); `target` is the CPU "
        "backend issue's; `met` needs the target ratio *and* a result that matches PyTorch. "
        "Where other processes kept cores busy meanwhile the note says how many: the "
        "machine is shared, and from about half a core on the multi-thread figures mostly "
        "measure waits for a time slice.",
        "**" + cpu.summary(cpu_result["rows"]) + "**",
        cpu.ratio_table(cpu_result["rows"]),
        "Every row, with the other processes' load per thread count, is in `results.json` "
        "(`cpu_vs_torch.rows`).",
    ]


def _guarded(bench, quick: bool) -> dict:
    """``bench(quick)``, or ``{"error": ...}`` when it raises: one broken section must not
    cost the suite its other tables."""
    try:
        return bench(quick)
    except Exception as e:  # reported in the section instead
        return {"error": f"{type(e).__name__}: {e}"}


def _torch_sections(device_result: dict | None, training_result: dict | None) -> list[str]:
    """The report's PyTorch-device parts: per-op overhead and elementwise ratios, then
    training steps (skipped without PyTorch; a section that raised says so)."""
    if device_result is None or training_result is None:
        return ["## PyTorch device and training steps", "Skipped: PyTorch is not installed."]
    if "error" in device_result:
        device = ["## PyTorch device `hologram` vs CPU eager",
                  f"**Failed**: `{device_result['error']}`"]
    else:
        device = [
            f"## PyTorch device `hologram` vs CPU eager ({device_result['threads']} threads)",
            "`a + b` on 100 elements split into dispatch, allocation, launch and the kernel's "
            "Python; elementwise ops and activations on device tensors against the same on "
            "CPU tensors. `ratio` is CPU / device: above 1, the device was faster.",
            sdk.table(device_result),
        ]
    if "error" in training_result:
        return [*device, "## Training steps", f"**Failed**: `{training_result['error']}`"]
    load = training_result["load_average"]
    return [
        *device,
        f"## Training steps ({training_result['threads']} threads, load average "
        f"{load[0]} before / {load[1]} after)",
        "One `zero_grad` + forward + loss + backward + Adam step on a fixed batch; medians of "
        "interleaved rounds, and the fastest step of each side (medians on a loaded machine "
        "include waits for a time slice). `check`: the first two steps' losses match the CPU "
        "within 1e-4 relative. The note counts one warm step's native kernel calls and the "
        "ops that ran through the CPU fallback. `ratio` is CPU / Hologram.",
        training.table(training_result),
    ]


def _distributed(quick: bool) -> dict:
    # --quick: the small sizes of the benchmark's own tests (the same code paths); the
    # workers' start and kernel compiles are most of its time either way
    return distributed.run(quick, sizes=distributed.TINY_SIZES if quick else None)


def _distributed_section(result: dict | None) -> list[str]:
    """The report's torch.distributed part: the device's collectives and a DDP step on two
    processes against gloo on CPU tensors (skipped without PyTorch; failed if it raised)."""
    title = "## torch.distributed: the device against gloo on CPU tensors"
    if result is None:
        return [title, "Skipped: PyTorch is not installed."]
    if "error" in result:
        return [title, f"**Failed**: `{result['error']}`"]
    load = result["load_average"]
    return [
        f"{title} ({result['world']} processes, {result['threads']} thread each, load "
        f"average {load[0]} before / {load[1]} after)",
        "A float32 `all_reduce` (64 MiB; 1 MiB with `--quick`) on device tensors through the "
        "`hologram` backend, and a DDP training step of the MLP, each against the same on "
        "CPU tensors through plain gloo; rank 0's medians of interleaved rounds. `ratio` is "
        "CPU time / device time (above 1: the device was faster); `check`: sums and the "
        "first losses agree.",
        distributed.table(result),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench-results")
    parser.add_argument("--quick", action="store_true", default=config.get().bench_quick)
    parser.add_argument("--no-torch-compile", dest="torch_compile", action="store_false",
                        help="skip the torch.compile comparison (its compiles take seconds)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # The interpreter check is small on purpose: the CPU section is the main one.
    repeat = 3 if args.quick else 7
    sizes = [10_000] if args.quick else [10_000, 100_000]
    backend = backends.resolve("auto")

    with tempfile.TemporaryDirectory() as cache_dir:
        os.environ["HOLOGRAM_CACHE_DIR"] = cache_dir  # never touch the user's cache
        cpu_result = cpu.run(args.quick, args.torch_compile)
        sdk_result = sdk.run(args.quick)
        has_torch = importlib.util.find_spec("torch") is not None
        device_result = _guarded(torch_device.run, args.quick) if has_torch else None
        training_result = _guarded(training.run, args.quick) if has_torch else None
        distributed_result = _guarded(_distributed, args.quick) if has_torch else None
        compiler_rows = bench_compiler(100_000, 5 if args.quick else 15, backend)
        new_process_ms = bench_new_process_disk_hit(backend)
        execution_rows = bench_execution(sizes, repeat)

    results = {
        "system": {"python": platform.python_version(), "numpy": np.__version__,
                   "hologram": hologram.__version__, "machine": platform.machine(),
                   "processor": platform.processor(), "quick": args.quick},
        "cpu_vs_torch": cpu_result,
        "sdk": sdk_result,
        "torch_device": device_result,
        "training": training_result,
        "distributed": distributed_result,
        "compiler_backend": backend,
        "compiler": compiler_rows,
        "new_process_disk_hit_ms": new_process_ms,
        "execution": execution_rows,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    report = "\n\n".join([
        "# Hologram benchmark report" + (" (quick)" if args.quick else ""),
        *_cpu_section(cpu_result),
        f"## SDK costs ({sdk_result['threads']} threads)",
        "`ratio` is baseline / Hologram: above 1, the Hologram form was faster.",
        sdk.table(sdk_result),
        *_torch_sections(device_result, training_result),
        *_distributed_section(distributed_result),
        f"## Compiler and program cache (µs), backend `{backend}`",
        _table(compiler_rows, ["program", "kernels_before", "kernels_after", "temps_after",
                               "canonicalize_us", "fuse_schedule_us", "cold_compile_us",
                               "memo_hit_us", "disk_hit_us"]),
        f"A new process finds a compiled program on disk in {new_process_ms:.2f} ms "
        "(canonicalization included; imports excluded).",
        "## Fused programs on the reference interpreter vs NumPy eager",
        "`numpy_over_interp` > 1 means the interpreter was faster.",
        _table(execution_rows, ["program", "elements", "interp_us", "numpy_us",
                                "numpy_over_interp"]),
    ])
    (out / "report.md").write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
