"""Hologram's compiler: pure ``Program -> Program`` passes (see :mod:`.pipeline`) and the
program cache (:mod:`.cache`). Compiling for a backend and running the result is the
runtime's part (:mod:`hologram.runtime.launch`): the compiler imports no backend and no
runtime module."""

from hologram.compiler.canonicalize import canonicalize
from hologram.compiler.fuse import fuse
from hologram.compiler.options import CompileOptions
from hologram.compiler.pipeline import PIPELINE, canonical_form, lower, run
from hologram.compiler.schedule import schedule

__all__ = [
    "PIPELINE", "CompileOptions", "canonical_form", "canonicalize", "fuse", "lower", "run",
    "schedule",
]
