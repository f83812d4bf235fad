"""LLVM IR written as text directly: the part of ``llvmlite.ir``'s API the cpu renderer uses.

The renderer (:mod:`.render`, with :mod:`.mathlib`, :mod:`.softfloat` and
:mod:`.intrinsics`) builds a module through ``Module``, ``Function``, ``IRBuilder`` and
``Constant`` as it would with ``llvmlite.ir``, and prints it with ``str(module)``; the text
is the same, character for character, as llvmlite's for the same calls (values are named
in the same order, by the same rules; ``tests/test_cpu.py`` compares the two). What
differs is the cost: llvmlite keeps an object graph of instructions, operands and name
scopes and formats it all when printed, which took about 0.7 ms of a kernel's compile
(a transformer's first training step renders ~100 modules); here each instruction is
formatted once, when it is made, into one small object, and printing joins the lines.

Types are llvmlite's own (``IntType``, ``FloatType``, ...), so code may mix them with
llvmlite's. :class:`Constant` is usable in llvmlite's builders too (it has ``type`` and
``get_reference()``); :func:`namespace` gives the classes that go with a module, so the
emitters that tests also drive with ``llvmlite.ir`` modules (:mod:`.mathlib`,
:mod:`.softfloat`) build each module with its own kind of functions and builders.
"""

from __future__ import annotations

import contextlib
import re
import struct
import sys
from types import ModuleType

from llvmlite import ir as _llvmlite
from llvmlite.ir import (
    ArrayType,
    DoubleType,
    FloatType,
    FunctionType,
    HalfType,
    IntType,
    LabelType,
    MetaDataType,
    PointerType,
    Type,
    VectorType,
    VoidType,
)

__all__ = ["ArrayType", "Block", "Constant", "DoubleType", "FloatType", "Function",
           "FunctionType", "HalfType", "IRBuilder", "IntType", "MDValue", "MetaDataString",
           "Module", "PointerType", "Type", "VectorType", "VoidType", "namespace"]

_SIMPLE_IDENTIFIER = re.compile(r"[-a-zA-Z$._][-a-zA-Z$._0-9]*$")
_CMP = {">": "gt", "<": "lt", "==": "eq", "!=": "ne", ">=": "ge", "<=": "le"}
_METADATA = MetaDataType()
_LABEL = LabelType()
_VOID = VoidType()
_I1 = IntType(1)
_PACK_D, _PACK_F, _PACK_E = struct.Struct("<d"), struct.Struct("<f"), struct.Struct("<e")
_BITS = struct.Struct("<Q")


def _quoted(prefix: str, name: str) -> str:
    if "\\" in name or '"' in name:
        name = name.replace("\\", "\\5c").replace('"', "\\22")
    return f'{prefix}"{name}"'


# --- constants -------------------------------------------------------------------------
def _double_hex(value: float) -> str:
    return f"{_BITS.unpack(_PACK_D.pack(float(value)))[0]:#16x}"  # (llvmlite pads: 0.0 too)


def _format(ty: Type, value) -> str:
    """llvmlite's ``ty.format_constant(value)`` for the types the renderer uses."""
    kind = type(ty)
    if kind is IntType:
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)
    if kind is FloatType:
        return _double_hex(_PACK_F.unpack(_PACK_F.pack(value))[0])
    if kind is DoubleType:
        return _double_hex(value)
    if kind is HalfType:
        try:
            return _double_hex(_PACK_E.unpack(_PACK_E.pack(value))[0])
        except (struct.error, OverflowError):
            return _double_hex(_PACK_F.unpack(_PACK_F.pack(value))[0])
    if kind is ArrayType:
        return "[" + ", ".join(f"{x.type} {x.get_reference()}" for x in value) + "]"
    if kind is VectorType and not isinstance(value, (list, tuple)):
        return f"splat ({ty.element} {_format(ty.element, value)})"  # every lane the same
    return ty.format_constant(value)


