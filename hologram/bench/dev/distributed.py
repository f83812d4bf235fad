"""torch.distributed on ``torch.device('hologram')`` against plain gloo on CPU tensors,
on 2 local processes.

    python -m hologram.bench.dev.distributed [--quick] [--json FILE]

The command starts two worker processes (a FileStore rendezvous, one thread each), which
join a ``hologram`` process group and a plain ``gloo`` group over the same store, then run
every case on both, interleaved round by round (the order alternating), each sample
after a barrier on a third group; rank 0's medians are reported. Cases:

- ``all_reduce``: a 64 MiB float32 tensor (``--quick``: the same size, fewer rounds):
  a device tensor through the ``hologram`` backend (gloo on a zero-copy view) against a CPU
  tensor through plain gloo: target >= 0.95x the bandwidth. A second row sends CPU
  tensors through the ``hologram`` group (its Python wrapper's cost on gloo).
- ``ddp_mlp``: one ``DistributedDataParallel`` training step (zero_grad, forward, MSE,
  backward with the gradient all-reduce, SGD step) of the MLP of
  :mod:`hologram.bench.dev.training` (256-512-512-1, a global batch of 64, 32 per rank):
  the model on the device against the model on the CPU over plain gloo; and the same step
  of both without DDP, interleaved with them (what the step costs without communication).
  The DDP row's note counts one device step's kernel calls and CPU fallbacks.

Before timing, the all-reduce results are checked against the expected sums, and the
first two DDP losses of both sides must agree (1e-4 relative). ``ratio`` is
``cpu / hologram`` in time (so hologram's bandwidth over the CPU's), the median over rounds
of each round's ratio (a round's two samples are taken back to back, so the machine's
load drifting between rounds cancels out): above 1 means the device side was faster. The
fastest sample of each side is listed too: on a loaded machine medians include waits for
a time slice.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hologram.bench.dev import cpu, training

SIZES = {"all_reduce_bytes": 64 << 20, "mlp": training.SIZES["mlp"], "ddp_batch": 64}
# Small enough for a test: the same code paths, a fraction of the time.
TINY_SIZES = {"all_reduce_bytes": 1 << 20, "mlp": training.TINY_SIZES["mlp"], "ddp_batch": 8}
WORLD = 2
RUN_TIMEOUT_S = 900


def _rounds(quick: bool) -> dict:
    return {"all_reduce": 5 if quick else 31, "ddp": 10 if quick else 40, "warm": 3}


# --- the workers --------------------------------------------------------------------------

def _timed_rounds(dist, barrier, contestants, rounds: int) -> list[list[float]]:
    """ms per call of each of ``contestants``, interleaved, each sample after a barrier on
    the group ``barrier`` (every rank runs the same schedule: the calls are collectives).
    That group is neither side's, so that no side's gloo threads start out warmer."""
    samples: list[list[float]] = [[] for _ in contestants]
    order = list(range(len(contestants)))
    for _ in range(rounds):
        for i in order:
            dist.barrier(group=barrier)
            start = time.perf_counter()
            contestants[i]()
            samples[i].append((time.perf_counter() - start) * 1e3)
        order.reverse()
    return samples


def _paired_ratio(hologram: list[float], cpu: list[float]) -> float:
    """The median over rounds of ``cpu / hologram``: the two samples of a round are taken
    back to back, so a change of the machine's load between rounds cancels out."""
    return statistics.median(c / h for h, c in zip(hologram, cpu))


