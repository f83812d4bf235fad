"""The user-facing SDK: :mod:`.ops` (operations on buffers), :mod:`.jit` (trace a function
of buffers into one fused program) and :mod:`.backend` (backend selection). The package
root re-exports them as ``hologram.ops``, ``hologram.jit`` and ``hologram.backend``."""