class Constant:
    """A constant of type ``ty`` (llvmlite's ``ir.Constant``: the same text, equality by
    it; also accepted by llvmlite's builders)."""

    __slots__ = ("constant", "ref", "type")

    def __init__(self, ty: Type, constant):
        self.type = ty
        if type(ty) is ArrayType and isinstance(constant, (list, tuple)):
            if len(constant) != ty.count:
                raise ValueError(f"wrong constant size for {ty}: got {len(constant)} elements")
            constant = [x if isinstance(x, (Constant, _llvmlite.Value)) else
                        Constant(ty.element, x) for x in constant]
        elif constant is None and type(ty) is IntType:
            constant = 0
        self.constant = constant
        self.ref = _format(ty, constant)

    def get_reference(self) -> str:
        return self.ref

    def __str__(self) -> str:
        return f"{self.type} {self.ref}"

    def __eq__(self, other) -> bool:
        return isinstance(other, Constant) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __repr__(self) -> str:
        return f"<textir.Constant type='{self.type}' value={self.constant!r}>"


# --- metadata --------------------------------------------------------------------------
class MetaDataString:
    """``!"text"`` in a metadata node."""

    __slots__ = ("ref", "string")
    type = _METADATA

    def __init__(self, module: Module | None, string: str):
        self.string = string
        self.ref = '!"' + _llvmlite.values._escape_string(string) + '"'

    def get_reference(self) -> str:
        return self.ref

    def _key(self) -> tuple:
        return ("s", self.string)


class MDValue:
    """A numbered metadata node ``!N`` of the module (``Module.add_metadata`` makes the
    usual, shared ones). Subclasses may override :meth:`descr` (llvmlite's signature)."""

    type = _METADATA

    def __init__(self, module: Module, operands, name: str):
        self.operands = tuple(operands)
        self.name = module._register_metadata_name(name)
        module.metadata.append(self)

    def get_reference(self) -> str:
        return "!" + str(self.name)

    def descr(self, buf: list) -> None:
        parts = []
        for op in self.operands:
            if op.type is _METADATA or isinstance(op.type, MetaDataType):
                parts.append(op.get_reference())
            else:
                parts.append(f"{op.type} {op.get_reference()}")
        buf += ("!{ " + ", ".join(parts) + " }", "\n")

    def _key(self) -> tuple:
        # llvmlite compares nodes by their operands: two nodes with equal operands are
        # one cache entry of add_metadata (even distinct ones); kept, for the same text.
        return ("m", tuple(_metadata_key(op) for op in self.operands))

    def __str__(self) -> str:
        buf: list[str] = []
        self.descr(buf)
        return (self.get_reference() + " = " + "".join(buf)).rstrip()


def _metadata_key(op) -> tuple:
    key = getattr(op, "_key", None)
    if key is not None:
        return key()
    return ("c", str(op))


# --- module, functions, blocks -----------------------------------------------------------
class _Scope:
    """llvmlite's ``NameScope``: a name is registered as given, or with ``.N`` appended
    (N counted per base name) until unused; the empty name gives ``.1``, ``.2``, ..."""

    __slots__ = ("counts", "used")

    def __init__(self):
        self.used = {""}
        self.counts: dict[str, int] = {}

    def deduplicate(self, name: str) -> str:
        used, counts = self.used, self.counts
        base = name
        while name in used:
            n = counts.get(base, 0) + 1
            counts[base] = n
            name = f"{base}.{n}"
        used.add(name)
        return name


