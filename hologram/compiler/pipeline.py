"""The pass pipeline: one ordered list of named, pure ``Program -> Program`` stages.

With ``HOLOGRAM_DUMP_DIR`` set, every stage writes its output program there as
``<program>.<NN>.<stage>.atlas`` (the text form, which parses back); the backends add their
own stages after these through :func:`dump` (the cpu backend: ``<program>.<NN>.cpu.ll``, the
LLVM IR it renders; ``.cpu.opt.ll``, after LLVM's optimizer; ``.cpu.s``, the assembly). The
directory is
created (parents too) when missing; a path that names a file or cannot be written stops
the compile with one :class:`~hologram.errors.HologramError` naming the variable.

The cache key is taken after the ``canonicalize`` stage (:data:`KEY_STAGE`): two
spellings of one computation meet there, so everything after it is done once per
canonical program and backend.

:data:`TARGET_PASSES` follow for one target: ``Program -> Program`` passes that read the
target's :class:`~hologram.compiler.capabilities.Capabilities` (the numeric lowering its
instructions lack). A backend runs them on the lowered program (:func:`for_target`) before
it plans loops and renders; they are dumped like the others, numbered after
:data:`PIPELINE`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from hologram import config
from hologram.compiler.capabilities import Capabilities
from hologram.compiler.options import CompileOptions
from hologram.compiler.passes.canonicalize import canonicalize
from hologram.compiler.passes.coalesce import coalesce
from hologram.compiler.passes.decompose import decompose
from hologram.compiler.passes.fuse import fuse
from hologram.compiler.passes.schedule import schedule
from hologram.compiler.passes.specialize import specialize
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
    ("specialize", specialize),           # split kernels along coordinate-selected dims
    ("canonicalize.fused", canonicalize), # CSE across merged bodies, drop dead temporaries
    ("schedule", schedule),               # parallel grid per kernel, temporary arena
    ("coalesce", coalesce),               # merge grid dimensions walked as one
    ("verify.final", _verify),            # the passes must hand backends valid IR
)
KEY_STAGE = "canonicalize"

TargetPass = Callable[[Program, Capabilities], Program]


TARGET_PASSES: tuple[tuple[str, TargetPass], ...] = (
    ("decompose", decompose),   # f16/bf16 via f32, integer division, min/max (verified)
)


def run(program: Program, options: CompileOptions | None = None,
        start: str | None = None, stop: str | None = None) -> Program:
    """Run the stages from ``start`` through ``stop`` (names from :data:`PIPELINE`;
    default: all of them)."""
    options = options or CompileOptions()
    names = [name for name, _ in PIPELINE]
    first = names.index(start) if start else 0
    last = names.index(stop) if stop else len(names) - 1
    dump_dir = _dump_dir()
    for index in range(first, last + 1):
        name, stage = PIPELINE[index]
        program = _run_pass(name, stage, program, options, index, dump_dir)
    return program


def for_target(program: Program, caps: Capabilities) -> Program:
    """Run :data:`TARGET_PASSES` for a target with ``caps`` on a lowered program."""
    dump_dir = _dump_dir()
    for offset, (name, stage) in enumerate(TARGET_PASSES):
        program = _run_pass(name, stage, program, caps, len(PIPELINE) + offset, dump_dir)
    return program


def _run_pass(name: str, stage: Callable, program: Program, argument: object, index: int,
              dump_dir: Path | None) -> Program:
    try:
        program = stage(program, argument)
    except HologramError:
        raise
    except Exception as err:  # a bug in a pass: report it with the program it got
        raise CompileError(f"pass {name!r} failed on program {program.name}: {err!r}",
                           source=str(program)) from err
    if dump_dir is not None:
        _dump(dump_dir, f"{_file_name(program.name)}.{index:02d}.{name}.atlas", program)
    return program


def dump(program_name: str, stage: str, text: str | Callable[[], str]) -> None:
    """Write a backend stage's artifact as ``<program>.<NN>.<stage>`` under
    ``HOLOGRAM_DUMP_DIR``, numbered after the passes and the target passes in the order
    of ``stage`` names a backend dumps; nothing when the variable is unset. ``text`` may
    be a function, called only then (assembly is not free)."""
    path = _dump_dir()
    if path is None:
        return
    index = len(PIPELINE) + len(TARGET_PASSES) + \
        _BACKEND_STAGES.setdefault(stage, len(_BACKEND_STAGES))
    content = text() if callable(text) else text
    try:
        (path / f"{_file_name(program_name)}.{index:02d}.{stage}").write_text(content)
    except OSError as err:
        raise _dump_error(path, err) from None


# Backend stage name -> its number after the passes (first dumped, first numbered).
_BACKEND_STAGES: dict[str, int] = {}


def _dump_dir() -> Path | None:
    """``HOLOGRAM_DUMP_DIR``, created if missing; checked before any stage runs, so a bad
    setting fails a compile once, with one error, not midway through the stages."""
    path = config.get().dump_dir
    if path is not None:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise _dump_error(path, err) from None
    return path


def _dump(path: Path, name: str, program: Program) -> None:
    try:
        (path / name).write_text(str(program))
    except OSError as err:
        raise _dump_error(path, err) from None


def _dump_error(path: Path, err: OSError) -> HologramError:
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        why = "it is a file" if existing == path else f"{str(existing)!r} is a file"
    else:
        why = err.strerror or str(err)
    return HologramError(f"HOLOGRAM_DUMP_DIR={str(path)!r} cannot hold the compiler's stage "
                         f"dumps: {why}; set it to a directory (a missing one is created, "
                         "parents too) or unset it")


def _file_name(name: str) -> str:
    """A program name as a file name (a jit function's name may hold any character)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "program"


def canonical_form(program: Program, options: CompileOptions | None = None) -> Program:
    """The program as verified and canonicalized: what cache keys are computed from."""
    return run(program, options, stop=KEY_STAGE)


def lower(canonical: Program, options: CompileOptions | None = None) -> Program:
    """The remaining stages, from a canonical program to what backends compile."""
    names = [name for name, _ in PIPELINE]
    return run(canonical, options, start=names[names.index(KEY_STAGE) + 1])
