"""The SDK's costs against PyTorch eager: per-op overhead, allocating ops, hg.jit fusion.

    python -m hologram.bench.dev.sdk [--quick] [--json FILE]

Same method as :mod:`hologram.bench.dev.cpu`: one process, Hologram and PyTorch interleaved
round by round, medians, every result checked before timing. Rows and targets (the SDK
issue's):

- ``overhead``: ``hg.ops.vector_add(ex, a, b, c)`` on 100 float32 elements with a
  preallocated output, against ``torch.add(a, b, out=c)``; target <= 1.5 µs. The same call
  is split into its parts: the launch alone (the compiled kernel called by address), the
  dispatch (what remains), and allocation (``ex.empty`` vs ``torch.empty``) for ops that
  return new buffers.
- ``allocating``: the allocating form ``hg.ops.vector_add(a, b)`` (a new output buffer per
  call) against ``torch.add(a, b)``; target >= 1.5x PyTorch at 1e7.
- ``fused``: ``hg.jit(lambda a, b, c: relu(a * b + c))`` against the same three ops called
  one by one through the SDK; target >= 2x at 1e6. PyTorch eager is listed for reference.

``ratio`` is ``baseline_us / hologram_us``: above 1 means the Hologram form was faster.
"""

from __future__ import annotations

import numpy as np

import hologram as hg
from hologram.bench import stats
from hologram.bench.dev import cpu

TOLERANCE = (1e-5, 1e-6)  # (rtol, atol)


def _check(got: np.ndarray, want, name: str) -> str:
    status = cpu.check(got, np.asarray(want), TOLERANCE)
    return status if status == "ok" else f"{name}: {status}"


def _row(name, size, hologram_us, baseline, baseline_us, target, check, note=""):
    ratio = baseline_us / hologram_us
    met = None if target is None else (
        ratio >= target if target > 0 else hologram_us <= -target)
    return {"case": name, "elements": size, "hologram_us": round(hologram_us, 3),
            "baseline": baseline, "baseline_us": round(baseline_us, 3),
            "ratio": round(ratio, 3), "target": target, "met": met and check == "ok",
            "check": check, "note": note}


def bench_overhead(ex, torch, settings) -> list[dict]:
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal(100, dtype=np.float32) for _ in range(2))
    a, b, c = ex.from_numpy(x), ex.from_numpy(y), ex.empty(100)
    ta, tb, tc = torch.from_numpy(x.copy()), torch.from_numpy(y.copy()), torch.empty(100)
    hg.ops.vector_add(ex, a, b, c)
    check = _check(c.to_numpy(), x + y, "vector_add")
    kernel = next(iter(hg.ops.vector_add.op.kernels.values()))
    addresses = (a.handle, b.handle, c.handle)
    f32 = np.dtype(np.float32)
    op_us, torch_us, launch_us, empty_us, torch_empty_us = stats.interleaved([
        (hg.ops.vector_add, (ex, a, b, c)),
        (lambda: torch.add(ta, tb, out=tc), ()),
        (kernel.by_address, (addresses,)),
        (ex.empty, (100, f32)),
        (torch.empty, (100,)),
    ], settings)
    return [
        _row("vector_add(ex, a, b, c)", 100, op_us, "torch.add(out=)", torch_us, -1.5, check,
             f"launch {launch_us:.2f} µs + dispatch {op_us - launch_us:.2f} µs"),
        _row("ex.empty", 100, empty_us, "torch.empty", torch_empty_us, None, "ok",
             "allocation, paid by ops that return new buffers"),
    ]


def bench_allocating(ex, torch, settings, sizes) -> list[dict]:
    rows = []
    rng = np.random.default_rng(1)
    for n in sizes:
        x, y = (rng.standard_normal(n, dtype=np.float32) for _ in range(2))
        a, b = ex.from_numpy(x), ex.from_numpy(y)
        ta, tb = torch.from_numpy(x), torch.from_numpy(y)
        check = _check(hg.ops.vector_add(a, b).to_numpy(), x + y, "vector_add")
        hg_us, torch_us = stats.interleaved(
            [(hg.ops.vector_add, (a, b)), (torch.add, (ta, tb))], settings,
            warm_s=0.05 if n >= 10**6 else 0.0)
        rows.append(_row("vector_add(a, b)", n, hg_us, "torch.add", torch_us,
                         1.5 if n == 10**7 else None, check))
    return rows


def bench_fused(ex, torch, settings, sizes) -> list[dict]:
    rows = []
    rng = np.random.default_rng(2)
    fused = hg.jit(lambda a, b, c: hg.ops.relu(a * b + c))

    def one_by_one(a, b, c):
        return hg.ops.relu(hg.ops.vector_add(hg.ops.vector_mul(a, b), c))

    for n in sizes:
        xs = [rng.standard_normal(n, dtype=np.float32) for _ in range(3)]
        bufs = tuple(ex.from_numpy(v) for v in xs)
        tensors = tuple(torch.from_numpy(v) for v in xs)
        want = np.maximum(xs[0] * xs[1] + xs[2], 0)
        check = _check(fused(*bufs).to_numpy(), want, "jit relu(a*b+c)")
        if check == "ok":
            check = _check(one_by_one(*bufs).to_numpy(), want, "eager relu(a*b+c)")
        kernels = len(hg.compiler.pipeline.lower(
            hg.compiler.pipeline.canonical_form(fused.trace(*bufs))).kernels)
        fused_us, eager_us, torch_us = stats.interleaved(
            [(fused, bufs), (one_by_one, bufs),
             (lambda a, b, c: torch.relu(a * b + c), tensors)], settings, warm_s=0.05)
        rows.append(_row("jit relu(a*b+c)", n, fused_us, "hg.ops one by one", eager_us,
                         2.0 if n == 10**6 else None, check,
                         f"{kernels} kernel(s); torch eager {torch_us:.1f} µs "
                         f"({torch_us / fused_us:.2f}x)"))
    return rows


def run(quick: bool = False) -> dict:
    torch = cpu.import_torch()
    settings = cpu.Settings.make(quick)
    ex = hg.Executor("cpu")
    rows = bench_overhead(ex, torch, settings)
    rows += bench_allocating(ex, torch, settings, (10**5, 10**7) if quick else
                             (10**3, 10**5, 10**6, 10**7))
    rows += bench_fused(ex, torch, settings, (10**6,) if quick else (10**5, 10**6, 10**7))
    return {"threads": hg.get_num_threads(), "rows": rows}


def table(result: dict) -> str:
    lines = ["| case | elements | hologram µs | baseline | baseline µs | ratio | target | met "
             "| check | note |", "|" + "---|" * 10]
    for r in result["rows"]:
        target = ("" if r["target"] is None else f"<= {-r['target']} µs" if r["target"] < 0
                  else f">= {r['target']}x")
        met = "" if r["target"] is None else "yes" if r["met"] else "**no**"
        lines.append(f"| {r['case']} | {r['elements']:,} | {r['hologram_us']} | "
                     f"{r['baseline']} | {r['baseline_us']} | {r['ratio']} | {target} | {met} "
                     f"| {r['check']} | {r['note']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    cpu.table_main(__doc__, run, table, argv)


if __name__ == "__main__":
    main()