class Module:
    """An LLVM module: functions (in the order made) and numbered metadata."""

    def __init__(self, name: str = ""):
        self.name = name
        self.triple = "unknown-unknown-unknown"
        self.data_layout = ""
        self.globals: dict[str, Function] = {}
        self.metadata: list[MDValue] = []
        self.compiler_used: list[Function] = []  # kept alive though nothing calls them
        self._metadata_cache: dict[tuple, MDValue] = {}
        self._metadata_names = _Scope()

    def _register_metadata_name(self, name: str) -> str:
        return self._metadata_names.deduplicate(name)

    def add_metadata(self, operands) -> MDValue:
        """The node with ``operands`` (a string operand becomes a metadata string): an
        equal one made before, or a new one."""
        fixed = []
        for op in operands:
            if isinstance(op, str):
                op = MetaDataString(self, op)
            elif isinstance(op, (list, tuple)):
                op = self.add_metadata(op)
            fixed.append(op)
        key = tuple(_metadata_key(op) for op in fixed)
        node = self._metadata_cache.get(key)
        if node is None:
            node = self._metadata_cache[key] = MDValue(self, fixed, name=str(len(self.metadata)))
        return node

    def get_global(self, name: str) -> Function:
        return self.globals[name]

    def __str__(self) -> str:
        lines = [f'; ModuleID = "{self.name}"', f'target triple = "{self.triple}"',
                 f'target datalayout = "{self.data_layout}"', ""]
        if self.compiler_used:
            refs = ", ".join(f"ptr {f.ref}" for f in self.compiler_used)
            lines.append(f"@llvm.compiler.used = appending global [{len(self.compiler_used)}"
                         f' x ptr] [{refs}], section "llvm.metadata"\n')
        lines += [str(f) for f in self.globals.values()]
        lines += [str(md) for md in self.metadata]
        return "\n".join(lines)

    __repr__ = __str__


_FUNCTION_ATTRIBUTES = _llvmlite.values.FunctionAttributes._known


class _Attributes(set):
    """A set of attribute names, printed sorted."""

    def __init__(self, known):
        super().__init__()
        self._known = known

    def add(self, name: str) -> None:
        if name not in self._known:
            raise ValueError(f"unknown attr {name!r}")
        super().add(name)


class Argument:
    """A function's parameter."""

    __slots__ = ("attributes", "name", "ref", "type")

    def __init__(self, function: Function, ty: Type, name: str = ""):
        self.type = ty
        self.name = function.scope.deduplicate(name)
        self.ref = _quoted("%", self.name)
        self.attributes = _Attributes(_llvmlite.values.ArgumentAttributes._known)

    def add_attribute(self, attr: str) -> None:
        self.attributes.add(attr)

    def get_reference(self) -> str:
        return self.ref

    def __str__(self) -> str:
        if self.attributes:
            names = " ".join(f"{a}({self.type.pointee})"
                             if _llvmlite.values.ArgumentAttributes._known[a] else a
                             for a in sorted(self.attributes))
            return f"{self.type} {names} {self.ref}"
        return f"{self.type} {self.ref}"


class Function:
    """A function of ``module`` (a declaration until it has blocks)."""

    def __init__(self, module: Module, ftype: FunctionType, name: str):
        if name in module.globals:
            raise NameError(name)
        self.module = self.parent = module
        self.ftype = ftype
        self.type = ftype.as_pointer()
        self.name = name
        self.ref = _quoted("@", name)
        self.scope = _Scope()
        self.blocks: list[Block] = []
        self.attributes = _Attributes(_FUNCTION_ATTRIBUTES)
        self.string_attributes: dict[str, str] = {}  # "key"="value", printed after those
        self.linkage = ""
        self.args = tuple(Argument(self, t) for t in ftype.args)
        self.scope.deduplicate("")  # llvmlite's return value takes a name: the same numbering
        module.globals[name] = self

    @property
    def function_type(self) -> FunctionType:
        return self.ftype

    @property
    def is_declaration(self) -> bool:
        return not self.blocks

    def get_reference(self) -> str:
        return self.ref

    def append_basic_block(self, name: str = "") -> Block:
        block = Block(self, name)
        self.blocks.append(block)
        return block

    def __str__(self) -> str:
        state = "define" if self.blocks else "declare"
        prefix = " ".join(x for x in (state, self.linkage, str(self.ftype.return_type)) if x)
        args = ", ".join(str(a) for a in self.args)
        vararg = (", ..." if self.args else "...") if self.ftype.var_arg else ""
        attrs = " " + " ".join(sorted(self.attributes)) if self.attributes else ""
        attrs += "".join(f' "{k}"="{v}"' for k, v in self.string_attributes.items())
        out = [f"{prefix} {self.ref}({args}{vararg}){attrs}\n"]
        if self.blocks:
            out.append("{\n")
            for block in self.blocks:
                out.append(block.text())
            out.append("}\n")
        return "".join(out)


