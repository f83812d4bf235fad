"""The ``interp`` backend: the reference interpreter behind the backend contract.

Its artifact is the scheduled program's text form, so the disk cache holds something a
person can read, and loading an artifact re-parses and re-verifies it: a damaged entry
fails there and is rebuilt by the cache.
"""

from __future__ import annotations

import platform

from hologram.backends.base import Backend, Executable
from hologram.backends.interp.interpreter import execute
from hologram.isa.ir import Program
from hologram.isa.text import parse_program, print_program


class InterpBackend(Backend):
    name = "interp"

    def target(self) -> str:
        import numpy

        # The artifact is portable; NumPy's version is what could change results.
        return f"numpy-{numpy.__version__} {platform.machine()}"

    def compile(self, program: Program) -> bytes:
        return print_program(program).encode()

    def load(self, artifact: bytes) -> Executable:
        program = parse_program(artifact.decode())

        def run(arrays) -> None:
            execute(program, [a.reshape(-1) for a in arrays])

        return run
