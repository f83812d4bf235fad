"""GPU check: the cuda backend on buffers of 2**31 + 4096 elements (int64 indices).

    python3 tools/gpu/big_buffer.py            # from the repository root, on a GPU
    python3 tools/gpu/big_buffer.py --emulate  # the script itself, on a CPU: 16384 + 4096
                                          # elements, every kernel forced to int64
                                          # indices, in Triton's interpreter

render.py computes a kernel's indices in int64 where they may reach 2**31 (a buffer of
2**31 elements or more); this runs such kernels on the GPU and checks values near the
start and the end of each result (read through the device memory's ``read``, without
copying whole results back) against NumPy on the host copies of the inputs. One line per
case: PASS/FAIL, the first call's time (Triton's compile included) and a second call's.
Each case catches its own exceptions. About 14-25 GiB of GPU memory, 6 GiB of host
memory, well under a minute on an H200.
"""

from __future__ import annotations

import sys
import time
import traceback

import numpy as np

import hologram as hg
from hologram.frontend.graph import Graph

B = 2**31  # the first element index int32 cannot hold
N = B + 4096
SMALL = B - 4096  # the same add below 2**31: int32 indices, for the timing
EDGE = 4096  # elements checked at each end
RESULTS: list[tuple[str, bool]] = []


def periodic(pattern: np.ndarray, n: int) -> np.ndarray:
    """``pattern`` repeated to ``n`` elements (by doubling copies: fast, no index array)."""
    out = np.empty(n, pattern.dtype)
    filled = min(len(pattern), n)
    out[:filled] = pattern[:filled]
    while filled < n:
        step = min(filled, n - filled)
        out[filled:filled + step] = out[:step]
        filled += step
    return out


def sync_time(ex, fn) -> float:
    ex.synchronize()
    start = time.perf_counter()
    fn()
    ex.synchronize()
    return time.perf_counter() - start


def read(ex, buf, start: int, count: int) -> np.ndarray:
    """``count`` elements of ``buf`` from element ``start`` (a small copy to the host)."""
    ex.synchronize()
    out = np.empty(count, buf.dtype)
    ex.allocator.read(buf.handle + start * buf.dtype.itemsize, out)
    return out


def ends(ex, buf, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first and the last ``EDGE`` elements of ``buf`` (of ``n``)."""
    edge = min(EDGE, n)
    return read(ex, buf, 0, edge), read(ex, buf, n - edge, edge)


def timed(ex, program, inputs) -> tuple[list, float, float]:
    """``program`` (a Graph's) compiled for cuda and launched on ``inputs`` and fresh
    outputs, twice: the outputs, the first call's seconds (compile, allocation and
    launch) and the second's (the launch alone, on the same buffers)."""
    box = {}

    def first_call():
        outs = [ex.empty(p.shape, p.dtype.storage) for p in program.params[len(inputs):]]
        compiled = hg.compile(program, backend="cuda")
        handles = tuple(b.handle for b in (*inputs, *outs))
        box["outs"], box["go"] = outs, lambda: compiled.launch(handles)
        box["go"]()

    first = sync_time(ex, first_call)
    second = sync_time(ex, box["go"])
    return box["outs"], first, second


def rate(nbytes: int, seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms ({nbytes / seconds / 1e9:.0f} GB/s)"


def kernels_of(program) -> str:
    """The int64 marks of its cuda kernels: how many have int64 program ids, of how many."""
    info = hg.build(program, backend="cuda").metadata
    source = info["source"]
    wide = source.count("tl.program_id(0).to(tl.int64)")
    return f"{wide}/{len(info['kernels'])} kernels int64"


def case(name: str, fn) -> None:
    start = time.perf_counter()
    try:
        problem, detail = fn()
    except Exception as exc:  # one case's failure is a line, not the end of the run
        problem, detail = f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=6)
    took = time.perf_counter() - start
    ok = not problem
    RESULTS.append((name, ok))
    print(f"{'PASS' if ok else 'FAIL'} {name} ({took:.1f} s in all){'' if ok else ': ' + problem}",
          flush=True)
    if detail:
        print(f"     {detail}".replace("\n", "\n     ").rstrip(), flush=True)


def compare(got: np.ndarray, want: np.ndarray, what: str, rtol: float = 0.0) -> str:
    if got.shape != want.shape:
        return f"{what}: shape {got.shape} != {want.shape}"
    if rtol:
        bad = ~np.isclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=0)
    else:
        bad = got != want
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return f"{what}: {int(bad.sum())} differ, first at {i}: {got[i]!r} != {want[i]!r}"
    return ""


