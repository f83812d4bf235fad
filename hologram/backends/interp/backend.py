"""The ``interp`` backend: the reference interpreter behind the backend contract.

Its artifact is the scheduled program's text form, so the disk cache holds something a
person can read, and loading an artifact re-parses and re-verifies it: a damaged entry
fails there and is rebuilt by the cache.
"""

from __future__ import annotations

import platform

import numpy as np

from hologram.backends.base import Allocator, Backend, Executable, host_arrays
from hologram.backends.hostmem import Pool
from hologram.backends.interp.interpreter import execute
from hologram.compiler.capabilities import Capabilities
from hologram.errors import HologramError
from hologram.isa.dtypes import DType
from hologram.isa.ir import Program
from hologram.isa.text import parse_program, print_program


class InterpBackend(Backend):
    name = "interp"

    def target(self, name: str | None = None) -> str:
        if name not in (None, "host"):
            raise HologramError(f"backend 'interp' has one target, 'host' (the artifact is "
                                f"portable program text), not {name!r}")
        # The artifact is portable; NumPy's version is what could change results.
        return f"numpy-{np.__version__} {platform.machine()}"

    def supports(self, op: str, dtype: DType) -> bool:
        """Everything: the interpreter is the ISA's definition (and the oracle the
        conformance suite compares every backend with)."""
        return True

    def capabilities(self, target: str | None = None) -> Capabilities:
        """Every operation (its programs are not lowered for a target: it runs the ISA
        as defined)."""
        self.target(target)
        return Capabilities(gather=True, scatter=True)

    def compile(self, program: Program, target: str | None = None) -> bytes:
        self.target(target)
        return print_program(program).encode()

    def describe(self, artifact: bytes) -> dict:
        program = parse_program(artifact.decode())
        return {"format": "atlas text", "bytes": len(artifact),
                "kernels": [k.name for k in program.kernels], "arena": program.arena_bytes}

    def load(self, artifact: bytes) -> Executable:
        return _Interpreted(parse_program(artifact.decode()))

    def allocator(self, memory_limit: int | None = None) -> Allocator:
        return Pool(memory_limit)


class _Interpreted(Executable):
    def __init__(self, program: Program):
        self.program = program

    def launch(self, handles: tuple[int, ...]) -> None:
        execute(self.program, host_arrays(self.program.params, handles))
