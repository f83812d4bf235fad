"""A helper process that builds programs into the disk cache, so that a long compile does
not share this process's GIL with the thread that waits for it.

Why: the torch device compiles a recorded region's fused program on a background thread
while the region keeps running op by op (docs/torch.md, "Recorded execution"). That
compile is 0.1-14 s of CPU, much of it Python (passes, rendering) holding the GIL. The
thread that records and launches ops gives the GIL up at every native call, and gets it
back only when the compiling thread's switch interval (5 ms) runs out: a training step
that took 10 ms took 0.6-0.8 s while its fused program compiled (up to 10 ms an op
recorded). Threads cannot be given priorities over the GIL; processes have their own, and
a scheduler priority: the helper runs at nice 10, so it takes the cores this process
leaves.

:func:`build` sends a program, its backend and options, and this process's ``HOLOGRAM_*``
settings (the cache directory and CPU target among them) to the helper, which runs
:func:`~hologram.runtime.launch.prebuild` (the full build :func:`hologram.compile` would
load, written to the disk cache, not loaded) and answers; the caller then calls
:func:`hologram.compile`, which finds the build on disk. Anything the helper cannot do (no
disk cache, the helper failed or died) only means the caller compiles here, as before:
the key is computed in this process, so a build the helper made under other settings is
never loaded. One helper per process, started at the first call, one request at a time;
it exits when this process closes its pipe.

Protocol: length-prefixed pickles on stdin/stdout, ``{"program", "backend", "options",
"environment"}`` in, ``None`` (built) or the error's text out.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import struct
import subprocess
import sys
import threading
from pathlib import Path

from hologram import config
from hologram.compiler.options import CompileOptions
from hologram.isa.ir import Program
from hologram.runtime.launch import prebuild

#: The backends built there: ``cpu``, whose builds are object files that do not depend on
#: this process's state. GPU backends build against the device and driver this process
#: opened (and cuda's Triton already runs in a process of its own).
BACKENDS = frozenset({"cpu"})
#: After this many failed requests the helper is not used again in this process.
MAX_FAILURES = 3
_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the package

_lock = threading.Lock()
_state: dict = {"process": None, "failures": 0, "builds": 0}


def build(program: Program, backend: str, options: CompileOptions | None = None) -> bool:
    """Have the helper write ``program``'s full build for ``backend`` into the disk cache;
    True when it did. False where it cannot (a backend not in :data:`BACKENDS`, no disk
    cache, the helper failed): the caller compiles here."""
    settings = config.get()
    if backend not in BACKENDS or not settings.disk_cache or \
            _state["failures"] >= MAX_FAILURES:
        return False
    request = {"program": program, "backend": backend,
               "options": options or CompileOptions.from_env(),
               "environment": {k: v for k, v in os.environ.items()
                               if k.startswith("HOLOGRAM_")}
               | {"HOLOGRAM_CACHE_DIR": str(settings.cache_dir)}}
    try:
        data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # (a program is plain data; this would be a bug worth a fallback)
        _state["failures"] += 1
        return False
    with _lock:
        try:
            reply = _call(data)
        except BaseException:
            # Interrupted or broken between the request and its reply: the reply would
            # answer the next request. This helper goes; the next call starts another.
            _stop()
            _state["failures"] += 1
            return False
    if reply is not None:
        _state["failures"] += 1
        return False
    _state["builds"] += 1
    return True


def stats() -> dict:
    """Programs built by the helper, failed requests, and whether it is running."""
    process = _state["process"]
    return {"builds": _state["builds"], "failures": _state["failures"],
            "running": process is not None and process.poll() is None}


def _call(data: bytes) -> str | None:
    process = _state["process"]
    if process is None or process.poll() is not None:
        process = _state["process"] = _start()
    process.stdin.write(struct.pack("<Q", len(data)) + data)
    process.stdin.flush()
    head = process.stdout.read(8)
    if len(head) < 8:
        raise EOFError("the compile helper exited")
    return pickle.loads(process.stdout.read(struct.unpack("<Q", head)[0]))


def _start(stderr=None) -> subprocess.Popen:
    path = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=_ROOT + (os.pathsep + path if path else ""),
               OMP_NUM_THREADS="1")
    # -P: the working folder must not shadow the package; stderr is this process's, where
    # a crash of the helper says why.
    # (-c, not -m: a module the package imports would be imported twice, once as __main__)
    return subprocess.Popen([sys.executable, "-P", "-c",
                             "from hologram.runtime.compile_process import serve; serve()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                            env=env)


def _stop() -> None:
    process, _state["process"] = _state["process"], None
    if process is None:
        return
    try:
        if process.poll() is None:
            process.stdin.close()
            try:
                process.wait(timeout=1)  # an idle helper exits at the end of its input
            except subprocess.TimeoutExpired:
                # Busy with a build, which may take seconds: not waited for (entries are
                # written to a temporary file and renamed: a killed write leaves none).
                process.kill()
                process.wait()
    except OSError:
        process.kill()
    finally:
        process.stdout.close()


def _forked() -> None:
    """In a forked child: no helper (its pipes are the parent's), and a lock of its own."""
    global _lock
    _lock = threading.Lock()
    _state["process"] = None


atexit.register(_stop)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def serve() -> None:
    """The helper's loop (what the helper process runs)."""
    with contextlib.suppress(OSError, AttributeError):  # (no nice on Windows: as it is)
        os.nice(10)
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # stdout carries replies only
    while True:
        head = requests.read(8)
        if len(head) < 8:
            return  # the parent closed the pipe, or exited
        request = pickle.loads(requests.read(struct.unpack("<Q", head)[0]))
        for name in [k for k in os.environ if k.startswith("HOLOGRAM_")]:
            del os.environ[name]
        os.environ.update(request["environment"])
        try:
            built = prebuild(request["program"], request["backend"], request["options"])
            reply = None if built else "the build could not be written to the disk cache"
        except Exception as err:
            reply = f"{type(err).__name__}: {err}"
        data = pickle.dumps(reply)
        try:
            replies.write(struct.pack("<Q", len(data)) + data)
            replies.flush()
        except BrokenPipeError:
            # The parent is gone (it exited without waiting: os._exit, a signal): nobody
            # to answer, and nothing to report on the terminal it shared with us.
            os._exit(0)
