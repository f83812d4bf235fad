"""Checks of the torch device on a GPU (the cuda backend), section by section:

    HOLOGRAM_TORCH_BACKEND=cuda python3 tools/gpu/checks.py SECTION

``views``: views that start between 16-byte boundaries, op by op and recorded; ``dlpack``:
DLPack both ways with torch CUDA tensors (values, shared memory, stream order, lifetimes);
``async``: pinned memory and non-blocking uploads; ``launch``: the per-op host cost against
PyTorch CUDA's; ``compile``: ``torch.compile`` regions of device tensors on the GPU
(values, gradients, a scalar input, an index check, and the step's time against eager);
``notwin``: a probe of an unaligned view with the unaligned twin switched off (it may
fault: run it last, in its own process). One PASS/FAIL/ERROR line per check,
and a summary; with ``$OUT`` set, the lines are written to ``$OUT/checks_SECTION.txt``.
``views`` also runs on the emulation (``HOLOGRAM_CUDA_EMULATE=1``). tools/gpu/run.sh runs
the sections and the training cases (docs/cuda.md, "Checks on a GPU")."""
import os
import sys
import time
import traceback

import torch

import hologram_torch

D = "hologram"
results = []


def case(name):
    def wrap(fn):
        t0 = time.perf_counter()
        try:
            ok = fn()
            status = "PASS" if ok is True else f"FAIL {ok}"
        except Exception as e:
            status = f"ERROR {type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc(limit=3)
        line = f"{status[:600]} | {name} ({time.perf_counter() - t0:.2f} s)"
        print(line, flush=True)
        results.append(line)
        return fn
    return wrap


def same(a, b):
    a, b = a.cpu(), b.cpu()
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{a.shape} {a.dtype} vs {b.shape} {b.dtype}"
    if not torch.equal(a, b):
        if a.is_floating_point() and torch.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True):
            return True
        return f"values differ: {a.flatten()[:6]} vs {b.flatten()[:6]}"
    return True


print("backend", hologram_torch.get_backend(), torch.__version__, flush=True)
which = sys.argv[1] if len(sys.argv) > 1 else "all"


if which in ("all", "views"):
    for lazy in (False, True):
        tag = "recorded" if lazy else "op by op"

        @case(f"offset views of f32 ({tag})")
        def _(lazy=lazy):  # (run at once by @case)
            with hologram_torch.set_lazy(lazy):
                c = torch.arange(4099.0)
                x = c.to(D)
                outs = [(x[1:] * 2, c[1:] * 2), (x[1:] + x[:-1], c[1:] + c[:-1]),
                        (x[3:4099].sum(), c[3:4099].sum()),
                        (x[5:].reshape(-1, 2)[:, 1] * 1.5, c[5:].reshape(-1, 2)[:, 1] * 1.5),
                        (torch.relu(x[7:] - 100), torch.relu(c[7:] - 100))]
                for got, want in outs:
                    r = same(got, want)
                    if r is not True:
                        return r
                return True

        @case(f"offset views of int8/f16/bf16 and slice writes ({tag})")
        def _(lazy=lazy):  # (run at once by @case)
            with hologram_torch.set_lazy(lazy):
                for dt in (torch.int8, torch.float16, torch.bfloat16, torch.int64):
                    c = torch.arange(1000).to(dt)
                    x = c.to(D)
                    r = same(x[3:] + x[:-3], c[3:] + c[:-3])
                    if r is not True:
                        return f"{dt}: {r}"
                c = torch.zeros(64, 65)
                x = c.to(D)
                for t in (c, x):
                    t[1:, 1:] += 1
                    t[5:9, 3:7] = 7
                    t[:, 1] = t[:, 2] * 3
                return same(x, c)

        @case(f"offset views into products and reductions ({tag})")
        def _(lazy=lazy):  # (run at once by @case)
            with hologram_torch.set_lazy(lazy):
                c = torch.randn(4097 * 65)
                x = c.to(D)
                a, b = x[1:1 + 64 * 64].view(64, 64), x[3:3 + 64 * 32].view(64, 32)
                ca, cb = c[1:1 + 64 * 64].view(64, 64), c[3:3 + 64 * 32].view(64, 32)
                r = same(torch.softmax(a, 1), torch.softmax(ca, 1))
                if r is not True:
                    return r
                got, want = (a @ b).cpu(), ca @ cb
                if not torch.allclose(got, want, rtol=1e-3, atol=1e-3):
                    return f"matmul off by {(got - want).abs().max()}"
                return same(a.max(1).values, ca.max(1).values)


