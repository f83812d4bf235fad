"""Training steps on ``torch.device('hologram')`` and with ``hologram_torch.nn`` against
PyTorch's CPU eager, in one process.

    python -m hologram.bench.dev.training [--quick] [--json FILE] [--profile [CASE]]
                                          [--first-step]

Same method as :mod:`hologram.bench.dev.cpu`: Hologram and PyTorch interleaved round by
round, medians. One timed call is one whole training step, ``zero_grad`` + forward + loss +
backward + ``optimizer.step`` (Adam), on a fixed batch. Cases:

- ``mlp``: Linear 256->512, GELU, Linear 512->512, ReLU, Linear 512->1 on a batch of 64,
  MSE loss: the model on the ``hologram`` device against the same model on the CPU, and
  the same MLP built from ``hologram_torch.nn`` modules on CPU tensors (Hologram kernels
  run zero-copy on CPU memory; Adam stays PyTorch's) against ``torch.nn`` on the CPU.
- ``transformer``: embedding, 2 ``nn.TransformerEncoderLayer`` (d_model 64, 4 heads, ff 128,
  dropout 0, batch_first), linear head, cross-entropy; batch 16 x sequence 32.
- ``cnn``: the MobileNet-style CNN of the first-step rows (below), batch 8 of 3x32x32.
- ``gru``: a GRU language model: embedding 32, one ``nn.GRU`` layer of 64, linear head,
  cross-entropy; batch 16 x sequence 32.

Then ``autocast``: one ``nn.TransformerEncoderLayer`` (d_model 256, 8 heads, ff 1024,
dropout 0, batch_first) trained on a batch of 8 x 128 random embeddings (loss: the mean
square of its output) on the device under ``torch.autocast('hologram',
dtype=torch.bfloat16)`` against the same step in float32 on the device (the baseline
column); its check compares two autocast losses with ``torch.autocast('cpu')``'s (1e-2
relative: both compute the products in bfloat16).

Then the inference of the same four models: the forward pass in eval mode under
``torch.no_grad()`` at batch 32 (the outputs read back), the outputs checked against the
CPU's.

Before timing, two steps from the same initial weights must give the same losses on both
sides (within 1e-4 relative; the second loss checks the first update), and one warm step
is recorded with :func:`hologram_torch.fallback_stats` (ops that ran on the CPU through the
fallback: they cost a copy and a dispatch each, and explain much of the numbers) and the
number of native kernel calls (``runner.run``) it made.

**First step** (:func:`first_step`): the first training step of ``transformer`` and of
``cnn`` (a small MobileNet-style CNN: strided, depthwise and pointwise convolutions with
batch norm and ReLU6, average pool, linear head; batch 8 of 3x32x32, cross-entropy) in a
fresh process, where every kernel is compiled or loaded at first use: with an empty cache
directory (``cold``), then again in another fresh process on the cache the first one left
(``warm``). ``ms`` is wall time, ``cpu ms`` the process's CPU time (on a loaded machine the
wall time includes waits for a time slice, the CPU time does not). The same process first
runs one step of the model on PyTorch's CPU (``torch ms``), which pays PyTorch's own
first-use costs (Adam imports ``torch._dynamo``), so the device's step is left with
Hologram's. Rows with ``HOLOGRAM_QUICK_COMPILE=0`` compile everything at the full tier,
as before the quick tier existed (docs/performance.md, "First step").

``peak MB`` is the most memory one warm step held beyond what it started with (weights,
gradients and Adam's state exist already): the device's by its allocator's peak, the CPU's
by PyTorch's profiler's allocation events.

``ratio`` is ``cpu_ms / hologram_ms`` (medians): above 1 means the Hologram side was faster.
The fastest single step of each side is listed too: on a loaded machine medians include
waits for a time slice, and ``run`` records the 1-minute load average before and after.
``--profile mlp`` prints a cProfile of device MLP steps, sorted by own time.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time

from hologram.bench import stats
from hologram.bench.dev import cpu

RTOL = 1e-4
# Untimed steps before every sample: three thread pools share the cores here (PyTorch's
# OpenMP, OpenBLAS's for Hologram's matmuls, Hologram's own), and a pool still spinning
# from the other side's steps (OpenBLAS's longest) slows the next steps by multiples.
WARM_S = 0.1
SIZES = {
    "mlp": {"features": 256, "hidden": 512, "batch": 64},
    "transformer": {"vocab": 32, "d_model": 64, "heads": 4, "ff": 128, "layers": 2,
                    "batch": 16, "seq": 32},
    "cnn": {"batch": 8, "image": 32, "classes": 10},
    "gru": {"vocab": 32, "embed": 32, "hidden": 64, "batch": 16, "seq": 32},
    "autocast": {"d_model": 256, "heads": 8, "ff": 1024, "batch": 8, "seq": 128},
}
#: The training rows' models, in order (``mlp`` also has a hologram_torch.nn row); then the
#: inference rows of the same models.
TRAINING_CASES = ("mlp", "transformer", "cnn", "gru")
#: The batch of the inference rows (at the full sizes; the tiny ones keep their own).
INFERENCE_BATCH = 32
# Small enough for a test: the same code paths, a fraction of the time.
TINY_SIZES = {
    "mlp": {"features": 16, "hidden": 32, "batch": 8},
    "transformer": {"vocab": 8, "d_model": 16, "heads": 2, "ff": 32, "layers": 1,
                    "batch": 2, "seq": 6},
    "cnn": {"batch": 2, "image": 8, "classes": 3},
    "gru": {"vocab": 8, "embed": 8, "hidden": 16, "batch": 2, "seq": 6},
    "autocast": {"d_model": 16, "heads": 2, "ff": 32, "batch": 2, "seq": 6},
}
#: How close the device's bfloat16 autocast losses are to the CPU's.
AUTOCAST_RTOL = 1e-2


def _mlp(torch, nn, s):
    return torch.nn.Sequential(nn.Linear(s["features"], s["hidden"]), nn.GELU(),
                               nn.Linear(s["hidden"], s["hidden"]), nn.ReLU(),
                               nn.Linear(s["hidden"], 1))


def _token_model(torch, s):
    class TokenModel(torch.nn.Module):
        """Embedding -> encoder layers -> vocabulary logits."""

        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(s["vocab"], s["d_model"])
            layer = torch.nn.TransformerEncoderLayer(
                s["d_model"], s["heads"], dim_feedforward=s["ff"], dropout=0.0,
                batch_first=True)
            self.encoder = torch.nn.TransformerEncoder(layer, s["layers"],
                                                       enable_nested_tensor=False)
            self.head = torch.nn.Linear(s["d_model"], s["vocab"])

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens)))

    return TokenModel()


def _cnn(torch, s):
    """A small MobileNet-style network (see the module docstring)."""
    nn = torch.nn

    def block(channels_in, channels_out, stride=1, groups=1, kernel=3):
        return [nn.Conv2d(channels_in, channels_out, kernel, stride, kernel // 2,
                          groups=groups, bias=False),
                nn.BatchNorm2d(channels_out), nn.ReLU6()]

    return nn.Sequential(*block(3, 16, 2), *block(16, 16, groups=16),
                         *block(16, 32, kernel=1), *block(32, 32, 2, groups=32),
                         *block(32, 64, kernel=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(64, s["classes"]))


def _gru(torch, s):
    """A GRU language model: embedding -> one GRU layer -> vocabulary logits."""
    class GruModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(s["vocab"], s["embed"])
            self.gru = torch.nn.GRU(s["embed"], s["hidden"], batch_first=True)
            self.head = torch.nn.Linear(s["hidden"], s["vocab"])

        def forward(self, tokens):
            return self.head(self.gru(self.embed(tokens))[0])

    return GruModel()


def cnn_inputs(torch, s):
    torch.manual_seed(0)
    x = torch.randn(s["batch"], 3, s["image"], s["image"])
    return x, torch.randint(0, s["classes"], (s["batch"],))


def _case(torch, case: str, s: dict):
    """(model, loss function, inputs, targets) of ``case`` at sizes ``s``, seeded."""
    if case == "mlp":
        x, y = mlp_inputs(torch, s)
        torch.manual_seed(1)
        return _mlp(torch, torch.nn, s), torch.nn.functional.mse_loss, x, y
    if case == "cnn":
        x, y = cnn_inputs(torch, s)
        torch.manual_seed(1)
        return _cnn(torch, s), torch.nn.functional.cross_entropy, x, y
    x, y = transformer_inputs(torch, s)  # token ids: the transformer's and the GRU's
    torch.manual_seed(1)

    def loss_fn(logits, target):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, s["vocab"]),
                                                 target.reshape(-1))

    return (_gru if case == "gru" else _token_model)(torch, s), loss_fn, x, y


def _stepper(torch, model, loss_fn, x, y):
    """One training step on a fixed batch, returning the loss tensor."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step


