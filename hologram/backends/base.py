"""The backend contract.

A backend is one folder under ``hologram/backends/`` with a :class:`Backend` subclass,
named in :data:`hologram.backends.BUILTIN`. It has three parts:

- **renderer + compiler** — :meth:`Backend.compile`: a scheduled Atlas program (the
  pipeline's output) to an artifact (bytes: object code, PTX, WGSL, ...). Pure: it never
  allocates device memory, and the same program and target give the same artifact, so
  artifacts can be cached on disk.
- **runtime** — :meth:`Backend.load`: an artifact to a callable that runs it on arrays
  (one per program parameter, in order; outputs written in place).
- **identity** — :meth:`Backend.target`: everything about the machine that changes the
  artifact (CPU name and features, GPU architecture). It is part of every cache key, so
  an artifact never runs on a machine it was not built for.

Device memory (allocate, copy in and out) joins this contract with the runtime's memory
pool; today every backend runs on host NumPy arrays.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np

from hologram.isa.ir import Program

Executable = Callable[[Sequence[np.ndarray]], None]


class Backend(ABC):
    name: ClassVar[str]

    @classmethod
    def is_available(cls) -> bool:
        """Can this backend run on this machine (drivers, devices, libraries present)?"""
        return True

    @abstractmethod
    def target(self) -> str:
        """Identity of the target machine, for cache keys."""

    @abstractmethod
    def compile(self, program: Program) -> bytes:
        """Render and compile a scheduled, verified program into an artifact."""

    @abstractmethod
    def load(self, artifact: bytes) -> Executable:
        """Turn an artifact (fresh or read back from the disk cache) into a callable."""
