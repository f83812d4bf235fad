"""A loader for the object files LLVM emits for x86-64 ELF hosts: sections copied into
fresh pages, relocations applied, the code made executable. What MCJIT does for one object,
without its per-object engine, target machine and empty module compiled at finalization
(~0.5 ms of each kernel's first use; this takes ~0.1).

Only what our objects use is handled: ``PROGBITS``/``NOBITS`` sections (code, constants,
data), the large code model's GOT-relative relocations and the PC-relative and absolute
ones. Anything else (another format or machine, TLS, an unknown relocation, a value that
does not fit its field) raises :class:`Unsupported` before any memory is touched, and the
caller loads the object with MCJIT instead. Unwind tables (``.eh_frame``) are not loaded:
nothing unwinds through kernels.

Memory is mapped read-write, filled, then made read+execute (code, constants, the GOT)
and read-write (data) in separate pages: never writable and executable at once. Like
MCJIT's engines, mappings live as long as the process (their code may be called anytime).

With ``HOLOGRAM_PERF_MAP=1`` each loaded function is named in ``/tmp/perf-<pid>.map``
(Linux perf's convention for code in anonymous memory), as ``hologram:<object>:<name>``
with the first 12 hex digits of the object's SHA-256 (the key of ``llvm.load_object``), so
``perf report`` shows which kernel the time went to.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
from collections.abc import Callable

from hologram import config
from hologram.backends.cpu import elf

_PAGE = mmap.PAGESIZE
_PROT_READ, _PROT_WRITE, _PROT_EXEC = 1, 2, 4
_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                  ctypes.c_long]
_mprotect = _libc.mprotect
_mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_munmap = _libc.munmap
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


# x86-64 relocation type (psABI) -> (field size, signed, how the value is computed from S
# (the symbol's address), A (the addend), P (the place), GOT (the table's address) and G
# (the symbol's slot offset in the table)).
_RELOCATIONS: dict[int, tuple[int, bool, Callable[[int, int, int, int, int], int]]] = {
    1: (8, False, lambda s, a, p, got, g: s + a),  # R_X86_64_64
    2: (4, True, lambda s, a, p, got, g: s + a - p),  # PC32
    4: (4, True, lambda s, a, p, got, g: s + a - p),  # PLT32
    24: (8, True, lambda s, a, p, got, g: s + a - p),  # PC64
    25: (8, True, lambda s, a, p, got, g: s + a - got),  # GOTOFF64
    26: (4, True, lambda s, a, p, got, g: got + a - p),  # GOTPC32
    29: (8, True, lambda s, a, p, got, g: got + a - p),  # GOTPC64
    27: (8, True, lambda s, a, p, got, g: g + a),  # GOT64
    9: (4, True, lambda s, a, p, got, g: got + g + a - p),  # GOTPCREL
    41: (4, True, lambda s, a, p, got, g: got + g + a - p),  # GOTPCRELX
    42: (4, True, lambda s, a, p, got, g: got + g + a - p),  # REX_GOTPCRELX
    28: (8, True, lambda s, a, p, got, g: got + g + a - p),  # GOTPCREL64
}
_USES_SLOT = frozenset({27, 9, 41, 42, 28})


_FIELD = {(4, True): "<i", (8, True): "<q", (8, False): "<Q"}


class Unsupported(Exception):
    """The object holds something this loader does not handle (load it with MCJIT)."""


def supported() -> bool:
    """Can this process use the loader at all (64-bit Linux on x86-64)?"""
    import platform
    import sys

    return sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")


def load(obj: bytes, names: list[str], resolve: Callable[[str], int],
         label: str = "") -> dict[str, int]:
    """Load ``obj`` and return the addresses of the functions ``names``; ``resolve(name)``
    gives the address of a symbol the object takes from outside (0: none); ``label``
    names the object in the perf map. Raises :class:`Unsupported` for what is outside
    this loader (see the module docstring) and ``LookupError`` for a name or symbol that
    cannot be found."""
    try:
        binary = elf.read(obj)
    except ValueError as err:
        raise Unsupported(str(err)) from None
    if binary.machine != elf.EM_X86_64:
        raise Unsupported("not an x86-64 ELF object")
    if binary.rel_sections:
        raise Unsupported("relocations without addends (REL)")
    placed = _layout(binary.sections)
    # those that apply to loaded sections
    relocations = [r for r in binary.relocations if r.section in placed]
    slots: dict[str, int] = {}
    for r in relocations:
        if r.type not in _RELOCATIONS:
            raise Unsupported(f"relocation type {r.type}")
        if r.symbol.shndx == 0 and not r.symbol.name:
            raise Unsupported(f"relocation type {r.type} without a symbol")
        if r.type in _USES_SLOT:
            if not r.symbol.name:
                raise Unsupported(f"relocation type {r.type} through an unnamed symbol")
            slots.setdefault(r.symbol.name, 8 * len(slots))
    executable_end = max((end for _, end, writable in placed.values() if not writable),
                         default=0)
    got_offset = _align(executable_end, 8)
    writable_start = _align(got_offset + 8 * len(slots), _PAGE)
    size = writable_start + max((end for _, end, w in placed.values() if w), default=0)
    size = _align(max(size, 1), _PAGE)

    base = _mmap(None, size, _PROT_READ | _PROT_WRITE,
                 mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if base in (None, _MAP_FAILED):
        raise Unsupported(f"mmap failed (errno {ctypes.get_errno()})")
    try:
        functions = _fill(obj, binary, base, writable_start, placed, relocations, slots,
                          got_offset, names, resolve)
    except BaseException:
        _munmap(base, size)
        raise
    if config.get().perf_map:
        sizes = {s.name: s.size for s in binary.symbols if s.name in functions}
        _name_for_perf(functions, sizes, label)
    return functions


def _name_for_perf(functions: dict[str, int], sizes: dict[str, int], label: str) -> None:
    """Append the functions to this process's perf map (``START SIZE name``, in hex)."""
    lines = "".join(f"{functions[n]:x} {sizes[n]:x} hologram:{label}:{n}\n"
                    for n in sorted(functions, key=functions.get) if sizes.get(n))
    with open(perf_map_path(), "a") as f:
        f.write(lines)