def _check(hologram_losses: list[float], cpu_losses: list[float]) -> str:
    for i, (h, c) in enumerate(zip(hologram_losses, cpu_losses)):
        if not abs(h - c) <= RTOL * abs(c):
            return f"MISMATCH at step {i}: loss {h:.6g} vs CPU {c:.6g}"
    return "ok"


def _losses(step, steps: int = 2) -> list[float]:
    return [step().item() for _ in range(steps)]


def _one_step_costs(step) -> tuple[dict[str, int], int]:
    """(fallback ops and their calls, native kernel calls) of one (warm) step."""
    import hologram_torch
    from hologram_torch.aten import runner

    step()  # compile whatever the step needs first
    calls = [0]
    run = runner.run

    def counting(*args, **kwargs):
        calls[0] += 1
        return run(*args, **kwargs)

    hologram_torch.reset_fallback_stats()
    runner.run = counting
    try:
        step()
    finally:
        runner.run = run
    stats = hologram_torch.fallback_stats()
    hologram_torch.reset_fallback_stats()
    return stats, calls[0]


def _note(fallbacks: dict[str, int], kernels: int) -> str:
    total = sum(fallbacks.values())
    if not fallbacks:
        return f"{kernels} kernel calls, no fallback"
    top = ", ".join(f"{op.removeprefix('aten::')} x{n}" for op, n in fallbacks.items())
    return f"{kernels} kernel calls; {total} fallback calls ({len(fallbacks)} ops: {top})"


