"""The device's native PrivateUse1 hooks: a small C++ library (``csrc/hooks.cpp``) built
with PyTorch's extension machinery and registered before the Python hooks.

The Python hooks a device can register (``torch._C._acc.PrivateUse1Hooks``) cannot
provide a pinned-memory allocator, which torch's C++ core asks for when it allocates
pinned host memory for the device: DDP's reducer does with ``find_unused_parameters=True``
or ``static_graph=True``, and so does ``torch.empty(..., pin_memory=True)``. The native
hooks answer as the Python ones did, and add that allocator (the device's memory is host
memory: pinned memory is host memory from the CPU allocator's functions, and
``is_pinned()`` is true for exactly the blocks it handed out) and ``getDeviceFromPtr``
(``hologram:0``). torch accepts one hooks object per process, so whichever registers
first serves the process: :func:`hologram_torch.device.register` tries these first.

The library is built once per source, torch build and Python version, and named after a
hash of those. A wheel carries it prebuilt for the torch it was built with
(``_prebuilt/``, next to this module; setup.py puts it there): it is loaded when its name
is this process's, that is when the torch is the same build. Otherwise it lives in torch's
extension directory (``$TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``),
in a folder of that name. ``make venv`` builds it there; otherwise the first import does,
saying so on stderr. Processes importing at the same time (pytest workers,
torchrun ranks) share one build through a lock file in that folder: one compiles, the
others wait for it. Without a C++ compiler (``$CXX``, by default ``c++``) or ninja,
the device runs on the Python hooks and :func:`reason` tells why the native ones are
missing and how to get them; DDP refuses the two options that need them.

``python -c "import hologram_torch.native as n; n.report()"`` builds (if needed) and
prints the state.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import _appdirs
from torch.utils.file_baton import FileBaton

from hologram import _native
from hologram.errors import CompileError

SOURCE = Path(__file__).resolve().parent / "csrc" / "hooks.cpp"
#: The front kernels of the hottest ops (see :func:`register_fast`).
OPS_SOURCE = SOURCE.with_name("ops.cpp")
#: The pending region of recorded execution (hologram_torch/lazy.py), which ops.cpp's
#: front kernels record into.
REGION_SOURCE = SOURCE.with_name("region.cpp")
SOURCES = (SOURCE, OPS_SOURCE, REGION_SOURCE)
#: hologram._native's C API (the pool's allocation, Launcher calls), which ops.cpp includes.
API_HEADER = Path(_native.__file__).resolve().parent / "csrc" / "native_api.h"
_CFLAGS = ("-O2",)
#: Where a wheel carries the library, built for the torch it was built with, and
#: MANIFEST, which names that torch.
PREBUILT = Path(__file__).resolve().parent / "_prebuilt"
MANIFEST = PREBUILT / "hooks.json"
# The longest a process waits for another's build (the lock file's age): a build takes
# seconds, so a lock older than this was left by a build that was killed.
_LOCK_STALE_S = 600.0
# How to get the native hooks on a machine without a compiler.
_REMEDY = ("install a C++ compiler and ninja (Debian/Ubuntu: apt-get install g++ "
           "ninja-build) and start Python again: the first import then builds the hooks")

_state: dict = {"active": False, "reason": "not loaded yet"}
# The library's functions that take Python objects, called with the GIL held (PyDLL).
_fast: ctypes.PyDLL | None = None


@functools.cache
def _name() -> str:
    """The library's name: a hash of everything its binary depends on."""
    key = hashlib.sha256(b"".join(source.read_bytes() for source in (*SOURCES, API_HEADER)))
    for part in (torch.__version__, torch.version.git_version, sys.implementation.cache_tag,
                 platform.machine(), *_CFLAGS):
        key.update(b"\0" + str(part).encode())
    return f"hologram_torch_hooks_{key.hexdigest()[:16]}"


def build_directory() -> Path:
    """Where the library is built: a folder of torch's extension directory."""
    # torch.utils.cpp_extension computes the same root, but importing it costs a third of a
    # second (it imports setuptools): too much for every import when the build is cached.
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or _appdirs.user_cache_dir(
        appname="torch_extensions")
    return Path(root).resolve() / _name()


