"""Timing and statistics, shared by every benchmark here: :class:`BenchmarkResult`,
:func:`benchmark_operation` and :func:`time_pair` (``hologram bench`` and the notebooks),
:func:`interleaved` (the developer suite, :mod:`hologram.bench.dev`).

Methodology: warm kernels (``warmup_runs`` untimed calls first, so compilation and caches
are excluded), then ``timing_runs`` timed calls, one call per sample, timed with
``time.perf_counter``. Calls are synchronous: Hologram's host backends return after the
kernel ran, and :func:`benchmark_operation` calls ``synchronize()`` on an executor it is
given (a no-op on host backends, required on queued ones). :func:`time_pair` times two
callables interleaved (A, B, B, A, A, B, ...) in one process, so drift on a shared machine
hits both alike. :func:`interleaved` does the same with samples that each loop enough calls
to last about ``sample_s``, so timer resolution does not matter for calls of a microsecond,
and returns medians.

Warm-up before each sample (``warm_s``, both timers): thread pools keep spinning for a
while after a parallel call before they sleep (PyTorch's OpenMP workers, and OpenBLAS's for
longer; docs/performance.md, "Measurement notes", has the windows measured). When the
threads of both libraries cover the cores, a pool still spinning from one library's call
slows the other's next calls several times over. Calling the same callable untimed for
``warm_s`` before each sample measures each side as it runs on its own; sleeping instead
does not work, since calls right after an idle pause are slow for other reasons. Both
timers pause the garbage collector while sampling, so it never lands inside a sample.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

#: A side whose median is over this many times its minimum is flagged: most of its samples
#: include a wait (on an idle machine no case of ``hologram bench`` comes near it).
STALL_RATIO = 3.0
#: Speedups within this factor of 1 count as ties (the report's headline uses the same).
TIE = 1.05

#: Two-sided 95% Student-t quantiles by degrees of freedom (1..30); 1.96 beyond.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile_95(dof: int) -> float:
    """The two-sided 95% quantile of Student's t with ``dof`` degrees of freedom."""
    if dof < 1:
        return math.nan
    return _T95[dof - 1] if dof <= len(_T95) else 1.96


def median_ci95(samples: Sequence[float]) -> tuple[float, float]:
    """A distribution-free confidence interval of at least 95% for the median: the order
    statistics j and n + 1 - j, with j the largest rank such that fewer than j of n
    samples fall below the median with probability at most 2.5% (Binomial(n, 1/2)).
    Timings are skewed and a stall is one huge sample, so a t interval of the mean is
    wide where the median is sound; this one is not moved by a few outliers. Below 6
    samples it is (min, max)."""
    ordered = sorted(samples)
    n = len(ordered)
    if n == 0:
        return (math.nan, math.nan)
    j, below = 0, 0.0
    while True:  # below = P(Binomial(n, 1/2) <= j)
        below += math.comb(n, j) / 2.0 ** n
        if below > 0.025:
            break
        j += 1
    j = max(j, 1)
    return (ordered[j - 1], ordered[n - j])


@dataclass
class BenchmarkResult:
    """Statistics of one operation's timed runs, in milliseconds.

    ``ci95_ms`` is the 95% confidence interval of the mean (Student t on the samples);
    ``output`` is what the last call returned (a tensor, a buffer, ...), kept so that it
    can be verified.
    """

    name: str
    samples_ms: list[float]
    output: Any = field(default=None, repr=False)

    @property
    def runs(self) -> int:
        return len(self.samples_ms)

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.samples_ms)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def std_ms(self) -> float:
        """Sample standard deviation (0 for a single run)."""
        return statistics.stdev(self.samples_ms) if self.runs > 1 else 0.0

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms)

    @property
    def max_ms(self) -> float:
        return max(self.samples_ms)

    @property
    def median_ci95_ms(self) -> tuple[float, float]:
        """95% confidence interval of the median (:func:`median_ci95`)."""
        return median_ci95(self.samples_ms)

    @property
    def stall_ratio(self) -> float:
        """The median over the minimum: near 1 when every sample did the same work; over
        :data:`STALL_RATIO`, most samples waited for something else (a time slice, a
        page fault storm) and the median is not the call's cost."""
        return self.median_ms / self.min_ms if self.min_ms > 0 else math.inf

    @property
    def ci95_ms(self) -> tuple[float, float]:
        if self.runs < 2:
            return (self.mean_ms, self.mean_ms)
        half = t_quantile_95(self.runs - 1) * self.std_ms / math.sqrt(self.runs)
        return (self.mean_ms - half, self.mean_ms + half)

    def summary(self, prefix: str = "") -> dict[str, float]:
        """The statistics as a flat dict (keys prefixed by ``prefix``), for result records."""
        low, high = self.ci95_ms
        median_low, median_high = self.median_ci95_ms
        values = {"mean_ms": self.mean_ms, "median_ms": self.median_ms, "std_ms": self.std_ms,
                  "min_ms": self.min_ms, "max_ms": self.max_ms, "ci95_low_ms": low,
                  "ci95_high_ms": high, "median_ci95_low_ms": median_low,
                  "median_ci95_high_ms": median_high, "runs": self.runs}
        return {prefix + key: value for key, value in values.items()}

    def __str__(self) -> str:
        low, high = self.ci95_ms
        return (f"{self.name}: {self.mean_ms:.4f} ± {self.std_ms:.4f} ms "
                f"(median {self.median_ms:.4f}, 95% CI [{low:.4f}, {high:.4f}], n={self.runs})")


