"""The runtime: memory, buffers, executors and launching compiled programs.

- :mod:`.pool`: :class:`Pool`, the host memory pool (96 size classes, blocks reused when
  arrays die); :func:`default_pool` is the process-wide instance. See ``docs/memory.md``.
- :mod:`.buffer`: :class:`~hologram.runtime.buffer.Buffer`, device memory of an executor.
- :mod:`.executor`: :class:`~hologram.runtime.executor.Executor`, a backend and a pool.
- :mod:`.launch`: ``hologram.compile`` / ``hologram.build`` and ``CompiledProgram``.

The runtime imports no module of the SDK (:mod:`hologram.sdk`); buffers get their
operators through :mod:`hologram.frontend.mixin`.
"""

from __future__ import annotations

from hologram.runtime.pool import Pool, default_pool

__all__ = ["Pool", "default_pool"]
