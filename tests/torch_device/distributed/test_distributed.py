"""torch.distributed on the hologram device (``hologram_torch.distributed``), in real
processes on localhost.

The ranks are copies of this file (``python
tests/torch_device/distributed/test_distributed.py CASE RANK WORLD INIT_METHOD
BACKEND``) running the worker function ``CASES[CASE]`` in a process group; each stage of
a case prints a line once its checks passed, and the tests look for those lines (a
case's last stage breaks its group on purpose: a mismatched collective, a rank that
dies). Every subprocess has a wall-clock limit, and every process group a short timeout:
a broken collective fails a test, it never hangs CI.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PG_TIMEOUT_S = 20  # the process groups' timeout (gloo's deadline for every call)
RUN_TIMEOUT_S = 120  # the wall-clock limit of one test's processes


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               HOLOGRAM_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env.update(extra or {})
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(case: str, world: int, *, init: str = "file", backend: str = "hologram",
            env: dict | None = None, timeout: float = RUN_TIMEOUT_S):
    """Run ``case`` on ``world`` ranks; returns ``[(returncode, output)]`` by rank and the
    seconds the slowest took. Kills every rank if the limit passes (and fails)."""
    with tempfile.TemporaryDirectory() as tmp:
        init_method = (f"file://{tmp}/store" if init == "file"
                       else f"tcp://127.0.0.1:{_free_port()}")
        procs = [subprocess.Popen(
            [sys.executable, __file__, case, str(rank), str(world), init_method, backend],
            cwd=tmp, env=_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True) for rank in range(world)]
        start = time.monotonic()
        results = []
        try:
            for p in procs:
                left = max(1.0, timeout - (time.monotonic() - start))
                out, _ = p.communicate(timeout=left)
                results.append((p.returncode, out))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            outputs = [p.communicate()[0] for p in procs]
            pytest.fail(f"{case} on {world} ranks ran past {timeout} s:\n"
                        + "\n".join(o[-2000:] for o in outputs))
        return results, time.monotonic() - start


def _ranks_printed(results, marker: str) -> None:
    for rank, (code, out) in enumerate(results):
        assert marker in out, f"rank {rank} (exit {code}) never printed {marker!r}:\n{out[-4000:]}"


# Each launch runs several stages, the last of which breaks its process group on purpose
# (a mismatched collective, a rank that dies): starting processes is most of the cost here
# (each imports torch and hologram_torch), so the tests below share launches.

@pytest.fixture(scope="module")
def two_ranks_detail():
    """2 ranks, FileStore, backend="hologram", TORCH_DISTRIBUTED_DEBUG=DETAIL (torch's
    cross-rank check wraps gloo): every collective, then a mismatched all_reduce."""
    return _launch("collectives_then_mismatch_detail", 2, init="file", backend="hologram",
                   env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})


@pytest.fixture(scope="module")
def four_ranks():
    """4 ranks, TCPStore, "cpu:gloo,hologram:hologram": every collective (fewer dtypes),
    then a mismatched all_reduce that gloo itself meets."""
    return _launch("collectives_then_mismatch", 4, init="tcp",
                   backend="cpu:gloo,hologram:hologram")


@pytest.fixture(scope="module")
def ddp_run():
    """2 ranks, TCPStore: DDP training checks, then rank 1 dies mid-training."""
    return _launch("ddp_then_rank_dies", 2, init="tcp")


def test_collectives_two_ranks_file_store(two_ranks_detail):
    results, _ = two_ranks_detail
    _ranks_printed(results, "collectives: all passed")


def test_collectives_four_ranks_tcp_store(four_ranks):
    results, _ = four_ranks
    _ranks_printed(results, "collectives: all passed")


def test_mismatched_shapes_give_torchs_error_with_debug_detail(two_ranks_detail):
    """With TORCH_DISTRIBUTED_DEBUG=DETAIL torch checks every collective across ranks
    (as it does for its own backends): each rank raises torch's mismatch error."""
    results, _ = two_ranks_detail
    _ranks_printed(results, "mismatch: torch's error")
    assert [code for code, _ in results] == [0, 0]


def test_mismatched_shapes_end_every_rank_as_gloo_does(four_ranks):
    """Without the debug check gloo itself meets the mismatch, as with CPU tensors: a rank
    that receives more than it expects aborts in gloo's thread ("Received data size
    doesn't match expected size"), its peers get gloo's connection errors -- all within
    the timeout, never a hang."""
    results, elapsed = four_ranks
    output = "\n".join(out for _, out in results)
    assert "Received data size doesn't match expected size" in output, output[-4000:]
    for code, out in results:
        assert code != 0 or "mismatch: gloo's error" in out, out[-4000:]
    assert elapsed < RUN_TIMEOUT_S


def test_ddp_matches_single_process_training(ddp_run):
    results, _ = ddp_run
    _ranks_printed(results, "DDP mlp matches the single-process run")
    _ranks_printed(results, "DDP transformer matches the single-process run")
    _ranks_printed(results, "DDP options: checked")
    from hologram_torch import native  # the ranks build or load the same hooks

    if native.active():
        _ranks_printed(results, "DDP find_unused_parameters matches the single-process run")
        _ranks_printed(results, "DDP static_graph matches the single-process run")
    else:
        _ranks_printed(results, "DDP unused parameters: refused without native hooks")
    _ranks_printed(results, "checkpoint: loaded on every rank")