def _bench_all_reduce(torch, dist, gloo, barrier, rank: int, nbytes: int, rounds: dict
                      ) -> list[dict]:
    n = nbytes // 4
    device = torch.full((n,), float(rank + 1), device="hologram")
    host = torch.full((n,), float(rank + 1))
    host_ours = host.clone()
    dist.all_reduce(device)
    dist.all_reduce(host, group=gloo)
    dist.all_reduce(host_ours)
    total = float(sum(range(1, WORLD + 1)))
    ok = all(bool((t == total).all()) for t in (device.cpu(), host, host_ours))
    check = "ok" if ok else "wrong sums"
    # the values double every call from now on: 2**60 stays finite in float32
    calls = [lambda: dist.all_reduce(device), lambda: dist.all_reduce(host, group=gloo),
             lambda: dist.all_reduce(host_ours)]
    _timed_rounds(dist, barrier, calls, rounds["warm"])
    samples = _timed_rounds(dist, barrier, calls, rounds["all_reduce"])
    device_ms, gloo_ms, ours_ms = (statistics.median(s) for s in samples)
    device_best, gloo_best, ours_best = (min(s) for s in samples)
    mib = nbytes / (1 << 20)

    def row(case, hologram, ms, best, mine, target):
        ratio = _paired_ratio(mine, samples[1])
        return {"case": case, "hologram": hologram, "hologram_ms": round(ms, 2),
                "best_ms": [round(best, 2), round(gloo_best, 2)],
                "hologram_gb_s": round(nbytes / ms / 1e6, 3), "baseline": "CPU tensor, gloo",
                "cpu_ms": round(gloo_ms, 2), "cpu_gb_s": round(nbytes / gloo_ms / 1e6, 3),
                "ratio": round(ratio, 3), "target": target,
                "met": None if target is None else ratio >= target and check == "ok",
                "check": check}

    return [row(f"all_reduce {mib:g} MiB f32", "device tensor, hologram", device_ms,
                device_best, samples[0], 0.95),
            row(f"all_reduce {mib:g} MiB f32", "CPU tensor, hologram", ours_ms, ours_best,
                samples[2], None)]


def _bench_ddp(torch, dist, gloo, barrier, rank: int, s: dict, batch: int, rounds: dict
               ) -> list[dict]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    cpu_model = training._mlp(torch, torch.nn, s)
    models = {"device ddp": DDP(copy.deepcopy(cpu_model).to("hologram")),
              "cpu ddp": DDP(copy.deepcopy(cpu_model), process_group=gloo),
              "device local": copy.deepcopy(cpu_model).to("hologram"),
              "cpu local": cpu_model}
    share = batch // WORLD
    g = torch.Generator().manual_seed(1 + rank)
    x, y = torch.randn(share, s["features"], generator=g), torch.randn(share, 1, generator=g)
    steps = {}
    for name, model in models.items():
        device = "hologram" if name.startswith("device") else "cpu"
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        xs, ys = x.to(device), y.to(device)

        def step(model=model, opt=opt, xs=xs, ys=ys):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xs), ys)
            loss.backward()
            opt.step()
            return loss

        steps[name] = step
    losses = {name: training._losses(step) for name, step in steps.items()}
    checks = {side: training._check(losses[f"device {side}"], losses[f"cpu {side}"])
              for side in ("ddp", "local")}
    fallbacks, kernels = training._one_step_costs(steps["device ddp"])
    training._one_step_costs(steps["cpu ddp"])  # the same collectives on every rank
    contestants = list(steps.values())
    _timed_rounds(dist, barrier, contestants, rounds["warm"])
    samples = _timed_rounds(dist, barrier, contestants, rounds["ddp"])
    by_name = dict(zip(steps, samples))
    ms = {name: statistics.median(v) for name, v in by_name.items()}
    best = {name: min(v) for name, v in by_name.items()}

    def row(case, side, note):
        device_ms, cpu_ms = ms[f"device {side}"], ms[f"cpu {side}"]
        return {"case": case, "hologram": "device model", "hologram_ms": round(device_ms, 2),
                "best_ms": [round(best[f"device {side}"], 2), round(best[f"cpu {side}"], 2)],
                "hologram_gb_s": None, "baseline": "CPU model" + (", gloo" if side == "ddp"
                                                                  else ""),
                "cpu_ms": round(cpu_ms, 2), "cpu_gb_s": None,
                "ratio": round(_paired_ratio(by_name[f"device {side}"],
                                             by_name[f"cpu {side}"]), 3),
                "target": None, "met": None, "check": checks[side], "note": note}

    return [row(f"ddp_mlp step (batch {share} per rank)", "ddp",
                training._note(fallbacks, kernels)),
            row(f"the same step without DDP (batch {share})", "local",
                "no communication: the step's own cost")]


