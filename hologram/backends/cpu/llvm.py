"""LLVM through llvmlite: target machines, the O3 pipeline, checked object code, one JIT.

- Code is generated for a :class:`~.target.Target` (``HOLOGRAM_CPU_TARGET``; this machine by
  default). :func:`compile_ir` turns LLVM IR text into a relocatable object file (bytes),
  which is what the disk cache stores; any target can be compiled on any machine.
- Generated code calls no runtime library: where a target lacks an instruction, LLVM would
  lower the operation to a call (``__truncdfhf2``, ``fmaf``, ``floorf``, ...) that the JIT
  cannot resolve, and the call would jump to address 0. The renderer asks
  :func:`lowers_natively` and emits our own IR instead (:mod:`.softfloat`); and every
  object is checked (:func:`check_object`) when it is emitted and again before it is
  loaded: a symbol it needs from outside is a :class:`CompileError`, never a load.
- Two tiers (:data:`TIERS`): ``"full"`` is the O3 pipeline with loop and SLP vectorization
  and code generation at O3; ``"quick"`` runs three passes (SROA, instcombine,
  simplifycfg) and generates code at O0 (fast instruction selection, fast register
  allocation), about 7x less compile time for slower code. Both compute the same bits for
  a module whose instructions carry no fast-math and no poison-generating flag
  (:func:`same_bits_at_every_tier`): without those flags every LLVM transform keeps the
  IEEE 754 result of each operation (NaN payloads aside, which docs/isa.md leaves open),
  and neither reassociates nor contracts. A module with such a flag (``reassoc`` products,
  the ``arcp`` reciprocal of sigmoid) is compiled at ``"full"`` only.
- :func:`load_object` loads an object file and returns the addresses of the functions
  asked for: with :mod:`.loader` (x86-64 ELF: sections copied, relocations applied, pages
  protected; ~0.1 ms), or, for what that does not handle, into its own MCJIT engine
  (~0.5-0.9 ms: an engine, a target machine and its empty module compiled each time).
  Each engine gets a fresh target machine (MCJIT takes ownership of it: reusing one after
  its engine is collected crashes the process), and engines are kept for the life of the
  process, because the code they hold may be called at any time. A second object added
  to an already finalized engine comes out broken (calling it crashes), hence one engine
  per object. Loading the same object twice returns the first load's addresses.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from functools import cache

import llvmlite.binding as llvm

from hologram.backends.cpu import elf, loader
from hologram.backends.cpu import target as targets
from hologram.backends.cpu.target import Target
from hologram.compiler import cache as programs
from hologram.errors import CompileError

_lock = threading.RLock()  # llvmlite objects are not thread-safe
_loaded: dict[str, dict[str, int]] = {}
_engines: list[llvm.ExecutionEngine] = []  # never collected: their code stays callable
#: Objects :func:`compile_ir` made in this process, most recent last, by IR, target, allowed
#: symbols and tier: the same module is compiled once (a model's elementwise ops on tensors
#: of different shapes with as many elements render alike: 39 of the 102 modules of a
#: transformer's first training step).
OBJECTS_KEPT = 256
_objects: OrderedDict[tuple, bytes] = OrderedDict()
_objects_lock = threading.Lock()  # not _lock, which a background compile holds for long

#: Symbols a kernel object may take from the process: libc's memory functions, which LLVM
#: calls for loops it recognises as a copy or a fill (``bzero`` on Darwin). Each is resolved
#: in this process before an object that needs it is loaded.
PROCESS_SYMBOLS = frozenset({"memcpy", "memmove", "memset", "bzero", "__bzero"})
# Defined by the linker, or by MCJIT's loader in its place.
_LINKER_SYMBOLS = frozenset({"_GLOBAL_OFFSET_TABLE_"})

TIERS = ("full", "quick")
# Instruction flags that let LLVM change a result (fast-math) or make it poison, which
# each optimization level may then fold differently; and fmuladd, which code generation
# fuses or not depending on the level. Function attributes such as "unsafe-fp-math" too.
_TIER_SENSITIVE_WORDS = ("fast", "reassoc", "nnan", "ninf", "nsz", "arcp", "contract", "afn",
                         "nsw", "nuw", "exact", "nneg", "disjoint", "samesign", "fmuladd")
_TIER_SENSITIVE = re.compile(rf"\b({'|'.join(_TIER_SENSITIVE_WORDS)})\b|-fp-math")
# Except the float max/min reductions' maxnum/minnum (render's ``_float_extremum``): the
# renderer puts the NaN and the zero's sign back after the loop, so every result the flags
# allow ends in the same bits.
_EXACT_AFTER_FIXUP = re.compile(
    r'call nnan nsz (float|double) @("?)llvm\.(maxnum|minnum)\.f(32|64)\2\(')
# The quick tier's passes: registers instead of stack slots (the renderer's accumulators
# and loop variables are allocas), then local simplification; no loop transformation.
_QUICK_PASSES = ("sroa", "instruction_combine", "simplify_cfg")


def host_cpu() -> tuple[str, str, str]:
    """(triple, CPU name, feature string) of this machine."""
    host = targets.host()
    return host.triple, host.cpu, host.features


def has_feature(name: str) -> bool:
    """Does this machine's CPU have the feature (``"avx2"``, ``"avx512f"``, ...)?"""
    return name in targets.host_features()


