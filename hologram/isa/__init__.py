"""The Atlas ISA: Hologram's kernel IR (see docs/isa.md).

``ir`` holds the data structures, ``dtypes`` the types (the one dtype table), ``verify``
the typing rules and the verifier, ``body`` the one kernel-body builder (typed,
hash-consed; the passes and the front ends share it), ``builder`` the Python construction
API on it, ``text`` the printer and parser, and ``semantics`` the executable definition of
every opcode (the interpreter runs it; the compiler folds constants with it).
"""

from hologram.isa.builder import KernelBuilder, ProgramBuilder, Value
from hologram.isa.dtypes import DType, dtype
from hologram.isa.ir import BufferDecl, IndexMap, Instr, Kernel, Program
from hologram.isa.verify import verify

__all__ = [
    "BufferDecl", "DType", "IndexMap", "Instr", "Kernel", "KernelBuilder", "Program",
    "ProgramBuilder", "Value", "dtype", "verify",
]