if which in ("all", "dlpack"):
    @case("export: torch.from_dlpack(hologram tensor) is a CUDA tensor on the same memory")
    def _():
        h = torch.randn(64, 33, device=D)
        c = torch.from_dlpack(h)
        if c.device.type != "cuda" or c.data_ptr() != h.data_ptr():
            return f"{c.device} {c.data_ptr():#x} vs {h.data_ptr():#x}"
        r = same(c, h)
        if r is not True:
            return r
        c.add_(1)
        torch.cuda.synchronize()
        return same(h.cpu(), c.cpu())

    @case("export: views, offsets and dtypes")
    def _():
        base = torch.randn(65, 66)
        h = base.to(D)
        for got, want in ((h.t(), base.t()), (h[1:, 3:], base[1:, 3:]),
                          (h[:, ::2], base[:, ::2]), (h[5], base[5])):
            c = torch.from_dlpack(got)
            if c.stride() != want.stride():
                return f"strides {c.stride()} vs {want.stride()}"
            r = same(c, want)
            if r is not True:
                return r
        for dt in (torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.uint8):
            want = torch.testing.make_tensor((7, 9), dtype=dt, device="cpu")
            r = same(torch.from_dlpack(want.to(D)), want)
            if r is not True:
                return f"{dt}: {r}"
        return True

    @case("export: the consumer's stream waits for queued device work (no host sync)")
    def _():
        x = torch.randn(4096, 4096, device=D)
        y = x
        for _ in range(30):  # queued work, long enough to be pending at the export
            y = y * 1.0001 + 0.5
        c = torch.from_dlpack(y)  # torch's current stream waits for our event
        got = (c * 1).cpu()
        want = y.cpu()
        return same(got, want)

    @case("import: hologram_torch.from_dlpack(CUDA tensor) shares memory")
    def _():
        g = torch.randn(1000, 3, device="cuda")
        h = torch.hologram.from_dlpack(g)
        if h.device.type != D or h.data_ptr() != g.data_ptr():
            return f"{h.device} {h.data_ptr():#x}"
        r = same(h * 2, g * 2)
        if r is not True:
            return r
        h.add_(1)
        torch.hologram.synchronize()
        r = same(h.cpu(), g.cpu())
        if r is not True:
            return r
        for got, want in ((g.t(), g.t()), (g[1:], g[1:]), (g[:, 1], g[:, 1])):
            hh = torch.hologram.from_dlpack(got)
            r = same(hh * 3, want * 3)
            if r is not True:
                return r
        b = torch.randn(50, device="cuda", dtype=torch.bfloat16)
        return same(torch.hologram.from_dlpack(b) + 1, b + 1)

    @case("import: our stream waits for the producer's side stream")
    def _():
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            g = torch.randn(4096, 4096, device="cuda")
            for _ in range(30):
                g = g * 1.0001 + 0.5
            h = torch.hologram.from_dlpack(g)  # hands the producer our stream
        got = (h * 1).cpu()
        s.synchronize()
        return same(got, g.cpu())

    @case("import: the producer outlives its tensor's deletion while we use it")
    def _():
        g = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
        h = torch.hologram.from_dlpack(g)
        del g
        torch.cuda.empty_cache()
        junk = torch.full((1 << 22,), 7.0, device="cuda")  # would reuse the block
        r = same(h[:5], torch.arange(5.0))
        del junk
        return r

    @case("non_blocking copies in and out")
    def _():
        c = torch.randn(1 << 22)
        p = c.pin_memory() if hasattr(c, "pin_memory") else c
        h = p.to(D, non_blocking=True)
        r = same(h, c)
        if r is not True:
            return r
        back = h.to("cpu", non_blocking=True)
        torch.hologram.synchronize()
        return same(back, c)

    @case("memory: allocated bytes go back after imports and exports")
    def _():
        torch.hologram.synchronize()
        before = torch.hologram.memory_allocated()
        h = torch.randn(1 << 20, device=D)
        c = torch.from_dlpack(h)
        del h
        c.mul_(2)
        torch.cuda.synchronize()
        del c
        torch.hologram.synchronize()
        import gc
        gc.collect()
        return True if torch.hologram.memory_allocated() <= before else (
            f"{torch.hologram.memory_allocated()} > {before}")

if which == "notwin":
    from hologram.backends.cuda import runtime

    runtime.ALIGNMENT = 1  # never the twin

    @case("probe: an offset view WITHOUT the unaligned twin (expected to fault or differ)")
    def _():
        # (a length divisible by 4: Triton vectorizes only then)
        c = torch.arange(1 << 20, dtype=torch.float32)
        x = c.to(D)
        return same(x[1:1 + (1 << 19)] * 2, c[1:1 + (1 << 19)] * 2)