def _row(case, hologram, hologram_ms, baseline, cpu_ms, check, note, fallbacks, kernels,
         best_us, peak_mb=None):
    return {"case": case, "hologram": hologram, "hologram_ms": round(hologram_ms, 3),
            "peak_mb": list(peak_mb) if peak_mb else None,
            "baseline": baseline, "cpu_ms": round(cpu_ms, 3),
            # three significant digits: ratios far below 1 keep their precision too
            "ratio": float(f"{cpu_ms / hologram_ms:.3g}"),
            "best_ms": [round(us / 1e3, 3) for us in best_us], "check": check, "note": note,
            "fallbacks": fallbacks, "kernel_calls": kernels}


def _interleaved(steps, settings) -> tuple[list[float], list[float]]:
    """(median µs, fastest µs) per step function, by :func:`hologram.bench.stats.interleaved`.

    The fastest single call is kept too: on a loaded machine a median step can include
    waits for whole time slices of the scheduler, the fastest rarely does."""
    best = [float("inf")] * len(steps)

    def timed(i, step):
        def call():
            start = time.perf_counter()
            step()
            best[i] = min(best[i], (time.perf_counter() - start) * 1e6)
        return call

    medians = stats.interleaved([(timed(i, s), ()) for i, s in enumerate(steps)], settings,
                              warm_s=WARM_S)
    return medians, best


def _peak_mb(torch, step, device: bool) -> float:
    """The most memory one (warm) ``step`` held at once beyond what it started with, in
    MB: the device's by its allocator's peak statistic; the CPU's by the allocations and
    frees PyTorch's profiler records (its memory events, in order)."""
    step()  # warm: Adam's state exists, every kernel is compiled
    if device:
        torch.hologram.synchronize()
        torch.hologram.reset_peak_memory_stats()
        start = torch.hologram.memory_allocated()
        step()
        torch.hologram.synchronize()
        return round((torch.hologram.max_memory_allocated() - start) / 1e6, 3)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    held = peak = 0
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    for e in sorted(events, key=lambda e: e.start_ns()):
        held += e.nbytes()
        peak = max(peak, held)
    return round(peak / 1e6, 3)


