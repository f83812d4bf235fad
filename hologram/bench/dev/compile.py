"""``torch.compile(backend="hologram")`` against PyTorch eager and Inductor, in one process.

    python -m hologram.bench.dev.compile [--quick] [--json FILE] [--no-inductor]

The models are :mod:`hologram.bench.dev.training`'s: the MLP (256-512-512-1, batch 64, MSE
loss) and the token transformer (embedding, 2 encoder layers, head, cross-entropy; batch
16 x 32), on CPU tensors. Each is timed in two modes, at 1 and at 2 threads (PyTorch's and
Hologram's thread counts both set):

- ``inference``: ``model(x)`` under ``torch.no_grad()`` in eval mode. The transformer's
  encoder has an inference fast path (one fused native op per layer) that graph compilers
  cannot look into; its compiled rows run with the fast path off, and an extra eager row
  with it on is PyTorch's best eager number.
- ``training``: one whole step, ``zero_grad`` + compiled ``loss(model(x), y)`` + backward +
  ``Adam.step`` (eager, PyTorch's, on every side).

Contestants are timed interleaved round by round (:func:`hologram.bench.stats.interleaved`),
medians of µs per call. Before timing, every compiled side must agree with eager (outputs
within 1e-4 relative for inference; two training losses, the second after one update).
``first call s`` is the wall time of the first compiled call (dynamo, AOTAutograd, the
backend, compiling or loading programs); the Hologram rows also give the backend's own
share (``compile_stats()['compile_time_s']``) and whether its programs came from the disk
cache. ``ratio`` columns are other / hologram: above 1 means Hologram was faster.
"""

from __future__ import annotations

import copy
import os
import time

from hologram.bench.dev import cpu, training

RTOL = 1e-4


def _models(torch, sizes):
    """(name, model, inputs (x, y), loss function) for each model, initialised by seed."""
    s = sizes["mlp"]
    x, y = training.mlp_inputs(torch, s)
    torch.manual_seed(1)
    mlp = training._mlp(torch, torch.nn, s)
    out = [("mlp", mlp, (x, y), torch.nn.functional.mse_loss)]
    s = sizes["transformer"]
    x, y = training.transformer_inputs(torch, s)
    torch.manual_seed(1)
    vocab = s["vocab"]

    def cross_entropy(logits, target):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), target.reshape(-1))

    out.append(("transformer", training._token_model(torch, s), (x, y), cross_entropy))
    return out


def _compiled(torch, fn, backend):
    if backend == "eager":
        return fn
    if backend == "hologram":
        return torch.compile(fn, backend="hologram")
    return torch.compile(fn)  # Inductor, torch.compile's default


def _inference(torch, model, x, backend):
    model = copy.deepcopy(model).eval()
    f = _compiled(torch, model, backend)

    def call():
        with torch.no_grad():
            return f(x)

    return call


def _training(torch, model, loss_fn, x, y, backend):
    model = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_of = _compiled(torch, lambda a, b: loss_fn(model(a), b), backend)

    def step():
        optimizer.zero_grad()
        loss = loss_of(x, y)
        loss.backward()
        optimizer.step()
        return loss

    return step


def _first_call(torch, fn):
    """(result, seconds) of a call; for Hologram also its own compile time and programs."""
    import hologram
    import hologram_torch

    hologram_torch.reset_compile_stats()
    disk_before = hologram.cache_info()["disk_hits"]
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    s = hologram_torch.compile_stats()
    own = {"backend_s": round(s["compile_time_s"], 3), "programs": s["programs"],
           "disk_hits": hologram.cache_info()["disk_hits"] - disk_before,
           "ops_eager": s["ops_eager"], "partitions": s["partitions"]}
    return result, seconds, own


def _agree(torch, got, expected) -> bool:
    return bool(torch.allclose(got.float(), expected.float(), rtol=RTOL, atol=RTOL))


