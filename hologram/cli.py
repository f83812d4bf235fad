"""The ``hologram`` command (also ``python -m hologram``).

    hologram bench [--quick] [--ops OP ...] [--sizes N ...] [--gemm-sizes N ...]
                   [--threads N] [--backend B] [--out DIR] [--runs N] [--no-torch-compile]

``bench`` compares Hologram with PyTorch (see :mod:`hologram.bench`) and writes
results.json, results.csv, PNG plots and report.md/report.html into ``--out``. It exits with
status 1 when a case failed verification (the run still completes and reports it).
"""

from __future__ import annotations

import argparse
import shlex
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hologram", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser(
        "bench", help="benchmark Hologram against PyTorch and write a report",
        description="Benchmark Hologram against PyTorch eager (and torch.compile for fused "
                    "chains); every case is verified before it is timed.")
    bench.add_argument("--quick", action="store_true",
                       help="small sizes and fewer runs (also HOLOGRAM_BENCH_QUICK=1)")
    bench.add_argument("--ops", nargs="+", metavar="OP",
                       help="ops (add, relu, gemm, ...) or families (elementwise, "
                            "activations, transcendentals, reductions, gemm, losses, fused)")
    bench.add_argument("--sizes", nargs="+", type=int, metavar="N",
                       help="element counts for every family but GEMM")
    bench.add_argument("--gemm-sizes", nargs="+", type=int, metavar="N",
                       help="N of the N×N×N matrix products")
    bench.add_argument("--threads", type=int, help="threads for Hologram and PyTorch alike "
                                                   "(default: every core available)")
    bench.add_argument("--backend", default="auto", help="Hologram backend (default: auto)")
    bench.add_argument("--out", default="bench-results", help="output directory")
    bench.add_argument("--runs", type=int, help="timed runs per case (default 20, quick 10)")
    bench.add_argument("--warmup", type=int, default=5, help="warm-up runs per case")
    bench.add_argument("--no-torch-compile", action="store_true",
                       help="skip torch.compile in the fused-chain family")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def bench(args: argparse.Namespace, argv: list[str]) -> int:
    import hologram
    from hologram.bench.report import headline
    from hologram.bench.results import create_summary_table, frame
    from hologram.bench.suite import BenchConfig, run_bench

    quick = args.quick or hologram.config.get().bench_quick
    config = BenchConfig(out=args.out, quick=quick, ops=args.ops, sizes=args.sizes,
                         gemm_sizes=args.gemm_sizes, threads=args.threads,
                         backend=args.backend, warmup=args.warmup, timing=args.runs,
                         torch_compile=not args.no_torch_compile,
                         progress=not args.no_progress)
    try:
        outcome = run_bench(config, command=shlex.join(["hologram", *argv]))
    except ValueError as exc:  # unknown op names
        print(f"hologram bench: {exc}", file=sys.stderr)
        return 2
    import pandas as pd

    with pd.option_context("display.width", 120, "display.max_columns", 20,
                           "display.precision", 3):
        print()
        print(create_summary_table(outcome["records"]).to_string(index=False))
    print()
    for line in headline(frame(outcome["records"])):
        print(line)
    for record in outcome["failed"]:
        print(f"❌ VERIFICATION FAILED: {record['error']}")
    print(f"\n{len(outcome['records'])} cases in {outcome['seconds']:.1f} s; report: "
          f"{args.out}/report.md and {args.out}/report.html")
    return 1 if outcome["failed"] else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hologram`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.command == "bench":
        return bench(args, argv)
    return 2  # unreachable: argparse requires a known command


if __name__ == "__main__":
    sys.exit(main())
