"""Hologram's compiler: pure ``Program -> Program`` passes (see :mod:`.pipeline`) and the
driver that runs them, consults the program cache and hands the result to a backend."""

from hologram.compiler.canonicalize import canonicalize
from hologram.compiler.driver import CompiledProgram, compile
from hologram.compiler.fuse import fuse
from hologram.compiler.options import CompileOptions
from hologram.compiler.pipeline import PIPELINE, canonical_form, lower, run
from hologram.compiler.schedule import schedule

__all__ = [
    "PIPELINE", "CompileOptions", "CompiledProgram", "canonical_form", "canonicalize",
    "compile", "fuse", "lower", "run", "schedule",
]
