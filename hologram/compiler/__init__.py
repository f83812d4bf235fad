"""Hologram's compiler: pure ``Program -> Program`` passes (see :mod:`.pipeline`), the
program cache (:mod:`.cache`) and elementwise programs' templates (:mod:`.generic`).
Compiling for a backend and running the result is the runtime's part
(:mod:`hologram.runtime.launch`): the compiler imports no backend and no runtime module."""

from hologram.compiler.options import CompileOptions
from hologram.compiler.passes.canonicalize import canonicalize
from hologram.compiler.passes.fuse import fuse
from hologram.compiler.passes.schedule import schedule
from hologram.compiler.pipeline import PIPELINE, canonical_form, lower, run

__all__ = [
    "PIPELINE", "CompileOptions", "canonical_form", "canonicalize", "fuse", "lower", "run",
    "schedule",
]