def test_a_rank_dying_mid_training_fails_the_others_quickly(ddp_run):
    (code0, out0), (code1, out1) = ddp_run[0]
    assert code1 == 3, out1[-4000:]  # the rank that died
    assert code0 == 0, out0[-4000:]  # rank 0 caught the error, in time (it checks)
    assert "rank 0 saw:" in out0 and "Connection" in out0, out0[-4000:]


@pytest.mark.parametrize("backend", ["cuda", "webgpu"])
def test_collectives_and_ddp_on_gpu_memory(backend):
    """The process group on device tensors in GPU memory, which host code cannot read:
    the cuda emulation's, and webgpu's on lavapipe (two processes on the one emulated
    adapter); two ranks, gloo staging through host copies."""
    if backend == "cuda":
        pytest.importorskip("triton")
    else:
        from hologram.backends.webgpu.backend import WebGpuBackend

        if not (WebGpuBackend.is_available() or os.environ.get("HOLOGRAM_REQUIRE_WEBGPU")):
            pytest.skip("no WebGPU adapter (apt-get install mesa-vulkan-drivers libvulkan1)")
    results, _ = _launch("gpu_memory", 2, env={"HOLOGRAM_CUDA_EMULATE": "1",
                                               "HOLOGRAM_TORCH_BACKEND": backend})
    _ranks_printed(results, "GPU memory: collectives passed")
    _ranks_printed(results, "GPU memory: DDP matches the single-process run")


def test_each_rank_on_its_own_device():
    """Code written for one GPU per rank (``set_device(rank)``, ``hologram:<rank>``,
    ``DDP(device_ids=[rank])``) on two host-memory devices (HOLOGRAM_TORCH_DEVICES=2)."""
    from hologram_torch import native

    if not native.active():
        pytest.skip(f"several devices need the device's native library: {native.reason()}")
    results, _ = _launch("rank_devices", 2, env={"HOLOGRAM_TORCH_DEVICES": "2",
                                                 "HOLOGRAM_TORCH_BACKEND": "cpu"})
    _ranks_printed(results, "own device: DDP matches the single-process run")


TEARDOWNS = 300


def test_groups_set_up_used_and_torn_down_in_a_loop_never_hang():
    """Group setups, DDP steps and teardowns, the DDP model freed only after its group is
    destroyed (its reducer then frees the group, with the GIL held, while gloo's thread
    may be letting go of the last call): before gloo's calls were kept until gloo's thread
    let go of them, about one run in three of 300 such teardowns hung. Also: the calls
    kept stay few."""
    results, _ = _launch("teardowns", 2, init="file")
    _ranks_printed(results, f"teardowns: {TEARDOWNS} done")


def test_torchrun_example():
    """examples/ddp_train.py as users run it: torchrun, env:// rendezvous, 2 processes."""
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", str(ROOT / "examples" / "ddp_train.py"), "--steps", "3"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "rank 0/2" in done.stdout and "rank 1/2" in done.stdout, done.stdout
    assert "parameters identical on every rank" in done.stdout, done.stdout


def test_benchmark_runs_on_tiny_sizes():
    """hologram.bench.dev.distributed end to end (its 2 workers, every row checked)."""
    from hologram.bench.dev import distributed

    result = distributed.run(quick=True, sizes=distributed.TINY_SIZES,
                             timeout=RUN_TIMEOUT_S)
    assert [r["check"] for r in result["rows"]] == ["ok"] * 4, result["rows"]
    assert "no fallback" in result["rows"][2]["note"], result["rows"][2]
    assert "| all_reduce 1 MiB f32 | device tensor, hologram |" in distributed.table(result)
    # make bench-dev's report carries it as a section (or says why it is missing)
    from hologram.bench.dev import run

    section = "\n".join(run._distributed_section(result))
    assert distributed.table(result) in section and "2 processes" in section, section
    assert "Skipped" in run._distributed_section(None)[1]
    assert "**Failed**: `RuntimeError: x`" in run._distributed_section(
        {"error": "RuntimeError: x"})[1]


# --- the workers -----------------------------------------------------------------------
# Everything below runs in the launched processes (imports of torch are local to them, so
# that collecting this file stays cheap).

DEVICE = "hologram"


def _worker_dtypes(torch):
    return [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
            torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool, torch.uint16,
            torch.uint32, torch.uint64, torch.float8_e4m3fn]


def _values(torch, rank: int, dtype, n: int, shift: int):
    """Small per-rank values, exact in every dtype: sums and products of 4 ranks' values
    stay exact, so gloo's order of operations cannot change a result."""
    v = (torch.arange(n) * (rank + 2) + rank + 3 * shift) % 4
    if dtype == torch.bool:
        return (v % 2 == 1)
    if dtype.is_signed or dtype.is_floating_point:
        v = v - 1
    return v.to(dtype)


