"""What ``torch.compile(backend="hologram")`` did in this process: the counters behind
:func:`hologram_torch.compile_stats`. Importing this module imports nothing of dynamo, so
``import hologram_torch`` stays cheap."""

from __future__ import annotations

import threading

_FIELDS = (
    "graphs",            # ATen graphs given to the backend (forward, backward, inference)
    "partitions",        # regions compiled as one Hologram program each
    "ops_lowered",       # ATen nodes inside those regions
    "ops_eager",         # ATen nodes left to run as PyTorch runs them (views aside)
    "views_eager",       # view nodes left outside regions (metadata only, no copy)
    "programs",          # Hologram programs built (one per region and signature)
    "recompiles",        # programs built for a region that already had one (new shapes)
    "eager_fallbacks",   # signatures whose program could not be built: ran eagerly
    "graph_fallbacks",   # whole graphs the backend could not partition: ran eagerly
)
_lock = threading.Lock()
_counts: dict[str, int] = dict.fromkeys(_FIELDS, 0)
_times = {"compile_time_s": 0.0}
_eager_ops: dict[str, int] = {}


def add(field: str, n: int = 1) -> None:
    with _lock:
        _counts[field] += n


def add_time(seconds: float) -> None:
    with _lock:
        _times["compile_time_s"] += seconds


def add_eager_op(name: str) -> None:
    with _lock:
        _eager_ops[name] = _eager_ops.get(name, 0) + 1


def compile_stats() -> dict:
    """Counters since the process started (or :func:`reset_compile_stats`): ``graphs``,
    ``partitions``, ``ops_lowered``, ``ops_eager``, ``views_eager``, ``programs``, ``recompiles``,
    ``eager_fallbacks``, ``graph_fallbacks``, ``compile_time_s`` (partitioning, lowering and
    compiling programs, wall seconds) and ``eager_ops`` (ATen op name -> nodes left eager)."""
    with _lock:
        return {**_counts, **_times, "eager_ops": dict(_eager_ops)}


def reset_compile_stats() -> None:
    with _lock:
        for k in _counts:
            _counts[k] = 0
        _times["compile_time_s"] = 0.0
        _eager_ops.clear()
