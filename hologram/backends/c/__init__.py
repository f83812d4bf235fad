"""The ``c`` backend: portable C99 source compiled with the system C compiler and loaded
with ctypes (docs/c.md). :mod:`.render` writes the source, :mod:`.mathlib` and
:mod:`.prelude` the helpers it calls, :mod:`.toolchain` finds and runs the compiler, and
:mod:`.backend` is the :class:`~hologram.backends.base.Backend`."""
