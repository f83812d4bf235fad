"""``torch.device('hologram')`` against PyTorch's CPU eager, in one process.

    python -m hologram.bench.dev.torch_device [--quick] [--json FILE]

Same method as :mod:`hologram.bench.dev.cpu`: Hologram and PyTorch interleaved round by
round, medians, every result checked against the CPU before timing. Rows and targets (the
device issue's):

- ``overhead``: ``a + b`` on 100 float32 elements on the device, against the same on the
  CPU; target <= 3 µs. Where the native front kernels serve the call
  (``hologram_torch/csrc/ops.cpp``) the note says so; else the call is split into its
  parts: the dispatcher reaching a Python kernel (a no-op kernel of a private op),
  allocating the result (a pool block wrapped as a device tensor) against
  ``torch.empty``, and the compiled kernel launched by address; the remainder is the
  kernel's own Python (promotion, the compiled-kernel lookup).
- ``elementwise`` and activations at 1e5 (reference), 1e6 and 1e7 elements: target >= 1.0x
  PyTorch at 1e6 and 1e7.

``ratio`` is ``cpu_us / hologram_us``: above 1 means the device was faster.
"""

from __future__ import annotations

from hologram.bench import stats
from hologram.bench.dev import cpu
from hologram.bench.dev.sdk import _row, table

CASES = {
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "relu": lambda a, b: a.relu(),
    "sigmoid": lambda a, b: a.sigmoid(),
    "tanh": lambda a, b: a.tanh(),
    "gelu": lambda a, b: __import__("torch").nn.functional.gelu(a),
    "exp": lambda a, b: a.exp(),
}


def _check(torch, got, want, name: str) -> str:
    # atol 1e-5: float32 gelu near its zero crossing differs from PyTorch's by ~1e-6
    status = cpu.check(got.cpu().numpy(), want.numpy(), (1e-5, 1e-5))
    return status if status == "ok" else f"{name}: {status}"


def _noop_kernel(torch):
    """A private op whose hologram kernel returns its input: the dispatcher's share."""
    lib = torch.library.Library("hologram_bench", "FRAGMENT")
    lib.define("noop(Tensor a, Tensor b) -> Tensor")
    lib.impl("noop", lambda a, b: a, "PrivateUse1")
    return lib, torch.ops.hologram_bench.noop.default


def bench_overhead(torch, settings) -> list[dict]:
    from hologram_torch import memory, native
    from hologram_torch.aten import runner

    a, b = torch.randn(100), torch.randn(100)
    da, db = a.to("hologram"), b.to("hologram")
    check = _check(torch, da + db, a + b, "a + b")
    operand = (torch.float32, torch.Size([100]), (1,))
    entry = next(e for k, e in runner._cache.items() if k[0] == "add" and operand in k)
    out = memory.empty([100], torch.float32)
    addresses = (da.data_ptr(), db.data_ptr(), out.data_ptr())
    layout = ([100], [1], 400, torch.float32)
    lib, noop = _noop_kernel(torch)
    op_us, cpu_us, dispatch_us, alloc_us, empty_us, launch_us = stats.interleaved([
        (lambda: da + db, ()),
        (lambda: a + b, ()),
        (noop, (da, db)),
        (memory.new, layout),
        (torch.empty, (100,)),
        (entry.launch, (addresses,)),
    ], settings)
    del lib
    rest = op_us - dispatch_us - alloc_us - launch_us
    note = ("served by the native front kernel (a Python kernel's dispatch alone: "
            f"{dispatch_us:.2f} µs)" if native.fast_active() else
            f"dispatch {dispatch_us:.2f} + allocation {alloc_us:.2f} + launch "
            f"{launch_us:.2f} + kernel Python {rest:.2f} µs")
    return [
        _row("a + b (device)", 100, op_us, "a + b (CPU)", cpu_us, -3.0, check, note),
        _row("allocate a result", 100, alloc_us, "torch.empty", empty_us, None, "ok",
             "pool block + storage + tensor metadata"),
    ]


def bench_elementwise(torch, settings, sizes) -> list[dict]:
    rows = []
    for n in sizes:
        a, b = torch.randn(n), torch.randn(n)
        da, db = a.to("hologram"), b.to("hologram")
        for name, f in CASES.items():
            check = _check(torch, f(da, db), f(a, b), name)
            dev_us, cpu_us = stats.interleaved([(f, (da, db)), (f, (a, b))], settings,
                                             warm_s=0.05 if n >= 10**6 else 0.0)
            rows.append(_row(name, n, dev_us, "CPU eager", cpu_us,
                             1.0 if n >= 10**6 else None, check))
    return rows


def run(quick: bool = False) -> dict:
    torch = cpu.import_torch()
    import hologram_torch  # noqa: F401  (registers the device)

    settings = cpu.Settings.make(quick)
    rows = bench_overhead(torch, settings)
    rows += bench_elementwise(torch, settings, (10**6,) if quick else (10**5, 10**6, 10**7))
    return {"threads": torch.get_num_threads(), "rows": rows}


def main(argv: list[str] | None = None) -> None:
    cpu.table_main(__doc__, run, table, argv)


if __name__ == "__main__":
    main()
