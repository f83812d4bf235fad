"""Benchmarking Hologram against PyTorch: the library behind ``hologram bench`` and the
notebooks' ``benchmark_utils``.

    from hologram.bench import benchmark_operation, verify_correctness
    r = benchmark_operation(lambda: hg.ops.exp(buf), warmup_runs=5, timing_runs=10)
    verify_correctness(r.output, torch.exp(t), rtol=1e-5, atol=1e-8, name="exp")

Modules: :mod:`~hologram.bench.stats` (timing, :class:`BenchmarkResult`, interleaving),
:mod:`~hologram.bench.verify` (:func:`verify_correctness`, :class:`VerificationError`),
:mod:`~hologram.bench.sysinfo`, :mod:`~hologram.bench.cases` (the op registry),
:mod:`~hologram.bench.runners` (cases and the notebooks' ``benchmark_*_op`` helpers),
:mod:`~hologram.bench.results` (tables, save/load), :mod:`~hologram.bench.plots`,
:mod:`~hologram.bench.report`, :mod:`~hologram.bench.suite` (``hologram bench``),
:mod:`~hologram.bench.output` (its output directory, replaced all at once).

Needs the ``bench`` extra (torch, pandas, matplotlib, tqdm); matplotlib is imported only
when plotting.
"""

from hologram.bench.results import (
    compare_frameworks,
    compare_results,
    create_summary_table,
    load_results,
    save_results,
)
from hologram.bench.runners import (
    TorchDeviceUnavailableError,
    benchmark_elementwise_op,
    benchmark_loss_op,
    benchmark_matmul_op,
    benchmark_reduction_op,
    compare,
)
from hologram.bench.stats import BenchmarkResult, benchmark_operation, time_pair
from hologram.bench.sysinfo import collect_system_info
from hologram.bench.verify import Verification, VerificationError, verify_correctness


def __getattr__(name: str):
    # The plots import matplotlib; load them only when asked for.
    if name in ("plot_comparison", "plot_speedup", "plot_scaling", "plot_heatmap",
                "save_plots"):
        from hologram.bench import plots

        return getattr(plots, name)
    raise AttributeError(f"module 'hologram.bench' has no attribute {name!r}")


__all__ = [
    "BenchmarkResult", "TorchDeviceUnavailableError", "Verification", "VerificationError",
    "benchmark_elementwise_op", "benchmark_loss_op", "benchmark_matmul_op",
    "benchmark_operation", "benchmark_reduction_op", "collect_system_info", "compare",
    "compare_frameworks", "compare_results", "create_summary_table", "load_results",
    "plot_comparison", "plot_heatmap", "plot_scaling", "plot_speedup", "save_plots",
    "save_results", "time_pair", "verify_correctness",
]