def _device_case(torch, model, loss_fn, x, y):
    """(device step, CPU step, check, fallbacks, kernel calls, peak MB of the device and
    the CPU step) for a model on both sides."""
    from hologram_torch import lazy

    device = torch.device("hologram")
    dx, dy = x.to(device), y.to(device)
    check = _check(_losses(_stepper(torch, copy.deepcopy(model).to(device), loss_fn, dx, dy)),
                   _losses(_stepper(torch, copy.deepcopy(model), loss_fn, x, y)))
    recorded = _stepper(torch, copy.deepcopy(model).to(device), loss_fn, dx, dy)

    def dev_step():
        # a step is done when its recorded ops have run (HOLOGRAM_LAZY=1; without it,
        # nothing is pending and this costs nothing)
        loss = recorded()
        torch.hologram.synchronize()
        return loss

    cpu_step = _stepper(torch, copy.deepcopy(model), loss_fn, x, y)
    fallbacks, kernels = _one_step_costs(dev_step)
    _settle(dev_step)
    peak = (_peak_mb(torch, dev_step, True), _peak_mb(torch, cpu_step, False))
    lazy.wait_for_compiles()
    return dev_step, cpu_step, check, fallbacks, kernels, peak


def _settle(step) -> None:
    """Run ``step`` until its code is in its final form, so that the timed steps are the
    ones after (the first steps are first_step's): recorded, the step's fused programs
    compile in the background from its second sighting; every program first compiled at
    the quick tier is built in full on a background thread after
    ``HOLOGRAM_PROMOTE_AFTER`` calls (timed meanwhile, a step would share the cores with
    that build)."""
    from hologram import config
    from hologram.backends.cpu import backend
    from hologram_torch import lazy

    lazy.wait_for_compiles()
    for _ in range(config.get().promote_after + 1):
        step()
    lazy.wait_for_compiles()
    backend.wait_for_promotions()


def _device() -> str:
    """The device rows' name: recorded execution (HOLOGRAM_LAZY=1) or op by op."""
    from hologram_torch import lazy

    return "hologram device (lazy)" if lazy.active() else "hologram device"


def mlp_inputs(torch, s):
    torch.manual_seed(0)
    x = torch.randn(s["batch"], s["features"])
    y = x[:, :1] * 0.5 + 0.1 * torch.randn(s["batch"], 1)
    return x, y


def bench_mlp(torch, settings, s) -> list[dict]:
    import hologram_torch as hgt

    x, y = mlp_inputs(torch, s)
    torch.manual_seed(1)
    model = _mlp(torch, torch.nn, s)
    mse = torch.nn.functional.mse_loss
    dev_step, cpu_step, check, fallbacks, kernels, peak = _device_case(torch, model, mse, x,
                                                                        y)

    # The same weights in hologram_torch.nn modules (same classes' state_dict keys).
    hg_model = _mlp(torch, hgt.nn, s)
    hg_model.load_state_dict(model.state_dict())
    hg_loss = hgt.nn.MSELoss()
    hg_check = _check(_losses(_stepper(torch, copy.deepcopy(hg_model), hg_loss, x, y)),
                      _losses(_stepper(torch, copy.deepcopy(model), mse, x, y)))
    hg_step = _stepper(torch, hg_model, hg_loss, x, y)
    _, hg_kernels = _one_step_costs(hg_step)

    (dev_us, hg_us, cpu_us), (dev_best, hg_best, cpu_best) = _interleaved(
        [dev_step, hg_step, cpu_step], settings)
    label = _label("mlp", s)
    return [
        _row(label, _device(), dev_us / 1e3, "CPU eager", cpu_us / 1e3, check,
             _note(fallbacks, kernels), fallbacks, kernels, (dev_best, cpu_best), peak),
        _row(label, "hologram_torch.nn on CPU tensors", hg_us / 1e3, "torch.nn on CPU",
             cpu_us / 1e3, hg_check,
             f"{hg_kernels} kernel calls (Linear, GELU, ReLU, MSELoss); Adam is PyTorch's",
             {}, hg_kernels, (hg_best, cpu_best)),
    ]


def transformer_inputs(torch, s):
    torch.manual_seed(0)
    x = torch.randint(0, s["vocab"], (s["batch"], s["seq"]))
    return x, (x + 1) % s["vocab"]  # predict the next token id


def _label(case: str, s: dict) -> str:
    if case == "mlp":
        return f"MLP {s['features']}-{s['hidden']}-{s['hidden']}-1, batch {s['batch']}"
    if case == "transformer":
        return (f"Transformer {s['layers']}x(d {s['d_model']}, {s['heads']} heads, "
                f"ff {s['ff']}), batch {s['batch']}x{s['seq']}")
    if case == "cnn":
        return f"CNN (MobileNet-style), batch {s['batch']}x3x{s['image']}x{s['image']}"
    if case == "autocast":
        return (f"Encoder layer (d {s['d_model']}, {s['heads']} heads, ff {s['ff']}), "
                f"batch {s['batch']}x{s['seq']}, bf16 autocast")
    return f"GRU LM (embed {s['embed']}, hidden {s['hidden']}), batch {s['batch']}x{s['seq']}"


