"""The Hologram exception tree.

Every error Hologram raises on purpose is a :class:`HologramError`. Messages name the
operation (or IR instruction), the shapes, dtypes and backend involved, and what to do
about it. ``assert`` is reserved for internal invariants.

    HologramError
    ├── IRError            ill-formed Atlas program (verifier, parser)
    ├── CompileError       a pass or a backend compiler failed
    ├── DeviceError        backend unavailable or failing at run time
    ├── ShapeError         shapes that do not fit (also a ValueError)
    ├── DTypeError         unsupported or mismatched dtypes (also a TypeError)
    ├── IndexOutOfRangeError  an index in the data outside its extent (also an IndexError)
    ├── OutOfMemoryError   allocation beyond the configured limit (also a MemoryError)
    ├── CacheError         the program cache cannot be used
    └── GradientError      no derivative rule for an operation a gradient passes
"""

from __future__ import annotations


class HologramError(Exception):
    """Base class of every error Hologram raises deliberately."""


class IRError(HologramError):
    """An Atlas program is ill-formed.

    ``instr`` is the textual form (or index) of the offending instruction when there is one.
    """

    def __init__(self, message: str, *, instr: str | None = None):
        self.instr = instr
        super().__init__(f"{message}\n  at: {instr}" if instr else message)


class CompileError(HologramError):
    """Compilation failed; carries the source and the tool's log when there are any."""

    def __init__(self, message: str, *, source: str | None = None, log: str | None = None):
        self.source = source
        self.log = log
        parts = [message]
        if log:
            parts.append(f"--- log ---\n{log}")
        if source:
            parts.append(f"--- source ---\n{source}")
        super().__init__("\n".join(parts))


class DeviceError(HologramError):
    """A backend is unavailable or failed while running."""


class ShapeError(HologramError, ValueError):
    """Shapes are incompatible with the operation."""


class DTypeError(HologramError, TypeError):
    """A dtype is unsupported or does not match what the operation requires."""


class IndexOutOfRangeError(HologramError, IndexError):
    """A value used as an index (a class label, a coordinate) lies outside the extent it
    indexes; the message names the operation, the shapes and the offending value."""


class OutOfMemoryError(HologramError, MemoryError):
    """An allocation would exceed the configured memory limit."""


class CacheError(HologramError):
    """The program cache directory cannot be used."""


class InvalidBufferError(HologramError):
    """An SDK buffer cannot be used: it was freed, its executor was closed, it belongs to
    another executor, or it is read-only and an op would write to it."""


class GradientError(HologramError):
    """A gradient cannot be derived: it would pass through an operation that has no
    derivative rule (the message names it, with its shapes and dtypes)."""
