"""The ``hologram bench`` suite: which sizes each family runs, :func:`prepare`, which checks a
configuration before anything runs, and :func:`run_bench`, which runs the cases and writes
every artifact (results.json/.csv, PNG plots, report.md/.html) into ``out`` at once (see
:mod:`hologram.bench.output`). After the op cases, the torch.compile section
(:mod:`hologram.bench.compile`: whole models, Hologram against eager and Inductor) runs
unless ``torch_compile`` is off (``--no-torch-compile``).

Sizes (elements; N for GEMM), default and ``quick`` (``--quick`` or
``HOLOGRAM_BENCH_QUICK=1``): elementwise, activations, transcendentals and fused chains
1e3..1e7 (quick: 1e4, 1e6); reductions and losses 1e3..1e6 (quick: 1e4, 1e6); GEMM
64..1024 (quick: 64, 256). Timed runs: 20 (quick: 10), after 5 warm-up runs. A case whose
timings are stalls or noise is flagged and timed again up to twice (quick: flagged only);
short calls are also timed in a loop (see :func:`hologram.bench.runners.compare`).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from hologram.bench.cases import OpSpec
from hologram.bench.output import OutputError, check_output, staged_output
from hologram.errors import HologramError

DEFAULT_SIZES = (1_000, 10_000, 100_000, 1_000_000, 10_000_000)
QUICK_SIZES = (10_000, 1_000_000)
DEFAULT_GEMM = (64, 128, 256, 512, 1024)
QUICK_GEMM = (64, 256)
# Reductions and losses stop an order of magnitude earlier, as in the notebooks.
REDUCTION_FAMILIES = ("reductions", "losses")
#: A case holds up to about this many float32 copies of its largest operand at once: the
#: inputs for both libraries, the outputs, and the float64 copies verification makes.
COPIES_PER_CASE = 24


class BenchError(HologramError):
    """A benchmark configuration that cannot run: a count that is not positive, an
    unknown op or backend, sizes whose buffers do not fit in memory. One line."""


@dataclass
class BenchConfig:
    """What :func:`run_bench` runs. ``sizes``/``gemm_sizes`` None: the defaults (quick or
    not); ``threads`` None: every core available, for Hologram and PyTorch alike."""

    out: str = "bench-results"
    quick: bool = False
    ops: list[str] | None = None
    sizes: list[int] | None = None
    gemm_sizes: list[int] | None = None
    threads: int | None = None
    backend: str = "auto"
    warmup: int = 5
    timing: int | None = None
    torch_compile: bool = True
    progress: bool = True
    warm_s: float | None = None
    #: Re-measurements of a case whose timings cannot be read as a result (a median over
    #: 3x its minimum, a speedup whose 95% interval holds 1; see runners.compare). None:
    #: 2, none for ``quick`` runs (which are for a first look, and flag the same cases).
    retries: int | None = None
    #: Also time calls in a loop where single calls are short (the report's latency view).
    loop: bool = True


def cases(specs: list[OpSpec], config: BenchConfig) -> list[tuple[OpSpec, int]]:
    """(spec, size) pairs in report order."""
    sizes = list(config.sizes or (QUICK_SIZES if config.quick else DEFAULT_SIZES))
    gemm = list(config.gemm_sizes or (QUICK_GEMM if config.quick else DEFAULT_GEMM))
    pairs = []
    for spec in specs:
        if spec.family == "gemm":
            chosen = gemm
        elif spec.family in REDUCTION_FAMILIES and not config.sizes and not config.quick:
            chosen = sizes[:-1]
        else:
            chosen = sizes
        pairs += [(spec, size) for size in chosen]
    return pairs


def case_bytes(spec: OpSpec, size: int) -> int:
    """About the most memory one case takes at once (see :data:`COPIES_PER_CASE`)."""
    elements = size * size if spec.family == "gemm" else size
    return COPIES_PER_CASE * 4 * elements


def _counts(name: str, values, minimum: int = 1) -> None:
    if values is None:
        return
    for value in values if isinstance(values, (list, tuple)) else [values]:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise BenchError(f"{name}: expected integers >= {minimum}, got {value!r}")


def prepare(config: BenchConfig) -> tuple[list[tuple[OpSpec, int]], str]:
    """Check ``config`` before anything runs. Returns the cases to run and the absolute path
    of the output directory. Raises :class:`BenchError` for counts that are not positive
    (``sizes``, ``gemm_sizes``, ``threads``, ``timing``; ``warmup`` may be 0), an unknown or
    unavailable backend (or the cuda emulation, whose timings mean nothing), unknown op
    names, or a case whose buffers would not fit in the memory available;
    :class:`~hologram.bench.output.OutputError` when ``out`` cannot be written (see
    :func:`~hologram.bench.output.check_output`)."""
    from hologram import config as hologram_config
    from hologram.bench.cases import select
    from hologram.bench.sysinfo import memory_available_bytes
    from hologram.sdk.backend import validate_backend

    _counts("sizes", config.sizes)
    _counts("gemm_sizes", config.gemm_sizes)
    _counts("threads", config.threads)
    _counts("timing runs", config.timing)
    _counts("warm-up runs", config.warmup, minimum=0)
    _counts("retries", config.retries, minimum=0)
    target = check_output(config.out)
    try:
        backend = validate_backend(config.backend)
        if backend == "cuda" and hologram_config.get().cuda_emulate:
            raise BenchError("the cuda backend is emulated here (HOLOGRAM_CUDA_EMULATE=1: "
                             "Triton's interpreter on the CPU), so its timings would say "
                             "nothing about a GPU; benchmark it on a machine with an NVIDIA "
                             "GPU, without HOLOGRAM_CUDA_EMULATE")
        # HOLOGRAM_BACKEND too, whichever backend runs: importing torch (in select) imports
        # hologram_torch, which resolves it.
        validate_backend("auto")
        specs = select(config.ops)
    except (HologramError, ValueError) as exc:  # an unknown backend or op, a bad HOLOGRAM_*
        raise BenchError(str(exc)) from exc
    plan = cases(specs, config)
    available = memory_available_bytes()
    if plan and available is not None:
        spec, size = max(plan, key=lambda case: case_bytes(*case))
        need = case_bytes(spec, size)
        if need > available:
            what = "--gemm-sizes" if spec.family == "gemm" else "--sizes"
            raise BenchError(f"{spec.name} at size {size:,} needs about {need / 2**30:.1f} GiB "
                             f"of memory, {available / 2**30:.1f} GiB is available; choose "
                             f"smaller {what}")
    return plan, target


def run_bench(config: BenchConfig, command: str = "") -> dict:
    """Check ``config`` (:func:`prepare`), run the suite, and write its artifacts into a new
    directory that replaces ``config.out`` only once all of them are written; on any error
    or a KeyboardInterrupt ``config.out`` is left as it was. Returns ``records``,
    ``system``, ``paths`` (every file written, under ``config.out``), ``failed`` (records
    that did not verify) and ``seconds``. Raises :class:`BenchError` and
    :class:`~hologram.bench.output.OutputError` (one-line messages) for what the user can
    fix."""
    start = time.perf_counter()
    # Checked before torch is imported: torch imports hologram_torch, which needs a valid
    # HOLOGRAM_BACKEND.
    plan, target = prepare(config)
    import torch

    import hologram as hg
    from hologram.bench.runners import LOOP, QUICK_LOOP, run_suite, torch_device
    from hologram.bench.sysinfo import collect_system_info

    existed = os.path.lexists(target)
    threads = config.threads or hg.get_num_threads()
    hg.set_num_threads(threads)
    torch.set_num_threads(threads)
    timing = config.timing or (10 if config.quick else 20)
    retries = config.retries if config.retries is not None else (0 if config.quick else 2)
    # The staging directory is made now, so an --out that cannot be written fails before
    # the benchmarks run, not after.
    with staged_output(target) as staging:
        system = collect_system_info()
        ex = hg.Executor(backend=config.backend)
        system["hologram_backend"] = str(ex.backend)
        system["pytorch_device"] = torch_device(ex)
        stats = ex.memory_stats()  # a GPU backend's device: which adapter, what it flushes
        system.update({key: stats[key] for key in ("adapter", "flushes_subnormals")
                       if key in stats})
        system.update(quick=config.quick, warmup_runs=config.warmup, timing_runs=timing,
                      retries=retries)
        # Quick runs warm for less before each sample (see runners.default_warm_s).
        warm_s = config.warm_s if config.warm_s is not None else (0.02 if config.quick
                                                                  else None)
        loop = (QUICK_LOOP if config.quick else LOOP) if config.loop else None
        records = run_suite(plan, warmup=config.warmup, timing=timing, executor=ex,
                            torch_compile=config.torch_compile, progress=config.progress,
                            warm_s=warm_s, retries=retries, loop=loop)
        section = compile_section(config)
        system["load_average_after"] = (os.getloadavg()[0] if hasattr(os, "getloadavg")
                                        else None)
        try:
            written = _write(records, system, staging, warmup=config.warmup, timing=timing,
                             command=command, compiled=section)
        except OSError as exc:
            name = f" ({os.path.basename(exc.filename)})" if exc.filename else ""
            kept = "is unchanged" if existed else "was not created"
            raise OutputError(f"cannot write the results{name}: {exc.strerror or exc}; "
                              f"{config.out} {kept}") from exc
    paths = [os.path.join(config.out, os.path.basename(p)) for p in written]
    return {"records": records, "system": system, "paths": paths,
            "failed": [r for r in records if not r["verified"]], "torch_compile": section,
            "seconds": time.perf_counter() - start}


def compile_section(config: BenchConfig) -> dict:
    """The torch.compile section's results (:func:`hologram.bench.compile.run`), or why it
    did not run."""
    if not config.torch_compile:
        return {"skipped": "--no-torch-compile"}
    from hologram.bench import compile as compile_bench

    if config.progress:
        print("torch.compile section (whole models; compiles, then times)...", file=sys.stderr)
    return compile_bench.run(config.quick)


def _write(records: list[dict], system: dict, out_dir: str, *, warmup: int, timing: int,
           command: str, compiled: dict) -> list[str]:
    """Every artifact of a run, written into ``out_dir``; returns their paths."""
    from hologram.bench.plots import save_plots
    from hologram.bench.report import write_report
    from hologram.bench.results import save_results

    paths = [save_results(records, os.path.join(out_dir, "results.json"), "json",
                          metadata=system, sections={"torch_compile": compiled}),
             save_results(records, os.path.join(out_dir, "results.csv"), "csv")]
    plots = save_plots(records, out_dir)
    paths += plots
    paths += write_report(records, system, plots, out_dir, warmup=warmup, timing=timing,
                          command=command, compiled=compiled)
    return paths
