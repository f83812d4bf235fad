"""The parts of a 64-bit little-endian ELF relocatable object that the JIT reads: sections,
the symbol table and the relocations with addends.

Every kernel the cpu backend loads on Linux is such an object, checked
(:func:`~.llvm.undefined_symbols`) and loaded (:mod:`.loader`) at its first use. Reading it
takes a few ``struct`` unpacks. lief reads every format and stays for Mach-O and COFF, but
importing it takes 0.3-0.7 s, which was most of a model's first training step when its
kernels came from the disk cache (docs/performance.md, "First step").

Field layouts are the System V ABI's (``Elf64_Ehdr``, ``Elf64_Shdr``, ``Elf64_Sym``,
``Elf64_Rela``); :func:`read` raises ``ValueError`` for anything else (another class,
byte order, or a truncated file), and the callers fall back to lief or MCJIT.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import NamedTuple

# Section types and flags (System V ABI, ch. 4)
PROGBITS, SYMTAB, RELA, NOBITS, REL = 1, 2, 4, 8, 9
WRITE, ALLOC, TLS = 0x1, 0x2, 0x400
STT_FUNC = 2
EM_X86_64 = 62

_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_SECTION = struct.Struct("<IIQQQQIIQQ")
_SYMBOL = struct.Struct("<IBBHQQ")
_RELA = struct.Struct("<QQq")


class Section(NamedTuple):
    index: int
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    alignment: int
    entsize: int


class Symbol(NamedTuple):
    name: str
    type: int  # STT_*
    shndx: int  # 0: undefined (taken from outside)
    value: int
    size: int = 0  # bytes (a function's code)


class Relocation(NamedTuple):
    section: int  # the index of the section it patches
    offset: int  # where in that section
    type: int  # R_<machine>_*
    symbol: Symbol
    addend: int


class Object(NamedTuple):
    machine: int
    sections: list[Section]
    symbols: list[Symbol]
    relocations: list[Relocation]  # RELA entries only
    rel_sections: int  # how many REL (addend-less) sections there are (unhandled)

    def content(self, data: bytes, section: Section) -> bytes:
        return data[section.offset:section.offset + section.size]


def is_elf64(data: bytes) -> bool:
    """A 64-bit little-endian ELF file (class 2, data 1)?"""
    return data[:4] == b"\x7fELF" and data[4:6] == b"\x02\x01"


@lru_cache(maxsize=8)
def read(data: bytes) -> Object:
    """The sections, symbols and relocations of ``data`` (see the module docstring).
    Remembered for the last few objects: a load reads its object twice, for the symbol
    check and for the loader (~20 µs for a small kernel, 2.4 ms for a fused region of
    750 KB). The result is shared: callers do not change it."""
    if not is_elf64(data) or len(data) < _HEADER.size:
        raise ValueError("not a 64-bit little-endian ELF file")
    try:
        return _read(data)
    except (struct.error, IndexError) as err:
        raise ValueError(f"truncated or malformed ELF file ({err})") from None


def _read(data: bytes) -> Object:
    header = _HEADER.unpack_from(data)
    machine, shoff, shentsize, shnum, shstrndx = header[2], header[6], header[11], \
        header[12], header[13]
    raw = [_SECTION.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    names = raw[shstrndx] if shnum else None

    def string(table, at: int) -> str:
        start = table[4] + at
        return data[start:data.index(b"\0", start)].decode()

    sections = [Section(i, string(names, s[0]), s[1], s[2], s[4], s[5], s[6], s[7], s[8],
                        s[9]) for i, s in enumerate(raw)]
    symbols: list[Symbol] = []
    for section in sections:
        if section.type == SYMTAB:
            strings = raw[section.link]
            for at in range(section.offset, section.offset + section.size, _SYMBOL.size):
                name, info, _, shndx, value, size = _SYMBOL.unpack_from(data, at)
                symbols.append(Symbol(string(strings, name), info & 0xF, shndx, value, size))
            break
    relocations = []
    for section in sections:
        if section.type == RELA:
            for at in range(section.offset, section.offset + section.size, _RELA.size):
                offset, info, addend = _RELA.unpack_from(data, at)
                relocations.append(Relocation(section.info, offset, info & 0xFFFFFFFF,
                                              symbols[info >> 32], addend))
    return Object(machine, sections, symbols, relocations,
                  sum(s.type == REL for s in sections))
