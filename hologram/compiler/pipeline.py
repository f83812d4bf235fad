"""The pass pipeline: one ordered list of named, pure ``Program -> Program`` stages.

With ``HOLOGRAM_DUMP_DIR`` set, every stage writes its output program there as
``<program>.<NN>.<stage>.atlas`` (the text form, which parses back).

The cache key is taken after the ``canonicalize`` stage (:data:`KEY_STAGE`): two
spellings of one computation meet there, so everything after it is done once per
canonical program and backend.
"""

from __future__ import annotations

from collections.abc import Callable

from hologram import config
from hologram.compiler.canonicalize import canonicalize
from hologram.compiler.coalesce import coalesce
from hologram.compiler.fuse import fuse
from hologram.compiler.options import CompileOptions
from hologram.compiler.schedule import schedule
from hologram.errors import CompileError, HologramError
from hologram.isa.ir import Program
from hologram.isa.verify import verify

Pass = Callable[[Program, CompileOptions], Program]


def _verify(program: Program, options: CompileOptions) -> Program:
    return verify(program)


PIPELINE: tuple[tuple[str, Pass], ...] = (
    ("verify", _verify),                  # reject ill-formed input before any rewrite
    ("canonicalize", canonicalize),       # fold, simplify, order operands, CSE, DCE
    ("fuse", fuse),                       # inline elementwise producers, merge epilogues
    ("canonicalize.fused", canonicalize), # CSE across merged bodies, drop dead temporaries
    ("schedule", schedule),               # parallel grid per kernel, temporary arena
    ("coalesce", coalesce),               # merge grid dimensions walked as one
    ("verify.final", _verify),            # the passes must hand backends valid IR
)
KEY_STAGE = "canonicalize"


def run(program: Program, options: CompileOptions | None = None,
        start: str | None = None, stop: str | None = None) -> Program:
    """Run the stages from ``start`` through ``stop`` (names from :data:`PIPELINE`;
    default: all of them)."""
    options = options or CompileOptions()
    names = [name for name, _ in PIPELINE]
    first = names.index(start) if start else 0
    last = names.index(stop) if stop else len(names) - 1
    dump_dir = config.get().dump_dir
    for index in range(first, last + 1):
        name, stage = PIPELINE[index]
        try:
            program = stage(program, options)
        except HologramError:
            raise
        except Exception as err:  # a bug in a pass: report it with the program it got
            raise CompileError(f"pass {name!r} failed on program {program.name}: {err!r}",
                               source=str(program)) from err
        if dump_dir is not None:
            dump_dir.mkdir(parents=True, exist_ok=True)
            (dump_dir / f"{program.name}.{index:02d}.{name}.atlas").write_text(str(program))
    return program


def canonical_form(program: Program, options: CompileOptions | None = None) -> Program:
    """The program as verified and canonicalized: what cache keys are computed from."""
    return run(program, options, stop=KEY_STAGE)


def lower(canonical: Program, options: CompileOptions | None = None) -> Program:
    """The remaining stages, from a canonical program to what backends compile."""
    names = [name for name, _ in PIPELINE]
    return run(canonical, options, start=names[names.index(KEY_STAGE) + 1])