class Block:
    """A basic block: its instructions, in order, each one's text made when it was."""

    __slots__ = ("instructions", "name", "parent", "ref", "terminator")
    type = _LABEL

    def __init__(self, function: Function, name: str = ""):
        self.parent = function
        self.name = function.scope.deduplicate(name)
        self.ref = _quoted("%", self.name)
        self.instructions: list[Instruction] = []
        self.terminator: Instruction | None = None

    @property
    def function(self) -> Function:
        return self.parent

    @property
    def module(self) -> Module:
        return self.parent.module

    @property
    def is_terminated(self) -> bool:
        return self.terminator is not None

    def get_reference(self) -> str:
        return self.ref

    def text(self) -> str:
        name = self.name
        if not _SIMPLE_IDENTIFIER.match(name):
            name = _quoted("", name)
        return name + ":\n" + "".join(["  " + i.line() + "\n" for i in self.instructions])


# --- instructions --------------------------------------------------------------------------
class Instruction:
    """An instruction and the value it makes (``type``, ``ref``; void ones have a name
    too, which llvmlite's numbering counts). ``body`` is its text after ``%ref = `` and
    before any metadata; ``space``: whether a space precedes the metadata there."""

    __slots__ = ("body", "metadata", "ref", "space", "type")

    def __init__(self, ty: Type, ref: str | None, body: str, space: bool = False):
        self.type = ty
        self.ref = ref
        self.body = body
        self.metadata: dict | None = None
        self.space = space

    def get_reference(self) -> str:
        return self.ref

    def set_metadata(self, name: str, node) -> None:
        if self.metadata is None:
            self.metadata = {}
        self.metadata[name] = node

    def _text(self) -> str:
        return self.body

    def line(self) -> str:
        text = self._text()
        if self.metadata:
            text += (" " if self.space else "") + "".join(
                f", !{k} {v.get_reference()}" for k, v in self.metadata.items())
        if self.ref is not None:
            text = self.ref + " = " + text
        return text.rstrip()

    def __str__(self) -> str:
        return self.line()


class PhiInstr(Instruction):
    """``phi``: its incoming values are added after it is made."""

    __slots__ = ("incomings",)

    def __init__(self, ty: Type, ref: str):
        super().__init__(ty, ref, "", space=True)
        self.incomings: list = []

    def add_incoming(self, value, block: Block) -> None:
        self.incomings.append((value, block))

    def _text(self) -> str:
        incoming = ", ".join(f"[{v.get_reference()}, {b.ref}]" for v, b in self.incomings)
        return f"phi  {self.type} {incoming}"