def prebuilt_path() -> Path:
    """Where a wheel's library for this very torch build would be (it may not exist)."""
    return PREBUILT / f"{_name()}.so"


def library_path() -> Path:
    """The library this process loads: the wheel's prebuilt one if it is for this torch
    build, else the one built in :func:`build_directory`."""
    if prebuilt_path().exists():
        return prebuilt_path()
    return build_directory() / f"{_name()}.so"


def prebuilt_for() -> str | None:
    """The torch version the wheel's prebuilt library was built for (None: no wheel
    library, as in a checkout or an sdist installed without torch at build time)."""
    try:
        return json.loads(MANIFEST.read_text())["torch"]
    except (OSError, ValueError, KeyError):
        return None


def _prebuilt_mismatch() -> str:
    """A note for messages when the wheel's library is for another torch build."""
    built_for = prebuilt_for()
    if built_for is None or prebuilt_path().exists():
        return ""
    return (f"this package's prebuilt hooks are for torch {built_for}, not this torch "
            f"{torch.__version__} (install torch=={built_for}, or ")


def _missing_tools() -> list[str]:
    # cpp_extension compiles with $CXX (default c++) and builds through ninja
    compiler = os.environ.get("CXX", "c++")
    return [tool for tool in (compiler, "ninja") if shutil.which(tool) is None]


def _wait_for_other_build(lock: Path) -> None:
    """Wait while another process builds (its lock file exists), up to the lock's age
    :data:`_LOCK_STALE_S`; raise if it is older (a killed build left it)."""
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return
        if age > _LOCK_STALE_S:
            raise CompileError(f"the lock file {lock} is {age:.0f} s old: a build of the "
                               "native hooks was interrupted; delete the file and start "
                               "Python again")
        time.sleep(0.1)


def _compile(path: Path) -> None:
    print(f"hologram_torch: building the device's native hooks in {path.parent} (once "
          "per torch version)", file=sys.stderr, flush=True)
    from torch.utils import cpp_extension  # slow to import: only when building

    try:
        cpp_extension.load(_name(), [str(source) for source in SOURCES],
                           extra_cflags=list(_CFLAGS),
                           extra_include_paths=[str(API_HEADER.parent)],
                           build_directory=str(path.parent), is_python_module=False)
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        log = getattr(e, "output", None) or str(e)  # a failed command's output, if any
        if isinstance(log, bytes):
            log = log.decode(errors="replace")
        raise CompileError(f"building the native hooks from {SOURCE} in {path.parent} "
                           f"failed ({type(e).__name__})", log=log[-4000:]) from e


def build() -> Path:
    """The library's path, built first unless cached. Raises :class:`CompileError` (with
    the build's log) when it cannot be built."""
    if prebuilt_path().exists():
        return prebuilt_path()
    path = library_path()
    # Held while one process builds; the others wait, then load its result. (cpp_extension
    # has a lock of its own, "lock", but its waiters poll forever, and only the process
    # that wins it knows it builds: this one says so once and its waits are bounded.)
    lock = path.parent / "hologram_build.lock"
    if path.exists() and not lock.exists():
        return path
    missing = _missing_tools()
    if missing:
        mismatch = _prebuilt_mismatch()
        remedy = f"{mismatch}{_REMEDY})" if mismatch else _REMEDY
        raise CompileError(f"{' and '.join(missing)} not found; {remedy}")
    path.parent.mkdir(parents=True, exist_ok=True)
    baton = FileBaton(str(lock))
    while not baton.try_acquire():
        _wait_for_other_build(lock)
        if path.exists():
            return path  # else the other build failed: try ours (and report its error)
    try:
        if not path.exists():
            _compile(path)
    finally:
        baton.release()
    return path


