"""The disk cache of compiled kernels: each kernel's cubin, PTX, metadata and resources,
one file per kernel under ``<HOLOGRAM_CACHE_DIR>/cuda-kernels/``.

The program cache (:mod:`hologram.compiler.cache`) keeps whole artifacts keyed by the
backend's target string; this cache sits under it, at the Triton compile, so that a
kernel compiled once is never compiled again by another program, another process or a
fresh program cache, and so that a cubin is never reused across what it depends on. Its
key covers:

- the Triton module's source, the kernel's name, signature and warps, and the compile
  options (the code);
- the GPU architecture (``80``, ``90``) and the Triton version (the compiler);
- the CUDA toolkit that assembled the cubin (the version of the ``ptxas`` Triton runs);
- the CUDA driver's version where a GPU is present (``none`` for an ahead-of-time build on
  a machine without one), so a driver update starts afresh.

A hit costs a file read: no Triton process is started. Like the program cache, the disk is
only an optimization: a damaged or mismatched file is a miss, and a disk that cannot be
written is ignored. ``HOLOGRAM_DISABLE_DISK_CACHE=1`` turns it off.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from hologram import config

from . import triton_process

#: Files larger than this are not read (no real entry comes near it).
MAX_ENTRY_BYTES = 64 << 20
_FORMAT = "cuda-kernel-1"
_counters = {"hits": 0, "misses": 0, "stores": 0}
_lock = threading.Lock()


@functools.cache
def toolkit_version() -> str:
    """The version of the ``ptxas`` that Triton assembles sm_80/sm_90 cubins with
    (``"12.9.86"``), or ``"unknown"`` where it cannot be run (the compile then fails on
    its own)."""
    # Triton's choice of ptxas: TRITON_PTXAS_PATH (Triton's own setting), else the one
    # bundled in its wheel. Found without importing Triton (see _child).
    path = os.environ.get("TRITON_PTXAS_PATH")
    if not path:
        spec = importlib.util.find_spec("triton")
        if spec is None or not spec.submodule_search_locations:
            return "unknown"
        path = str(Path(spec.submodule_search_locations[0], "backends", "nvidia", "bin",
                        "ptxas"))
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    found = re.search(r"release [\d.]+, V([\d.]+)", done.stdout)
    return found.group(1) if found else "unknown"


def key(source: str, kernel: dict, options: dict, arch: int, driver: int | None) -> str:
    """The digest naming one kernel's entry (everything its cubin depends on)."""
    parts = {"format": _FORMAT, "source": source, "name": kernel["name"],
             "signature": kernel["signature"], "num_warps": kernel["num_warps"],
             "num_stages": kernel["num_stages"], "options": options, "arch": arch,
             "triton": triton_process.TRITON_VERSION,
             "toolkit": toolkit_version(), "driver": driver}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _path(digest: str) -> Path | None:
    settings = config.get()
    if not settings.disk_cache:
        return None
    return settings.cache_dir / "cuda-kernels" / digest[:2] / f"{digest}.json"


def load(digest: str) -> dict[str, Any] | None:
    """The compiled kernel stored under ``digest``, or None (absent, damaged, or not the
    entry it claims to be)."""
    path = _path(digest)
    entry = None
    if path is not None:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            if path.is_file() and path.stat().st_size <= MAX_ENTRY_BYTES:
                stored = json.loads(path.read_bytes())
                cubin = base64.b64decode(stored["kernel"]["cubin"])
                # The key and the cubin's digest are inside the file: a file copied under
                # another entry's name, or cut short, is not taken.
                if (stored["key"] == digest
                        and stored["cubin_sha256"] == hashlib.sha256(cubin).hexdigest()):
                    entry = stored["kernel"]
    with _lock:
        _counters["hits" if entry is not None else "misses"] += 1
    return entry


def store(digest: str, kernel: dict[str, Any]) -> None:
    """Keep ``kernel`` (an artifact's ``compiled`` entry) under ``digest``; written whole
    or not at all (a temporary file renamed into place)."""
    path = _path(digest)
    if path is None:
        return
    cubin = base64.b64decode(kernel["cubin"])
    data = json.dumps({"key": digest, "cubin_sha256": hashlib.sha256(cubin).hexdigest(),
                       "kernel": kernel}).encode()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(temporary, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            return
        with _lock:
            _counters["stores"] += 1


def info() -> dict[str, int]:
    """This process's lookups: ``hits``, ``misses``, ``stores``."""
    with _lock:
        return dict(_counters)