def _collective_calls(torch, dist, rank: int, world: int):
    """``{name: fn(make, group, op) -> result tensors}``: each collective once, on the
    tensors ``make(shift, n)`` creates (on one device, of one dtype)."""
    n = 6

    def all_reduce(make, group, op):
        t = make(0, n)
        dist.all_reduce(t, op=op, group=group)
        return [t]

    def broadcast(make, group, op):
        t = make(0, n)
        dist.broadcast(t, src=world - 1, group=group)
        return [t]

    def reduce(make, group, op):
        t = make(0, n)
        dist.reduce(t, dst=1 % world, op=op, group=group)
        return [t] if rank == 1 % world else []  # elsewhere the contents are unspecified

    def all_gather(make, group, op):
        outs = [make(9, n) for _ in range(world)]
        dist.all_gather(outs, make(0, n), group=group)
        return outs

    def all_gather_into_tensor(make, group, op):
        out = make(9, n * world)
        dist.all_gather_into_tensor(out, make(0, n), group=group)
        return [out]

    def reduce_scatter(make, group, op):
        out = make(9, n)
        dist.reduce_scatter(out, [make(j, n) for j in range(world)], op=op, group=group)
        return [out]

    def reduce_scatter_tensor(make, group, op):
        out = make(9, n)
        dist.reduce_scatter_tensor(out, make(0, n * world), op=op, group=group)
        return [out]

    def all_to_all(make, group, op):
        outs = [make(9, n) for _ in range(world)]
        dist.all_to_all(outs, [make(j, n) for j in range(world)], group=group)
        return outs

    def all_to_all_single(make, group, op):
        # uneven splits: rank r sends r + j + 1 elements to rank j
        sizes = [rank + j + 1 for j in range(world)]
        out = make(9, sum(sizes))
        dist.all_to_all_single(out, make(0, sum(sizes)), sizes, sizes, group=group)
        return [out]

    def gather(make, group, op):
        outs = [make(9, n) for _ in range(world)] if rank == 0 else None
        dist.gather(make(0, n), outs, dst=0, group=group)
        return outs or []

    def scatter(make, group, op):
        out = make(9, n)
        ins = [make(j, n) for j in range(world)] if rank == world - 1 else None
        dist.scatter(out, ins, src=world - 1, group=group)
        return [out]

    def send_recv(make, group, op):
        out = make(9, n)
        works = [dist.isend(make(0, n), (rank + 1) % world, group=group),
                 dist.irecv(out, (rank - 1) % world, group=group)]
        for w in works:
            w.wait()
        return [out]

    def batch_send_recv(make, group, op):
        out = make(9, n)
        ops = [dist.P2POp(dist.isend, make(1, n), (rank + 1) % world, group),
               dist.P2POp(dist.irecv, out, (rank - 1) % world, group)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return [out]

    R = dist.ReduceOp
    reductions = [R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]
    return {
        "all_reduce": (all_reduce, reductions),
        "reduce": (reduce, [R.SUM, R.MAX]),
        "reduce_scatter": (reduce_scatter, [R.SUM, R.AVG, R.MIN]),
        "reduce_scatter_tensor": (reduce_scatter_tensor, [R.SUM, R.AVG, R.MAX]),
        "broadcast": (broadcast, [None]),
        "all_gather": (all_gather, [None]),
        "all_gather_into_tensor": (all_gather_into_tensor, [None]),
        "all_to_all": (all_to_all, [None]),
        "all_to_all_single": (all_to_all_single, [None]),
        "gather": (gather, [None]),
        "scatter": (scatter, [None]),
        "send_recv": (send_recv, [None]),
        "batch_isend_irecv": (batch_send_recv, [None]),
    }


def _expect_refusal(dtype, op, torch, dist) -> str | None:
    """The error the backend must raise for ``dtype`` and reduction ``op`` (None: none)."""
    R = dist.ReduceOp
    if op is None:
        return None
    if op == R.AVG and not dtype.is_floating_point:
        return "ReduceOp.AVG"
    if dtype == torch.float8_e4m3fn:
        return "cannot reduce"
    if dtype == torch.uint64 and op in (R.MIN, R.MAX):
        return "cannot reduce"
    return None


def _case_collectives(torch, dist, rank: int, world: int) -> None:
    """Every collective on hologram tensors equals the same collective on CPU tensors
    through plain gloo (``dist.new_group(backend="gloo")``); dtypes gloo lacks are checked
    against gloo on int64 copies of the same values, AVG against gloo's SUM / world."""
    import hologram_torch
    from hologram_torch.distributed import GLOO_DTYPES

    gloo = dist.new_group(backend="gloo")
    R = dist.ReduceOp
    dtypes = _worker_dtypes(torch)
    if world > 2:  # every path once more at 4 ranks: native, bit-view, widened, refused
        dtypes = [torch.float32, torch.bfloat16, torch.int16, torch.uint64]
    hologram_torch.reset_fallback_stats()
    checked = 0
    for name, (fn, ops) in _collective_calls(torch, dist, rank, world).items():
        for dtype in dtypes:
            for op in ops:
                what = f"{name} {dtype} {op}"
                if op in (R.BAND, R.BOR, R.BXOR) and dtype.is_floating_point:
                    continue  # bitwise ops are for integers

                def make(shift, n, device, as_dtype=dtype, dtype=dtype):
                    return _values(torch, rank, dtype, n, shift).to(as_dtype).to(device)

                refusal = _expect_refusal(dtype, op, torch, dist)
                if refusal:
                    for device in (DEVICE, "cpu"):
                        try:
                            fn(lambda s, n, device=device: make(s, n, device), None, op)
                        except hologram_torch.compat.UnsupportedError as e:
                            assert refusal in str(e), (what, str(e))
                        else:
                            raise AssertionError(f"{what} on {device}: no error")
                    continue
                ours = fn(lambda s, n: make(s, n, DEVICE), None, op)
                ours_cpu = fn(lambda s, n: make(s, n, "cpu"), None, op)
                if dtype in GLOO_DTYPES and op != R.AVG:
                    ref = fn(lambda s, n: make(s, n, "cpu"), gloo, op)
                elif op == R.AVG:
                    ref = [t.to(dtype) for t in fn(
                        lambda s, n: make(s, n, "cpu", torch.float64), gloo, R.SUM)]
                    ref = [(t.double() / world).to(dtype) for t in ref]
                else:
                    ref = [t.to(dtype) for t in fn(
                        lambda s, n: make(s, n, "cpu", torch.int64), gloo, op)]
                assert len(ours) == len(ours_cpu) == len(ref), what
                for d, c, r in zip(ours, ours_cpu, ref):
                    assert d.device.type == DEVICE and d.dtype == dtype, what
                    assert torch.equal(d.cpu(), c), (what, d.cpu(), c)
                    if op == R.AVG:  # a sum divided: one rounding may differ
                        assert torch.allclose(c.double(), r.double(), rtol=1e-2), (what, c, r)
                    else:
                        assert torch.equal(c, r), (what, c, r)
                checked += 1
    assert checked > (200 if world == 2 else 60), checked
    _check_in_place_zero_copy(torch, dist, rank, world)
    _check_async(torch, dist, rank, world)
    _check_coalesced(torch, dist, rank, world)
    _check_objects_and_barrier(torch, dist, rank, world)
    _check_subgroup(torch, dist, rank, world)
    # Every collective ran on the device's own memory: none went through the CPU fallback
    # (which would mean an op of ours ran outside gloo on a copy).
    assert hologram_torch.fallback_stats(lacking=False) == {}, hologram_torch.fallback_stats()
    print(f"rank {rank}: collectives: all passed ({checked} cases)", flush=True)


def _check_in_place_zero_copy(torch, dist, rank: int, world: int) -> None:
    # a view into the middle of a device tensor, and a strided one: results land in the
    # device memory they view, nothing around them moves, no new memory
    base = torch.full((4, 8), -7.0, device=DEVICE)
    row = base[1, 2:6]
    ptr = row.data_ptr()
    row.copy_(torch.arange(4.0) + rank)
    dist.all_reduce(row)
    expected = torch.full((4, 8), -7.0)
    expected[1, 2:6] = torch.arange(4.0) * world + sum(range(world))
    assert row.data_ptr() == ptr
    assert torch.equal(base.cpu(), expected), base.cpu()
    column = base[:, 0]  # not contiguous
    dist.broadcast(column, src=0)
    assert torch.equal(base.cpu(), expected)
    # views with gaps are reduced, gathered and received element by element: exactly
    # their elements change, nothing around them
    grid = torch.arange(24.0, device=DEVICE).reshape(4, 6) * (rank + 1)
    before = grid.cpu()
    dist.all_reduce(grid[:, 1])
    dist.all_reduce(grid[1:, ::2], op=dist.ReduceOp.MAX)
    expected = before.clone()
    expected[:, 1] = before[:, 1] / (rank + 1) * sum(range(1, world + 1))
    expected[1:, ::2] = before[1:, ::2] / (rank + 1) * world
    assert torch.equal(grid.cpu(), expected), (grid.cpu(), expected)
    gathered = torch.zeros(world, 6, device=DEVICE)
    dist.all_gather([gathered[i, ::2] for i in range(world)], grid[0, ::2])
    for i in range(world):
        assert torch.equal(gathered[i, ::2].cpu(), before[0, ::2] / (rank + 1) * (i + 1))
        assert torch.equal(gathered[i, 1::2].cpu(), torch.zeros(3))
    if world == 2:
        box = torch.zeros(3, 4, device=DEVICE)
        if rank == 0:
            dist.send(torch.arange(12.0, device=DEVICE).reshape(3, 4)[:, 1], dst=1)
            dist.send(torch.arange(12.0, device=DEVICE).reshape(3, 4)[:, 3], dst=1)
        else:
            dist.recv(box[:, 2], src=0)
            assert dist.recv(box[:, 0]) == 0  # from any source
            assert torch.equal(box.cpu()[:, 2], torch.tensor([1.0, 5.0, 9.0]))
            assert torch.equal(box.cpu()[:, 0], torch.tensor([3.0, 7.0, 11.0]))
            assert box.cpu().sum() == 36


def _check_async(torch, dist, rank: int, world: int) -> None:
    R = dist.ReduceOp
    t = torch.full((5,), float(rank + 1), device=DEVICE)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert work.is_completed()
    assert torch.equal(t.cpu(), torch.full((5,), float(sum(range(1, world + 1)))))
    # futures report the caller's device tensors, through every kind of Work
    for op, dtype in ((R.SUM, torch.float32), (R.AVG, torch.float32), (R.SUM, torch.int16)):
        t = torch.full((3,), rank + 1, dtype=dtype, device=DEVICE)
        work = dist.all_reduce(t, op=op, async_op=True)
        value = work.get_future().wait()
        total = sum(range(1, world + 1))
        want = torch.full((3,), total / world if op == R.AVG else total).to(dtype)
        assert value[0].device.type == DEVICE and value[0].data_ptr() == t.data_ptr()
        assert torch.equal(t.cpu(), want), (op, dtype, t.cpu())
        work.wait()
    out = torch.empty(2, device=DEVICE)
    work = dist.reduce_scatter_tensor(out, torch.ones(2 * world, device=DEVICE), op=R.AVG,
                                      async_op=True)  # gloo's Work has no future here
    assert work.get_future().wait()[0].data_ptr() == out.data_ptr()
    assert torch.equal(out.cpu(), torch.ones(2))


def _check_coalesced(torch, dist, rank: int, world: int) -> None:
    from torch.distributed.distributed_c10d import _coalescing_manager

    a = torch.full((3,), float(rank), device=DEVICE)
    b = torch.full((2,), rank + 1, dtype=torch.int64, device=DEVICE)
    with _coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b, op=dist.ReduceOp.MAX)  # the first call's op holds for all
    cm.wait()
    assert torch.equal(a.cpu(), torch.full((3,), float(sum(range(world)))))
    assert torch.equal(b.cpu(), torch.full((2,), sum(range(1, world + 1))))
    outs = [torch.empty(2 * world, device=DEVICE) for _ in range(2)]
    with _coalescing_manager():
        for k, out in enumerate(outs):
            dist.all_gather_into_tensor(out, torch.full((2,), float(rank + k), device=DEVICE))
    for k, out in enumerate(outs):
        assert torch.equal(out.cpu(), (torch.arange(world).repeat_interleave(2) + k).float())
    outs = [torch.empty(2, device=DEVICE) for _ in range(2)]
    with _coalescing_manager():
        for k, out in enumerate(outs):
            dist.reduce_scatter_tensor(out, torch.full((2 * world,), float(k), device=DEVICE))
    for k, out in enumerate(outs):
        assert torch.equal(out.cpu(), torch.full((2,), float(k * world)))
    # the older form: each call issued at once, _end_coalescing waits for all of them
    c = torch.ones(4, device=DEVICE)
    with _coalescing_manager(device=torch.device(DEVICE)):
        dist.broadcast(c, src=0)
        dist.all_reduce(c)
    assert torch.equal(c.cpu(), torch.full((4,), float(world)))


