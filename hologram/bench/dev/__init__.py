"""The developer benchmark suite (``make bench-dev`` = ``python -m hologram.bench.dev.run``).

Each module also runs on its own: :mod:`~hologram.bench.dev.cpu` (the cpu backend against
PyTorch eager and torch.compile), :mod:`~hologram.bench.dev.sdk` (the SDK's per-op costs and
``hg.jit`` fusion), :mod:`~hologram.bench.dev.torch_device` (the torch device's per-op
overhead and elementwise ratios), :mod:`~hologram.bench.dev.training` (training steps), and
:mod:`~hologram.bench.dev.run` (all of them, plus compiler and cache costs, into one report).
They share the timing of :mod:`hologram.bench.stats`.
"""