if which in ("all", "async"):
    @case("non_blocking upload from pinned memory returns before the copy ends")
    def _():
        c = torch.randn(1 << 27)  # 512 MiB
        p = c.pin_memory()
        d = torch.empty(1 << 27, device=D)
        for attempt in ("first", "second"):  # the first also sets up the copy's machinery
            torch.hologram.synchronize()
            t0 = time.perf_counter()
            d.copy_(p, non_blocking=True)
            queued = time.perf_counter() - t0
            torch.hologram.synchronize()
            done = time.perf_counter() - t0
            print(f"  {attempt}: queued in {queued * 1e3:.2f} ms, done after "
                  f"{done * 1e3:.2f} ms", flush=True)
        t0 = time.perf_counter()
        d.copy_(p)
        blocking = time.perf_counter() - t0
        print(f"  pinned={p.is_pinned()}; blocking copy {blocking * 1e3:.2f} ms "
              f"({c.nbytes / blocking / 1e9:.1f} GB/s)", flush=True)
        r = same(d, c)
        if r is not True:
            return r
        return True if queued < done / 4 else f"not asynchronous: {queued} vs {done}"

    @case("pin_memory on another thread (DataLoader's pin thread), uploads, torch CUDA's copy")
    def _():
        import threading
        box = {}
        t = threading.Thread(target=lambda: box.update(p=torch.randn(1 << 26).pin_memory()))
        t.start()
        t.join()
        p = box["p"]
        d = p.to(D, non_blocking=True)
        g = torch.empty(1 << 26, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g.copy_(p, non_blocking=True)
        queued = time.perf_counter() - t0
        torch.cuda.synchronize()
        print(f"  torch CUDA's copy from it: queued {queued * 1e3:.2f} ms, done "
              f"{(time.perf_counter() - t0) * 1e3:.2f} ms", flush=True)
        r = same(d, p)
        return r if r is not True else same(g, p)

    @case("non_blocking upload then a kernel on the same stream sees the data")
    def _():
        c = torch.randn(1 << 24).pin_memory()
        d = torch.empty(1 << 24, device=D)
        d.copy_(c, non_blocking=True)
        return same(d * 2, c * 2)

if which in ("all", "launch"):
    @case("per-op host cost: a * 2.5 at 1e5, ctypes launch vs cuda-bindings vs torch CUDA")
    def _():
        import statistics

        from hologram.backends.cuda import backend as cb

        driver = cb.gpu()[0]

        def timed(fn, sync):
            for _ in range(50):
                fn()
            sync()
            samples = []
            for _ in range(9):
                t0 = time.perf_counter()
                for _ in range(200):
                    fn()
                sync()
                samples.append((time.perf_counter() - t0) / 200 * 1e6)
            return statistics.median(samples)

        a = torch.randn(100000, device=D)
        g = torch.randn(100000, device="cuda")
        raw = driver._raw_launch
        fast = timed(lambda: a * 2.5, torch.hologram.synchronize)
        driver._raw_launch = None
        slow = timed(lambda: a * 2.5, torch.hologram.synchronize)
        driver._raw_launch = raw
        ref = timed(lambda: g * 2.5, torch.cuda.synchronize)
        print(f"  ctypes {fast:.1f} us, cuda-bindings {slow:.1f} us, torch CUDA {ref:.1f} us",
              flush=True)
        return same(a * 2.5, a.cpu() * 2.5)

if which in ("all", "compile"):
    @case("torch.compile: a training step's regions run on the GPU with eager's values")
    def _():
        import statistics

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                                    torch.nn.Linear(2048, 512)).to(D)
        x, y = torch.randn(256, 512, device=D), torch.randn(256, 512, device=D)

        def step(m):
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            return loss

        hologram_torch.reset_compile_stats()
        compiled = torch.compile(model, backend="hologram")
        want = step(model)
        grads = [(p.grad.clone(), p) for p in model.parameters()]
        got = step(compiled)  # (its backward adds the same gradients again)
        stats = hologram_torch.compile_stats()
        if stats["eager_fallbacks"] or stats["programs"] < 2:
            return f"regions did not compile for the GPU: {stats}"
        if not torch.allclose(got.cpu(), want.cpu(), rtol=1e-4):
            return f"loss {got.item()} vs eager {want.item()}"
        if not all(torch.allclose(2 * g.cpu(), p.grad.cpu(), rtol=1e-3, atol=1e-5)
                   for g, p in grads):
            return "gradients differ from eager's"

        def timed(m):
            for _ in range(3):
                step(m)
            torch.hologram.synchronize()
            samples = []
            for _ in range(7):
                t0 = time.perf_counter()
                for _ in range(5):
                    step(m)
                torch.hologram.synchronize()
                samples.append((time.perf_counter() - t0) / 5 * 1e3)
            return statistics.median(samples)

        print(f"  step: eager {timed(model):.2f} ms, compiled {timed(compiled):.2f} ms",
              flush=True)
        return True

    @case("torch.compile: a CPU scalar input and an index check on the GPU")
    def _():
        f = torch.compile(lambda a, s: torch.relu(a * s + 1).sum(1), backend="hologram")
        a = torch.randn(64, 33)
        for s in (0.5, 2.0):
            r = same(f(a.to(D), torch.tensor(s)), torch.relu(a * s + 1).sum(1))
            if r is not True:
                return r
        g = torch.compile(lambda x, i: torch.gather(x, 1, i), backend="hologram")
        try:
            g(a.to(D), torch.tensor([[0, 40]]).expand(64, 2).to(D))
        except RuntimeError as e:
            return True if "out of bounds" in str(e) else str(e)
        return "no error for an index out of range"

fails = [r for r in results if not r.startswith("PASS")]
print(f"SUMMARY {len(results) - len(fails)}/{len(results)} passed", flush=True)
out = os.environ.get("OUT")
if out:
    with open(os.path.join(out, f"checks_{which}.txt"), "w") as f:
        f.write("\n".join(results) + "\n")