def _check_objects_and_barrier(torch, dist, rank: int, world: int) -> None:
    objects = [{"from": rank}]
    dist.broadcast_object_list(objects, src=world - 1)
    assert objects == [{"from": world - 1}]
    gathered = [None] * world
    dist.all_gather_object(gathered, ("rank", rank))
    assert gathered == [("rank", r) for r in range(world)]
    dist.barrier()


def _check_subgroup(torch, dist, rank: int, world: int) -> None:
    """A group of the even ranks (another hologram group, over their ranks only)."""
    evens = list(range(0, world, 2))
    group = dist.new_group(ranks=evens)
    if rank in evens:
        t = torch.full((3,), float(rank), device=DEVICE)
        dist.all_reduce(t, group=group)
        assert torch.equal(t.cpu(), torch.full((3,), float(sum(evens))))
    dist.barrier()


def _training_models(torch):
    """(name, builder, batch maker, loss, accumulate?) for the two DDP models."""

    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(),
                                   torch.nn.Linear(32, 16), torch.nn.ReLU(),
                                   torch.nn.Linear(16, 1))

    def mlp_batch(g):
        return torch.randn(8, 12, generator=g), torch.randn(8, 1, generator=g)

    def mlp_loss(model, x, y):
        return torch.nn.functional.mse_loss(model(x), y)

    class TinyTransformer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(11, 16)
            layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0,
                                                     batch_first=True)
            self.encoder = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
            self.head = torch.nn.Linear(16, 11)

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens)))

    def tokens_batch(g):
        tokens = torch.randint(0, 11, (4, 5), generator=g)
        return tokens, torch.randint(0, 11, (4, 5), generator=g)

    def tokens_loss(model, x, y):
        logits = model(x)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 11), y.reshape(-1))

    # (the MLP accumulates over two micro-batches under no_sync; the transformer syncs
    # every backward: one batch shape each keeps the kernels to compile few)
    return [("mlp", mlp, mlp_batch, mlp_loss, True),
            ("transformer", TinyTransformer, tokens_batch, tokens_loss, False)]