def _new_lock_in_child() -> None:
    global _lock
    _lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    # A fork while another thread compiles (a background promotion) would leave the child
    # with the lock held forever: forks wait for the compile under way.
    os.register_at_fork(before=lambda: _lock.acquire(), after_in_parent=lambda: _lock.release(),
                        after_in_child=_new_lock_in_child)


def same_bits_at_every_tier(ir: str) -> bool:
    """Do both :data:`TIERS` compute the same bits for LLVM IR ``ir``? True when no
    instruction carries a fast-math or poison-generating flag and nothing calls
    ``llvm.fmuladd`` (a word that merely looks like one, in a name, answers False: safe)."""
    # Substring tests first: the regex alone, which tries every alternative at every
    # position, took ~0.3 ms of a kernel's compile; most modules contain none of the words.
    if not any(word in ir for word in _TIER_SENSITIVE_WORDS) and "-fp-math" not in ir:
        return True
    if "call nnan nsz" in ir:
        ir = _EXACT_AFTER_FIXUP.sub(r"call \1 @\2llvm.\3.f\4\2(", ir)
    return _TIER_SENSITIVE.search(ir) is None


def _target_machine(target: Target, opt: int = 3) -> llvm.TargetMachine:
    features = target.features
    if target.arch == "x86_64":
        # LLVM emits 256-bit vectors by default even for AVX-512 CPUs; full-width vectors
        # run our polynomial math ~1.5x faster and memory-bound loops no slower. (Without
        # AVX-512 there are no 512-bit registers and this changes nothing.)
        features = ",".join(f for f in (features, "-prefer-256-bit") if f)
    return llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu, features=features, opt=opt, reloc="pic", codemodel="jitdefault")


@cache
def _emitter(target: Target, tier: str = "full") -> llvm.TargetMachine:
    """The target machine used to optimize and emit objects at ``tier`` (never given to
    MCJIT)."""
    return _target_machine(target, 3 if tier == "full" else 0)


def _parse(ir: str, target: Target) -> llvm.ModuleRef:
    try:
        module = llvm.parse_assembly(ir)
        module.verify()
    except RuntimeError as err:
        raise CompileError("LLVM rejected the generated IR", source=ir, log=str(err)) from None
    module.triple = target.triple
    module.data_layout = str(_emitter(target).target_data)
    return module


