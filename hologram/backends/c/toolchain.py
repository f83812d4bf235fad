"""The system C compiler: finding it, naming it, and turning C99 source into a shared
library.

The compiler is ``$CC`` when it is set (a command line: ``"ccache gcc"`` works), else the
first of ``cc``, ``gcc`` and ``clang`` on ``PATH``. Its identity (the resolved path and
the first line of ``--version``), the machine and the flags are the backend's target: they
are what changes the artifact, so they key the program cache.

The flags keep IEEE semantics exact (docs/c.md): C99, no fast-math, no contraction of
``a * b + c`` into an fma (``-ffp-contract=off``: Clang contracts by default),
``-fno-strict-aliasing`` (temporaries of different dtypes share arena bytes between
kernels, which a compiler inlining the kernels must not reorder), and ``-fno-math-errno``
(``sqrt`` becomes one instruction; no value changes). Subnormals are kept: nothing sets
flush-to-zero (no ``-ffast-math``, so no ``crtfastmath.o``).
"""

from __future__ import annotations

import functools
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from hologram.errors import CompileError, DeviceError

#: The compilers looked for on PATH, in order, when $CC is unset.
CANDIDATES = ("cc", "gcc", "clang")
#: The flags every program is compiled with (see the module docstring). ``-O1``: the
#: conformance suite's 370 programs took 74 ms each on average with GCC 12 (-O2: 108 ms,
#: -O0: no faster than -O1, the compiler's start dominates).
FLAGS = ("-std=c99", "-O1", "-pipe", "-fPIC", "-shared", "-ffp-contract=off",
         "-fno-strict-aliasing", "-fno-math-errno", "-fno-fast-math")
#: How long one compile may take before it is abandoned (seconds).
TIMEOUT = 600


class CCompilerNotFoundError(DeviceError):
    """The ``c`` backend found no C compiler (``$CC``, or cc, gcc or clang on PATH)."""


def command() -> list[str]:
    """The compiler's command line: ``$CC`` split as a shell would, else the first
    candidate on PATH. Raises :class:`CCompilerNotFoundError` naming the fix."""
    configured = os.environ.get("CC", "").strip()
    if configured:
        words = shlex.split(configured)
        found = shutil.which(words[0])
        if found is None:
            raise CCompilerNotFoundError(
                f"backend 'c': $CC is {configured!r}, but {words[0]!r} is not an executable "
                "on PATH; set CC to a C99 compiler (gcc, clang) or unset it to use cc")
        return [found, *words[1:]]
    for name in CANDIDATES:
        found = shutil.which(name)
        if found is not None:
            return [found]
    raise CCompilerNotFoundError(
        "backend 'c' needs a C99 compiler and found none: $CC is unset and none of "
        f"{', '.join(CANDIDATES)} is on PATH; install one (Debian/Ubuntu: apt install gcc; "
        "macOS: xcode-select --install) or set CC to its path")


def available() -> bool:
    """Is there a compiler to use (without running it)?"""
    try:
        command()
    except CCompilerNotFoundError:
        return False
    return True


def identity() -> str:
    """The target identity: compiler, its version, the machine, the flags."""
    cmd = command()
    return _identity(tuple(cmd), os.path.getmtime(cmd[0]))


@functools.lru_cache(maxsize=8)
def _identity(cmd: tuple[str, ...], mtime: float) -> str:
    # Keyed by the binary's mtime too: an upgraded compiler is another target.
    try:
        done = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=60)
        version = (done.stdout or done.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError) as err:
        raise CCompilerNotFoundError(f"backend 'c': the C compiler {' '.join(cmd)!r} does not "
                                     f"run ({err}); set CC to a working one") from None
    return (f"{' '.join(cmd)} ({version}) {platform.machine()}-{platform.system().lower()} "
            f"{' '.join(FLAGS)}")


def compile_source(source: str, name: str) -> bytes:
    """The shared library (bytes) of C ``source``; :class:`~hologram.errors.CompileError`
    with the compiler's messages and the source if it fails. ``name``: the program's, for
    the message."""
    cmd = command()
    with tempfile.TemporaryDirectory(prefix="hologram-c-") as work:
        src, lib = Path(work, "program.c"), Path(work, "program.so")
        src.write_text(source)
        try:
            done = subprocess.run([*cmd, *FLAGS, "-o", str(lib), str(src), "-lm"],
                                  capture_output=True, text=True, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            raise CompileError(f"backend 'c': compiling program {name} took over {TIMEOUT} s",
                               source=source) from None
        if done.returncode != 0:
            raise CompileError(f"backend 'c': {' '.join(cmd)} failed on program {name} (exit "
                               f"{done.returncode})", log=done.stderr + done.stdout,
                               source=source)
        return lib.read_bytes()
