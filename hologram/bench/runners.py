"""Running comparisons: one case (an operation at one size) verified, then timed against
PyTorch interleaved in this process; the notebooks' ``benchmark_*_op`` helpers; the suite.

Every case is verified before it is timed. A failed verification (or a Hologram call that
raises) is recorded in the case's record (``verified`` False, ``error`` the message) and
printed prominently; the case is still timed when Hologram produced an output, and never
dropped.

``hologram_device``: None runs Hologram through the SDK (``hg.Executor``, ``hg.ops``). A
``torch.device`` (``torch.device('hologram:0')`` once ``hologram_torch`` is imported) runs
the same PyTorch op on that device instead: the inputs are copied to the device before
timing, the output is verified against the op on CPU tensors, each timed call is followed by
the device module's ``synchronize()`` (``torch.hologram.synchronize``), and the record's
``fallback_ops`` names the aten ops that ran through ``hologram_torch``'s CPU fallback
during the (untimed) verification call. A device that cannot hold tensors (``hologram_torch``
not imported) raises :class:`TorchDeviceUnavailableError`, naming the remedies.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import hologram as hg
from hologram.bench.cases import OpSpec, find_by_torch
from hologram.bench.stats import (
    BenchmarkResult,
    LoopSampling,
    Sampling,
    call_and_sync,
    interleaved,
    time_pair,
    unreliable,
)
from hologram.bench.sysinfo import OtherLoad, available_cores, wait_for_quiet
from hologram.bench.verify import contraction_bound, verify_correctness
from hologram.errors import DeviceError

Record = dict[str, Any]


#: Calls in a loop are timed too (``loop_us`` in the record) where both sides' single-call
#: medians are below this: beyond it a call is long enough that the two agree.
LOOP_MAX_MS = 0.25
#: How ``hologram bench`` samples calls in a loop, and its ``--quick`` runs.
LOOP = LoopSampling()
QUICK_LOOP = LoopSampling(min_rounds=3, max_rounds=7, budget_s=0.05)
#: Before a re-measurement, wait up to this long for other processes to go idle.
QUIET_WAIT_S = 1.0
#: A case is flagged when other processes used more cores than this beyond those its
#: threads left free: a parallel call then waits for a time slice (milliseconds), on
#: every sample alike, so the median-over-minimum test does not see it.
CROWDED = 0.5


def load_average() -> float:
    """The 1-minute load average (NaN where the OS has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan


class TorchDeviceUnavailableError(DeviceError, NotImplementedError):
    """``hologram_device`` names a torch device that cannot run tensors yet."""


_executor: hg.Executor | None = None


def default_executor() -> hg.Executor:
    """The executor the notebook helpers use when none is given (created on first use)."""
    global _executor
    if _executor is None or _executor.closed:
        _executor = hg.Executor()
    return _executor


def _check_device(device: Any) -> None:
    import torch

    try:
        torch.empty(1, device=device)
    except Exception as exc:  # an unknown device type raises RuntimeError, others vary
        raise TorchDeviceUnavailableError(
            f"hologram_device={device!r} cannot hold tensors here ({type(exc).__name__}: "
            f"{exc}). For torch.device('hologram'), `import hologram_torch` first; or pass "
            f"hologram_device=None to benchmark Hologram through its SDK.") from exc


def _device_sync(device: Any) -> Callable[[], None] | None:
    """The device module's ``synchronize`` (``torch.hologram.synchronize``), called with no
    argument: the call with a device argument parses it, a cost that would be timed."""
    import torch

    module = getattr(torch, torch.device(device).type, None)
    return getattr(module, "synchronize", None)


def _fallback_counts() -> dict[str, int] | None:
    """``hologram_torch.fallback_stats()`` when the device package is loaded."""
    module = sys.modules.get("hologram_torch")
    stats = getattr(module, "fallback_stats", None)
    return stats() if stats is not None else None


def _shape(arrays: Sequence[np.ndarray]) -> str:
    return ", ".join(str(a.shape[0]) if a.ndim == 1 else str(a.shape) for a in arrays)


def compare(name: str, size: int, torch_fn: Callable, hologram_fn: Callable,
            arrays: Sequence[np.ndarray], *, warmup: int = 5, timing: int = 10,
            rtol: float = 1e-5, atol: float = 1e-8, family: str = "",
            executor: hg.Executor | None = None, hologram_device: Any = None,
            compiled_fn: Callable | None = None, warm_s: float | None = None,
            contraction: bool = False, retries: int = 0,
            loop: Sampling | None = None) -> Record:
    """Verify ``hologram_fn`` against ``torch_fn`` on ``arrays``, then time both (and
    ``compiled_fn``, a ``torch.compile`` of ``torch_fn``, when given) interleaved.
    ``contraction``: the output is ``arrays[0] @ arrays[1]``, and may differ from PyTorch's
    by up to :func:`~hologram.bench.verify.contraction_bound` (recorded as ``err_bound``,
    its largest element) on top of ``rtol``/``atol``.

    ``hologram_fn`` takes Hologram buffers (``hologram_device`` None) or tensors on
    ``hologram_device``. Returns one record: statistics prefixed ``pytorch_``,
    ``hologram_`` (and ``torch_compile_``), ``speedup`` (PyTorch's median time over
    Hologram's: above 1 means Hologram was faster), ``verified`` and the errors (and, on a
    device, ``fallback_ops``: the ops that ran on the CPU during the verification call).
    ``warm_s``: see :func:`~hologram.bench.stats.time_pair`; None picks
    :func:`default_warm_s`.

    Timings that cannot be read as a result (:func:`~hologram.bench.stats.unreliable`: a
    median over 3x its minimum, or a speedup whose interval holds 1; or other processes
    used the cores its threads needed, :data:`CROWDED`) are timed again, up to ``retries``
    times, each after waiting up to :data:`QUIET_WAIT_S` for other processes to go idle;
    the record keeps the first attempt without a reason, else the one with the
    lowest median-over-minimum, and says why in ``flag`` ("" when nothing is wrong), with
    ``attempts``, ``other_load`` (cores other processes used while it was timed) and the
    load average before and after the case (``load_before``, ``load_after``). With
    ``loop`` (a :class:`~hologram.bench.stats.Sampling`), cases whose single calls take
    under :data:`LOOP_MAX_MS` are also timed as calls in a loop, interleaved
    (``pytorch_loop_us``, ``hologram_loop_us``, ``speedup_loop``).
    """
    import torch

    # The device path needs no SDK executor: don't create one.
    ex = executor or (default_executor() if hologram_device is None else None)
    where = torch_device(ex)
    tensors = tuple(torch.from_numpy(a).to(where) for a in arrays)
    torch_sync = torch.cuda.synchronize if where == "cuda" else None
    if hologram_device is None:
        operands = tuple(ex.from_numpy(a) for a in arrays)
        sync = ex.synchronize
    else:
        _check_device(hologram_device)
        operands = tuple(t.to(hologram_device) for t in tensors)
        sync = _device_sync(hologram_device)
    record: Record = {
        "family": family, "operation": name, "size": size, "shape": _shape(arrays),
        "dtype": str(arrays[0].dtype), "backend": str(ex.backend) if hologram_device is None
        else str(hologram_device), "hologram_threads": hg.get_num_threads(),
        "torch_threads": torch.get_num_threads(), "rtol": rtol, "atol": atol,
        "pytorch_device": where, "load_before": load_average(),
    }
    bound = contraction_bound(arrays[0], arrays[1]) if contraction else None
    expected = torch_fn(*tensors)
    before = _fallback_counts() if hologram_device is not None else None
    try:
        try:
            actual = hologram_fn(*operands)
        finally:
            if before is not None:
                after = _fallback_counts() or {}
                record["fallback_ops"] = ", ".join(
                    sorted(op for op, n in after.items() if n > before.get(op, 0)))
        check = verify_correctness(actual, expected, rtol=rtol, atol=atol,
                                   name=f"{name}[{size}]", raise_on_error=False, bound=bound)
        record.update(verified=check.ok, max_abs_err=check.max_abs_err,
                      max_rel_err=check.max_rel_err, error="" if check.ok else check.message)
        if contraction:
            record["err_bound"] = check.bound
    except Exception as exc:  # a failing Hologram call is a result to report, not a crash
        record.update(verified=False, max_abs_err=math.nan, max_rel_err=math.nan,
                      error=f"{name}[{size}]: {type(exc).__name__}: {exc}")
        result = time_pair([lambda: torch_fn(*tensors)], warmup, timing, ["pytorch"],
                           [torch_sync])[0]
        record.update(result.summary("pytorch_"))
        record.update(_nan_summary("hologram_"), speedup=math.nan, flag="", attempts=1,
                      load_after=load_average())
        return record
    fns = [lambda: torch_fn(*tensors), lambda: hologram_fn(*operands)]
    names, syncs = ["pytorch", "hologram"], [torch_sync, sync]
    if hologram_device is None:
        promote(fns[1])
    if compiled_fn is not None:
        check = verify_correctness(compiled_fn(*tensors), expected, rtol=rtol, atol=atol,
                                   name=f"{name}[{size}] torch.compile", raise_on_error=False,
                                   bound=bound)
        record["torch_compile_verified"] = check.ok
        fns.append(lambda: compiled_fn(*tensors))
        names.append("torch_compile")
        syncs.append(torch_sync)
    if warm_s is None:
        warm_s = default_warm_s(family)
    results, reasons, attempts, others = _measure(fns, names, syncs, warmup, timing, warm_s,
                                                  retries)
    for result in results:
        record.update(result.summary(result.name + "_"))
    record["speedup"] = results[0].median_ms / results[1].median_ms
    if compiled_fn is not None:
        record["speedup_vs_compile"] = results[2].median_ms / results[1].median_ms
    record.update(flag="; ".join(reasons), attempts=attempts, other_load=others)
    if loop is not None and max(r.median_ms for r in results[:2]) < LOOP_MAX_MS:
        # A few ms of calls per sample is its own warm-up; a short one lets the other
        # library's pool stop spinning.
        contestants = [(call_and_sync(fn, sync), ()) for fn, sync in zip(fns[:2], syncs)]
        torch_us, hologram_us = interleaved(contestants, loop, warm_s=min(warm_s, 0.005))
        record.update(pytorch_loop_us=torch_us, hologram_loop_us=hologram_us,
                      speedup_loop=torch_us / hologram_us)
    record["load_after"] = load_average()
    return record


def _measure(fns: list[Callable], names: list[str], syncs: list, warmup: int, timing: int,
             warm_s: float, retries: int
             ) -> tuple[list[BenchmarkResult], list[str], int, float | None]:
    """Time ``fns`` interleaved, again while the timings are unreliable (up to ``retries``
    more times). Returns the attempt kept (see :func:`compare`), its reasons, the attempts
    made and the cores other processes used during the one kept."""
    import torch

    threads = max(hg.get_num_threads(), torch.get_num_threads())
    cores = available_cores()
    free = max(0, cores - threads)
    best = None
    attempt = 0
    while attempt <= retries:
        if attempt:
            wait_for_quiet(QUIET_WAIT_S)
        attempt += 1
        load = OtherLoad()
        results = time_pair(fns, warmup, timing, names, syncs, warm_s=warm_s)
        others = load.cores()
        reasons = unreliable(results[0], results[1], results[2:])
        if others is not None and others > free + CROWDED:
            reasons.append(f"other processes used {others:.1f} of {cores} cores "
                           f"({threads} threads timed)")
        rank = (bool(reasons), max(r.stall_ratio for r in results))
        if best is None or rank < best[0]:
            best = (rank, results, reasons, others)
        if not reasons:
            break
    _, results, reasons, others = best
    return results, reasons, attempt, others


def promote(call: Callable[[], Any]) -> None:
    """Run ``call`` until the cpu backend has replaced its quick first builds by full ones
    (docs/compiler.md, "Tiers"; the ``promote_after``-th call queues the full build on a
    background thread): timing the quick code, or timing while the full build compiles on
    a core the samples need, would time what only a program's first few calls see."""
    for _ in range(hg.config.get().promote_after + 1):
        call()
    try:
        from hologram.backends.cpu.backend import wait_for_promotions
    except ImportError:  # no cpu backend in this build: nothing was compiled quickly
        return
    wait_for_promotions(timeout=300)


def torch_device(executor: hg.Executor | None) -> str:
    """Where PyTorch runs against ``executor``: on CUDA for the cuda backend when PyTorch
    has a GPU (a GPU timed against PyTorch's CPU kernels would say little), else the CPU."""
    import torch

    on_gpu = executor is not None and str(executor.backend) == "cuda"
    return "cuda" if on_gpu and torch.cuda.is_available() else "cpu"


def default_warm_s(family: str) -> float:
    """Untimed warm-up before each sample: none when both libraries run on one thread (no
    pool to spin), else past PyTorch's OpenMP spin or, for matrix products, OpenBLAS's
    longer one (see :mod:`hologram.bench.stats`)."""
    import torch

    if hg.get_num_threads() == 1 and torch.get_num_threads() == 1:
        return 0.0
    return 0.12 if family == "gemm" else 0.05


def _nan_summary(prefix: str) -> Record:
    empty = BenchmarkResult("", [math.nan])
    return {key: math.nan for key in empty.summary(prefix)}


def report_line(record: Record) -> str:
    """The notebooks' three-line printout of a record, with a loud line for a failed check."""
    lines = []
    if not record["verified"]:
        lines.append(f"  ❌ VERIFICATION FAILED: {record['error']}")
    lines.append(f"  PyTorch:  {record['pytorch_mean_ms']:.4f} ± "
                 f"{record['pytorch_std_ms']:.4f} ms")
    lines.append(f"  Hologram: {record['hologram_mean_ms']:.4f} ± "
                 f"{record['hologram_std_ms']:.4f} ms")
    speedup = record["speedup"]
    who = "(Hologram faster)" if speedup > 1 else "(PyTorch faster)"
    lines.append(f"  Speedup (median): {speedup:.2f}x {who}")
    return "\n".join(lines)


# --- the notebooks' helpers -----------------------------------------------------------------
def _hologram_op(torch_op: Callable, hologram_op: Callable | None, device: Any,
                 op_name: str) -> Callable:
    if device is not None:
        return torch_op  # the same PyTorch op, run on the hologram device
    if hologram_op is not None:
        return hologram_op
    spec = find_by_torch(torch_op)
    if spec is None:
        raise ValueError(f"{op_name}: no Hologram op is registered for {torch_op!r}; pass "
                         f"hologram_op=")
    return spec.hologram_fn


def _run_sizes(op_name: str, family: str, torch_op: Callable, hologram_fn: Callable,
               test_sizes: Sequence[int], make: Callable[[int], tuple], warmup: int,
               timing: int, rtol: float, atol: float, results_list: list | None,
               hologram_device: Any, executor: hg.Executor | None,
               verbose: bool, contraction: bool = False) -> list[Record]:
    results = results_list if results_list is not None else []
    for size in test_sizes:
        if verbose:
            print(f"\nBenchmarking {op_name} (size={size:,})...")
        arrays = tuple(np.ascontiguousarray(a) for a in make(size))
        record = compare(op_name, size, torch_op, hologram_fn, arrays, warmup=warmup,
                         timing=timing, rtol=rtol, atol=atol, family=family,
                         executor=executor, hologram_device=hologram_device,
                         contraction=contraction)
        results.append(record)
        if verbose:
            print(report_line(record))
    return results


def _randn(count: int) -> Callable[[int], tuple]:
    return lambda size: tuple(np.random.randn(size).astype(np.float32) for _ in range(count))


def benchmark_elementwise_op(op_name: str, torch_op: Callable, test_sizes: Sequence[int],
                             warmup: int = 5, timing: int = 10, rtol: float = 1e-5,
                             atol: float = 1e-8, results_list: list | None = None,
                             hologram_device: Any = None,
                             data_generator: Callable[[int], tuple] | None = None, *,
                             hologram_op: Callable | None = None,
                             executor: hg.Executor | None = None,
                             verbose: bool = True, family: str = "elementwise"
                             ) -> list[Record]:
    """Benchmark an elementwise op at each size, appending one record per size to
    ``results_list`` (also returned). ``data_generator(size)`` returns the input arrays
    (default: one standard-normal float32 vector); the Hologram op is ``hologram_op`` or
    the registered counterpart of ``torch_op`` (``torch.abs`` → ``hg.ops.vector_abs``);
    ``family`` labels the records (``activations``, ``transcendentals``, ...)."""
    fn = _hologram_op(torch_op, hologram_op, hologram_device, op_name)
    return _run_sizes(op_name, family, torch_op, fn, test_sizes,
                      data_generator or _randn(1), warmup, timing, rtol, atol, results_list,
                      hologram_device, executor, verbose)


def benchmark_reduction_op(op_name: str, torch_op: Callable, test_sizes: Sequence[int],
                           warmup: int = 5, timing: int = 10, rtol: float = 1e-5,
                           atol: float = 1e-8, results_list: list | None = None,
                           hologram_device: Any = None,
                           data_generator: Callable[[int], tuple] | None = None, *,
                           hologram_op: Callable | None = None,
                           executor: hg.Executor | None = None,
                           verbose: bool = True) -> list[Record]:
    """Benchmark a full reduction (``torch.sum``, ``torch.max``, ...) at each size; as
    :func:`benchmark_elementwise_op`. Float32 sums in different orders differ by about
    ``eps * sqrt(n) * |x|``: pass an ``atol`` that allows it."""
    fn = _hologram_op(torch_op, hologram_op, hologram_device, op_name)
    return _run_sizes(op_name, "reductions", torch_op, fn, test_sizes,
                      data_generator or _randn(1), warmup, timing, rtol, atol, results_list,
                      hologram_device, executor, verbose)


def benchmark_matmul_op(test_sizes: Sequence[int], warmup: int = 5, timing: int = 10,
                        rtol: float = 1e-4, atol: float = 1e-4,
                        results_list: list | None = None, hologram_device: Any = None, *,
                        op_name: str = "gemm", executor: hg.Executor | None = None,
                        verbose: bool = True) -> list[Record]:
    """Benchmark N×N @ N×N float32 matrix products (``torch.matmul`` against
    ``hg.ops.gemm(A, B, m=N, n=N, k=N)``) for each N in ``test_sizes``. Outputs are verified
    within ``rtol``/``atol`` plus :func:`~hologram.bench.verify.contraction_bound`: a
    result summed over k in another order than PyTorch's is not a failure."""
    import torch

    def gemm(a, b):
        return hg.ops.gemm(a, b, m=a.shape[0], n=b.shape[1], k=a.shape[1])

    fn = torch.matmul if hologram_device is not None else gemm
    return _run_sizes(op_name, "gemm", torch.matmul, fn, test_sizes,
                      lambda n: tuple(np.random.randn(n, n).astype(np.float32)
                                      for _ in range(2)),
                      warmup, timing, rtol, atol, results_list, hologram_device, executor,
                      verbose, contraction=True)


def benchmark_loss_op(op_name: str, torch_loss_fn: Callable, test_sizes: Sequence[int],
                      warmup: int = 5, timing: int = 10, rtol: float = 1e-5,
                      atol: float = 1e-8, results_list: list | None = None,
                      hologram_device: Any = None,
                      data_generator: Callable[[int], tuple] | None = None, *,
                      hologram_op: Callable | None = None,
                      executor: hg.Executor | None = None,
                      verbose: bool = True) -> list[Record]:
    """Benchmark a loss (``F.mse_loss``: prediction and target vectors of each size;
    ``F.cross_entropy``: give a ``data_generator`` returning logits [N, C] and int64
    targets [N])."""
    fn = _hologram_op(torch_loss_fn, hologram_op, hologram_device, op_name)
    return _run_sizes(op_name, "losses", torch_loss_fn, fn, test_sizes,
                      data_generator or _randn(2), warmup, timing, rtol, atol, results_list,
                      hologram_device, executor, verbose)


# --- the suite ------------------------------------------------------------------------------
def run_spec(spec: OpSpec, size: int, *, warmup: int, timing: int, rng: np.random.Generator,
             executor: hg.Executor, torch_compile: bool = True,
             warm_s: float | None = None, retries: int = 0,
             loop: Sampling | None = None) -> Record:
    """One registry case: ``spec`` at ``size``, with its inputs and tolerances
    (``retries``, ``loop``: see :func:`compare`)."""
    rtol, atol = spec.tolerances(size)
    compiled = spec.compiled if torch_compile else None
    return compare(spec.name, size, spec.torch_fn, spec.hologram_fn, spec.inputs(rng, size),
                   warmup=warmup, timing=timing, rtol=rtol, atol=atol, family=spec.family,
                   executor=executor, compiled_fn=compiled,
                   warm_s=None if warm_s is None or spec.family == "gemm" else warm_s,
                   contraction=spec.contraction, retries=retries, loop=loop)


def run_suite(cases: Sequence[tuple[OpSpec, int]], *, warmup: int = 5, timing: int = 10,
              executor: hg.Executor | None = None, torch_compile: bool = True,
              progress: bool = True, seed: int = 0,
              warm_s: float | None = None, retries: int = 2,
              loop: Sampling | None = LOOP) -> list[Record]:
    """Run every (spec, size) case in order, with a tqdm progress bar when ``progress``
    (and tqdm is installed). Returns the records. ``retries``: re-measurements of a case
    whose timings are unreliable; ``loop``: how calls in a loop are sampled (None: not
    timed); see :func:`compare`."""
    ex = executor or default_executor()
    rng = np.random.default_rng(seed)
    bar = _progress(len(cases), progress)
    records = []
    for spec, size in cases:
        if bar is not None:
            bar.set_postfix_str(f"{spec.family}/{spec.name} {size:,}")
        record = run_spec(spec, size, warmup=warmup, timing=timing, rng=rng, executor=ex,
                          torch_compile=torch_compile, warm_s=warm_s, retries=retries,
                          loop=loop)
        records.append(record)
        if bar is not None:
            if not record["verified"]:
                bar.write(f"❌ VERIFICATION FAILED: {record['error']}")
            bar.update()
    if bar is not None:
        bar.close()
    return records


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="case", dynamic_ncols=True)