def bench_case(torch, settings, name, model, inputs, loss_fn, mode, backends):
    """One row: every backend's median ms for (model, mode) at the current thread count."""
    x, y = inputs
    fastpath = name == "transformer" and mode == "inference"
    contestants, first, checks, notes = {}, {}, [], {}
    if fastpath:
        torch.backends.mha.set_fastpath_enabled(False)
    try:
        for backend in backends:
            torch._dynamo.reset()
            if mode == "inference":
                call = _inference(torch, model, x, backend)
                result, seconds, own = _first_call(torch, call)
                checks.append(_agree(torch, result, _inference(torch, model, x, "eager")()))
            else:
                call = _training(torch, model, loss_fn, x, y, backend)
                result, seconds, own = _first_call(torch, call)
                reference = _training(torch, model, loss_fn, x, y, "eager")
                losses = [result, call()]
                expected = [reference(), reference()]
                checks += [_agree(torch, a, b) for a, b in zip(losses, expected)]
            contestants[backend] = call
            first[backend] = round(seconds, 3)
            if backend == "hologram":
                notes = own
    finally:
        if fastpath:
            torch.backends.mha.set_fastpath_enabled(True)
    if fastpath:  # PyTorch's own eager inference, fast path on
        contestants["eager (fast path)"] = _inference(torch, model, x, "eager")
    names = list(contestants)

    def timed(fn):
        if fastpath and fn is not contestants.get("eager (fast path)"):
            def call():
                torch.backends.mha.set_fastpath_enabled(False)
                try:
                    fn()
                finally:
                    torch.backends.mha.set_fastpath_enabled(True)
            return call
        return fn

    medians, best = training._interleaved([timed(contestants[n]) for n in names], settings)
    ms = {n: round(us / 1e3, 3) for n, us in zip(names, medians)}
    return {"model": name, "mode": mode, "threads": torch.get_num_threads(), "ms": ms,
            "best_ms": {n: round(us / 1e3, 3) for n, us in zip(names, best)},
            "first_call_s": first, "hologram": notes,
            "check": "ok" if all(checks) else "MISMATCH"}


def run(quick: bool = False, inductor: bool = True, sizes: dict | None = None,
        threads: list[int] | None = None, models: tuple[str, ...] = ("mlp", "transformer"),
        ) -> dict:
    """Every case: ``{"load_average", "rows"}``; ``sizes`` replaces training.SIZES,
    ``threads`` the thread counts (1 and all cores), ``models`` the models timed."""
    import warnings

    torch = cpu.import_torch()
    if torch is None:
        return {"rows": [], "skipped": "PyTorch is not installed"}
    import hologram

    settings = cpu.Settings.make(quick)
    backends = ["eager", "hologram"] + (["inductor"] if inductor else [])
    load_before = os.getloadavg()
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in threads or cpu.thread_counts():
            torch.set_num_threads(n)
            hologram.set_num_threads(n)
            try:
                for name, model, inputs, loss_fn in _models(torch, sizes or training.SIZES):
                    if name not in models:
                        continue
                    for mode in ("inference", "training"):
                        rows.append(bench_case(torch, settings, name, model, inputs, loss_fn,
                                               mode, backends))
            finally:
                hologram.set_num_threads(None)
    load_after = os.getloadavg()
    return {"load_average": [round(v, 2) for v in (load_before[0], load_after[0])],
            "rows": rows}


def table(result: dict) -> str:
    lines = ["| model | mode | threads | eager ms | hologram ms | inductor ms | eager/hologram "
             "| inductor/hologram | fastest ms (eager / hologram / inductor) | first call s "
             "(hologram / inductor) | hologram backend s (programs, disk hits) | check |",
             "|" + "---|" * 12]
    for r in result["rows"]:
        ms, best, first, own = r["ms"], r["best_ms"], r["first_call_s"], r["hologram"]
        h = ms["hologram"]
        eager = f"{ms['eager']}"
        if "eager (fast path)" in ms:
            eager += f" (fast path {ms['eager (fast path)']})"
        ind = ms.get("inductor")
        fastest = " / ".join(str(best.get(k, "-")) for k in ("eager", "hologram", "inductor"))
        lines.append(
            f"| {r['model']} | {r['mode']} | {r['threads']} | {eager} | {h} | {ind or '-'} "
            f"| {ms['eager'] / h:.2f} | {f'{ind / h:.2f}' if ind else '-'} | {fastest} "
            f"| {first['hologram']} / {first.get('inductor', '-')} "
            f"| {own['backend_s']} ({own['programs']}, {own['disk_hits']}) | {r['check']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = cpu.cli(__doc__)
    parser.add_argument("--no-inductor", dest="inductor", action="store_false",
                        help="skip Inductor (its first compile takes tens of seconds)")
    args = parser.parse_args(argv)
    result = run(args.quick, args.inductor)
    cpu.report(f"load average (1 min) before/after: {result.get('load_average')}\n\n"
               + table(result), result, args.json)


if __name__ == "__main__":
    main()
