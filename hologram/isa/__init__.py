"""The Atlas ISA: Hologram's kernel IR (see docs/isa.md).

``ir`` holds the data structures, ``dtypes`` the types, ``verify`` the typing rules and
the verifier, ``builder`` the Python construction API, ``text`` the printer and parser.
"""

from hologram.isa.builder import KernelBuilder, ProgramBuilder, Value
from hologram.isa.dtypes import DType, dtype
from hologram.isa.ir import Buffer, IndexMap, Instr, Kernel, Program
from hologram.isa.verify import verify

__all__ = [
    "Buffer", "DType", "IndexMap", "Instr", "Kernel", "KernelBuilder", "Program",
    "ProgramBuilder", "Value", "dtype", "verify",
]
