"""The ``c`` backend: Atlas -> portable C99 -> the system C compiler -> a shared library
loaded with ctypes, on host memory.

It is the way to run Hologram's kernels where LLVM is unavailable (a platform without
llvmlite wheels, a sandbox that forbids a JIT): any C99 compiler with IEEE floats does.
It is a reference, not a fast backend: one thread, no library calls for products.

**Compile** (:meth:`CBackend.compile`): the target passes for its capabilities
(``pipeline.for_target``: f16/bf16 arithmetic through f32, guarded integer division),
:func:`.render.render` to one C source, :func:`.toolchain.compile_source` to a shared
library. The artifact holds both, after a JSON header: the launch layout (buffers,
parameters, temporaries and the arena) and what :meth:`CBackend.describe` reports.

**Load** (:meth:`CBackend.load`): the library is written to a private temporary file,
opened with ctypes (the file is removed at once; the mapping stays) and kept open as long
as the executable lives. A launch passes one pointer per buffer (parameters at their
handles, temporaries in an arena taken per call from a host pool) to ``hologram_run``.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import tempfile
import threading

import numpy as np

from hologram.backends.base import Allocator, Backend, Executable
from hologram.backends.c import render, toolchain
from hologram.backends.hostmem import Pool
from hologram.codegen import loops
from hologram.compiler import pipeline
from hologram.compiler.capabilities import Capabilities
from hologram.errors import CompileError, HologramError
from hologram.isa.dtypes import DType
from hologram.isa.ir import Program

#: The artifact: MAGIC, the header's length (u32), the JSON header, the source, the library.
MAGIC = b"HGC1"
_LENGTH = struct.Struct("<I")
#: What C code on this backend can use: everything the renderer writes (gather, scatter;
#: IEEE maximum/minimum as helpers), f16/bf16 arithmetic computed in f32 by the decompose
#: pass; no splits (one thread).
CAPABILITIES = Capabilities(gather=True, scatter=True)
_ARENAS = Pool()  # programs' scratch memory, one block per call
_BYTE = np.dtype(np.uint8)


class CBackend(Backend):
    name = "c"

    @classmethod
    def is_available(cls) -> bool:
        return toolchain.available()

    @classmethod
    def auto_available(cls) -> bool:
        """Never: "auto" takes the cpu backend (LLVM) or the interpreter; ask for "c"."""
        return False

    @classmethod
    def not_auto_reason(cls) -> str:
        """Why ``"auto"`` passes it over (``hologram info``)."""
        return "a portable reference on one thread: 'auto' takes the cpu backend; ask for 'c'"

    @classmethod
    def unavailable_reason(cls) -> str:
        try:
            toolchain.command()
        except toolchain.CCompilerNotFoundError as err:
            return str(err)
        return "a C compiler is there"

    def target(self, name: str | None = None) -> str:
        if name not in (None, "host"):
            raise HologramError(f"backend 'c' has one target, 'host' (this machine's C "
                                f"compiler, $CC or cc), not {name!r}")
        return toolchain.identity()

    def capabilities(self, target: str | None = None) -> Capabilities:
        if target not in (None, "host"):
            self.target(target)
        return CAPABILITIES

    def supports(self, op: str, dtype: DType) -> bool:
        """Every ISA opcode on every dtype."""
        return True

    def compile(self, program: Program, target: str | None = None) -> bytes:
        identity = self.target(target)
        program = pipeline.for_target(program, CAPABILITIES)
        pipeline.dump(program.name, "loops", lambda: loops.dump(program, CAPABILITIES))
        source = render.render(program, CAPABILITIES)
        pipeline.dump(program.name, "c", source)
        library = toolchain.compile_source(source, program.name)
        header = {
            "compiler": identity,
            "kernels": [k.name for k in program.kernels],
            "buffers": len(program.buffers),
            "params": [i for i, b in enumerate(program.buffers) if b.kind != "temp"],
            "temps": [[i, b.offset] for i, b in enumerate(program.buffers) if b.kind == "temp"],
            "arena": program.arena_bytes,
            "source_bytes": len(source.encode()),
        }
        data = json.dumps(header).encode()
        return MAGIC + _LENGTH.pack(len(data)) + data + source.encode() + library

    def describe(self, artifact: bytes) -> dict:
        header, source, library = split(artifact)
        return {"format": "C99 source and shared library", "bytes": len(artifact),
                "compiler": header["compiler"], "flags": list(toolchain.FLAGS),
                "kernels": header["kernels"], "arena": header["arena"],
                "source_lines": source.count("\n"), "library_bytes": len(library),
                "entry": render.ENTRY, "threads": 1}

    def load(self, artifact: bytes) -> Executable:
        header, _, library = split(artifact)
        return _Executable(header, _open(library))

    def allocator(self, memory_limit: int | None = None) -> Allocator:
        return Pool(memory_limit)


def split(artifact: bytes) -> tuple[dict, str, bytes]:
    """(header, C source, shared library) of an artifact; a damaged one raises
    :class:`~hologram.errors.CompileError` (the program cache then rebuilds it)."""
    try:
        if artifact[:4] != MAGIC:
            raise ValueError("not a c backend artifact")
        (size,) = _LENGTH.unpack_from(artifact, 4)
        start = 4 + _LENGTH.size
        header = json.loads(artifact[start : start + size])
        start += size
        end = start + header["source_bytes"]
        return header, artifact[start:end].decode(), artifact[end:]
    except (ValueError, KeyError, struct.error) as err:
        raise CompileError(f"backend 'c': damaged artifact ({err})") from None


def source(artifact: bytes) -> str:
    """The C source an artifact was compiled from."""
    return split(artifact)[1]


_open_lock = threading.Lock()


def _open(library: bytes) -> ctypes.CDLL:
    """The library opened from a private temporary file, removed once it is mapped."""
    with _open_lock, tempfile.TemporaryDirectory(prefix="hologram-c-") as work:
        path = os.path.join(work, "program.so")
        with open(path, "wb") as f:
            f.write(library)
        return ctypes.CDLL(path)


class _Executable(Executable):
    """A loaded program: ``hologram_run`` on one pointer per buffer."""

    def __init__(self, header: dict, library: ctypes.CDLL):
        self.library = library  # kept open as long as the executable lives
        self.run = getattr(library, render.ENTRY)
        self.run.restype, self.run.argtypes = None, [ctypes.c_void_p]
        self.params, self.temps, self.arena = header["params"], header["temps"], header["arena"]
        self.pointers = ctypes.c_void_p * max(header["buffers"], 1)

    def launch(self, handles: tuple[int, ...]) -> None:
        pointers = self.pointers()
        for slot, address in zip(self.params, handles):
            pointers[slot] = address
        arena = _ARENAS.alloc((self.arena,), _BYTE) if self.arena else None
        if arena is not None:  # per call: concurrent calls must not share scratch memory
            base = arena.ctypes.data
            for slot, offset in self.temps:
                pointers[slot] = base + offset
        self.run(pointers)
