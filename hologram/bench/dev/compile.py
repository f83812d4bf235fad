"""The models and calls of the torch.compile benchmark (:mod:`hologram.bench.compile`, a
section of ``hologram bench``): ``torch.compile(backend="hologram")`` against PyTorch eager
and Inductor.

The models are :mod:`hologram.bench.dev.training`'s: the MLP (256-512-512-1, batch 64, MSE
loss) and the token transformer (embedding, 2 encoder layers, head, cross-entropy; batch
16 x 32), on CPU tensors, each called in two modes:

- ``inference``: ``model(x)`` under ``torch.no_grad()`` in eval mode;
- ``training``: one whole step, ``zero_grad`` + compiled ``loss(model(x), y)`` + backward +
  ``Adam.step`` (eager, PyTorch's, on every side).

:func:`first_call` times a compiled side's first call and, for Hologram, the backend's own
share (``compile_stats()['compile_time_s']``) and its disk-cache hits; :func:`agree` is
the check every compiled side passes against eager before it is timed.
"""

from __future__ import annotations

import copy
import time

from hologram.bench.dev import training

RTOL = 1e-4


def models(torch, sizes):
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


def compiled(torch, fn, backend):
    if backend == "eager":
        return fn
    if backend == "hologram":
        return torch.compile(fn, backend="hologram")
    return torch.compile(fn)  # Inductor, torch.compile's default


def inference(torch, model, x, backend):
    model = copy.deepcopy(model).eval()
    f = compiled(torch, model, backend)

    def call():
        with torch.no_grad():
            return f(x)

    return call


def training_step(torch, model, loss_fn, x, y, backend):
    model = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_of = compiled(torch, lambda a, b: loss_fn(model(a), b), backend)

    def step():
        optimizer.zero_grad()
        loss = loss_of(x, y)
        loss.backward()
        optimizer.step()
        return loss

    return step


def first_call(torch, fn):
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


def agree(torch, got, expected) -> bool:
    return bool(torch.allclose(got.float(), expected.float(), rtol=RTOL, atol=RTOL))