def optimize_ir(ir: str, target: Target | None = None, tier: str = "full") -> llvm.ModuleRef:
    """Parse, verify and optimize ``ir`` at ``tier`` (``"full"``: O3, loop and SLP
    vectorization, unrolling; ``"quick"``: see the module docstring)."""
    if tier not in TIERS:
        raise CompileError(f"unknown LLVM tier {tier!r}; known: {', '.join(TIERS)}")
    target = target or targets.current()
    with _lock:
        module = _parse(ir, target)
        full = tier == "full"
        options = llvm.create_pipeline_tuning_options(speed_level=3 if full else 0)
        options.loop_vectorization = full
        options.slp_vectorization = full
        options.loop_unrolling = full
        builder = llvm.create_pass_builder(_emitter(target, tier), options)
        if full:
            builder.getModulePassManager().run(module, builder)
            # The vector variants the loop vectorizer called (.mathlib: rarely taken paths)
            inline = llvm.create_new_module_pass_manager()
            inline.add_always_inliner_pass()
            inline.run(module, builder)
        else:
            passes = llvm.create_new_module_pass_manager()
            for name in _QUICK_PASSES:
                getattr(passes, f"add_{name}_pass")()
            passes.run(module, builder)
        return module


def compile_ir(ir: str, target: Target | None = None,
               allowed: Iterable[str] = PROCESS_SYMBOLS,
               dump: Callable[[str, str | Callable[[], str]], None] | None = None,
               tier: str = "full", cached: bool = True) -> bytes:
    """LLVM IR text -> optimized, checked object file for ``target`` (default: the current
    one) at ``tier`` (:data:`TIERS`; ``"quick"`` only where :func:`same_bits_at_every_tier`:
    the caller checks). ``allowed``: the symbols the object may take from the process.
    ``dump(stage, text)``, when given, receives the optimized IR (``cpu.opt.ll``) and the
    assembly (``cpu.s``).

    ``cached``: the object is kept in the program cache's directory, under a key of the IR
    text, the target, the tier, the allowed symbols and the compiler's version, and read
    back from there by later processes (support code such as the worker pool, compiled in
    every process: ~70 ms at O3). The cpu backend passes False: its artifacts, which hold
    the object, are cached already. Nothing is cached when ``dump`` is given."""
    target = target or targets.current()
    if tier not in TIERS:
        raise CompileError(f"unknown LLVM tier {tier!r}; known: {', '.join(TIERS)}")
    allowed = frozenset(allowed)
    if dump is not None:  # the dumps come from a compile
        obj = _compile_ir(ir, target, allowed, dump, tier)
        check_object(obj, target, allowed)
        return obj
    key = (hashlib.sha256(ir.encode()).digest(), target.identity, allowed, tier)
    with _objects_lock:
        obj = _objects.get(key)
        if obj is not None:
            _objects.move_to_end(key)
            return obj
    obj = _compile_ir(ir, target, allowed, None, tier) if not cached else \
        _cached_object(ir, target, allowed, tier)
    check_object(obj, target, allowed)  # fresh, or read back from disk
    with _objects_lock:
        _objects[key] = obj
        while len(_objects) > OBJECTS_KEPT:
            _objects.popitem(last=False)
    return obj


def _cached_object(ir: str, target: Target, allowed: frozenset[str], tier: str) -> bytes:
    """:func:`_compile_ir`'s object through the program cache's directory."""
    key = programs.CacheKey(
        hashlib.sha256(ir.encode()).hexdigest(), "cpu", target.identity,
        f"llvm-object;tier={tier};allowed={','.join(sorted(allowed))}",
        f"{programs.compiler_version('cpu')};llvm={'.'.join(map(str, llvm.llvm_version_info))}")
    return programs.default_cache().artifact(
        key, lambda: _compile_ir(ir, target, allowed, None, tier), counted=False)