def _case_ddp(torch, dist, rank: int, world: int) -> None:
    """Each rank trains on its share of every batch; after the steps the parameters equal
    a single-process run on the full batches (float32 reduction-order tolerance; the
    single process runs on the CPU, whose results the device's kernels match)."""
    import copy

    from torch.nn.parallel import DistributedDataParallel as DDP

    steps = 3
    trained = {}
    for name, build, batch, loss_fn, accumulate in _training_models(torch):
        torch.manual_seed(0)
        reference = build()  # on the CPU: no compiles for the full batch's shapes
        model = copy.deepcopy(reference).to(DEVICE)
        if rank != 0:  # DDP must broadcast rank 0's initial weights
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
        # small buckets: the gradients travel in several all_reduces
        ddp = DDP(model, bucket_cap_mb=0.002)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(1)
        for _ in range(steps):
            x, y = batch(g)
            share = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
            opt.zero_grad()
            if accumulate:  # two halves of the share, gradients synced on the second
                half = (share.stop - share.start) // 2
                first = slice(share.start, share.start + half)
                second = slice(share.start + half, share.stop)
                with ddp.no_sync():
                    (loss_fn(ddp, x[first].to(DEVICE), y[first].to(DEVICE)) / 2).backward()
                (loss_fn(ddp, x[second].to(DEVICE), y[second].to(DEVICE)) / 2).backward()
            else:
                loss_fn(ddp, x[share].to(DEVICE), y[share].to(DEVICE)).backward()
            opt.step()
            ref_opt.zero_grad()
            loss_fn(reference, x, y).backward()
            ref_opt.step()
        for (pname, p), q in zip(ddp.module.named_parameters(), reference.parameters()):
            assert p.device.type == DEVICE
            # torch.testing.assert_close would import DTensor: seconds per process
            assert torch.allclose(p.detach().cpu(), q.detach().cpu(), rtol=1e-5, atol=1e-6), (
                name, pname, (p.detach().cpu() - q.detach().cpu()).abs().max())
        print(f"rank {rank}: DDP {name} matches the single-process run", flush=True)
        trained[name] = (ddp, build)
    _check_checkpoint(torch, dist, rank, *trained["mlp"])
    print(f"rank {rank}: checkpoint: loaded on every rank", flush=True)
    _check_ddp_options(torch, dist, rank, world)
    print(f"rank {rank}: DDP options: checked", flush=True)


