"""Custom PyTorch operators written with Hologram's tensor front end (docs/custom_ops.md).

Three fused ops, each one Hologram program forward and one backward (derived), checked
against the unfused PyTorch composition: values, gradients (gradcheck in float64),
torch.library.opcheck, and speed (forward + backward, medians).

    python examples/custom_ops.py            # checks, and a short timing at 6e4 elements
    python examples/custom_ops.py --bench    # timing at 1e6 elements
"""

import functools
import sys
import time

import torch
from torch import Tensor

import hologram_torch
from hologram import config
from hologram.backends.cpu import backend
from hologram.frontend import functional as hf


@hologram_torch.custom_op("examples::bias_gelu")
def bias_gelu(x: Tensor, bias: Tensor) -> Tensor:
    """gelu(x + bias), exact (erf) form."""
    return hf.gelu(x + bias)


@hologram_torch.custom_op("examples::rms_norm")
def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension."""
    g = x.graph
    return x * g.unary("rsqrt", g.mean(x * x, -1, keepdim=True) + eps) * weight


@hologram_torch.custom_op("examples::attention_scores")
def attention_scores(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """softmax(q @ k^T * scale) over the keys: q [..., S, D], k [..., T, D]."""
    order = list(range(k.ndim))
    order[-2:] = order[:-3:-1]
    return hf.softmax((q @ k.permute(*order)) * scale, -1)


def reference(name, *args):
    """The unfused PyTorch composition of each op."""
    if name == "bias_gelu":
        x, b = args
        return torch.nn.functional.gelu(x + b)
    if name == "rms_norm":
        x, w = args
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
    q, k = args
    return torch.softmax(q @ k.transpose(-1, -2) * 0.125, -1)


#: name -> (the op, its operands' shapes for the checks, for n elements in the timing)
OPS = {
    "bias_gelu": (bias_gelu, [(4, 8), (8,)], lambda n: [(n // 1024, 1024), (1024,)]),
    "rms_norm": (rms_norm, [(4, 8), (8,)], lambda n: [(n // 1024, 1024), (1024,)]),
    "attention_scores": (lambda q, k: attention_scores(q, k, 0.125),
                         [(2, 3, 4), (2, 5, 4)],
                         lambda n: [(4, n // 4 // 256, 64), (4, 256, 64)]),
}

DEFINITIONS = {"bias_gelu": bias_gelu, "rms_norm": rms_norm,
               "attention_scores": attention_scores}


def check(device: str) -> None:
    torch.manual_seed(0)
    for name, (op, shapes, _) in OPS.items():
        small = [torch.randn(s, dtype=torch.float64, device=device, requires_grad=True)
                 for s in shapes]
        got, want = op(*small), reference(name, *small)
        torch.testing.assert_close(got, want)
        assert torch.autograd.gradcheck(op, small), name
        if device == "cpu":  # (on hologram tensors: tests/torch_device/device/test_custom_op.py)
            args = [t.detach().float().requires_grad_() for t in small]
            extra = (0.125,) if name == "attention_scores" else ()
            result = torch.library.opcheck(DEFINITIONS[name], (*args, *extra))
            assert set(result.values()) == {"SUCCESS"}, (name, result)
        print(f"{name} on {device}: values and gradcheck (float64) pass"
              + (", opcheck passes" if device == "cpu" else ""))


def median_times(fns, repeat: int) -> list[float]:
    """Each function's median time over ``repeat`` rounds, the functions interleaved."""
    times = [[] for _ in fns]
    for _ in range(repeat):
        for fn, spent in zip(fns, times):
            start = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - start)
    return [sorted(t)[len(t) // 2] for t in times]


def step(f, args, grad) -> None:
    for a in args:
        a.grad = None
    f(*args).backward(grad)


def bench(n: int, repeat: int) -> None:
    """Forward + backward of each op against the unfused composition, in one process,
    interleaved, medians of ``repeat`` runs. Timed once each program is in its final form:
    a program first compiled at the quick tier is rebuilt in full in the background after
    ``HOLOGRAM_PROMOTE_AFTER`` calls (docs/performance.md, "First step")."""
    torch.manual_seed(0)
    print(f"forward + backward at {n:.0e} elements, float32, {torch.get_num_threads()} "
          f"threads, medians of {repeat}")
    for name, (op, _, shapes) in OPS.items():
        args = [torch.randn(s, requires_grad=True) for s in shapes(n)]
        grad = torch.randn_like(op(*args))
        fused = functools.partial(step, op, args, grad)
        unfused = functools.partial(step, functools.partial(reference, name), args, grad)
        for _ in range(config.get().promote_after + 1):  # compile, promote, warm up
            fused()
            unfused()
        backend.wait_for_promotions()
        fused, unfused = median_times([fused, unfused], repeat)
        print(f"  {name:17s} hologram {fused * 1e3:7.3f} ms   pytorch {unfused * 1e3:7.3f} ms"
              f"   speedup {unfused / fused:5.2f}x")


if __name__ == "__main__":
    for device in ("cpu", "hologram"):
        check(device)
    if "--bench" in sys.argv:
        bench(1 << 20, 21)
    else:
        bench(1 << 16, 3)
