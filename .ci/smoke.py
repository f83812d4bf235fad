"""What a user of the installed wheel does first, run by .ci/package from outside the source
tree in a fresh venv with no C or C++ compiler on PATH: `hologram info`, an SDK op,
`hg.jit`, a training step on torch.device('hologram'), torch.compile(backend="hologram")
and `hologram bench --quick` on one small case. Fails (non-zero exit) on any difference.

``--without-torch``: the Pythons for which no supported torch can be had here (3.10, 3.12):
`hologram info` must say torch is missing, and the SDK part runs."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

_START = time.perf_counter()


def check(condition: bool, message: str) -> None:
    if not condition:
        sys.exit(f"smoke: FAILED: {message}")
    print(f"smoke: ok ({time.perf_counter() - _START:5.1f} s): {message}", flush=True)


def main(with_torch: bool) -> None:
    for tool in ("cc", "gcc", "c++", "g++", "clang", "ninja"):
        check(shutil.which(tool) is None, f"no {tool} on PATH")

    import hologram as hg

    here = Path(hg.__file__).resolve()
    check(Path(sys.prefix) in here.parents, f"hologram is this venv's copy ({here})")

    done = subprocess.run(["hologram", "info", "--json"], capture_output=True, text=True,
                          check=True)
    report = json.loads(done.stdout)
    check(report["hologram"]["installed_version"] == hg.__version__,
          f"hologram info: installed hologram-tensor {hg.__version__}")
    hooks = report["native"]["torch_hooks"]
    if with_torch:
        check(report["torch"]["matches"] is True, "hologram info: torch is the supported release")
        check(hooks["active"] and hooks["origin"] == "prebuilt",
              f"the torch device's prebuilt hooks are loaded ({hooks})")
    else:
        check(report["torch"]["installed"] is False and not hooks["active"],
              f"hologram info: no torch, no torch hooks ({report['torch']}, {hooks})")

    # The SDK: one op and a jit-fused function.
    x = np.linspace(-2, 2, 1000, dtype=np.float32)
    with hg.Executor() as ex:
        a = ex.from_numpy(x)
        check(np.allclose(hg.ops.vector_add(a, a).to_numpy(), 2 * x), "SDK vector_add")
        fused = hg.jit(lambda u, v: hg.ops.relu(u * v + 1.0))
        check(np.allclose(fused(a, a).to_numpy(), np.maximum(x * x + 1, 0), rtol=1e-6),
              "hg.jit relu(u * v + 1)")
    if not with_torch:
        print("smoke: all passed (without torch)")
        return

    import torch

    import hologram_torch

    # A training step on the device matches the same step on the CPU.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    inputs, targets = torch.randn(8, 16), torch.randn(8, 4)
    cpu_model = copy.deepcopy(model)
    device_model = model.to("hologram")
    for net, where in ((device_model, "hologram"), (cpu_model, "cpu")):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        loss = torch.nn.functional.mse_loss(net(inputs.to(where)), targets.to(where))
        loss.backward()
        optimizer.step()
    for (name, p), q in zip(device_model.named_parameters(), cpu_model.parameters()):
        check(torch.allclose(p.cpu(), q, atol=1e-5), f"device training step: {name}")
    check(hologram_torch.native.active(), "device hooks active after the step")

    # torch.compile with the hologram backend matches eager.
    net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU())
    compiled = torch.compile(net, backend="hologram")
    check(torch.allclose(compiled(inputs), net(inputs), atol=1e-5),
          "torch.compile(backend='hologram')")
    stats = hologram_torch.compile_stats()
    check(stats["programs"] >= 1 and stats["graph_fallbacks"] == 0,
          f"torch.compile ran Hologram programs ({stats['programs']})")

    # hologram bench on one small case, written outside the tree.
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(["hologram", "bench", "--quick", "--ops", "add", "--sizes", "1000",
                               "--runs", "2", "--warmup", "1", "--no-torch-compile",
                               "--no-progress", "--out", out], capture_output=True, text=True)
        check(done.returncode == 0, f"hologram bench --quick (exit {done.returncode}: "
                                    f"{done.stderr[-2000:]})")
        check(os.path.exists(os.path.join(out, "report.md")), "hologram bench wrote its report")
    print("smoke: all passed")


if __name__ == "__main__":
    main(with_torch="--without-torch" not in sys.argv[1:])
