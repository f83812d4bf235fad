"""The ``hologram bench`` suite: which sizes each family runs, and :func:`run_bench`, which
runs the cases and writes every artifact (results.json/.csv, PNG plots, report.md/.html).

Sizes (elements; N for GEMM), default and ``quick`` (``--quick`` or
``HOLOGRAM_BENCH_QUICK=1``): elementwise, activations, transcendentals and fused chains
1e3..1e7 (quick: 1e4, 1e6); reductions and losses 1e3..1e6 (quick: 1e4, 1e6); GEMM
64..1024 (quick: 64, 256). Timed runs: 20 (quick: 10), after 5 warm-up runs.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from hologram.bench.cases import OpSpec

DEFAULT_SIZES = (1_000, 10_000, 100_000, 1_000_000, 10_000_000)
QUICK_SIZES = (10_000, 1_000_000)
DEFAULT_GEMM = (64, 128, 256, 512, 1024)
QUICK_GEMM = (64, 256)
# Reductions and losses stop an order of magnitude earlier, as in the seeds.
REDUCTION_FAMILIES = ("reductions", "losses")


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


def run_bench(config: BenchConfig, command: str = "") -> dict:
    """Run the suite and write its artifacts into ``config.out``. Returns ``records``,
    ``system``, ``paths`` (every file written), ``failed`` (records that did not verify)
    and ``seconds``."""
    import torch

    import hologram as hg
    from hologram.bench.cases import select
    from hologram.bench.plots import save_plots
    from hologram.bench.report import write_report
    from hologram.bench.results import save_results
    from hologram.bench.runners import run_suite
    from hologram.bench.sysinfo import collect_system_info

    start = time.perf_counter()
    threads = config.threads or hg.get_num_threads()
    hg.set_num_threads(threads)
    torch.set_num_threads(threads)
    timing = config.timing or (10 if config.quick else 20)
    os.makedirs(config.out, exist_ok=True)
    system = collect_system_info()
    ex = hg.Executor(backend=config.backend)
    system["hologram_backend"] = str(ex.backend)
    system.update(quick=config.quick, warmup_runs=config.warmup, timing_runs=timing)
    plan = cases(select(config.ops), config)
    # Quick runs warm for less before each sample (see runners.default_warm_s).
    warm_s = config.warm_s if config.warm_s is not None else (0.02 if config.quick else None)
    records = run_suite(plan, warmup=config.warmup, timing=timing, executor=ex,
                        torch_compile=config.torch_compile, progress=config.progress,
                        warm_s=warm_s)
    system["load_average_after"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    paths = [save_results(records, os.path.join(config.out, "results.json"), "json",
                          metadata=system),
             save_results(records, os.path.join(config.out, "results.csv"), "csv")]
    plots = save_plots(records, config.out)
    paths += plots
    paths += write_report(records, system, plots, config.out, warmup=config.warmup,
                          timing=timing, command=command)
    return {"records": records, "system": system, "paths": paths,
            "failed": [r for r in records if not r["verified"]],
            "seconds": time.perf_counter() - start}
