"""The reference interpreter backend: it runs the ISA's executable definition
(:mod:`hologram.isa.semantics`) on NumPy arrays.

:func:`run` executes a program; every other backend is tested against it. The backend
class (the :class:`~hologram.backends.base.Backend` wrapper) is in :mod:`.backend`.
"""

from hologram.backends.interp.interpreter import run

__all__ = ["run"]