def bench_model(torch, settings, case: str, s: dict) -> list[dict]:
    """The device's training step of ``case`` against CPU eager's."""
    model, loss_fn, x, y = _case(torch, case, s)
    dev_step, cpu_step, check, fallbacks, kernels, peak = _device_case(torch, model, loss_fn,
                                                                        x, y)
    (dev_us, cpu_us), (dev_best, cpu_best) = _interleaved([dev_step, cpu_step], settings)
    return [_row(_label(case, s), _device(), dev_us / 1e3, "CPU eager", cpu_us / 1e3, check,
                 _note(fallbacks, kernels), fallbacks, kernels, (dev_best, cpu_best), peak)]


def bench_autocast(torch, settings, s: dict) -> list[dict]:
    """The device's training step of an encoder layer under bfloat16 autocast against the
    same step in float32 on the device (see the module docstring)."""
    torch.manual_seed(0)
    x = torch.randn(s["batch"], s["seq"], s["d_model"])
    torch.manual_seed(1)
    layer = torch.nn.TransformerEncoderLayer(s["d_model"], s["heads"], s["ff"], dropout=0.0,
                                             batch_first=True)
    device = torch.device("hologram")
    dx = x.to(device)

    def stepper(where: str, low: bool):
        model = copy.deepcopy(layer).to(where)
        inputs = dx if where == "hologram" else x
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            optimizer.zero_grad()
            with torch.autocast(where, dtype=torch.bfloat16, enabled=low):
                loss = model(inputs).float().pow(2).mean()
            loss.backward()
            optimizer.step()
            if where == "hologram":
                torch.hologram.synchronize()
            return loss

        return step

    got, want = _losses(stepper("hologram", True)), _losses(stepper("cpu", True))
    check = "ok"
    for i, (h, c) in enumerate(zip(got, want)):
        if not abs(h - c) <= AUTOCAST_RTOL * abs(c):
            check = f"MISMATCH at step {i}: loss {h:.6g} vs CPU autocast {c:.6g}"
    low, full = stepper("hologram", True), stepper("hologram", False)
    fallbacks, kernels = _one_step_costs(low)
    _settle(low)
    _settle(full)
    peak = (_peak_mb(torch, low, True), _peak_mb(torch, full, True))
    (low_us, full_us), (low_best, full_best) = _interleaved([low, full], settings)
    return [_row(_label("autocast", s), _device(), low_us / 1e3, "hologram device, float32",
                 full_us / 1e3, check, _note(fallbacks, kernels), fallbacks, kernels,
                 (low_best, full_best), peak)]


def bench_inference(torch, settings, case: str, s: dict) -> list[dict]:
    """The forward pass of ``case`` in eval mode under ``torch.no_grad()`` (the outputs
    read back: synchronized) on the device against CPU eager; the check compares the
    outputs (1e-4 relative to their largest magnitude)."""
    model, _, x, _ = _case(torch, case, s)
    model.eval()
    device = torch.device("hologram")
    dev_model, dx = copy.deepcopy(model).to(device), x.to(device)

    def dev_forward():
        with torch.no_grad():
            out = dev_model(dx)
        torch.hologram.synchronize()
        return out

    def cpu_forward():
        with torch.no_grad():
            return model(x)

    want, got = cpu_forward(), dev_forward().cpu()
    scale = float(want.abs().max()) or 1.0
    error = float((got - want).abs().max()) / scale
    check = "ok" if error <= RTOL else f"MISMATCH: max error {error:.3g} of the largest output"

    fallbacks, kernels = _one_step_costs(dev_forward)
    _settle(dev_forward)
    (dev_us, cpu_us), (dev_best, cpu_best) = _interleaved([dev_forward, cpu_forward],
                                                          settings)
    return [_row(f"{_label(case, s)}, inference", _device(), dev_us / 1e3, "CPU eager",
                 cpu_us / 1e3, check, _note(fallbacks, kernels), fallbacks, kernels,
                 (dev_best, cpu_best))]


