"""The reference interpreter backend: the executable definition of the Atlas ISA.

:func:`run` executes a program on NumPy arrays; :func:`evaluate` gives the value of one
instruction (the constant folder uses it too). Every other backend is tested against them.
"""

from hologram.backends.interp.interpreter import run
from hologram.isa.semantics import evaluate

# The lead adds the backend class (the Backend interface wrapper) here later.

__all__ = ["evaluate", "run"]