def worker(rank: int, store: str, out: str, quick: bool, sizes: dict) -> None:
    """One rank: join both groups, run every case, rank 0 writes the rows to ``out``."""
    import datetime
    import warnings

    import torch
    import torch.distributed as dist

    import hologram_torch

    torch.set_num_threads(1)
    dist.init_process_group("hologram", init_method=f"file://{store}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=120))
    gloo = dist.new_group(backend="gloo")
    barrier = dist.new_group(backend="gloo")
    rounds = _rounds(quick)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hologram_torch.FallbackWarning)
        rows = _bench_all_reduce(torch, dist, gloo, barrier, rank, sizes["all_reduce_bytes"],
                                 rounds)
        rows += _bench_ddp(torch, dist, gloo, barrier, rank, sizes["mlp"], sizes["ddp_batch"],
                           rounds)
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    dist.destroy_process_group()


# --- the command ------------------------------------------------------------------------

def run(quick: bool = False, sizes: dict | None = None, timeout: float = RUN_TIMEOUT_S
        ) -> dict:
    """Start the two workers and collect rank 0's rows: ``{"world", "threads",
    "load_average", "rows"}``; ``sizes`` replaces :data:`SIZES` (e.g. :data:`TINY_SIZES`
    in the tests). Workers still running after ``timeout`` seconds are killed."""
    if cpu.import_torch() is None:
        return {"world": WORLD, "rows": [], "skipped": "PyTorch is not installed"}
    sizes = sizes or SIZES
    env = dict(os.environ, HOLOGRAM_NUM_THREADS="1", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        args = [json.dumps(sizes), os.path.join(tmp, "store"), out, str(int(quick))]
        procs = [subprocess.Popen([sys.executable, "-m", "hologram.bench.dev.distributed",
                                   "--worker", str(rank),
                                   *args], env=env) for rank in range(WORLD)]
        try:
            codes = [p.wait(timeout=timeout) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if any(codes):
            raise RuntimeError(f"distributed benchmark workers exited with {codes}")
        rows = json.loads(Path(out).read_text())
    load_after = os.getloadavg()
    return {"world": WORLD, "threads": 1,
            "load_average": [round(load_before[0], 2), round(load_after[0], 2)],
            "rows": rows}


def table(result: dict) -> str:
    lines = ["| case | hologram | ms | GB/s | baseline | ms | GB/s | ratio | fastest ms "
             "(hologram / CPU) | target | met | check | note |", "|" + "---|" * 13]
    for r in result["rows"]:
        target = "" if r["target"] is None else f">= {r['target']}x"
        met = "" if r["target"] is None else "yes" if r["met"] else "**no**"
        lines.append(f"| {r['case']} | {r['hologram']} | {r['hologram_ms']} | "
                     f"{r['hologram_gb_s'] or ''} | {r['baseline']} | {r['cpu_ms']} | "
                     f"{r['cpu_gb_s'] or ''} | {r['ratio']} | "
                     f"{' / '.join(str(v) for v in r['best_ms'])} | {target} | {met} | "
                     f"{r['check']} | {r.get('note', '')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        rank, sizes, store, out, quick = argv[1:6]
        worker(int(rank), store, out, quick == "1", json.loads(sizes))
        return
    args = cpu.cli(__doc__).parse_args(argv)
    result = run(args.quick)
    cpu.report(f"{result['world']} processes, {result.get('threads')} thread each, load "
               f"average (1 min) before/after: {result.get('load_average')}\n\n"
               + table(result), result, args.json)


if __name__ == "__main__":
    main()
