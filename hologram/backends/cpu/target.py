"""Which CPU the cpu backend generates code for (``HOLOGRAM_CPU_TARGET``).

``host`` (the default) is this machine: LLVM's name for its CPU and the features it reports.
Any other name is one of :data:`TARGETS`: an x86-64 microarchitecture level, a named x86
CPU or a named AArch64 CPU, whose code is generated with LLVM's defaults for that CPU.
Code for a named target runs here only if this machine has every feature the target
assumes (:meth:`Target.runnable_here`); code for any target can be compiled anywhere,
which is how tests prove the generated code for CPUs we cannot run.

A target's :attr:`Target.identity` is part of every cache key, so an object built for one
target is never loaded for another.

The feature sets below are the ISA extensions that LLVM's definition of each CPU enables
and that code generation can use (vector, FMA, half conversion, bit-manipulation and
AVX-512 subsets), written with LLVM's feature names as ``get_host_cpu_features`` reports
them. The x86-64 levels are those of the x86-64 psABI.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache

import llvmlite.binding as llvm

from hologram import config
from hologram.compiler.capabilities import Capabilities
from hologram.errors import DeviceError, HologramError

_V2 = frozenset({"cx16", "sahf", "popcnt", "sse3", "sse4.1", "sse4.2", "ssse3"})
_V3 = _V2 | {"avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
_ICELAKE = _V4 | {"avx512vbmi", "avx512vbmi2", "avx512vnni", "avx512bitalg",
                  "avx512vpopcntdq", "avx512ifma", "gfni", "vaes", "vpclmulqdq"}
_ZNVER3 = _V3 | {"vaes", "vpclmulqdq", "sha", "aes", "pclmul", "adx"}

#: Named targets: name -> (architecture, features code for it may use).
TARGETS: dict[str, tuple[str, frozenset[str]]] = {
    "x86-64": ("x86_64", frozenset()),
    "x86-64-v2": ("x86_64", _V2),
    "x86-64-v3": ("x86_64", _V3),
    "x86-64-v4": ("x86_64", _V4),
    "haswell": ("x86_64", _V3),
    "skylake-avx512": ("x86_64", _V4),
    "icelake-server": ("x86_64", _ICELAKE),
    "sapphirerapids": ("x86_64", _ICELAKE | {"avx512bf16", "avx512fp16", "avxvnni"}),
    "znver3": ("x86_64", _ZNVER3),
    "znver4": ("x86_64", _ZNVER3 | _ICELAKE | {"avx512bf16"}),
    "neoverse-n1": ("aarch64", frozenset({"neon", "fullfp16", "dotprod"})),
    "neoverse-v1": ("aarch64", frozenset({"neon", "fullfp16", "dotprod", "sve", "bf16"})),
    "apple-m1": ("aarch64", frozenset({"neon", "fullfp16", "dotprod"})),
}


#: What code for every CPU target can use: f64, i64, 8/16-bit storage, IEEE min/max
#: (``llvm.minimum``/``llvm.maximum``), gather and scatter (the loops run in index order).
CAPABILITIES = Capabilities(gather=True, scatter=True)


@dataclass(frozen=True)
class Target:
    """A CPU to generate code for: LLVM triple, CPU name and feature string."""

    name: str  # "host" or a key of TARGETS
    triple: str
    cpu: str
    features: str  # LLVM's "+a,-b,..." form; empty means the CPU's defaults
    assumes: frozenset[str]  # what the host needs to run the code (empty for host)

    @property
    def arch(self) -> str:
        return self.triple.split("-", 1)[0].replace("arm64", "aarch64")

    @property
    def identity(self) -> str:
        """What cache keys say about the target: an object built for one identity never
        runs under another."""
        digest = hashlib.sha256(self.features.encode()).hexdigest()[:16]
        return (f"{self.triple} cpu={self.cpu} features={digest} "
                f"llvm={llvm.llvm_version_info}")

    @property
    def capabilities(self) -> Capabilities:
        """What code for this CPU can use. Every CPU target has f64, i64 and narrow
        storage; f16/bf16 are computed in float32 even where the CPU has half arithmetic
        (AVX512-FP16), so results do not depend on the CPU."""
        return CAPABILITIES

    def has(self, feature: str) -> bool:
        """Does code for this target assume ``feature`` (LLVM's name, e.g. ``avx512f``)?"""
        if self.name == "host":
            return feature in host_features()
        return feature in self.assumes

    def missing_here(self) -> list[str]:
        """Features this target assumes that this machine lacks (empty: runnable)."""
        if self.arch != host().arch:
            return [f"the {self.arch} architecture"]
        return sorted(self.assumes - host_features())

    def runnable_here(self) -> bool:
        return not self.missing_here()

    def check_runnable(self) -> None:
        """Raise a :class:`~hologram.errors.DeviceError` if this machine cannot run code
        for the target."""
        missing = self.missing_here()
        if missing:
            raise DeviceError(
                f"HOLOGRAM_CPU_TARGET={self.name}: code for {self.cpu} ({self.triple}) "
                f"cannot run on this machine ({host().cpu}), which lacks "
                f"{', '.join(missing)}. Unset HOLOGRAM_CPU_TARGET (or set it to 'host'), "
                "or choose a target this CPU implements, e.g. "
                f"{', '.join(runnable_targets()[-3:])}")


@cache
def _initialized() -> bool:
    # Every target, not only the host's: code for other CPUs is compiled (not run) too.
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return True


@cache
def host() -> Target:
    """This machine."""
    _initialized()
    features = llvm.get_host_cpu_features().flatten()
    return Target("host", llvm.get_process_triple(), llvm.get_host_cpu_name(), features,
                  frozenset())


@cache
def host_features() -> frozenset[str]:
    return frozenset(f[1:] for f in host().features.split(",") if f.startswith("+"))


@cache
def named(name: str) -> Target:
    """The target called ``name`` (``host`` or a key of :data:`TARGETS`)."""
    if name == "host":
        return host()
    if name not in TARGETS:
        raise HologramError(
            f"HOLOGRAM_CPU_TARGET={name!r} is not a known CPU target; use 'host' (the "
            f"default) or one of: {', '.join(TARGETS)}")
    arch, assumes = TARGETS[name]
    triple = host().triple
    if arch != host().arch:
        # Same operating system, other architecture: the object format stays the host's.
        triple = f"{arch}-{triple.split('-', 1)[1]}"
        if "apple" in triple:
            triple = "arm64-" + triple.split("-", 1)[1]
    return Target(name, triple, name, "", frozenset(assumes))


def current() -> Target:
    """The target selected by ``HOLOGRAM_CPU_TARGET``."""
    return named(config.get().cpu_target)


def runnable_targets() -> list[str]:
    """The names of the targets whose code this machine can run (``host`` first)."""
    return ["host"] + [name for name in TARGETS if named(name).runnable_here()]
