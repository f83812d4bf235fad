"""The Triton process, from Hologram's side: one long-lived child per mode (``compile``:
Triton's ahead-of-time compiler; ``interpret``: ``TRITON_INTERPRET=1``), started on first
use. Triton runs there and never in this process (why: :mod:`._child`)."""

from __future__ import annotations

import atexit
import importlib.util
import os
import pickle
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from hologram.errors import CompileError, DeviceError

#: The Triton release the artifacts are built and checked with (the calling convention
#: of compiled kernels changes between releases).
TRITON_VERSION = "3.9.0"
_CHILD = Path(__file__).with_name("_child.py")
_workers: dict[str, _Worker] = {}
_lock = threading.Lock()


def triton_installed() -> bool:
    """Whether the ``triton`` package is installed (found, not imported: see _child)."""
    return importlib.util.find_spec("triton") is not None


def installed_version() -> str | None:
    try:
        from importlib.metadata import version
        return version("triton")
    except Exception:
        return None


class _Worker:
    def __init__(self, mode: str):
        # One thread: the interpreter's NumPy and torch work is small, and idle OpenMP
        # threads spinning in the child would take the cores from the caller's process.
        env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0",
                   TRITON_DEFAULT_FP_FUSION="0", OMP_NUM_THREADS="1")
        env.pop("TRITON_INTERPRET", None)
        # -P: the script's folder (this package) must not shadow Triton's imports.
        self.process = subprocess.Popen([sys.executable, "-P", str(_CHILD), mode],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.lock = threading.Lock()

    def call(self, request: dict) -> dict:
        data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        with self.lock:
            try:
                self.process.stdin.write(struct.pack("<Q", len(data)) + data)
                self.process.stdin.flush()
                head = self.process.stdout.read(8)
                if len(head) < 8:
                    raise EOFError
                return pickle.loads(self.process.stdout.read(struct.unpack("<Q", head)[0]))
            except (EOFError, BrokenPipeError, OSError) as err:
                code = self.process.poll()
                raise DeviceError(f"cuda: the Triton process exited (code {code}); its "
                                  "stderr above says why (is triton "
                                  f"{TRITON_VERSION} installed? pip install "
                                  "'hologram-tensor[cuda]')") from err
            except BaseException:
                # Interrupted between the request and its reply (Ctrl-C, a test's time
                # limit): the reply would answer the next request. The child goes; the
                # next call starts another.
                self.process.kill()
                raise

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=10)
        self.process.stdout.close()  # also after the child died: no unclosed pipe left


def call(mode: str, request: dict, source: str) -> dict[str, Any]:
    """Send ``request`` to the ``mode`` child; a failure there raises
    :class:`CompileError` carrying ``source`` and Triton's message."""
    if not triton_installed():
        raise DeviceError("cuda: the triton package is not installed; pip install "
                          f"'hologram-tensor[cuda]' (triton=={TRITON_VERSION})")
    with _lock:
        worker = _workers.get(mode)
        if worker is None or worker.process.poll() is not None:
            worker = _workers[mode] = _Worker(mode)
    reply = worker.call(request)
    if not reply["ok"]:
        raise CompileError(f"cuda: Triton ({mode}) failed on {request.get('name') or 'the kernels'}"
                           f": {reply['error']}", source=source, log=reply["traceback"])
    return reply


@atexit.register
def _close_all() -> None:
    for worker in _workers.values():
        try:
            worker.close()
        except Exception:
            worker.process.kill()