def run(quick: bool = False, sizes: dict | None = None) -> dict:
    """Every case: ``{"threads", "load_average", "rows"}``; ``sizes`` replaces
    :data:`SIZES` (e.g. :data:`TINY_SIZES` in the tests)."""
    import warnings

    torch = cpu.import_torch()
    if torch is None:
        return {"threads": None, "load_average": None, "rows": [],
                "skipped": "PyTorch is not installed"}
    import hologram_torch

    sizes = sizes or SIZES
    settings = cpu.Settings.make(quick)
    load_before = os.getloadavg()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hologram_torch.FallbackWarning)
        rows = bench_mlp(torch, settings, sizes["mlp"])
        for case in TRAINING_CASES[1:]:
            rows += bench_model(torch, settings, case, sizes[case])
        rows += bench_autocast(torch, settings, sizes["autocast"])
        for case in TRAINING_CASES:
            s = sizes[case] if sizes is not SIZES else dict(sizes[case], batch=INFERENCE_BATCH)
            rows += bench_inference(torch, settings, case, s)
    load_after = os.getloadavg()
    return {"threads": torch.get_num_threads(),
            "load_average": [round(v, 2) for v in (load_before[0], load_after[0])],
            "rows": rows, "first_step": first_step(quick, tiny=sizes is TINY_SIZES)}


def table(result: dict) -> str:
    lines = ["| case | hologram | hologram ms | baseline | baseline ms | ratio | fastest ms "
             "(hologram / baseline) | peak MB (hologram / baseline) | check | note |",
             "|" + "---|" * 10]
    for r in result["rows"]:
        best = " / ".join(str(v) for v in r["best_ms"])
        peak = " / ".join(str(v) for v in r["peak_mb"]) if r.get("peak_mb") else "-"
        lines.append(f"| {r['case']} | {r['hologram']} | {r['hologram_ms']} | {r['baseline']} "
                     f"| {r['cpu_ms']} | {r['ratio']} | {best} | {peak} | {r['check']} "
                     f"| {r['note']} |")
    if result.get("first_step"):
        lines += ["", "First training step in a fresh process, every kernel compiled (cold: "
                  "empty cache directory) or loaded from disk (warm); `cpu ms` is the "
                  "process's CPU time, `torch` a first CPU step in the same process "
                  "(docs/performance.md, \"First step\").", "",
                  first_step_table(result["first_step"])]
    return "\n".join(lines)


def profile(case: str = "mlp", steps: int = 20, top: int = 25) -> str:
    """cProfile of ``steps`` warm device training steps of ``case``, sorted by own time."""
    import cProfile
    import io
    import pstats
    import statistics
    import warnings

    torch = cpu.import_torch()
    import hologram_torch

    device = torch.device("hologram")
    model, loss_fn, x, y = _case(torch, case, SIZES[case])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hologram_torch.FallbackWarning)
        model = model.to(device)
        x, y = x.to(device), y.to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        phases = {"zero_grad": [], "forward + loss": [], "backward": [], "optimizer.step": []}
        profiler = cProfile.Profile()
        # Backward on this thread: the autograd engine otherwise runs a device's backward
        # on its own thread, where cProfile does not see the kernels' Python.
        with torch.autograd.set_multithreading_enabled(False):
            for i in range(steps + 2):
                if i == 2:
                    profiler.enable()
                t0 = time.perf_counter()
                optimizer.zero_grad()
                t1 = time.perf_counter()
                loss = loss_fn(model(x), y)
                t2 = time.perf_counter()
                loss.backward()
                t3 = time.perf_counter()
                optimizer.step()
                t4 = time.perf_counter()
                if i >= 2:
                    for name, t in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                        phases[name].append(t * 1e3)
        profiler.disable()
    out = io.StringIO()
    out.write(f"{case}: {steps} device steps (profiled), median ms per phase: "
              + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in phases.items())
              + "\n")
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


FIRST_STEP_CASES = ("transformer", "cnn")