class IRBuilder:
    """Appends instructions to a block (llvmlite's ``IRBuilder``, for the calls the
    renderer makes)."""

    def __init__(self, block: Block | None = None):
        self._block = block
        self._anchor = len(block.instructions) if block is not None else 0

    @property
    def block(self) -> Block:
        return self._block

    basic_block = block

    @property
    def function(self) -> Function:
        return self._block.parent

    @property
    def module(self) -> Module:
        return self._block.parent.module

    # positions
    def position_at_start(self, block: Block) -> None:
        self._block, self._anchor = block, 0

    def position_at_end(self, block: Block) -> None:
        self._block, self._anchor = block, len(block.instructions)

    def position_before(self, instr: Instruction) -> None:
        for block in self.function.blocks:
            if instr in block.instructions:
                self._block, self._anchor = block, block.instructions.index(instr)
                return
        raise ValueError("instruction not in this function")

    def append_basic_block(self, name: str = "") -> Block:
        return self.function.append_basic_block(name)

    @contextlib.contextmanager
    def goto_block(self, block: Block):
        old = self._block
        if block.terminator is not None:
            self._block, self._anchor = block, block.instructions.index(block.terminator)
        else:
            self.position_at_end(block)
        try:
            yield
        finally:
            self.position_at_end(old)

    @contextlib.contextmanager
    def if_then(self, pred, likely=None):
        if likely is not None:
            raise NotImplementedError("textir: if_then(likely=...)")
        block = self._block
        then = self.append_basic_block(_label_suffix(block.name, ".if"))
        end = self.append_basic_block(_label_suffix(block.name, ".endif"))
        self.cbranch(pred, then, end)
        self.position_at_end(then)
        yield end
        if self._block.terminator is None:
            self.branch(end)
        self.position_at_end(end)

    # the instruction's name and its insertion
    def _name(self, name: str) -> str:
        return _quoted("%", self._block.parent.scope.deduplicate(name))

    def _insert(self, instr: Instruction) -> Instruction:
        block = self._block
        if self._anchor == len(block.instructions):
            block.instructions.append(instr)
        else:
            block.instructions.insert(self._anchor, instr)
        self._anchor += 1
        return instr

    def _op(self, ty: Type, body: str, name: str = "", space: bool = False) -> Instruction:
        ref = self._name(name)  # void instructions take a name too (llvmlite's numbering)
        return self._insert(Instruction(ty, None if type(ty) is VoidType else ref, body, space))

    def _binop(self, opname: str, lhs, rhs, name: str, flags) -> Instruction:
        ty = lhs.type
        if ty is not rhs.type and ty != rhs.type:
            raise ValueError(f"Operands must be the same type, got ({ty}, {rhs.type})")
        if flags:
            opname = " ".join([opname, *flags])
        return self._op(ty, f"{opname} {ty} {lhs.get_reference()}, {rhs.get_reference()}",
                        name)

    def add(self, lhs, rhs, name="", flags=()):
        return self._binop("add", lhs, rhs, name, flags)

    def sub(self, lhs, rhs, name="", flags=()):
        return self._binop("sub", lhs, rhs, name, flags)

    def mul(self, lhs, rhs, name="", flags=()):
        return self._binop("mul", lhs, rhs, name, flags)

    def udiv(self, lhs, rhs, name="", flags=()):
        return self._binop("udiv", lhs, rhs, name, flags)

    def sdiv(self, lhs, rhs, name="", flags=()):
        return self._binop("sdiv", lhs, rhs, name, flags)

    def urem(self, lhs, rhs, name="", flags=()):
        return self._binop("urem", lhs, rhs, name, flags)

    def srem(self, lhs, rhs, name="", flags=()):
        return self._binop("srem", lhs, rhs, name, flags)

    def fadd(self, lhs, rhs, name="", flags=()):
        return self._binop("fadd", lhs, rhs, name, flags)

    def fsub(self, lhs, rhs, name="", flags=()):
        return self._binop("fsub", lhs, rhs, name, flags)

    def fmul(self, lhs, rhs, name="", flags=()):
        return self._binop("fmul", lhs, rhs, name, flags)

    def fdiv(self, lhs, rhs, name="", flags=()):
        return self._binop("fdiv", lhs, rhs, name, flags)

    def frem(self, lhs, rhs, name="", flags=()):
        return self._binop("frem", lhs, rhs, name, flags)

    def and_(self, lhs, rhs, name="", flags=()):
        return self._binop("and", lhs, rhs, name, flags)

    def or_(self, lhs, rhs, name="", flags=()):
        return self._binop("or", lhs, rhs, name, flags)

    def xor(self, lhs, rhs, name="", flags=()):
        return self._binop("xor", lhs, rhs, name, flags)

    def shl(self, lhs, rhs, name="", flags=()):
        return self._binop("shl", lhs, rhs, name, flags)

    def lshr(self, lhs, rhs, name="", flags=()):
        return self._binop("lshr", lhs, rhs, name, flags)

    def ashr(self, lhs, rhs, name="", flags=()):
        return self._binop("ashr", lhs, rhs, name, flags)

    def not_(self, value, name=""):
        return self.xor(value, Constant(value.type, -1), name=name)

    def neg(self, value, name=""):
        return self.sub(Constant(value.type, 0), value, name=name)

    def fneg(self, arg, name="", flags=()):
        opname = " ".join(["fneg", *flags]) if flags else "fneg"
        return self._op(arg.type, f"{opname} {arg.type} {arg.get_reference()}", name)

    # comparisons and selects
    def _compare(self, opname: str, op: str, lhs, rhs, name: str, flags=()) -> Instruction:
        flagged = "".join(" " + f for f in flags)
        ty = lhs.type
        mask = VectorType(_I1, ty.count) if type(ty) is VectorType else _I1
        return self._op(mask, f"{opname}{flagged} {op} {lhs.type} {lhs.get_reference()}, "
                              f"{rhs.get_reference()}", name, space=True)

    def _icmp(self, prefix: str, cmpop: str, lhs, rhs, name: str) -> Instruction:
        try:
            op = _CMP[cmpop]
        except KeyError:
            raise ValueError(f"invalid comparison {cmpop!r} for icmp") from None
        if cmpop not in ("==", "!="):
            op = prefix + op
        return self._compare("icmp", op, lhs, rhs, name)

    def icmp_signed(self, cmpop, lhs, rhs, name=""):
        return self._icmp("s", cmpop, lhs, rhs, name)

    def icmp_unsigned(self, cmpop, lhs, rhs, name=""):
        return self._icmp("u", cmpop, lhs, rhs, name)

    def fcmp_ordered(self, cmpop, lhs, rhs, name="", flags=()):
        op = "o" + _CMP[cmpop] if cmpop in _CMP else cmpop
        return self._compare("fcmp", op, lhs, rhs, name, flags)

    def fcmp_unordered(self, cmpop, lhs, rhs, name="", flags=()):
        op = "u" + _CMP[cmpop] if cmpop in _CMP else cmpop
        return self._compare("fcmp", op, lhs, rhs, name, flags)

    def select(self, cond, lhs, rhs, name="", flags=()):
        ty = lhs.type
        return self._op(ty, f"select {' '.join(flags)} {cond.type} {cond.get_reference()}, "
                            f"{ty} {lhs.get_reference()}, {rhs.type} {rhs.get_reference()}",
                        name, space=True)

    # casts: none when the value has the type already
    def _cast(self, opname: str, value, ty: Type, name: str):
        if value.type == ty:
            return value
        return self._op(ty, f"{opname} {value.type} {value.get_reference()} to {ty}", name,
                        space=True)

    def trunc(self, value, typ, name=""):
        return self._cast("trunc", value, typ, name)

    def zext(self, value, typ, name=""):
        return self._cast("zext", value, typ, name)

    def sext(self, value, typ, name=""):
        return self._cast("sext", value, typ, name)

    def fptrunc(self, value, typ, name=""):
        return self._cast("fptrunc", value, typ, name)

    def fpext(self, value, typ, name=""):
        return self._cast("fpext", value, typ, name)

    def bitcast(self, value, typ, name=""):
        return self._cast("bitcast", value, typ, name)

    def fptoui(self, value, typ, name=""):
        return self._cast("fptoui", value, typ, name)

    def uitofp(self, value, typ, name=""):
        return self._cast("uitofp", value, typ, name)

    def fptosi(self, value, typ, name=""):
        return self._cast("fptosi", value, typ, name)

    def sitofp(self, value, typ, name=""):
        return self._cast("sitofp", value, typ, name)

    # memory
    def alloca(self, typ, size=None, name=""):
        if size is not None:
            raise NotImplementedError("textir: alloca(size=...)")
        return self._op(typ.as_pointer(), f"alloca {typ}", name)

    def load(self, ptr, name="", align=None, typ=None):
        ptr_type = ptr.type
        if not isinstance(ptr_type, PointerType):
            raise TypeError(f"cannot load from value of type {ptr_type}: not a pointer")
        ty = typ if typ is not None else ptr_type.pointee
        extra = f", align {align}" if align is not None else ""
        return self._op(ty, f"load {ty}, {ptr_type} {ptr.get_reference()}{extra}", name)

    def store(self, value, ptr, align=None):
        ptr_type = ptr.type
        if not isinstance(ptr_type, PointerType):
            raise TypeError(f"cannot store to value of type {ptr_type}: not a pointer")
        if ptr_type.pointee != value.type:
            raise TypeError(f"cannot store {value.type} to {ptr_type}: mismatching types")
        extra = f", align {align}" if align is not None else ""
        return self._op(_VOID, f"store {value.type} {value.get_reference()}, {ptr_type} "
                               f"{ptr.get_reference()}{extra}")

    def gep(self, ptr, indices, inbounds=False, name=""):
        ptr_type = ptr.type
        ty = ptr_type
        for index in indices:
            ty = ty.gep(index)
        op = "getelementptr inbounds" if inbounds else "getelementptr"
        refs = ", ".join(f"{i.type} {i.get_reference()}" for i in indices)
        return self._op(ty.as_pointer(), f"{op} {ptr_type.pointee}, {ptr_type} "
                                         f"{ptr.get_reference()}, {refs}", name, space=True)

    def extract_value(self, agg, idx, name=""):
        indices = idx if isinstance(idx, (tuple, list)) else [idx]
        ty = agg.type
        for i in indices:
            ty = ty.elements[i]
        return self._op(ty, f"extractvalue {agg.type} {agg.get_reference()}, "
                            f"{', '.join(str(i) for i in indices)}", name, space=True)

    def phi(self, typ, name="", flags=()):
        if flags:
            raise NotImplementedError("textir: phi(flags=...)")
        return self._insert(PhiInstr(typ, self._name(name)))

    def call(self, fn, args, name="", cconv=None, tail=False, fastmath=(), attrs=(),
             arg_attrs=None):
        if cconv or tail or attrs or arg_attrs:
            raise NotImplementedError("textir: call() with options")
        fnty = fn.function_type
        if len(args) != len(fnty.args):
            raise TypeError(f"{len(args)} arguments for {fnty}")
        for i, (arg, expected) in enumerate(zip(args, fnty.args)):
            if arg.type != expected:
                raise TypeError(f"Type of #{i + 1} arg mismatch: {expected} != {arg.type}")
        ret = fnty.return_type
        text = ", ".join(f"{a.type} {a.get_reference()}" for a in args)
        flags = "".join(f"{flag} " for flag in fastmath)
        return self._op(ret, f"call {flags}{ret} {fn.get_reference()}({text})", name)

    # terminators
    def _terminate(self, ty: Type, body: str) -> Instruction:
        block = self._block
        if block.terminator is not None:
            raise AssertionError("block already terminated")
        instr = self._op(ty, body)
        block.terminator = instr
        return instr

    def branch(self, target: Block):
        return self._terminate(_VOID, f"br label {target.ref}")

    def cbranch(self, cond, truebr: Block, falsebr: Block):
        return self._terminate(_VOID, f"br {cond.type} {cond.get_reference()}, label "
                                      f"{truebr.ref}, label {falsebr.ref}")

    def ret_void(self):
        return self._terminate(_VOID, "ret void")

    def ret(self, value):
        return self._terminate(_VOID, f"ret {value.type} {value.get_reference()}")


def _label_suffix(label: str, suffix: str) -> str:
    return label[:25] + ".." + suffix if len(label) > 50 else label + suffix


def namespace(module) -> ModuleType:
    """The IR classes that go with ``module``: this module's for a :class:`Module`,
    ``llvmlite.ir`` for an ``llvmlite.ir.Module``."""
    return sys.modules[__name__] if isinstance(module, Module) else _llvmlite
