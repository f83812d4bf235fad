"""LLVM through llvmlite: one host target machine, the O3 pipeline, object code, one JIT.

- :func:`host_identity` is the part of cache keys that says which machine code was built
  for: triple, CPU name and the feature string. An object file built for one host never
  runs on another.
- :func:`compile_ir` turns LLVM IR text into a relocatable object file (bytes), which is
  what the disk cache stores.
- :func:`load_object` loads an object file into its own MCJIT engine and returns the
  addresses of the functions asked for. Each engine gets a fresh target machine (MCJIT
  takes ownership of it: reusing one after its engine is collected crashes the process),
  and engines are kept for the life of the process, because the code they hold may be
  called at any time. A second object added to an already finalized engine was observed to
  come out unrelocated (its functions silently did nothing), hence one engine per object.
  Loading the same object twice returns the first load's addresses.
"""

from __future__ import annotations

import hashlib
import threading
from functools import cache

import llvmlite.binding as llvm

from hologram.errors import CompileError

_lock = threading.Lock()  # llvmlite objects are not thread-safe
_loaded: dict[str, dict[str, int]] = {}
_engines: list[llvm.ExecutionEngine] = []  # never collected: their code stays callable


@cache
def _initialized() -> bool:
    # llvm.initialize() is deprecated and raises in recent llvmlite; these two suffice.
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return True


@cache
def host_cpu() -> tuple[str, str, str]:
    """(triple, CPU name, feature string) of this machine."""
    _initialized()
    return (llvm.get_process_triple(), llvm.get_host_cpu_name(),
            llvm.get_host_cpu_features().flatten())


def host_identity() -> str:
    triple, cpu, features = host_cpu()
    digest = hashlib.sha256(features.encode()).hexdigest()[:16]
    return f"{triple} cpu={cpu} features={digest} llvm={llvm.llvm_version_info}"


def has_feature(name: str) -> bool:
    """Does the host CPU have the feature (``"avx2"``, ``"avx512f"``, ...)?"""
    return f"+{name}" in host_cpu()[2].split(",")


def _target_machine() -> llvm.TargetMachine:
    triple, cpu, features = host_cpu()
    if has_feature("avx512f"):
        # LLVM emits 256-bit vectors by default even on AVX-512 hosts; full-width vectors
        # run our polynomial math ~1.5x faster and memory-bound loops no slower.
        features += ",-prefer-256-bit"
    target = llvm.Target.from_triple(triple)
    return target.create_target_machine(cpu=cpu, features=features, opt=3,
                                        reloc="pic", codemodel="jitdefault")


@cache
def _emitter() -> llvm.TargetMachine:
    """The target machine used to optimize and emit objects (never given to MCJIT)."""
    return _target_machine()


def optimize_ir(ir: str) -> llvm.ModuleRef:
    """Parse, verify and optimize (O3, loop and SLP vectorization, unrolling) ``ir``."""
    with _lock:
        _initialized()
        try:
            module = llvm.parse_assembly(ir)
            module.verify()
        except RuntimeError as err:
            raise CompileError("LLVM rejected the generated IR", source=ir, log=str(err)) from None
        tm = _emitter()
        options = llvm.create_pipeline_tuning_options(speed_level=3)
        options.loop_vectorization = True
        options.slp_vectorization = True
        options.loop_unrolling = True
        builder = llvm.create_pass_builder(tm, options)
        builder.getModulePassManager().run(module, builder)
        return module


def compile_ir(ir: str) -> bytes:
    """LLVM IR text -> optimized object file for this host."""
    module = optimize_ir(ir)
    with _lock:
        return _emitter().emit_object(module)


def assembly(ir: str) -> str:
    """The host assembly for ``ir`` after optimization (for tests and debugging)."""
    module = optimize_ir(ir)
    with _lock:
        return _emitter().emit_assembly(module)


def load_object(obj: bytes, names: list[str]) -> dict[str, int]:
    """Add ``obj`` to the JIT and return the addresses of the functions ``names``."""
    key = hashlib.sha256(obj).hexdigest()
    with _lock:
        if key not in _loaded:
            _initialized()
            engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), _target_machine())
            engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
            engine.finalize_object()
            _engines.append(engine)
            addresses = {name: engine.get_function_address(name) for name in names}
            missing = [name for name, address in addresses.items() if not address]
            if missing:
                raise CompileError(f"object file lacks functions {missing}")
            _loaded[key] = addresses
        return _loaded[key]