def register() -> bool:
    """Build (if needed), load and register the native hooks; False, with :func:`reason`
    set, when they cannot be (the caller then registers the Python hooks)."""
    try:
        library = ctypes.CDLL(str(build()))
    except (CompileError, OSError) as e:
        _state.update(active=False, reason=str(e))
        if _missing_tools():
            return False  # the expected case on machines without a compiler: no noise
        warnings.warn(f"hologram_torch runs on its Python device hooks (DDP's "
                      f"find_unused_parameters and static_graph are unavailable): {e}",
                      RuntimeWarning, stacklevel=2)
        return False
    status = library.hologram_torch_register_hooks()
    if status == 1:
        _load_fast(library)
        library.hologram_torch_page_lock.argtypes = (ctypes.c_void_p,) * 4
        library.hologram_torch_page_lock.restype = None
        _state["library"] = library
    reasons = {0: "other PrivateUse1 hooks were registered first (torch takes one set per "
                  "process)",
               -1: "torch refused to register the native hooks"}
    _state.update(active=status == 1, reason=reasons.get(status))
    return status == 1


def _load_fast(library: ctypes.CDLL) -> None:
    global _fast
    fast = ctypes.PyDLL(library._name, handle=library._handle)
    fast.hologram_torch_fast_register.argtypes = (ctypes.c_char_p, ctypes.py_object)
    fast.hologram_torch_fast_register.restype = ctypes.c_int
    fast.hologram_torch_fast_setup.argtypes = (ctypes.py_object,) * 2
    fast.hologram_torch_fast_setup.restype = ctypes.c_int
    fast.hologram_torch_fast_file.argtypes = (ctypes.py_object,) * 5
    fast.hologram_torch_fast_file.restype = ctypes.c_int
    fast.hologram_torch_fast_clear.argtypes = ()
    fast.hologram_torch_fast_clear.restype = None
    fast.hologram_torch_fast_stats.argtypes = ()
    fast.hologram_torch_fast_stats.restype = ctypes.py_object
    fast.hologram_torch_metadata_register.argtypes = (ctypes.c_char_p,)
    fast.hologram_torch_metadata_register.restype = ctypes.c_int
    fast.hologram_torch_place.argtypes = (ctypes.py_object,) * 2
    fast.hologram_torch_place.restype = ctypes.c_int
    library.hologram_torch_set_device_count.argtypes = (ctypes.c_int,)
    library.hologram_torch_set_device_count.restype = None
    library.hologram_torch_current_device.argtypes = ()
    library.hologram_torch_current_device.restype = ctypes.c_int
    library.hologram_torch_set_current_device.argtypes = (ctypes.c_int,)
    library.hologram_torch_set_current_device.restype = None
    _fast = fast


def set_device_count(count: int) -> bool:
    """Tell torch's device guard there are ``count`` devices (hologram:0 to
    hologram:<count - 1>); False where the native hooks are not active (one device)."""
    library = _state.get("library")
    if library is None or not _state["active"]:
        return False
    library.hologram_torch_set_device_count(count)
    return True


def current_device() -> int:
    """This thread's current device, as torch's device guards set it (0 without hooks)."""
    library = _state.get("library")
    return library.hologram_torch_current_device() if library is not None else 0


def set_current_device(index: int) -> None:
    library = _state.get("library")
    if library is not None:
        library.hologram_torch_set_current_device(index)


def place(tensor, storage) -> None:
    """Point device tensor ``tensor`` at ``storage``, taking its device (hologram:N): the
    way to make tensors on devices other than hologram:0 (torch's Python API makes them
    on hologram:0, and ``set_`` keeps a tensor's device)."""
    _fast.hologram_torch_place(tensor, storage)


def page_lock(functions: tuple[int, int, int, int] | None) -> bool:
    """Make the pinned memory the hooks hand out (``pin_memory()``, DataLoader's) page-locked
    through a GPU driver's ``(cuMemHostAlloc, cuMemFreeHost, cuCtxSetCurrent, context)``
    (addresses), or ordinary host memory again (None). False where the native hooks are
    not active (pinning then copies: :mod:`hologram_torch.compat`)."""
    library = _state.get("library")
    if library is None or not _state["active"]:
        return False
    library.hologram_torch_page_lock(*(functions or (None,) * 4))
    return True