def first_step_in_this_process(case: str, sizes: dict | None = None) -> dict:
    """One CPU step of ``case``, then the first step on the device, timed (the caller
    starts this process fresh and chooses its cache directory); then a second device
    step, which runs the code the first one compiled."""
    import warnings

    torch = cpu.import_torch()
    import hologram
    import hologram_torch
    from hologram.backends.cpu import backend

    s = (sizes or SIZES)[case]
    model, loss_fn, x, y = _case(torch, case, s)
    cpu_step = _stepper(torch, copy.deepcopy(model), loss_fn, x, y)
    start = time.perf_counter()
    cpu_step().item()
    torch_ms = (time.perf_counter() - start) * 1e3
    device = torch.device("hologram")
    before = hologram.cache_info()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hologram_torch.FallbackWarning)
        start, start_cpu = time.perf_counter(), time.process_time()
        step = _stepper(torch, model.to(device), loss_fn, x.to(device), y.to(device))
        loss = step().item()
        wall, process = time.perf_counter() - start, time.process_time() - start_cpu
        after = hologram.cache_info()
        promoted = backend.promotion_stats()["promoted"]
        start = time.perf_counter()
        step().item()
        second = time.perf_counter() - start
    return {"case": case, "ms": round(wall * 1e3, 1), "cpu_ms": round(process * 1e3, 1),
            "compiled": after["misses"] - before["misses"],
            "loaded": after["disk_hits"] - before["disk_hits"],
            "promoted": promoted, "second_ms": round(second * 1e3, 1),
            "torch_ms": round(torch_ms, 1), "loss": loss}


def _fresh_process(case: str, directory: str, quick_compile: bool, tiny: bool) -> dict:
    env = dict(os.environ, HOLOGRAM_CACHE_DIR=directory,
               HOLOGRAM_QUICK_COMPILE="1" if quick_compile else "0")
    env.pop("HOLOGRAM_DISABLE_DISK_CACHE", None)
    command = [sys.executable, "-m", "hologram.bench.dev.training", "--first-step-child",
               case] + (["--tiny"] if tiny else [])
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"first step of {case} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def first_step(quick: bool = False, tiny: bool = False) -> list[dict]:
    """The first step of each of :data:`FIRST_STEP_CASES`, cold and warm (see the module
    docstring), with the quick tier and (unless ``quick``) without it; ``tiny``: the
    :data:`TINY_SIZES` (tests)."""
    rows = []
    for case in FIRST_STEP_CASES:
        for quick_compile in (True,) if quick else (True, False):
            with tempfile.TemporaryDirectory(prefix="hologram-first-step-") as directory:
                cold = _fresh_process(case, directory, quick_compile, tiny)
                warm = _fresh_process(case, directory, quick_compile, tiny)
            rows.append({"case": case, "quick_compile": quick_compile, "cold": cold,
                         "warm": warm, "same_loss": cold["loss"] == warm["loss"]})
    return rows


def first_step_table(rows: list[dict]) -> str:
    lines = ["| model | HOLOGRAM_QUICK_COMPILE | kernels compiled | cold ms | cold cpu ms | "
             "warm ms | warm cpu ms | kernels loaded (warm) | 2nd step ms (cold) | "
             "torch first step ms | same loss |", "|" + "---|" * 11]
    for r in rows:
        c, w = r["cold"], r["warm"]
        lines.append(f"| {r['case']} | {int(r['quick_compile'])} | {c['compiled']} | {c['ms']} "
                     f"| {c['cpu_ms']} | {w['ms']} | {w['cpu_ms']} | {w['loaded']} "
                     f"| {c['second_ms']} | {c['torch_ms']} | {r['same_loss']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = cpu.cli(__doc__)
    parser.add_argument("--profile", nargs="?", const="mlp", choices=TRAINING_CASES,
                        help="print a cProfile of device steps of this case instead")
    parser.add_argument("--first-step", action="store_true",
                        help="only the first-step cases, each in fresh processes")
    parser.add_argument("--first-step-child", choices=FIRST_STEP_CASES,
                        help=argparse.SUPPRESS)
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.first_step_child:
        sizes = TINY_SIZES if args.tiny else None
        print(json.dumps(first_step_in_this_process(args.first_step_child, sizes)))
        return
    if args.first_step:
        rows = first_step(args.quick)
        cpu.report(first_step_table(rows), {"first_step": rows}, args.json)
        return
    if args.profile:
        print(profile(args.profile))
        return
    result = run(args.quick)
    cpu.report(f"threads: {result['threads']}, load average (1 min) before/after: "
               f"{result['load_average']}\n\n" + table(result), result, args.json)


if __name__ == "__main__":
    main()