def _compile_ir(ir: str, target: Target, allowed: frozenset[str],
                dump: Callable[[str, str | Callable[[], str]], None] | None,
                tier: str) -> bytes:
    """:func:`compile_ir` without the cache or the object's check."""
    module = optimize_ir(ir, target, tier)
    with _lock:
        optimized = str(module) if dump is not None else ""
        emitter = _emitter(target, tier)
        obj = emitter.emit_object(module)
        if dump is not None:  # code generation may rewrite the module: the assembly of a copy
            dump("cpu.opt.ll", optimized)
            dump("cpu.s", lambda: emitter.emit_assembly(llvm.parse_assembly(optimized)))
    return obj


def assembly(ir: str, target: Target | None = None) -> str:
    """The assembly for ``ir`` after optimization (for tests and debugging)."""
    target = target or targets.current()
    module = optimize_ir(ir, target)
    with _lock:
        return _emitter(target).emit_assembly(module)


def undefined_symbols(obj: bytes) -> list[str]:
    """The symbols an object file uses but does not define (ELF, Mach-O or COFF), without
    Mach-O's leading underscore."""
    if not obj:  # a program of library calls only (BLAS) has no object code
        return []
    if elf.is_elf64(obj):  # every Linux host's objects: without lief's second-long import
        try:
            return sorted({s.name for s in elf.read(obj).symbols if s.shndx == 0 and s.name})
        except ValueError as err:
            raise CompileError("cannot read the symbol table of the generated object file "
                               f"({len(obj)} bytes): {err}") from None
    import lief  # here, not with the module: its import takes a second

    binary = lief.parse(obj)
    if isinstance(binary, lief.MachO.Binary):
        names = [s.name[1:] if s.name.startswith("_") else s.name for s in binary.symbols
                 if s.type == lief.MachO.Symbol.TYPE.UNDEFINED]
    elif isinstance(binary, lief.COFF.Binary):
        names = [s.name for s in binary.symbols if s.is_undefined]
    else:
        raise CompileError("cannot read the symbol table of the generated object file "
                           f"({len(obj)} bytes): not ELF, Mach-O or COFF")
    return sorted(set(names))


def check_object(obj: bytes, target: Target, allowed: Iterable[str] = PROCESS_SYMBOLS,
                 what: str = "") -> None:
    """Raise :class:`CompileError` if ``obj`` needs a symbol from outside other than
    ``allowed`` ones: such code would call a runtime-library function (the JIT resolves
    nothing else, so the call would jump to address 0)."""
    foreign = [s for s in undefined_symbols(obj)
               if s not in _LINKER_SYMBOLS and s not in set(allowed)]
    if foreign:
        functions = what or ", ".join(_defined_functions(obj)) or "?"
        raise CompileError(
            f"generated code for {target.cpu} ({target.triple}, HOLOGRAM_CPU_TARGET="
            f"{target.name}) calls {', '.join(foreign)}, which it does not define (in "
            f"{functions}): most likely a runtime-library call that LLVM emitted for an "
            "operation this CPU lacks. Not loaded. This is a Hologram bug: please report it "
            "with this message; another HOLOGRAM_CPU_TARGET may avoid it")


def _defined_functions(obj: bytes) -> list[str]:
    if elf.is_elf64(obj):
        return [s.name for s in elf.read(obj).symbols if s.type == elf.STT_FUNC and s.shndx]
    import lief

    binary = lief.parse(obj)  # held: its symbols' iterator does not keep it alive
    return [s.name for s in binary.symbols if s.name.startswith(("hg_", "_hg_"))]