def register_fast(name: str, kernel: Callable, pool) -> bool:
    """Register ``kernel``, the Python kernel of ``name`` (``"add.Tensor"``), behind a
    native front kernel (``csrc/ops.cpp``) that serves the calls ``kernel`` files through
    :func:`file_fast` without running Python; fresh results come from ``pool`` (the device
    pool's native core). False when the native library is not loaded, or the op does not
    return one tensor: the caller registers ``kernel`` itself."""
    if _fast is None:
        return False
    _fast.hologram_torch_fast_setup(pool, _native.C_API)
    return _fast.hologram_torch_fast_register(name.encode(), kernel) == 1


def register_metadata(name: str) -> bool:
    """Register ``name``, a metadata-only op (a view), as the CPU kernel run from native
    code on the device tensor (``csrc/ops.cpp``). False when the native library is not
    loaded: the caller registers its Python kernel."""
    return _fast is not None and _fast.hologram_torch_metadata_register(name.encode()) == 1


def file_fast(entry, operands: tuple, outs, checks: tuple = ()) -> None:
    """Tell the front kernel running on this thread, if any, that its call launched
    ``entry`` (a launch-cache entry of :mod:`.aten.program`) on ``operands`` (the
    program's operands in order: tensors and Python numbers) into ``outs``, a tensor or a
    tuple of them in the launch's order, each one of the call's arguments (written in
    place) or a fresh tensor. It serves the call's signature from then on if every result
    the kernel returns is one of ``outs`` or None (a gradient its mask leaves out):
    launching it, or recording it (:mod:`.lazy`). ``checks``: ``(index, bound, dim,
    ignore)`` argument positions, the index ranges every call must pass first (else its
    Python kernel runs, which raises PyTorch's error): every value of argument ``index``
    in ``[0, size)`` or equal to the int argument ``ignore`` (-1: none), ``size`` being
    dimension ``dim`` of tensor argument ``bound``, or the int argument ``bound`` where
    ``dim`` is -1. Not while recording."""
    if _fast is not None and _front[0]:
        _fast.hologram_torch_fast_file(entry.launch, entry, operands, outs, checks)


_front = [True]


def set_front(on: bool) -> None:
    """Let the front kernels serve calls (on), or forget and stop filing them (off: the
    device's memory is not host memory, and they pass numbers by host address)."""
    _front[0] = on
    if not on:
        clear_fast()


def region_functions() -> dict | None:
    """The pending region's functions (``csrc/region.cpp``) by name, or None without the
    native library."""
    if _fast is None:
        return None
    _fast.hologram_torch_region_functions.restype = ctypes.py_object
    return _fast.hologram_torch_region_functions()


def fast_active() -> bool:
    """Is the native library, with its front kernels, loaded?"""
    return _fast is not None


def clear_fast() -> None:
    """Forget every call the front kernels filed."""
    if _fast is not None:
        _fast.hologram_torch_fast_clear()


def fast_stats() -> dict | None:
    """The front kernels' counters (``hits``, ``misses``, ``filed``, ``entries``), or None
    without the native library."""
    return None if _fast is None else _fast.hologram_torch_fast_stats()


def active() -> bool:
    """Do the native hooks serve this process?"""
    return _state["active"]


def reason() -> str | None:
    """Why the native hooks are not active (with the remedy), or None when they are."""
    return None if _state["active"] else _state["reason"]


def state() -> dict:
    """For ``hologram info``: ``active``, ``path`` (the library loaded, or that would be),
    ``origin`` (``"prebuilt"`` with the wheel, ``"built"`` on this machine), ``reason`` (why
    not active), ``prebuilt_for`` (the torch of the wheel's library, if any) and ``fast``
    (the front kernels loaded)."""
    path = library_path()
    return {"active": active(), "path": str(path),
            "origin": "prebuilt" if path.parent == PREBUILT else "built",
            "reason": reason(), "prebuilt_for": prebuilt_for(), "fast": fast_active()}


def report() -> None:
    """Print whether the native hooks are active (``make venv`` runs this after
    installing, to build them ahead of the first import)."""
    import hologram_torch  # noqa: F401 (registers the device, building the hooks)

    if active():
        print(f"hologram_torch: native device hooks active ({library_path()})")
    else:
        print(f"hologram_torch: native device hooks unavailable: {reason()}")
