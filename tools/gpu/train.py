"""One training case on one side, in its own process:

    python3 tools/gpu/train.py SIDE CASE [lazy] [tiny] [cpu]

SIDE: ``hologram`` (``torch.device('hologram')``, on cuda where HOLOGRAM_TORCH_BACKEND says
so) or ``torch`` (PyTorch CUDA eager; ``cpu``: its CPU). CASE: mlp, transformer, cnn, gru
(hologram.bench.dev.training's models at GPU sizes; ``tiny``: its tiny sizes). ``lazy``:
recorded execution, timed once the region's fused program has compiled. PyTorch's CUDA
backward must run in a process without the hologram device (pytorch/pytorch#161129).
Prints one line ``ROW {json}``: the first five losses, the first step's seconds, the median
and fastest ms a step (5 samples of 5 steps, each reading its loss), peak memory, and the
device's fallbacks."""
import json
import statistics
import sys
import time

import torch

side, case = sys.argv[1], sys.argv[2]
lazy = "lazy" in sys.argv[3:]
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
from hologram.bench.dev.training import _case, _stepper  # noqa: E402

SIZES = {
    "mlp": {"features": 1024, "hidden": 4096, "batch": 256},
    "transformer": {"vocab": 1000, "d_model": 256, "heads": 8, "ff": 1024, "layers": 2,
                    "batch": 16, "seq": 128},
    "cnn": {"batch": 32, "image": 64, "classes": 10},
    "gru": {"vocab": 100, "embed": 128, "hidden": 256, "batch": 16, "seq": 64},
}
if "tiny" in sys.argv:
    from hologram.bench.dev.training import TINY_SIZES as SIZES
if side == "hologram":
    import hologram_torch

    hologram_torch.set_lazy(lazy)
    device, sync = torch.device("hologram"), torch.hologram.synchronize
else:
    device, sync = torch.device("cuda"), torch.cuda.synchronize
    if "cpu" in sys.argv:
        device, sync = torch.device("cpu"), (lambda: None)

model, loss_fn, x, y = _case(torch, case, SIZES[case])
model, x, y = model.to(device), x.to(device), y.to(device)
step = _stepper(torch, model, loss_fn, x, y)
t0 = time.perf_counter()
losses = [step().item()]
first = time.perf_counter() - t0
losses += [step().item() for _ in range(4)]
# Every step reads its loss, as a training loop that logs it does (both sides): one
# region a step when recorded.
for _ in range(3):
    step().item()
if lazy:  # the region runs op by op until its fused program is ready
    hologram_torch.lazy.wait_for_compiles(600)
    for _ in range(3):
        step().item()
sync()
samples = []
for _ in range(5):
    t0 = time.perf_counter()
    for _ in range(5):
        step().item()
    sync()
    samples.append((time.perf_counter() - t0) / 5 * 1e3)
row = {"side": side + (" lazy" if lazy else ""), "case": case, "losses": losses,
       "first_s": round(first, 3), "ms": round(statistics.median(samples), 3),
       "ms_min": round(min(samples), 3)}
if side == "hologram":
    row["fallbacks"] = dict(hologram_torch.fallback_stats())
    row["peak_mb"] = round(torch.hologram.max_memory_allocated() / 2**20, 1)
elif device.type == "cuda":
    row["peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
print("ROW " + json.dumps(row), flush=True)