def main() -> int:
    global B, N, SMALL, EDGE
    if "--emulate" in sys.argv[1:]:
        import os

        os.environ["HOLOGRAM_CUDA_EMULATE"] = "1"
        from hologram.backends.cuda import render

        render.WIDE_INDICES = 0  # every kernel int64, as the big ones are
        B, EDGE = 16384, 1024
        N, SMALL = B + 4096, B - 4096
    t_all = time.perf_counter()
    ex = hg.Executor("cuda")
    print(f"hologram {hg.__version__} on {ex.backend} ({ex.device}); N = {N:,}", flush=True)
    # Inputs, made on the host once: int8 patterns of periods 251 and 13, values in
    # [-100, 120] and [-6, 6] (sums of a period are not 0); a's maximum 127 placed twice
    # past 2**31 (argmax: the first of them).
    t = time.perf_counter()
    a_host = periodic(((np.arange(251) * 37) % 221 - 100).astype(np.int8), N)
    b_host = periodic((np.arange(13) - 6).astype(np.int8), N)
    top = (N - 1000, N - 10)
    a_host[list(top)] = 127
    a = ex.from_numpy(a_host)
    b = ex.from_numpy(b_host)
    ex.synchronize()
    print(f"     inputs: 2 x {a_host.nbytes / 2**30:.1f} GiB made and copied in "
          f"{time.perf_counter() - t:.1f} s", flush=True)
    state: dict = {}

    def add_i8():
        c = ex.empty(N, np.int8)
        first = sync_time(ex, lambda: hg.ops.vector_add(ex, a, b, c))
        second = sync_time(ex, lambda: hg.ops.vector_add(ex, a, b, c))
        head, tail = ends(ex, c, N)
        want = a_host + b_host  # wraps in int8, as the ISA's add does
        problem = compare(head, want[:EDGE], "head") or compare(tail, want[-EDGE:], "tail")
        # the same add on 2**31 - 4096 elements (int32 indices), for the timing
        small = [x.prefix(SMALL) for x in (a, b, c)]
        narrow = sync_time(ex, lambda: hg.ops.vector_add(ex, *small))
        narrow = sync_time(ex, lambda: hg.ops.vector_add(ex, *small))
        problem = problem or compare(read(ex, c, SMALL - EDGE, EDGE),
                                     want[SMALL - EDGE:SMALL], "narrow tail")
        state["c"] = c
        return problem, (f"first {first:.2f} s, then {rate(3 * N, second)}; at 2**31 - 4096 "
                         f"(int32 indices) {rate(3 * SMALL, narrow)}")

    def cast_f32():
        g = Graph("big_cast")
        x = g.input("a", "i8", (N,))
        g.output("x", g.cast(x, "f32") * 0.5)
        program = g.program()
        (state["x"],), first, second = timed(ex, program, [a])
        head, tail = ends(ex, state["x"], N)
        want = a_host.astype(np.float32) * np.float32(0.5)
        problem = compare(head, want[:EDGE], "head") or compare(tail, want[-EDGE:], "tail")
        return problem, (f"{kernels_of(program)}; first {first:.2f} s, then "
                         f"{rate(5 * N, second)}")

    def sum_i8():
        got = {}
        first = sync_time(ex, lambda: got.__setitem__("s", hg.ops.sum(a)))
        second = sync_time(ex, lambda: hg.ops.sum(a))
        value = int(got["s"].to_numpy().reshape(-1)[0])
        want = int(a_host.sum(dtype=np.int64))
        problem = "" if value == want else f"sum {value} != {want}"
        small = a.prefix(SMALL)
        sync_time(ex, lambda: got.__setitem__("n", hg.ops.sum(small)))
        narrow = sync_time(ex, lambda: hg.ops.sum(small))
        value_n = int(got["n"].to_numpy().reshape(-1)[0])
        want_n = int(a_host[:SMALL].sum(dtype=np.int64))
        problem = problem or ("" if value_n == want_n else f"narrow sum {value_n} != {want_n}")
        return problem, (f"sum {value} (int64); first {first:.2f} s, then {rate(N, second)}; "
                         f"at 2**31 - 4096 (int32 indices) {rate(SMALL, narrow)}")

    def sum_f32():
        x = state["x"]
        got = {}
        first = sync_time(ex, lambda: got.__setitem__("s", hg.ops.sum(x)))
        second = sync_time(ex, lambda: hg.ops.sum(x))
        value = float(got["s"].to_numpy().reshape(-1)[0])
        want = 0.5 * float(a_host.sum(dtype=np.int64))  # exact: every term is a half
        problem = "" if abs(value - want) <= 1e-6 * abs(want) else f"sum {value!r} != {want!r}"
        return problem, (f"sum {value!r}, exact {want!r}; first {first:.2f} s, then "
                         f"{rate(4 * N, second)}")

    def argmax_max_i8():
        g = Graph("big_argmax")
        x = g.input("a", "i8", (N,))
        g.output("i", g.reduce("argmax", x, (0,), keepdim=False))
        g.output("m", g.reduce("max", x, (0,), keepdim=False))
        g.output("j", g.reduce("argmin", x, (0,), keepdim=False))
        program = g.program()
        outs, first, second = timed(ex, program, [a])
        i, m, j = (int(o.to_numpy().reshape(-1)[0]) for o in outs)
        want_j = int(np.argmin(a_host))
        problem = ("" if (i, m, j) == (top[0], 127, want_j) else
                   f"argmax {i} (want {top[0]}), max {m} (want 127), argmin {j} (want {want_j})")
        return problem, (f"argmax {i} = N - {N - i}, argmin {j}; {kernels_of(program)}; "
                         f"first {first:.2f} s, then {rate(3 * N, second)} (3 reads)")

    def strided_views():
        g = Graph("big_views")
        x = g.input("a", "i8", (N,))
        g.output("rev", x[::-1] + 1)  # negative stride, offset N - 1
        g.output("third", x[1::3] * 2)  # stride 3, offset 1
        g.output("tail", x[B - 8:])  # a slice starting at 2**31 - 8
        program = g.program()
        (rev, third, tail), first, second = timed(ex, program, [a])
        want_rev = a_host[::-1] + np.int8(1)
        n3 = third.size
        want_third = a_host[1::3] * np.int8(2)
        head, end = ends(ex, rev, N)
        problem = (compare(head, want_rev[:EDGE], "rev head")
                   or compare(end, want_rev[-EDGE:], "rev tail"))
        head, end = ends(ex, third, n3)
        problem = problem or (compare(head, want_third[:EDGE], "third head")
                              or compare(end, want_third[-EDGE:], "third tail"))
        problem = problem or compare(tail.to_numpy(), a_host[B - 8:], "tail slice")
        moved = 2 * N + N + 2 * n3  # reversed: read and write; step 3: its lines, its out
        return problem, (f"{kernels_of(program)}; first {first:.2f} s, then "
                         f"{rate(moved, second)}")

    def strided_f32():
        x = state["x"]
        g = Graph("big_strided_f32")
        v = g.input("x", "f32", (N,))
        g.output("y", v[N - 1::-2] + v[:N // 2][::-1] * 0.25)
        program = g.program()
        (y,), first, second = timed(ex, program, [x])
        xs = a_host.astype(np.float32) * np.float32(0.5)
        want = xs[N - 1::-2] + xs[:N // 2][::-1] * np.float32(0.25)
        head, end = ends(ex, y, y.size)
        problem = compare(head, want[:EDGE], "head") or compare(end, want[-EDGE:], "tail")
        return problem, (f"{kernels_of(program)}; first {first:.2f} s, then "
                         f"{rate(4 * N + 4 * y.size, second)}")

    def rows_max():
        rows, cols = N // 4096, 4096  # 524289 rows of 4096: a grid of rows, no split
        g = Graph("big_rows")
        x = g.input("a", "i8", (N,))
        g.output("m", g.reduce("max", x.reshape(rows, cols), (1,), keepdim=False))
        g.output("s", g.reduce("sum", g.cast(x.reshape(rows, cols), "i32"), (1,),
                               keepdim=False))
        program = g.program()
        outs, first, second = timed(ex, program, [a])
        m, s = (o.to_numpy() for o in outs)
        grid = a_host.reshape(rows, cols)
        problem = (compare(m, grid.max(1), "row max")
                   or compare(s, grid.sum(1, dtype=np.int64).astype(np.int32), "row sum"))
        return problem, (f"{kernels_of(program)}; first {first:.2f} s, then "
                         f"{rate(N, second)}")

    def gather_scatter():
        ids_host = np.array([0, 5, B - 1, B, B + 7, N - 1000, N - 1, -1, -N], np.int64)
        ids = ex.from_numpy(ids_host)
        g = Graph("big_gather")
        x = g.input("a", "i8", (N,))
        i = g.input("ids", "i64", ids_host.shape)
        g.output("y", g.gather(x, (i,), ids_host.shape))
        program = g.program()
        (y,), _, _ = timed(ex, program, [a, ids])
        problem = compare(y.to_numpy(), a_host[ids_host], "gather")
        # a scatter-add of 100 into a copy of b at the same places (the copy: 2**31 +
        # 4096 elements), then its ends and the places read back
        g = Graph("big_scatter")
        x = g.input("b", "i8", (N,))
        i = g.input("ids", "i64", ids_host.shape)
        g.output("z", g.scatter(x, (i,), 100, ids_host.shape, "add"))
        program2 = g.program()
        (z,), first, second = timed(ex, program2, [b, ids])
        want = b_host.copy()
        np.add.at(want, ids_host % N, np.int8(100))
        places = np.array([read(ex, z, int(k) % N, 1)[0] for k in ids_host])
        head, end = ends(ex, z, N)
        problem = problem or (compare(places, want[ids_host % N], "scatter places")
                              or compare(head, want[:EDGE], "scatter head")
                              or compare(end, want[-EDGE:], "scatter tail"))
        return problem, (f"{kernels_of(program)} (gather), {kernels_of(program2)} "
                         f"(scatter); scatter first {first:.2f} s, then "
                         f"{rate(2 * N, second)} (its copy)")

    def matmul_f16():
        rows, k, n = N // 2048, 2048, 16  # 1048578 x 2048 f16 (4 GiB) @ 2048 x 16
        g = Graph("big_matmul")
        x = g.input("a", "i8", (N,))
        w = g.input("w", "f16", (k, n))
        g.output("y", g.cast(x, "f16").reshape(rows, k) @ w)
        program = g.program()
        # small integers times 1/64: the products and their f32 sums are exact
        w_host = (np.random.default_rng(0).integers(-1, 2, (k, n)) / 64).astype(np.float16)
        wb = ex.from_numpy(w_host)
        (y,), first, second = timed(ex, program, [a, wb])
        pick = np.array([0, 1, 2, rows // 2, rows - 3, rows - 2, rows - 1])
        got = np.stack([read(ex, y, int(r) * n, n) for r in pick])
        want = (a_host.reshape(rows, k)[pick].astype(np.float32)
                @ w_host.astype(np.float32)).astype(np.float16)
        return compare(got.reshape(-1), want.reshape(-1), "rows", rtol=1e-3), \
            f"{kernels_of(program)}; first {first:.2f} s, then {second * 1e3:.1f} ms"

    case("add_i8 (hg.ops.vector_add, 2**31 + 4096 int8)", add_i8)
    case("cast_f32 (int8 -> float32 * 0.5, 8 GiB out)", cast_f32)
    case("sum_i8 (hg.ops.sum of int8 -> int64, split reduction)", sum_i8)
    case("sum_f32 (hg.ops.sum of 8 GiB float32)", sum_f32)
    case("argmax/max/argmin of int8 (split, indices past 2**31)", argmax_max_i8)
    case("strided int8 views (reversed, step 3, slice at 2**31 - 8)", strided_views)
    case("strided float32 views (step -2 from the end, reversed prefix)", strided_f32)
    case("row max/sum (524289 rows of 4096, no split)", rows_max)
    case("gather/scatter-add (int64 ids past 2**31)", gather_scatter)
    case("matmul f16 (1048578 x 2048 operand, 4 GiB)", matmul_f16)
    failed = [name for name, ok in RESULTS if not ok]
    print(f"{len(RESULTS) - len(failed)}/{len(RESULTS)} passed in "
          f"{time.perf_counter() - t_all:.1f} s" + (f"; FAILED: {failed}" if failed else ""),
          flush=True)
    ex.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