def _check_ddp_options(torch, dist, rank: int, world: int) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    class Counting(torch.nn.Module):
        """A buffer each rank changes on its own in forward."""

        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.register_buffer("seen", torch.zeros(1))

        def forward(self, x):
            self.seen += 1 + rank  # ranks disagree until DDP broadcasts rank 0's buffers
            return self.linear(x)

    torch.manual_seed(0)
    ddp = DDP(Counting().to(DEVICE), broadcast_buffers=True, gradient_as_bucket_view=True)
    for step in range(3):
        ddp.zero_grad()
        ddp(torch.full((2, 4), float(rank + step), device=DEVICE)).sum().backward()
        # every forward started from rank 0's buffer (step), then added 1 + rank
        assert ddp.module.seen.item() == step + 1 + rank, ddp.module.seen
        for p in ddp.module.parameters():
            gathered = [torch.empty_like(p.grad) for _ in range(world)]
            dist.all_gather(gathered, p.grad)
            assert all(torch.equal(gathered[0].cpu(), o.cpu()) for o in gathered)
    # a communication hook (fp16 compression: casts on the device, futures chained on
    # the backend's Work) gives the average of the ranks' gradients
    import copy

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    local = torch.nn.Linear(4, 4).to(DEVICE)
    hooked = DDP(copy.deepcopy(local))
    hooked.register_comm_hook(None, default_hooks.fp16_compress_hook)
    x = torch.full((2, 4), float(rank + 1), device=DEVICE)
    hooked(x).sum().backward()
    local(x).sum().backward()
    for p, q in zip(hooked.module.parameters(), local.parameters()):
        want = q.grad.clone()
        dist.all_reduce(want, op=dist.ReduceOp.AVG)
        assert p.grad.device.type == DEVICE
        assert torch.allclose(p.grad.cpu(), want.cpu(), rtol=1e-3), (p.grad.cpu(), want)
    # find_unused_parameters and static_graph (the native hooks' pinned memory) ...
    _check_unused_parameters(torch, dist, rank, world)


def _branchy(torch):
    """A trunk and three heads: forward takes one head; "never" is used by no rank."""

    class Branchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk = torch.nn.Linear(6, 8)
            self.heads = torch.nn.ModuleDict({name: torch.nn.Linear(8, 1)
                                              for name in ("a", "b", "never")})

        def forward(self, x, head):
            return self.heads[head](torch.tanh(self.trunk(x)))

    return Branchy