def perf_map_path() -> str:
    """Where Linux perf looks for the names of this process's generated code."""
    return f"/tmp/perf-{os.getpid()}.map"


def _fill(obj: bytes, binary: elf.Object, base: int, writable_start: int, placed: dict,
          relocations: list[elf.Relocation], slots: dict[str, int], got_offset: int,
          names: list[str], resolve: Callable[[str], int]) -> dict[str, int]:
    """Copy the sections into the mapping at ``base``, fill the GOT, relocate, protect
    the pages, and return the addresses of ``names``."""
    address = {index: base + (writable_start if w else 0) + start
               for index, (start, _, w) in placed.items()}
    for index in placed:
        section = binary.sections[index]
        if section.type == elf.PROGBITS and section.size:
            content = binary.content(obj, section)
            ctypes.memmove(address[index], content, len(content))

    def symbol_address(symbol: elf.Symbol) -> int:
        if symbol.shndx == 0:  # from outside: the process
            if symbol.name == "_GLOBAL_OFFSET_TABLE_":
                return base + got_offset
            found = resolve(symbol.name)
            if not found:
                raise LookupError(f"symbol {symbol.name!r} not found")
            return found
        if symbol.shndx not in address:
            raise Unsupported(f"symbol {symbol.name!r} in a section not loaded")
        return address[symbol.shndx] + symbol.value

    got = base + got_offset
    by_name = {s.name: s for s in binary.symbols if s.name}
    for name, offset in slots.items():
        ctypes.c_uint64.from_address(got + offset).value = symbol_address(by_name[name])
    for r in relocations:
        width, signed, value = _RELOCATIONS[r.type]
        place = address[r.section] + r.offset
        result = value(symbol_address(r.symbol), r.addend, place, got,
                       slots.get(r.symbol.name, 0))
        try:
            packed = struct.pack(_FIELD[width, signed], result)
        except struct.error:
            raise Unsupported(f"relocation type {r.type} out of range") from None
        ctypes.memmove(place, packed, width)
    if _mprotect(base, writable_start, _PROT_READ | _PROT_EXEC) != 0:
        raise Unsupported(f"mprotect failed (errno {ctypes.get_errno()})")
    functions = {}
    for name in names:
        symbol = by_name.get(name)
        if symbol is None or symbol.shndx not in address:
            raise LookupError(f"object file lacks function {name!r}")
        functions[name] = address[symbol.shndx] + symbol.value
    return functions


def _layout(sections: list[elf.Section]) -> dict[int, tuple[int, int, bool]]:
    """Section index -> (start, end, writable) of each section to load: the read-only ones
    from offset 0 of the mapping, the writable ones from offset 0 of the writable part."""
    placed: dict[int, tuple[int, int, bool]] = {}
    ends = {False: 0, True: 0}
    for section in sections:
        if not section.flags & elf.ALLOC or section.name == ".eh_frame":
            continue
        if section.type not in (elf.PROGBITS, elf.NOBITS) or section.flags & elf.TLS:
            raise Unsupported(f"section {section.name} (type {section.type})")
        writable = bool(section.flags & elf.WRITE)
        start = _align(ends[writable], max(section.alignment, 1))
        ends[writable] = start + section.size
        placed[section.index] = (start, ends[writable], writable)
    return placed


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment
