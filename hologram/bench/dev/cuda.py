"""The cuda backend against PyTorch CUDA eager on one GPU (docs/cuda.md, "On an H100").

    python -m hologram.bench.dev.cuda [--quick] [--json FILE] [--backend cpu]

One process, Hologram and PyTorch interleaved (three rounds of each, three times), every
result checked against PyTorch's before timing; each sample times a batch of calls between
two synchronizations, and the medians are compared. Rows and targets (the CUDA issue's):

- ``copy``, ``add`` (``out=`` forms) at 1e7 and 1e8 float32 elements: bandwidth, the copy's
  being the reference; target: ``add`` >= 85% of the measured copy bandwidth.
- ``relu(a*b+c)`` through ``hg.jit`` (one kernel) against PyTorch's three; target >= 2x.
- ``sum`` and ``max`` of everything: target >= 0.9x. ``softmax`` over rows: target >= 1.0x
  (and over one row of 131072, the shape that is cut into split kernels).
- ``matmul`` of n×n float16 (target >= 0.7x cuBLAS at 4096) and float32 (TF32 off in both).
- DLPack both ways with CUDA PyTorch (values and shared memory).

``--backend cpu`` runs the same rows at small sizes against PyTorch on the CPU: a check that
this script works where there is no GPU (tests/test_bench_dev.py), not a measurement.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import hologram as hg
from hologram.bench.dev import cpu
from hologram.bench.verify import to_numpy, verify_correctness


def _timed(fn, sync, iters: int, rounds: int = 3) -> list[float]:
    """Seconds per call, one sample per batch of ``iters`` calls."""
    samples = []
    for _ in range(rounds):
        sync()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / iters)
    return samples


class _Bench:
    def __init__(self, torch, backend: str):
        self.torch, self.ex = torch, hg.Executor(backend)
        gpu = backend == "cuda"
        self.device = torch.device("cuda" if gpu else "cpu")
        self.torch_sync = torch.cuda.synchronize if gpu else (lambda: None)
        self.rows: list[dict] = []

    def tensor(self, array: np.ndarray):
        return self.torch.from_numpy(array).to(self.device)

    def case(self, name: str, moved: int, hologram_fn, torch_fn, check, iters: int,
             target: float | None = None, **extra) -> dict:
        """Check, then time ``hologram_fn`` against ``torch_fn``. ``moved``: bytes read and
        written per call (0: no bandwidth); ``check(got, want)``: an error, or ``""``."""
        row = {"case": name, "target": target, **extra}
        try:
            got = hologram_fn()
            self.ex.synchronize()
            row["check"] = check(got, torch_fn()) or "ok"
            ours, theirs = [], []
            for _ in range(3):
                ours += _timed(hologram_fn, self.ex.synchronize, iters)
                theirs += _timed(torch_fn, self.torch_sync, iters)
            hologram_s, torch_s = statistics.median(ours), statistics.median(theirs)
            row.update(hologram_us=round(hologram_s * 1e6, 1),
                       torch_us=round(torch_s * 1e6, 1), ratio=round(torch_s / hologram_s, 3))
            if moved:
                row.update(hologram_GBps=round(moved / hologram_s / 1e9, 1),
                           torch_GBps=round(moved / torch_s / 1e9, 1))
        except Exception as exc:  # a failing case is a row to report, not a crash
            row["check"] = f"{type(exc).__name__}: {exc}"
        self.rows.append(row)
        return row


def _error(got, want, tolerance: float = 1e-6, relative: bool = False) -> str:
    """``""`` when no element of ``got`` is further than ``tolerance`` from PyTorch's
    ``want`` (``relative``: times the largest ``|want|``, at least 1), else what differs
    (the suite's comparison, :func:`~hologram.bench.verify.verify_correctness`)."""
    scale = max(float(np.abs(to_numpy(want)).max(initial=0.0)), 1.0) if relative else 1.0
    check = verify_correctness(got, want, rtol=0.0, atol=tolerance * scale,
                               raise_on_error=False)
    return "" if check.ok else check.message


def _vectors(bench: _Bench, n: int, rng) -> None:
    """copy, add, the fused chain, sum and max of ``n`` float32 elements."""
    torch, ex = bench.torch, bench.ex
    iters = 5 if n >= 10**8 else 20
    arrays = [rng.standard_normal(n, dtype=np.float32) for _ in range(3)]
    a, b, c = (ex.from_numpy(v) for v in arrays)
    ta, tb, tc = (bench.tensor(v) for v in arrays)
    out, tout = ex.empty(n), torch.empty(n, device=bench.device)
    copy = bench.case("copy", 8 * n, lambda: hg.ops.copy(ex, a, out),
                      lambda: tout.copy_(ta), lambda g, w: _error(out, tout), iters, elements=n)
    add = bench.case("add", 12 * n, lambda: hg.ops.vector_add(ex, a, b, out),
                     lambda: torch.add(ta, tb, out=tout), lambda g, w: _error(out, tout),
                     iters, elements=n)
    if copy.get("hologram_us") and add.get("hologram_us"):
        # (from the times: a bandwidth rounded to 0.1 GB/s is 0 on a stalled machine)
        add["of_copy"] = round(12 * copy["hologram_us"] / (8 * add["hologram_us"]), 3)
    fused = hg.jit(lambda a, b, c: hg.ops.relu(a * b + c))
    bench.case("relu(a*b+c)", 16 * n, lambda: fused(a, b, c),
               lambda: torch.relu(ta * tb + tc), _error, iters, 2.0, elements=n)
    bench.case("sum", 4 * n, lambda: hg.ops.sum(a), lambda: torch.sum(ta),
               lambda g, w: _error(g, w, 1e-5, relative=True), iters, 0.9, elements=n)
    bench.case("max", 4 * n, lambda: hg.ops.max(a), lambda: torch.max(ta),
               lambda g, w: _error(g, w, 1e-5, relative=True), iters, 0.9, elements=n)


def _softmax(bench: _Bench, rows: int, cols: int, rng) -> None:
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    hx, tx = bench.ex.from_numpy(x), bench.tensor(x)
    bench.case("softmax", 8 * x.size, lambda: hg.ops.softmax(hx, dim=1),
               lambda: bench.torch.softmax(tx, dim=1), _error, 10, 1.0, shape=f"{rows}x{cols}")


def _matmul(bench: _Bench, dtype, n: int, rng) -> None:
    m = [rng.standard_normal((n, n)).astype(dtype) for _ in range(2)]
    ha, hb = (bench.ex.from_numpy(v) for v in m)
    ta, tb = (bench.tensor(v) for v in m)
    tolerance = 1e-2 if dtype is np.float16 else 1e-4  # relative to the largest output
    row = bench.case("matmul", 0, lambda: hg.ops.matmul(ha, hb),
                     lambda: bench.torch.matmul(ta, tb),
                     lambda g, w: _error(g, w, tolerance, relative=True),
                     5 if n >= 4096 else 20, 0.7 if dtype is np.float16 and n == 4096 else None,
                     shape=f"{n}^3", dtype=np.dtype(dtype).name)
    if "hologram_us" in row:
        row["hologram_TFLOPs"] = round(2 * n**3 / row["hologram_us"] / 1e6, 1)
        row["torch_TFLOPs"] = round(2 * n**3 / row["torch_us"] / 1e6, 1)


def run(quick: bool = False, backend: str = "cuda") -> dict:
    torch = cpu.import_torch()
    torch.backends.cuda.matmul.allow_tf32 = False
    bench = _Bench(torch, backend)
    small = backend != "cuda"
    rng = np.random.default_rng(0)
    for n in (10**4, 10**5) if small else (10**7,) if quick else (10**7, 10**8):
        _vectors(bench, n, rng)
    # 1 x 131072: a vocabulary's softmax at batch 1 (a kernel cut into split ones).
    for rows, cols in ((64, 64),) if small else ((4096, 4096),) if quick else (
            (4096, 4096), (32768, 1024), (1024, 32768), (1, 131072)):
        _softmax(bench, rows, cols, rng)
    for dtype in (np.float16, np.float32):
        for n in (64,) if small else (4096,) if quick else (1024, 4096):
            _matmul(bench, dtype, n, rng)
    bench.rows.append(_dlpack(torch, bench.ex, bench))
    return {"backend": str(bench.ex.backend), "torch_device": str(bench.device),
            "rows": bench.rows}


def _dlpack(torch, ex, bench) -> dict:
    """An exported buffer read and written by PyTorch, a PyTorch tensor written by an op."""
    row = {"case": "dlpack", "target": None}
    try:
        buf = ex.from_numpy(np.arange(6, dtype=np.float32))
        seen = torch.from_dlpack(buf)
        seen.mul_(2)
        bench.torch_sync()
        source = torch.arange(4, dtype=torch.float32, device=bench.device)
        view = ex.from_dlpack(source)
        hg.ops.scalar_mul(ex, view, 3.0, view)
        ex.synchronize()
        ok = (seen.device.type == bench.device.type
              and buf.to_numpy().tolist() == [0, 2, 4, 6, 8, 10]
              and source.cpu().tolist() == [0.0, 3.0, 6.0, 9.0])
        row["check"] = "ok" if ok else "values differ"
    except Exception as exc:
        row["check"] = f"{type(exc).__name__}: {exc}"
    return row


def table(result: dict) -> str:
    keys = ("case", "elements", "shape", "dtype", "hologram_us", "torch_us", "ratio", "target",
            "hologram_GBps", "torch_GBps", "of_copy", "hologram_TFLOPs", "torch_TFLOPs",
            "check")
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in result["rows"]:
        lines.append("| " + " | ".join(str(row.get(k, "")) for k in keys) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = cpu.cli(__doc__)
    parser.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args(argv)
    result = run(args.quick, args.backend)
    cpu.report(f"Hologram {result['backend']} against PyTorch on {result['torch_device']}"
               f"\n\n" + table(result), result, args.json)


if __name__ == "__main__":
    main()
