"""The runtime: memory pool; executors and buffers arrive with the SDK.

:class:`Pool` is the host memory pool (96 size classes, blocks reused when arrays die);
:func:`default_pool` is the process-wide instance. See ``docs/memory.md``.
"""

from __future__ import annotations

from hologram.runtime.pool import Pool, default_pool

__all__ = ["Pool", "default_pool"]