def _check_unused_parameters(torch, dist, rank: int, world: int) -> None:
    """DDP(find_unused_parameters=True) with ranks taking different heads each step, and
    DDP(static_graph=True) with one head always unused: on device tensors, the
    parameters after the steps equal a single-process run on the full batches, and the
    same DDP on CPU tensors in the same group (torch's own reducer on the CPU); a head no
    rank used has no gradient, as on the CPU. Without the native hooks (no C++ compiler)
    both options are refused up front, naming the fix."""
    import copy

    from torch.nn.parallel import DistributedDataParallel as DDP

    import hologram_torch
    from hologram_torch import native

    if not native.active():
        for option in ("find_unused_parameters", "static_graph"):
            try:
                DDP(torch.nn.Linear(4, 4).to(DEVICE), **{option: True})
            except hologram_torch.compat.UnsupportedError as e:
                assert f"{option}=True" in str(e) and "g++" in str(e), str(e)
            else:
                raise AssertionError(f"DDP({option}=True) without native hooks accepted")
        print(f"rank {rank}: DDP unused parameters: refused without native hooks",
              flush=True)
        return
    steps = 4
    for option, heads in (("find_unused_parameters", ("a", "b")), ("static_graph", ("a",))):
        torch.manual_seed(0)
        reference = _branchy(torch)()
        runs = {device: copy.deepcopy(reference).to(device) for device in (DEVICE, "cpu")}
        ddps = {device: DDP(model, bucket_cap_mb=0.0005, **{option: True})
                for device, model in runs.items()}
        opts = {device: torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
                for device, ddp in ddps.items()}
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(2)
        for step in range(steps):
            x, y = torch.randn(4 * world, 6, generator=g), torch.randn(4 * world, 1, generator=g)

            def head(r, step=step, heads=heads):  # ranks differ where there are two
                return heads[(step + r) % len(heads)]

            share = slice(4 * rank, 4 * rank + 4)
            for device, ddp in ddps.items():
                opts[device].zero_grad()
                out = ddp(x[share].to(device), head(rank))
                torch.nn.functional.mse_loss(out, y[share].to(device)).backward()
                opts[device].step()
            ref_opt.zero_grad()
            losses = [torch.nn.functional.mse_loss(reference(x[4 * r:4 * r + 4], head(r)),
                                                   y[4 * r:4 * r + 4]) for r in range(world)]
            (sum(losses) / world).backward()  # DDP averages the ranks' gradients
            ref_opt.step()
        named = {device: dict(ddp.module.named_parameters()) for device, ddp in ddps.items()}
        for name, q in reference.named_parameters():
            p, c = named[DEVICE][name], named["cpu"][name]
            assert p.device.type == DEVICE
            assert torch.allclose(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6), (
                option, name, (p.detach().cpu() - q.detach()).abs().max())
            assert torch.allclose(p.detach().cpu(), c.detach(), rtol=1e-5, atol=1e-6), (
                option, name)
            assert (p.grad is None) == (c.grad is None) == (q.grad is None), (option, name)
        assert named[DEVICE]["heads.never.weight"].grad is None
        print(f"rank {rank}: DDP {option} matches the single-process run", flush=True)


def _check_checkpoint(torch, dist, rank: int, ddp, build) -> None:
    """rank 0 saves the trained model; every rank loads the file, onto the device or the
    CPU, into a fresh model equal to its own."""
    import os

    path = os.path.join(os.getcwd(), "checkpoint.pt")
    if rank == 0:
        torch.save(ddp.module.state_dict(), path)
    dist.barrier()
    for location in (DEVICE, "cpu", None):
        fresh = build().to(DEVICE)
        fresh.load_state_dict(torch.load(path, map_location=location))
        for p, q in zip(fresh.parameters(), ddp.module.parameters()):
            assert p.device.type == DEVICE
            assert torch.equal(p.detach().cpu(), q.detach().cpu())
    dist.barrier()


def _case_collectives_then_mismatch_detail(torch, dist, rank: int, world: int) -> None:
    _case_collectives(torch, dist, rank, world)
    t = torch.ones(4 + rank, device=DEVICE)
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        assert "Detected mismatch between collectives" in str(e), str(e)
        print(f"rank {rank}: mismatch: torch's error", flush=True)
    else:
        raise AssertionError("a mismatched all_reduce passed")


def _case_collectives_then_mismatch(torch, dist, rank: int, world: int) -> None:
    import os

    _case_collectives(torch, dist, rank, world)
    try:
        dist.all_reduce(torch.ones(4 + 1000 * rank, device=DEVICE))
    except RuntimeError as e:
        print(f"rank {rank}: mismatch: gloo's error: {e}"[:400], flush=True)
        os._exit(0)  # the group is broken: skip destroy_process_group
    # the rank gloo aborts never gets here; one that does must hear of the mismatch
    raise AssertionError("a mismatched all_reduce passed")


def _case_ddp_then_rank_dies(torch, dist, rank: int, world: int) -> None:
    import os

    from torch.nn.parallel import DistributedDataParallel as DDP

    _case_ddp(torch, dist, rank, world)
    ddp = DDP(torch.nn.Linear(4, 4).to(DEVICE))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    start = time.monotonic()
    try:
        for step in range(20):
            if rank == 1 and step == 3:
                os._exit(3)  # no goodbye: the connection just closes
            opt.zero_grad()
            ddp(torch.randn(2, 4, device=DEVICE)).sum().backward()
            opt.step()
    except RuntimeError as e:
        print(f"rank {rank} saw: {e}"[:600], flush=True)
        assert time.monotonic() - start < PG_TIMEOUT_S
        os._exit(0)  # the group is broken: skip destroy_process_group
    raise AssertionError("training went on without rank 1")


