"""All ``HOLOGRAM_*`` environment variables, read in one place.

Other modules never read ``os.environ`` for Hologram settings; they call :func:`get`.
Values are read at call time, so tests and users can change the environment at run time.

| variable | meaning | default |
|---|---|---|
| ``HOLOGRAM_BACKEND`` | backend used by ``backend="auto"`` callers | ``auto`` |
| ``HOLOGRAM_NUM_THREADS`` | worker threads of CPU backends (0 = all cores) | ``0`` |
| ``HOLOGRAM_CACHE_DIR`` | on-disk program cache | ``$XDG_CACHE_HOME/hologram`` |
| ``HOLOGRAM_DISABLE_DISK_CACHE`` | ``1`` keeps compiled programs in memory only | ``0`` |
| ``HOLOGRAM_CACHE_SIZE`` | entries kept in the in-memory LRU | ``512`` |
| ``HOLOGRAM_DUMP_DIR`` | if set, each pass writes its output here (created if missing) | unset |
| ``HOLOGRAM_PERF_MAP`` | ``1``: names loaded CPU kernels for Linux ``perf`` | ``0`` |
| ``HOLOGRAM_FAST_MATH`` | ``1`` allows rewrites that are not exact under IEEE 754 | ``0`` |
| ``HOLOGRAM_BENCH_QUICK`` | ``1`` makes benchmarks use small sizes | ``0`` |
| ``HOLOGRAM_CPU_TARGET`` | CPU the cpu backend compiles for (``x86-64-v3``, ...) | ``host`` |
| ``HOLOGRAM_QUICK_COMPILE`` | ``1``: compile quickly first, fully when hot (compiler.md) | ``1`` |
| ``HOLOGRAM_PROMOTE_AFTER`` | calls before a quick compile is redone in full | ``16`` |
| ``HOLOGRAM_CUDA_EMULATE`` | ``1``: ``cuda`` runs in Triton's interpreter (docs/cuda.md) | ``0`` |
| ``HOLOGRAM_CUDA_ALLOW_TF32`` | ``1``: ``cuda`` f32 matmuls may use TF32 (docs/cuda.md) | ``0`` |
| ``HOLOGRAM_SHARE_OPENMP`` | ``1``: CPU kernels use the process's OpenMP threads, if any | ``1`` |
| ``HOLOGRAM_LAZY`` | ``1``: the torch device records ops, runs fused regions (torch.md) | ``0`` |
| ``HOLOGRAM_TORCH_BACKEND`` | the torch device's backend (cpu, cuda, webgpu, torch.md) | ``auto`` |
| ``HOLOGRAM_TORCH_DEVICES`` | devices ``hologram:0..N-1`` on host memory (torch.md) | ``1`` |
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from hologram.errors import HologramError


@dataclass(frozen=True)
class Settings:
    backend: str
    num_threads: int
    cache_dir: Path
    disk_cache: bool
    cache_size: int
    dump_dir: Path | None
    fast_math: bool
    bench_quick: bool
    cpu_target: str
    cuda_emulate: bool = False
    # f32 matrix products on the cuda backend may round their operands to TF32 (10-bit
    # mantissas), as torch.backends.cuda.matmul.allow_tf32; off: IEEE f32 products.
    cuda_allow_tf32: bool = False
    quick_compile: bool = True
    promote_after: int = 16
    # In a process with an OpenMP runtime loaded (PyTorch's), parallel CPU kernels run on
    # its threads instead of the cpu backend's own workers (hologram/backends/cpu/workers.py).
    share_openmp: bool = True
    # The torch device records its ops and runs them as fused regions (hologram_torch.lazy).
    lazy: bool = False
    # The backend of the torch device's kernels and memory (hologram_torch.aten.runner).
    torch_backend: str = "auto"
    # Devices of the torch device on host memory (hologram:0 to hologram:N-1).
    torch_devices: int = 1
    # Loaded CPU kernels are named in /tmp/perf-<pid>.map, where Linux perf looks for the
    # symbols of code it finds in anonymous memory (hologram/backends/cpu/loader.py).
    perf_map: bool = False


def _flag(name: str) -> bool:
    value = os.environ.get(name, "0").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise HologramError(f"{name}={value!r}: expected 0/1, true/false, yes/no or on/off")


def _flag_default(name: str, default: bool) -> bool:
    """:func:`_flag` for a variable that is on unless set: unset or empty is ``default``."""
    return _flag(name) if os.environ.get(name, "").strip() else default


def _int(name: str, default: int, minimum: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HologramError(f"{name}={raw!r}: expected an integer >= {minimum}") from None
    if value < minimum:
        raise HologramError(f"{name}={raw!r}: expected an integer >= {minimum}")
    return value


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hologram"


_VARIABLES = (
    "HOLOGRAM_BACKEND", "HOLOGRAM_NUM_THREADS", "HOLOGRAM_CACHE_DIR",
    "HOLOGRAM_DISABLE_DISK_CACHE", "HOLOGRAM_CACHE_SIZE", "HOLOGRAM_DUMP_DIR",
    "HOLOGRAM_FAST_MATH", "HOLOGRAM_BENCH_QUICK", "HOLOGRAM_CPU_TARGET", "HOLOGRAM_CUDA_EMULATE",
    "HOLOGRAM_CUDA_ALLOW_TF32",
    "HOLOGRAM_QUICK_COMPILE", "HOLOGRAM_PROMOTE_AFTER", "HOLOGRAM_SHARE_OPENMP",
    "HOLOGRAM_LAZY", "HOLOGRAM_TORCH_BACKEND", "HOLOGRAM_TORCH_DEVICES", "HOLOGRAM_PERF_MAP",
    "XDG_CACHE_HOME",
    "HOME",
)
_last: tuple[tuple, Settings] | None = None
# os.environ.get encodes every name and value (~0.3 µs a variable, several µs a call: too
# much for kernel launches, which ask for the thread count). CPython's os.environ keeps
# the raw bytes in a dict; reading that directly sees the same changes, ~10x cheaper.
_RAW = getattr(os.environ, "_data", None)
_KEYS = tuple(map(os.environ.encodekey, _VARIABLES)) if _RAW is not None else None


def get() -> Settings:
    """The current settings. Parsed again only when one of the variables changed, so this
    is cheap enough for hot paths and still follows changes made at run time."""
    global _last
    if _RAW is not None:
        snapshot = tuple(map(_RAW.get, _KEYS))
    else:
        snapshot = tuple(os.environ.get(name) for name in _VARIABLES)
    if _last is None or _last[0] != snapshot:
        _last = (snapshot, _read())
    return _last[1]


_THREADS = "HOLOGRAM_NUM_THREADS"
_THREADS_KEY = os.environ.encodekey(_THREADS) if _RAW is not None else None
_threads_seen: list = [None, 0]  # the raw value last parsed, and what it parsed to


def num_threads() -> int:
    """``get().num_threads`` for kernel launches, which ask on every parallel call: one
    lookup, and a parse only when the variable's value object changed."""
    raw = _RAW.get(_THREADS_KEY) if _RAW is not None else os.environ.get(_THREADS)
    if raw is None:
        return 0
    if raw is not _threads_seen[0]:
        _threads_seen[:] = [raw, _int(_THREADS, 0, 0)]
    return _threads_seen[1]


