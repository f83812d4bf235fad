"""The ``hologram`` command (also ``python -m hologram``).

    hologram info [--json]
    hologram --version

``info`` says what this installation is and what it can run here: versions, torch and its
match, the CPU, every backend (available or not, and why), the program cache, the native
parts, threads and the ``HOLOGRAM_*`` variables set (:mod:`hologram.about`); ``--json``
prints the same as JSON, for bug reports. Exit status 0.

    hologram bench [--quick] [--ops OP ...] [--sizes N ...] [--gemm-sizes N ...]
                   [--threads N] [--backend B] [--out DIR] [--runs N] [--no-torch-compile]

``bench`` compares Hologram with PyTorch (see :mod:`hologram.bench`) and writes
results.json, results.csv, PNG plots and report.md/report.html into ``--out``, all at once:
``--out`` is replaced only when every file was written. Exit status: 0; 1 when a case
failed verification (the run still completes and reports it); 2 for an invalid argument or
``HOLOGRAM_*`` variable, sizes that do not fit in memory, or an ``--out`` that cannot be
written (checked before the benchmarks run), each with one line on stderr; 130 on Ctrl-C,
143 on SIGTERM. In every case but 0 and 1 the previous ``--out`` is left as it was.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import signal
import sys
import threading


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line (``hologram bench: error: ...``)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _integer(minimum: int):
    """An argparse type: an integer >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value
    return parse


def _parser() -> argparse.ArgumentParser:
    from hologram.version import DISTRIBUTION, __version__

    parser = _Parser(prog="hologram", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version",
                        version=f"hologram {__version__} ({DISTRIBUTION})")
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser(
        "info", help="versions, backends and why, native parts, cache, threads",
        description="What this installation is and what it can run here; attach "
                    "`hologram info --json` to bug reports.")
    info.add_argument("--json", action="store_true", help="print the report as JSON")
    bench = commands.add_parser(
        "bench", help="benchmark Hologram against PyTorch and write a report",
        description="Benchmark Hologram against PyTorch eager (and torch.compile for fused "
                    "chains); every case is verified before it is timed.")
    bench.add_argument("--quick", action="store_true",
                       help="small sizes and fewer runs (also HOLOGRAM_BENCH_QUICK=1)")
    bench.add_argument("--ops", nargs="+", metavar="OP",
                       help="ops (add, relu, gemm, ...) or families (elementwise, "
                            "activations, transcendentals, reductions, gemm, losses, fused)")
    bench.add_argument("--sizes", nargs="+", type=_integer(1), metavar="N",
                       help="element counts for every family but GEMM")
    bench.add_argument("--gemm-sizes", nargs="+", type=_integer(1), metavar="N",
                       help="N of the N×N×N matrix products")
    bench.add_argument("--threads", type=_integer(1),
                       help="threads for Hologram and PyTorch alike (default: every core "
                            "available)")
    bench.add_argument("--backend", default="auto", help="Hologram backend (default: auto)")
    bench.add_argument("--out", default="bench-results",
                       help="output directory, replaced as a whole when the run completes "
                            "(new, empty, or a previous run's)")
    bench.add_argument("--runs", type=_integer(1),
                       help="timed runs per case (default 20, quick 10)")
    bench.add_argument("--warmup", type=_integer(0), default=5, help="warm-up runs per case")
    bench.add_argument("--no-torch-compile", action="store_true",
                       help="skip torch.compile (the fused-chain family's column and the "
                            "whole-model section)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


@contextlib.contextmanager
def _sigterm_unwinds():
    """SIGTERM raises SystemExit(143) while the run goes on, so that cleanups run (the
    staged output directory is removed) as for Ctrl-C; its default action kills at once."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers
        return

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _fail(message: object, status: int = 2) -> int:
    print(f"hologram bench: {message}", file=sys.stderr)
    return status


def bench(args: argparse.Namespace, argv: list[str]) -> int:
    import hologram
    from hologram.bench.output import OutputError
    from hologram.bench.report import headline
    from hologram.bench.results import create_summary_table, frame
    from hologram.bench.suite import BenchConfig, BenchError, run_bench

    try:
        quick = args.quick or hologram.config.get().bench_quick
    except hologram.HologramError as exc:  # a malformed HOLOGRAM_* variable
        return _fail(exc)
    config = BenchConfig(out=args.out, quick=quick, ops=args.ops, sizes=args.sizes,
                         gemm_sizes=args.gemm_sizes, threads=args.threads,
                         backend=args.backend, warmup=args.warmup, timing=args.runs,
                         torch_compile=not args.no_torch_compile,
                         progress=not args.no_progress)
    try:
        with _sigterm_unwinds():
            outcome = run_bench(config, command=shlex.join(["hologram", *argv]))
    except (BenchError, OutputError) as exc:
        return _fail(exc)
    except KeyboardInterrupt:
        return _fail(f"interrupted; nothing was written to {args.out}", 130)
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


def info(args: argparse.Namespace) -> int:
    import json

    from hologram import about

    report = about.collect()
    print(json.dumps(report, indent=2) if args.json else about.render(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hologram`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.command == "info":
        return info(args)
    if args.command == "bench":
        return bench(args, argv)
    return 2  # unreachable: argparse requires a known command


if __name__ == "__main__":
    sys.exit(main())