def speedup_ci95(pytorch: BenchmarkResult, hologram: BenchmarkResult) -> tuple[float, float]:
    """The speedup's interval from the two medians' 95% intervals (PyTorch's low end over
    Hologram's high end, and the reverse): conservative, as each side's interval is."""
    p_low, p_high = pytorch.median_ci95_ms
    h_low, h_high = hologram.median_ci95_ms
    low = p_low / h_high if h_high > 0 else math.nan
    high = p_high / h_low if h_low > 0 else math.inf
    return (low, high)


def unreliable(pytorch: BenchmarkResult, hologram: BenchmarkResult,
               others: Sequence[BenchmarkResult] = ()) -> list[str]:
    """Why a case's timings should not be read as a result; empty when they can.

    - a side (``others`` too, e.g. torch.compile) whose median is over
      :data:`STALL_RATIO` times its minimum: its median is mostly waiting, not work;
    - a speedup counted as a win or a loss (outside 1 ± 5%) whose confidence interval
      (:func:`speedup_ci95`) still holds 1: the interval is wider than the effect.
    """
    reasons = []
    for result in (pytorch, hologram, *others):
        if result.stall_ratio > STALL_RATIO:
            reasons.append(f"{result.name} median {result.stall_ratio:.1f}x its minimum")
    speedup = pytorch.median_ms / hologram.median_ms if hologram.median_ms > 0 else math.nan
    low, high = speedup_ci95(pytorch, hologram)
    decided = speedup > TIE or speedup < 1 / TIE
    if decided and low <= 1.0 <= high:
        reasons.append(f"speedup {speedup:.2f}x, 95% CI {low:.2f}-{high:.2f} holds 1")
    return reasons


def _check_runs(warmup_runs: int, timing_runs: int) -> None:
    if warmup_runs < 0 or timing_runs < 1:
        raise ValueError(f"need warmup_runs >= 0 and timing_runs >= 1, got {warmup_runs} and "
                         f"{timing_runs}")


def _timed(fn: Callable[[], Any], sync: Callable[[], None] | None) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    if sync is not None:
        sync()
    return (time.perf_counter() - start) * 1e3, out


