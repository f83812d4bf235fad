"""The runtime: memory, buffers, executors and launching compiled programs.

- :class:`Pool`, the host memory pool (96 size classes, blocks reused when arrays die), and
  :func:`default_pool`, the process-wide instance: re-exported from
  :mod:`hologram.backends.hostmem`, where the host backends' allocator lives. See
  ``docs/memory.md``.
- :mod:`.buffer`: :class:`~hologram.runtime.buffer.Buffer`, device memory of an executor.
- :mod:`.executor`: :class:`~hologram.runtime.executor.Executor`, a backend and the
  allocator its backend gives it (:meth:`hologram.backends.base.Backend.allocator`).
- :mod:`.launch`: ``hologram.compile`` / ``hologram.build``, ``CompiledProgram`` and
  :class:`~hologram.runtime.launch.LaunchCache`, the one cache from a call's signature to
  a ready launch (used by the SDK's ops, ``hg.jit`` and the torch device).

The runtime imports no module of the SDK (:mod:`hologram.sdk`); buffers get their
operators through :mod:`hologram.frontend.mixin`.
"""

from __future__ import annotations

from hologram.backends.hostmem import Pool, default_pool

__all__ = ["Pool", "default_pool"]
