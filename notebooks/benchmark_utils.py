"""The seed notebooks' ``benchmark_utils``: a re-export of :mod:`hologram.bench`, so that
``from benchmark_utils import benchmark_operation, ...`` works in ``notebooks/``."""

import os
import sys

try:
    import hologram  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hologram.bench import (
    BenchmarkResult,
    TorchDeviceUnavailableError,
    Verification,
    VerificationError,
    benchmark_elementwise_op,
    benchmark_loss_op,
    benchmark_matmul_op,
    benchmark_operation,
    benchmark_reduction_op,
    collect_system_info,
    compare,
    compare_frameworks,
    compare_results,
    create_summary_table,
    load_results,
    save_results,
    time_pair,
    verify_correctness,
)
from hologram.bench.plots import (
    plot_comparison,
    plot_heatmap,
    plot_scaling,
    plot_speedup,
)

__all__ = [
    "BenchmarkResult", "TorchDeviceUnavailableError", "Verification", "VerificationError",
    "benchmark_elementwise_op", "benchmark_loss_op", "benchmark_matmul_op",
    "benchmark_operation", "benchmark_reduction_op", "collect_system_info", "compare",
    "compare_frameworks", "compare_results", "create_summary_table", "load_results",
    "plot_comparison", "plot_heatmap", "plot_scaling", "plot_speedup", "save_results",
    "time_pair", "verify_correctness",
]