def _case_teardowns(torch, dist, rank: int, world: int) -> None:
    import datetime

    from torch.nn.parallel import DistributedDataParallel as DDP

    from hologram_torch.distributed import process_group

    # A group is never torn down before every rank has finished connecting to it: gloo
    # (ours as torch's own) retries a connection the other rank's teardown refused until
    # the group's timeout, or fails with "Connection closed by peer".
    dist.barrier()
    dist.destroy_process_group()  # the launch's group; each round makes its own
    device = torch.device(DEVICE, 0)
    most_kept = 0
    for i in range(TEARDOWNS):
        dist.init_process_group("hologram", init_method=f"{_INIT_METHOD}-{i}", rank=rank,
                                world_size=world, device_id=device,
                                timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
        # assigned, not deleted: the last round's model goes after its group is destroyed
        ddp = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                      torch.nn.Linear(16, 4)).to(device))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            ddp(torch.randn(4, 8, device=device)).sum().backward()
            opt.step()
        t = torch.ones(3, device=device)
        dist.all_reduce(t)
        assert t.tolist() == [world] * 3
        most_kept = max(most_kept, len(process_group._KEPT))
        dist.destroy_process_group()
    del ddp, opt
    # gloo's calls are let go of once done (a round issues a handful)
    assert 0 < most_kept < 100, most_kept
    print(f"teardowns: {TEARDOWNS} done", flush=True)
    dist.init_process_group("hologram", init_method=f"{_INIT_METHOD}-last", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    dist.barrier()  # for _worker's destroy_process_group (see above)


def _case_gpu_memory(torch, dist, rank: int, world: int) -> None:
    """Collectives and DDP on GPU memory (the cuda emulation's, webgpu's: memory the host
    cannot read): gloo works on host copies, and what it writes lands back on the
    device."""
    import hologram_torch
    from hologram_torch import memory

    x = torch.arange(6.0, device=DEVICE) * (rank + 1)
    # (emulated device handles; webgpu's buffer ids above a 32-bit offset)
    handle = x.data_ptr() >> (55 if hologram_torch.get_backend() == "cuda" else 32)
    assert not memory.host_memory() and handle >= 1, hex(x.data_ptr())
    dist.all_reduce(x)
    assert x.cpu().tolist() == [v * world * (world + 1) / 2 for v in range(6)], x.cpu()
    y = torch.full((3,), float(rank), device=DEVICE)
    dist.broadcast(y, world - 1)
    assert y.cpu().tolist() == [world - 1.0] * 3
    parts = [torch.empty(2, device=DEVICE) for _ in range(world)]
    dist.all_gather(parts, torch.full((2,), float(rank), device=DEVICE))
    assert [p.cpu().tolist() for p in parts] == [[float(r)] * 2 for r in range(world)]
    whole = torch.arange(8.0, device=DEVICE)
    dist.all_reduce(whole[1:5])  # a view: only its elements of the storage change
    assert whole.cpu().tolist() == [0.0, *(world * v for v in (1.0, 2.0, 3.0, 4.0)), 5.0,
                                    6.0, 7.0]
    print(f"rank {rank}: GPU memory: collectives passed", flush=True)
    _ddp_like_one_process(torch, rank, world, torch.device(DEVICE, 0), torch.nn.ReLU())
    print(f"rank {rank}: GPU memory: DDP matches the single-process run", flush=True)


def _ddp_like_one_process(torch, rank: int, world: int, device, activation,
                          **options) -> None:
    """Two SGD steps of a small MLP under DDP on ``device`` (each rank on its share of
    the batch) give the parameters one process gives on the whole batch; outputs,
    parameters and gradients stay on ``device``."""
    import copy

    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), activation, torch.nn.Linear(8, 2))
    ddp = DDP(copy.deepcopy(reference).to(device), **options)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    xs, ys = torch.randn(8, 4, generator=torch.Generator().manual_seed(1)), torch.randn(8, 2)
    share = slice(rank * 8 // world, (rank + 1) * 8 // world)
    for _ in range(2):
        opt.zero_grad()
        out = ddp(xs[share].to(device))
        assert out.device == device, out.device
        torch.nn.functional.mse_loss(out, ys[share].to(device)).backward()
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(xs), ys).backward()
        ref_opt.step()
    for p, q in zip(ddp.module.parameters(), reference.parameters()):
        assert p.device == device and p.grad.device == device
        assert torch.allclose(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6), (p, q)


def _case_rank_devices(torch, dist, rank: int, world: int) -> None:
    """DDP with each rank on hologram:<rank>, as with one GPU per rank."""
    torch.hologram.set_device(rank)
    device = torch.device(DEVICE, rank)
    x = torch.ones(3, device=DEVICE) * (rank + 1)  # the current device
    assert x.device == device, x.device
    dist.all_reduce(x)
    assert x.device == device and x.cpu().tolist() == [3.0] * 3, (x.device, x.cpu())
    _ddp_like_one_process(torch, rank, world, device, torch.nn.Tanh(), device_ids=[rank])
    print(f"rank {rank}: own device: DDP matches the single-process run", flush=True)


CASES = {
    "rank_devices": _case_rank_devices,
    "gpu_memory": _case_gpu_memory,
    "collectives_then_mismatch_detail": _case_collectives_then_mismatch_detail,
    "collectives_then_mismatch": _case_collectives_then_mismatch,
    "ddp_then_rank_dies": _case_ddp_then_rank_dies,
    "teardowns": _case_teardowns,
}
_INIT_METHOD = ""  # the launch's (a case making groups of its own derives theirs)


def _worker(case: str, rank: int, world: int, init_method: str, backend: str) -> None:
    import datetime
    import warnings

    import torch
    import torch.distributed as dist

    import hologram_torch  # noqa: F401 (registers the device and the backend)

    global _INIT_METHOD
    _INIT_METHOD = init_method
    warnings.simplefilter("ignore", FutureWarning)  # torch's deprecated collective names
    # the DDP run binds the group to the device, as scripts written for CUDA do
    bound = {"device_id": torch.device(DEVICE, 0)} if case.startswith("ddp") else {}
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=PG_TIMEOUT_S), **bound)
    CASES[case](torch, dist, rank, world)
    dist.destroy_process_group()


if __name__ == "__main__":
    _case, _rank, _world, _init, _backend = sys.argv[1:6]
    _worker(_case, int(_rank), int(_world), _init, _backend)
