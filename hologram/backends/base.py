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

from hologram.errors import DTypeError, ShapeError
from hologram.isa.ir import Buffer, Program

# Called with one array per parameter, already checked (check_arrays' rules: dtype, size,
# C-contiguous, writable outputs), in any shape. An executable may also have an attribute
# ``by_address``: None, or a callable taking one host address per parameter (a tuple of
# ints) that runs the program without array objects, for callers that own their memory
# (the SDK) and want the lowest per-call overhead.
Executable = Callable[[Sequence[np.ndarray]], None]


def check_arrays(program: Program, arrays: Sequence[object], where: str) -> list[np.ndarray]:
    """Check one array per parameter of ``program`` (count, dtype, size, contiguity,
    writability of outputs) and return flat views of them (stores land in the caller's
    arrays). Errors name ``where`` (the program and backend), the parameter, and what was
    expected and given."""
    params = program.params
    if len(arrays) != len(params):
        names = ", ".join(f"{p.kind} {p.name}" for p in params)
        raise ShapeError(f"{where}: takes {len(params)} arrays ({names}), got {len(arrays)}")
    return [_check(param, array, where) for param, array in zip(params, arrays)]


def _check(param: Buffer, array: object, where: str) -> np.ndarray:
    where = f"{where}, parameter {param.name} ({param.kind} {param.dtype.name}{list(param.shape)})"
    if not isinstance(array, np.ndarray):
        raise DTypeError(f"{where}: expected a NumPy array, got {type(array).__name__}")
    if array.dtype != param.dtype.storage:
        bits = " (bf16 bit patterns)" if param.dtype.name == "bf16" else ""
        raise DTypeError(f"{where}: expected {param.dtype.name} (NumPy "
                         f"{param.dtype.storage}{bits}), got {array.dtype}")
    if array.size != param.size:
        raise ShapeError(f"{where}: expected {param.size} elements, got shape "
                         f"{list(array.shape)}")
    if not array.flags.c_contiguous:
        raise ShapeError(f"{where}: the array must be C-contiguous "
                         "(pass np.ascontiguousarray(a) and copy results back)")
    if param.kind != "in" and not array.flags.writeable:
        raise ShapeError(f"{where}: output array is read-only")
    return array.reshape(-1)


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