def benchmark_operation(fn: Callable[[], Any], warmup_runs: int = 5, timing_runs: int = 10,
                        name: str = "", sync: Callable[[], None] | None = None
                        ) -> BenchmarkResult:
    """Call ``fn`` ``warmup_runs`` times untimed, then time ``timing_runs`` calls.

    ``sync`` (e.g. ``executor.synchronize``) is called inside each timed region after
    ``fn``, so queued work is counted.
    """
    _check_runs(warmup_runs, timing_runs)
    out = None
    for _ in range(warmup_runs):
        out = fn()
    if sync is not None:
        sync()
    samples = []
    for _ in range(timing_runs):
        ms, out = _timed(fn, sync)
        samples.append(ms)
    return BenchmarkResult(name, samples, out)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the garbage collector while sampling, so it never lands inside a sample.
    First collect the last calls' cyclic garbage: only the younger generations, where it
    is; the oldest holds what the imports made (in a process that imported torch.compile a
    full collection took ~0.5 s per case)."""
    gc.collect(1)
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _alternating(count: int, rounds: int) -> Iterator[int]:
    """The indices ``0 .. count-1``, round after round, every other round in reverse
    (ABC, CBA, ABC, ...), so drift within a round hits every side alike."""
    order = list(range(count))
    for r in range(rounds):
        yield from order if r % 2 == 0 else reversed(order)


def warm(fn: Callable[..., Any], args: tuple = (), seconds: float = 0.0) -> None:
    """Call ``fn(*args)`` untimed at least once and for at least ``seconds``."""
    end = time.perf_counter() + seconds
    fn(*args)
    while time.perf_counter() < end:
        fn(*args)


def call_and_sync(fn: Callable[[], Any], sync: Callable[[], None] | None
                   ) -> Callable[[], Any]:
    """What a timed sample runs, for the untimed warm-up: the call and its ``sync``."""
    if sync is None:
        return fn

    def call() -> Any:
        out = fn()
        sync()
        return out
    return call


def time_pair(fns: Sequence[Callable[[], Any]], warmup_runs: int = 5, timing_runs: int = 10,
              names: Sequence[str] | None = None,
              syncs: Sequence[Callable[[], None] | None] | None = None,
              warm_s: float = 0.0) -> list[BenchmarkResult]:
    """Time several callables interleaved in one process: every round calls each once,
    the order alternating between rounds (ABC, CBA, ...). Returns one result per callable.

    ``warm_s``: untimed calls of the same callable, each followed by its ``sync`` as in a
    sample, for that long before each sample (see the module docstring). Warming the call
    without its ``sync`` left the sync's code cold: on the cpu backend the executor's
    no-op ``synchronize`` then took 1-5 µs inside the timed region instead of 0.1.
    """
    _check_runs(warmup_runs, timing_runs)
    names = list(names) if names is not None else [f"fn{i}" for i in range(len(fns))]
    syncs = list(syncs) if syncs is not None else [None] * len(fns)
    warmers = [call_and_sync(fn, sync) for fn, sync in zip(fns, syncs)]
    outs: list[Any] = [None] * len(fns)
    for _ in range(warmup_runs):
        for i, fn in enumerate(fns):
            outs[i] = fn()
    samples: list[list[float]] = [[] for _ in fns]
    with _collector_paused():
        for i in _alternating(len(fns), timing_runs):
            if warm_s > 0:
                warm(warmers[i], (), warm_s)
            ms, outs[i] = _timed(fns[i], syncs[i])
            samples[i].append(ms)
    return [BenchmarkResult(n, s, o) for n, s, o in zip(names, samples, outs)]


# --- interleaved medians (the developer suite) ------------------------------------------

class Sampling(Protocol):
    """How :func:`interleaved` samples: rounds between ``min_rounds`` and ``max_rounds``,
    about ``budget_s`` seconds in all, each sample about ``sample_s`` seconds of calls."""

    min_rounds: int
    max_rounds: int
    budget_s: float
    sample_s: float


@dataclass(frozen=True)
class LoopSampling:
    """A :class:`Sampling` (e.g. ``hologram bench``'s calls in a loop)."""

    min_rounds: int = 5
    max_rounds: int = 15
    budget_s: float = 0.15
    sample_s: float = 0.002


def per_call_us(fn: Callable[..., Any], args: tuple = (), calls: int = 1) -> float:
    """Mean µs per call of ``fn(*args)`` over ``calls`` back-to-back calls."""
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - start) / calls * 1e6


def _calibrate(fn: Callable[..., Any], args: tuple, sample_s: float) -> tuple[int, float]:
    """(calls per sample, estimated µs per call), after two warm-up calls."""
    fn(*args)
    fn(*args)
    estimate = min(per_call_us(fn, args) for _ in range(3))
    calls = max(1, min(10_000, round(sample_s * 1e6 / max(estimate, 0.05))))
    return calls, estimate


def interleaved(contestants: Sequence[tuple[Callable[..., Any], tuple]], sampling: Sampling,
                warm_s: float = 0.0) -> list[float]:
    """Median µs per call of each ``(fn, args)``, sampled round by round in alternating
    order, with the garbage collector paused so it never lands inside one side's sample.

    ``warm_s``: untimed calls of the same function for that long before every sample (see
    the module docstring).
    """
    plan = [_calibrate(fn, args, sampling.sample_s) for fn, args in contestants]
    round_us = sum(max(warm_s * 1e6, estimate) + calls * estimate for calls, estimate in plan)
    rounds = int(sampling.budget_s * 1e6 / max(round_us, 1.0))
    rounds = max(sampling.min_rounds, min(sampling.max_rounds, rounds))
    samples: list[list[float]] = [[] for _ in contestants]
    with _collector_paused():
        for i in _alternating(len(contestants), rounds):
            fn, args = contestants[i]
            if warm_s:
                warm(fn, args, warm_s)
            samples[i].append(per_call_us(fn, args, plan[i][0]))
    return [statistics.median(s) for s in samples]