def num_threads_source() -> tuple[dict | None, bytes | None]:
    """Where :func:`num_threads` reads ``HOLOGRAM_NUM_THREADS``: the environment's raw
    mapping and the variable's key in it, (None, None) where ``os.environ`` has none. A
    new value is a new object there, so native code can tell that the value changed by
    identity alone."""
    return _RAW, _THREADS_KEY


def environment() -> dict[str, str]:
    """Every ``HOLOGRAM_*`` variable set, by name, known or not (a misspelled one shows up
    in ``hologram info``)."""
    return {name: value for name, value in sorted(os.environ.items())
            if name.startswith("HOLOGRAM_")}


@functools.cache
def available_cores() -> int:
    """Cores this process may run on (its affinity mask at first use, as OpenMP reads it
    once), not the machine's total: the default of ``HOLOGRAM_NUM_THREADS``."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def _read() -> Settings:
    dump = os.environ.get("HOLOGRAM_DUMP_DIR", "").strip()
    cache_dir = os.environ.get("HOLOGRAM_CACHE_DIR", "").strip()
    return Settings(
        backend=os.environ.get("HOLOGRAM_BACKEND", "auto").strip().lower() or "auto",
        num_threads=_int("HOLOGRAM_NUM_THREADS", 0, 0),
        cache_dir=Path(cache_dir) if cache_dir else _default_cache_dir(),
        disk_cache=not _flag("HOLOGRAM_DISABLE_DISK_CACHE"),
        cache_size=_int("HOLOGRAM_CACHE_SIZE", 512, 1),
        dump_dir=Path(dump) if dump else None,
        fast_math=_flag("HOLOGRAM_FAST_MATH"),
        bench_quick=_flag("HOLOGRAM_BENCH_QUICK"),
        cpu_target=os.environ.get("HOLOGRAM_CPU_TARGET", "").strip().lower() or "host",
        cuda_emulate=_flag("HOLOGRAM_CUDA_EMULATE"),
        cuda_allow_tf32=_flag("HOLOGRAM_CUDA_ALLOW_TF32"),
        quick_compile=_flag_default("HOLOGRAM_QUICK_COMPILE", True),
        promote_after=_int("HOLOGRAM_PROMOTE_AFTER", 16, 1),
        share_openmp=_flag_default("HOLOGRAM_SHARE_OPENMP", True),
        lazy=_flag("HOLOGRAM_LAZY"),
        torch_backend=os.environ.get("HOLOGRAM_TORCH_BACKEND", "auto").strip().lower()
        or "auto",
        torch_devices=_int("HOLOGRAM_TORCH_DEVICES", 1, 1),
        perf_map=_flag("HOLOGRAM_PERF_MAP"),
    )