@cache
def lowers_natively(target: Target, op: str, ty: str) -> bool:
    """Does ``target`` compile ``op`` on ``ty`` without a runtime-library call?

    ``op`` is an intrinsic base name (``fma``, ``floor``, ``ceil``, ``trunc``, ``rint``,
    ``roundeven``, ``ldexp``) or a conversion (``fpext``/``fptrunc`` to ``ty`` from half or
    double: ``f16_to_f32``, ``f32_to_f16``, ``f64_to_f16``). Answered by LLVM itself:
    a one-instruction function is compiled for the target and its symbols read."""
    conversions = {
        "f16_to_f32": ("float", "half", "%y = fpext half %x to float"),
        "f32_to_f16": ("half", "float", "%y = fptrunc float %x to half"),
        "f64_to_f16": ("half", "double", "%y = fptrunc double %x to half"),
    }
    if op in conversions:
        ret, arg, body = conversions[op]
        decl = ""
    else:
        ret = arg = ty
        suffix = {"float": "f32", "double": "f64"}[ty]
        if op == "fma":
            call, params = f"{ty} %x, {ty} %x, {ty} %x", f"{ty}, {ty}, {ty}"
        elif op == "ldexp":
            suffix, call, params = f"{suffix}.i32", f"{ty} %x, i32 3", f"{ty}, i32"
        else:
            call, params = f"{ty} %x", ty
        body = f"%y = call {ty} @llvm.{op}.{suffix}({call})"
        decl = f"declare {ty} @llvm.{op}.{suffix}({params})"
    ir = f"define {ret} @probe({arg} %x) {{\n  {body}\n  ret {ret} %y\n}}\n{decl}\n"
    with _lock:
        obj = _emitter(target).emit_object(_parse(ir, target))
    return not [s for s in undefined_symbols(obj) if s not in _LINKER_SYMBOLS]


#: Load objects with :mod:`.loader` where it handles them (else, and when False, MCJIT).
use_own_loader = loader.supported()
_process = ctypes.CDLL(None)


def _process_symbol(name: str) -> int:
    """The address of ``name`` as MCJIT would find it: symbols registered with LLVM
    (``llvm.add_symbol``) first, then the process's own; 0 if neither has it."""
    address = llvm.address_of_symbol(name)
    if address:
        return address
    try:
        return ctypes.cast(getattr(_process, name), ctypes.c_void_p).value or 0
    except AttributeError:
        return 0


def load_object(obj: bytes, names: list[str], allowed: Iterable[str] = PROCESS_SYMBOLS,
                target: Target | None = None) -> dict[str, int]:
    """Add ``obj``, built for ``target`` (default: the current one), to the JIT and return
    the addresses of the functions ``names``. The object is checked first (it may come from
    a disk cache): the target must run here, and every symbol the object needs must be
    ``allowed`` and resolvable in this process."""
    key = hashlib.sha256(obj).hexdigest()
    # Checked on every call: the same bytes may have been loaded for another target (code
    # that uses nothing particular to a CPU compiles alike for all of them), and a target
    # this machine cannot run is refused all the same.
    target = target or targets.current()
    target.check_runnable()
    with _lock:
        if key not in _loaded:
            check_object(obj, target, allowed)
            if use_own_loader:
                try:
                    _loaded[key] = loader.load(obj, names, _process_symbol, key[:12])
                except loader.Unsupported:
                    pass  # MCJIT below
                except LookupError as err:
                    raise CompileError(f"cannot load the generated code: {err}; not "
                                       "loaded") from None
                else:
                    return _loaded[key]
            # Creating an engine makes the process's own symbols visible to the lookup.
            # Its target machine only compiles the engine's empty module at finalization
            # (the object is code already): at O0 that costs ~0.3 ms less per load.
            engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""),
                                                _target_machine(target, opt=0))
            unresolved = [s for s in undefined_symbols(obj)
                          if s not in _LINKER_SYMBOLS and not llvm.address_of_symbol(s)]
            if unresolved:
                raise CompileError(f"the generated code needs {', '.join(unresolved)}, "
                                   "which this process does not provide; not loaded")
            engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
            engine.finalize_object()
            _engines.append(engine)
            addresses = {name: engine.get_function_address(name) for name in names}
            missing = [name for name, address in addresses.items() if not address]
            if missing:
                raise CompileError(f"object file lacks functions {missing}")
            _loaded[key] = addresses
        return _loaded[key]
