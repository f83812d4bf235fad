"""The options of ``torch.compile(model, backend="hologram", options={...})``."""

from __future__ import annotations

from dataclasses import dataclass

import hologram
from hologram.compiler.options import CompileOptions
from hologram.errors import HologramError
from hologram_torch import memory
from hologram_torch.aten import runner

#: option -> what it does (the error for an unknown option lists these).
DOCUMENTED = {
    "threads": "CPU threads each compiled program runs on (an int >= 1; default: the "
               "process's setting, hologram.set_num_threads)",
    "fast_math": "allow rewrites that are not exact under IEEE 754 (a bool; default: "
                 "HOLOGRAM_FAST_MATH)",
    "backend": "the Hologram backend that compiles the programs ('cpu', 'interp'; default: "
               "the device's, hologram_torch.get_backend())",
}


class OptionError(HologramError):
    """An unknown option or a value of the wrong kind."""


@dataclass(frozen=True)
class Options:
    threads: int | None = None
    fast_math: bool | None = None
    backend_name: str | None = None

    @classmethod
    def parse(cls, options: dict | None) -> Options:
        options = dict(options or {})
        unknown = sorted(set(options) - set(DOCUMENTED))
        if unknown:
            known = "; ".join(f"{k}: {v}" for k, v in DOCUMENTED.items())
            raise OptionError(f"torch.compile(backend='hologram'): unknown options {unknown}; "
                              f"the options are {known}")
        threads = options.get("threads")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                    or threads < 1):
            raise OptionError(f"option threads={threads!r}: expected an int >= 1")
        fast_math = options.get("fast_math")
        if fast_math is not None and not isinstance(fast_math, bool):
            raise OptionError(f"option fast_math={fast_math!r}: expected a bool")
        backend = options.get("backend")
        if backend is not None:
            backend = hologram.backend.validate_backend(backend)
        return cls(threads, fast_math, backend)

    def backend(self, on_device_memory: bool = False) -> str:
        """The backend named in the options, else the device's for a graph of device
        tensors or while the device's memory is host memory, else cpu: on a GPU backend
        the graphs of CPU tensors compile for the host."""
        if self.backend_name is not None:
            return self.backend_name
        return runner.backend() if on_device_memory or memory.host_memory() else "cpu"

    def compile_options(self) -> CompileOptions:
        if self.fast_math is None:
            return CompileOptions.from_env()
        return CompileOptions(fast_math=self.fast_math)
