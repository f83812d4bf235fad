"""The C renderer: a scheduled, decomposed Atlas program -> one C99 translation unit.

Every kernel becomes ``static void hg_kernel_N(void *const *hg_b)`` (``hg_b``: one
pointer per program buffer) and ``hologram_run(hg_b)`` calls them in program order. A
kernel follows its loop plan (:func:`hologram.codegen.loops.plan`), as the cpu renderer
does, one grid point at a time:

- the grid dimensions are ``for`` loops; a value the plan hoists before the loop over
  dimension ``d`` is computed there, one computed once per grid point at the point;
- a value that varies along loop dimensions is recomputed inside the loop nest of what
  needs it: a reduction (one nest over its axes, with an accumulator) or a group of
  stores (one nest over the dimensions they vary along). A reduction whose result varies
  along a loop dimension (the cpu backend interprets those) is recomputed in its user's
  nest the same way;
- every value is a ``const`` local of its register type (bool ``int``, f16 and bf16
  ``float``, rounded after each inexact operation), bound once per place it is computed.

Reductions accumulate as :mod:`hologram.codegen.loops` plans them: float sums in the cpu
backend's order (:mod:`.sums`), float products in float64, the others in one accumulator
of the operand type; argmax/argmin keep the first extreme, NaN the most extreme. A zero
extent needs no special kernel: a grid with one has no points, an empty reduction gives
its identity (+0.0 for a sum), and a store of an empty shape is left out.

Integer arithmetic computes in unsigned types and converts back (signed overflow is
undefined in C; the ISA wraps); integer ``div``/``mod`` arrive guarded by the decompose
pass; float-to-int casts saturate with NaN to 0 by compares, never by C's undefined
conversion.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

from hologram.backends.c import sums
from hologram.backends.c.mathlib import F32, F64, float_literal, int_literal
from hologram.backends.c.prelude import HEADER, Helpers
from hologram.codegen.loops import Accumulator, plan
from hologram.codegen.mathlib import COMPARISONS
from hologram.compiler.capabilities import Capabilities
from hologram.errors import CompileError
from hologram.isa import dtypes as dt
from hologram.isa.dtypes import DType
from hologram.isa.ir import FLOAT_UNARY_OPS, Instr, Kernel, Program

#: The entry point of every program's library.
ENTRY = "hologram_run"
REGISTER = {"bool": "int", "i8": "int8_t", "i16": "int16_t", "i32": "int32_t",
            "i64": "int64_t", "u8": "uint8_t", "f16": "float", "bf16": "float",
            "f32": "float", "f64": "double"}
MEMORY = {**REGISTER, "bool": "uint8_t", "f16": "uint16_t", "bf16": "uint16_t"}
_NARROW = (dt.float16, dt.bfloat16)
_EXACT_NARROW = frozenset({"neg", "abs", "select", "min", "max", "sign"})
_BITWISE = {"and": "&", "or": "|", "xor": "^"}
_LIBM = {"sqrt": "sqrt", "floor": "floor", "ceil": "ceil", "trunc": "trunc", "round": "rint"}


def render(program: Program, caps: Capabilities) -> str:
    """The C source of ``program`` (already through ``pipeline.for_target``)."""
    helpers = Helpers()
    kernels = "\n".join(_Kernel(program, k, caps, helpers, n).render()
                        for n, k in enumerate(program.kernels))
    calls = "".join(f"    hg_kernel_{n}(hg_b);\n" for n in range(len(program.kernels)))
    return (f"/* program {_comment(program.name)}: C99 from hologram.backends.c */\n{HEADER}\n"
            f"{helpers.source(kernels)}\n" + kernels
            + f"\nvoid {ENTRY}(void *const *hg_b);\n"
            f"void {ENTRY}(void *const *hg_b)\n{{\n    (void)hg_b;\n{calls}}}\n")


def _comment(name: str) -> str:
    """``name`` (any string: names may be JSON strings) safe inside a C comment: printable
    ASCII, no comment end, no trigraph (``??x``)."""
    text = "".join(c if c.isprintable() and c.isascii() else "?" for c in name)
    return text.replace("*/", "* /").replace("??", "? ?").replace("??", "? ?")


def _unsigned(t: DType) -> str:
    return "uint64_t" if t.bits == 64 else "uint32_t"


def _fmt(ctype: str):
    return F32 if ctype == "float" else F64


class _Kernel:
    def __init__(self, program: Program, kernel: Kernel, caps: Capabilities,
                 helpers: Helpers, number: int):
        self.program, self.kernel, self.h, self.number = program, kernel, helpers, number
        self.plan = plan(kernel, caps)
        self.lines: list[str] = []
        self.depth, self.names = 1, 0
        self.buffers: set[int] = set()
        self.index: dict[int, str] = {}  # domain dimension -> its loop variable
        self.hoisted: dict[int, str] = {}
        self.point: dict[int, str] = {}
        self.local: dict[int, str] = {}

    # --- text ---------------------------------------------------------------------------
    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def fresh(self, prefix: str = "t") -> str:
        self.names += 1
        return f"{prefix}{self.names}"

    def bind(self, ctype: str, expression: str) -> str:
        name = self.fresh()
        self.line(f"const {ctype} {name} = {expression};")
        return name

    def var(self, ctype: str, initial: str) -> str:
        name = self.fresh("a")
        self.line(f"{ctype} {name} = {initial};")
        return name

    @contextmanager
    def loop(self, dim: int, stop: int | str, start: int | str = 0, step: int = 1):
        i = self.fresh("i")
        self.line(f"for (int64_t {i} = {start}; {i} < {stop}; {i} += {step}) {{")
        saved = self.index.get(dim)
        self.index[dim], self.depth = i, self.depth + 1
        yield i
        self.depth -= 1
        self.line("}")
        if saved is None:
            self.index.pop(dim, None)
        else:
            self.index[dim] = saved

    @contextmanager
    def nest(self, dims: list[int]):
        if not dims:
            yield
            return
        with self.loop(dims[0], self.kernel.domain[dims[0]]), self.nest(dims[1:]):
            yield

    def render(self) -> str:
        kernel = self.kernel
        if 0 in kernel.domain[: kernel.grid_rank]:
            self.line("/* no grid points */")
        elif kernel.grid_rank == 0:
            self.grid_point()
        else:
            self.grid(0)
        buffers = self.program.buffers
        pointers = [f"    {MEMORY[buffers[i].dtype.name]} *const b{i} = "
                    f"({MEMORY[buffers[i].dtype.name]} *)hg_b[{i}];" for i in sorted(self.buffers)]
        about = (f"kernel {_comment(kernel.name)} domain {list(kernel.domain)} "
                 f"grid {kernel.grid_rank}")
        return (f"/* {about} */\n"
                f"static void hg_kernel_{self.number}(void *const *hg_b)\n{{\n"
                + "\n".join([*(pointers or ["    (void)hg_b;"]), *self.lines]) + "\n}\n")

    # --- structure (the cpu renderer's walk) --------------------------------------------
    def grid(self, d: int) -> None:
        if d == self.kernel.grid_rank:
            self.grid_point()
            return
        saved = dict(self.hoisted)
        self.point = self.local = self.hoisted
        for i in self.plan.hoisted_at(d):
            if i not in self.hoisted and 0 not in self.kernel.body[i].shape:
                self.hoisted[i] = self.emit(i)
        with self.loop(d, self.kernel.domain[d]):
            self.grid(d + 1)
        self.hoisted = saved

    def grid_point(self) -> None:
        self.point = dict(self.hoisted)
        body = self.kernel.body
        for dims, stores in self.plan.store_nests:
            stores = [p for p in stores if 0 not in body[p].shape]  # empty: nothing written
            for pos in stores:
                for a in body[pos].args:
                    self.prepare(a)
            with self.nest(list(dims)):
                self.local = {}
                for pos in stores:
                    (self.scatter if body[pos].op == "scatter" else self.store)(body[pos])

    def prepare(self, root: int) -> None:
        """Emit at grid-point level what ``root`` needs that varies along no loop
        dimension (reductions included); empty values are left to the loops (never run)."""
        for i in self.plan.point_values(self.kernel, root, self.point):
            instr = self.kernel.body[i]
            if i not in self.point and 0 not in instr.shape:
                self.local = self.point
                self.point[i] = self.emit(i)

    def value(self, i: int) -> str:
        if i in self.point:
            return self.point[i]
        if i not in self.local:
            self.local[i] = self.emit(i)
        return self.local[i]

    # --- memory -------------------------------------------------------------------------
    def element(self, instr: Instr) -> str:
        self.buffers.add(instr.buffer)
        terms = [int_literal(instr.map.offset, 64)] if instr.map.offset else []
        for d, (n, stride) in enumerate(zip(instr.shape, instr.map.strides)):
            if n > 1 and stride:
                step = "" if stride == 1 else f" * {int_literal(stride, 64)}"
                terms.append(f"{self.index[d]}{step}")
        return " + ".join(terms) or "0"

    def data_element(self, instr: Instr) -> str:
        """A gather's or scatter's element: the map's plus its operand clamped to the
        bounds (docs/isa.md), all in int64."""
        at = self.bind("int64_t", f"(int64_t){self.value(instr.args[-1])}")
        low, high = (int_literal(v, 64) for v in instr.bounds)
        at = self.bind("int64_t", f"{at} < {low} ? {low} : {at} > {high} ? {high} : {at}")
        return f"{self.element(instr)} + {at}"

    def from_memory(self, raw: str, t: DType) -> str:
        if t.is_bool:
            return f"{raw} != 0"
        if t is dt.bfloat16:
            return f"hg_float32((int32_t)((uint32_t){raw} << 16))"
        if t is dt.float16:
            return f"{self.h.use('hg_f16_to_f32')}({raw})"
        return raw

    def to_memory(self, value: str, t: DType) -> str:
        if t.is_bool:
            return f"(uint8_t){value}"
        if t is dt.bfloat16:
            return f"(uint16_t)((uint32_t)hg_bits32({value}) >> 16)"
        if t is dt.float16:
            return f"{self.h.use('hg_f32_to_f16')}({value})"
        return value

    def store(self, instr: Instr) -> None:
        value = self.value(instr.args[0])
        self.line(f"b{instr.buffer}[{self.element(instr)}] = {self.to_memory(value, instr.dtype)};")

    def scatter(self, instr: Instr) -> None:
        """One write of a scatter, at the current point of its nest (index order)."""
        t, value = instr.dtype, self.value(instr.args[0])
        at = self.bind("int64_t", self.data_element(instr))
        slot = f"b{instr.buffer}[{at}]"
        if instr.mode != "replace":
            old = self.bind(REGISTER[t.name], self.from_memory(slot, t))
            if instr.mode in ("max", "min"):
                value = self.bind(REGISTER[t.name], self.minmax(instr.mode, old, value, t))
            else:
                value = self.bind(REGISTER[t.name], self.arith(instr.mode, old, value, t))
                if t in _NARROW:
                    value = self.round(value, t)
        self.line(f"{slot} = {self.to_memory(value, t)};")

    # --- values -------------------------------------------------------------------------
    def emit(self, position: int) -> str:
        instr = self.kernel.body[position]
        op, t = instr.op, instr.dtype
        ctype = REGISTER[t.name]
        if op in ("load", "gather"):
            element = self.element(instr) if op == "load" else self.data_element(instr)
            return self.bind(ctype, self.from_memory(f"b{instr.buffer}[{element}]", t))
        if op == "const":
            return self.bind(ctype, self.const(instr.value, t))
        if op == "index":
            return self.bind(ctype, f"({ctype}){self.index.get(instr.axis, '0')}")
        if op in ("reduce", "contract"):
            return self.reduce(position)
        a = self.kernel.body[instr.args[0]].dtype
        if op in ("div", "mod") and a.is_int and not self.guarded(instr.args[1]):
            raise CompileError(f"kernel {self.kernel.name}: integer {op} with an unguarded "
                               "divisor reached the c renderer; compile through the backend "
                               "(compiler.pipeline.for_target guards 0 and -1)")
        if t in _NARROW and op not in _EXACT_NARROW and op != "cast":
            raise CompileError(f"kernel {self.kernel.name}: {op} on {t.name} reached the c "
                               "renderer; compile through the backend (the decompose pass "
                               "computes f16/bf16 arithmetic in f32 or f64)")
        args = [self.value(x) for x in instr.args]
        result = self.bind(ctype, self.operation(op, args, a, t))
        return self.round(result, t) if t in _NARROW and op == "cast" else result

    def guarded(self, divisor: int) -> bool:
        x = self.kernel.body[divisor]
        if x.op == "const":
            return x.value not in (0, -1)
        one = self.kernel.body[x.args[1]] if x.op == "select" else None
        return one is not None and one.op == "const" and one.value == 1

    def const(self, value, t: DType) -> str:
        if t.is_bool:
            return str(int(value))
        if t.is_int:
            return int_literal(value, 64 if t.bits == 64 else 32)
        return self.flit(value, REGISTER[t.name])

    def flit(self, value: float, ctype: str) -> str:
        return float_literal(value, _fmt(ctype))

    def operation(self, op: str, args: list[str], a: DType, t: DType) -> str:
        """The C expression of ``op`` on ``args`` (operand dtype ``a``, result ``t``)."""
        ctype, x = REGISTER[t.name], args[0]
        sfx = "f" if REGISTER[a.name] == "float" else ""
        if op in ("add", "sub", "mul"):
            return self.arith(op, *args, a)
        if op == "div":
            return f"{x} / {args[1]}" if a.is_float else f"({ctype})({x} / {args[1]})"
        if op == "mod":
            return f"fmod{sfx}({x}, {args[1]})" if a.is_float else f"({ctype})({x} % {args[1]})"
        if op in ("min", "max"):
            return self.minmax(op, *args, a)
        if op in ("and", "or", "xor"):
            return f"({ctype})({x} {_BITWISE[op]} {args[1]})"
        if op in COMPARISONS:
            return f"{x} {COMPARISONS[op]} {args[1]}"
        if op == "select":
            return f"{x} ? {args[1]} : {args[2]}"
        if op == "fma":
            return f"fma{sfx}({x}, {args[1]}, {args[2]})"
        if op == "cast":
            return self.cast(x, a, t)
        if op == "neg":
            return f"-{x}" if a.is_float else f"({ctype})(0u - ({_unsigned(a)}){x})"
        if op == "not":
            return f"!{x}" if a.is_bool else f"({ctype})~{x}"
        if op == "abs":
            if a.is_float:
                return f"fabs{sfx}({x})"
            return x if a.kind == "u" else f"{x} < 0 ? ({ctype})(0u - ({_unsigned(a)}){x}) : {x}"
        if op == "sign":
            if a.is_float:
                one = self.flit(1.0, ctype)
                return f"{x} > 0 ? {one} : {x} < 0 ? -{one} : {x}"
            return f"({ctype})({x} != 0)" if a.kind == "u" else f"({ctype})(({x} > 0) - ({x} < 0))"
        if op == "rsqrt":
            return f"{self.flit(1.0, ctype)} / sqrt{sfx}({x})"
        if op in _LIBM:
            return f"{_LIBM[op]}{sfx}({x})"
        if op in FLOAT_UNARY_OPS or op == "pow":
            return f"{self.h.math(str(op), _fmt(ctype).name)}({', '.join(args)})"
        raise CompileError(f"kernel {self.kernel.name}: the c renderer has no {op}")

    def arith(self, op: str, x: str, y: str, t: DType) -> str:
        symbol = {"add": "+", "sub": "-", "mul": "*"}[op]
        if t.is_float:
            return f"{x} {symbol} {y}"
        u = _unsigned(t)
        return f"({REGISTER[t.name]})(({u}){x} {symbol} ({u}){y})"

    def minmax(self, op: str, x: str, y: str, t: DType) -> str:
        largest = op in ("max", "argmax")
        if t.is_float:
            bits = "32" if REGISTER[t.name] == "float" else "64"
            name = f"hg_{'maximum' if largest else 'minimum'}_{bits}"
            return f"{self.h.use(name)}({x}, {y})"
        if t.is_bool:
            return f"{x} | {y}" if largest else f"{x} & {y}"
        return f"{x} {'>' if largest else '<'} {y} ? {x} : {y}"

    def cast(self, x: str, a: DType, t: DType) -> str:
        ctype = REGISTER[t.name]
        if a is t:
            return x
        if t.is_bool:
            return f"{x} != 0"
        if a.is_bool:
            return f"({ctype}){x}"
        if t in _NARROW and (a is dt.float64 or (a.is_int and a.bits >= 32)):
            # Through f32 would round twice; through f64 and round-to-odd rounds once.
            if a is dt.int64:
                wide = self.bind("double", f"hg_i64_to_f64({x} < 0 ? 0u - (uint64_t){x} : "
                                           f"(uint64_t){x}, {x} < 0)")
            else:
                wide = x if a.is_float else self.bind("double", f"(double){x}")
            return f"{self.h.use('hg_round_to_odd')}({wide})"
        if a.is_float and t.is_int:  # truncates; saturates; NaN -> 0
            lo, hi = (0, 256) if t.kind == "u" else (-(2 ** (t.bits - 1)), 2 ** (t.bits - 1))
            src = REGISTER[a.name]
            low, high = self.flit(float(lo), src), self.flit(float(hi), src)
            top = int_literal(hi - 1, 64 if t.bits == 64 else 32)
            bottom = int_literal(lo, 64 if t.bits == 64 else 32)
            return (f"{x} != {x} ? 0 : {x} <= {low} ? ({ctype}){bottom} : "
                    f"{x} >= {high} ? ({ctype}){top} : ({ctype}){x}")
        return f"({ctype}){x}"  # widen, narrow f64 -> f32, int -> float, int -> int (wraps)

    def round(self, x: str, t: DType) -> str:
        """A float32 rounded to the nearest f16 or bf16, kept in a float."""
        name = "hg_round_f16" if t is dt.float16 else "hg_round_bf16"
        return self.bind("float", f"{self.h.use(name)}({x})")

    def narrow(self, value: str, ctype: str, t: DType) -> str:
        target = REGISTER[t.name]
        if t in _NARROW:
            if ctype == "double":
                value = self.bind("float", f"{self.h.use('hg_round_to_odd')}({value})")
            return self.round(value, t)
        return value if ctype == target else self.bind(target, f"({target}){value}")

    # --- reductions ---------------------------------------------------------------------
    def reduce(self, position: int) -> str:
        body = self.kernel.body
        instr, acc = body[position], self.plan.accumulator(position)
        t = body[instr.args[0]].dtype
        if acc.kind == "sum" and math.prod(self.kernel.domain[a] for a in instr.axes) == 0:
            return self.bind(REGISTER[t.name], self.const(0, t))  # +0.0, not the -0.0 identity
        saved, self.local = self.local, {}
        if acc.blocked:
            result, ctype = sums.float_sum(self, instr, acc)
        else:
            result, ctype = self.accumulate(instr, acc, t)
        self.local = saved
        return result if acc.index else self.narrow(result, ctype, instr.dtype)

    def term(self, instr: Instr, ctype: str) -> str:
        """The reduction's term at the current indices (a contraction's product, in the
        accumulator's type), computed afresh in the loop body it is emitted in."""
        self.local = {}
        values = [self.value(a) for a in instr.args]
        if instr.op == "contract":
            t = self.kernel.body[instr.args[0]].dtype
            if not t.is_float:
                return self.bind(ctype, self.arith("mul", *values, t))
            return self.bind(ctype, f"({ctype}){values[0]} * ({ctype}){values[1]}")
        return values[0]

    def accumulate(self, instr: Instr, acc: Accumulator, t: DType) -> tuple[str, str]:
        """Products, extremes, integer sums and argmax/argmin, in order over the axes."""
        ctype = REGISTER[acc.dtype]
        kind, largest = acc.kind, acc.kind in ("min", "argmin")  # starts at the largest
        if kind in ("sum", "prod"):
            one = 0.0 if kind == "sum" else 1.0
            identity = self.flit(-one if kind == "sum" else one, ctype) if t.is_float \
                else str(int(one))
        else:
            identity = str(int(largest)) if t.is_bool else \
                self.const(t.max if largest else t.min, t)
        total = self.var(ctype, identity)
        best = self.var("int64_t", "0") if acc.index else None
        with self.nest(list(instr.axes)):
            value = self.term(instr, ctype)
            if t.is_float and ctype != REGISTER[t.name]:
                value = self.bind(ctype, f"({ctype}){value}")
            if best is None:
                combine = self.arith("add" if kind == "sum" else "mul", total, value, t) \
                    if kind in ("sum", "prod") else self.minmax(kind, total, value, t)
                self.line(f"{total} = {combine};")
            else:
                flat = "0"
                for axis in instr.axes:
                    flat = f"({flat}) * {self.kernel.domain[axis]} + {self.index[axis]}"
                self.line(f"if ({self.better(kind == 'argmax', value, total, t)}) {{ "
                          f"{total} = {value}; {best} = {flat}; }}")
        return (best, "int64_t") if best else (total, ctype)

    def better(self, largest: bool, v: str, b: str, t: DType) -> str:
        """Does ``v`` replace ``b`` (first occurrence wins; NaN is the extreme; -0.0 <
        +0.0, as the max/min reductions order them)?"""
        if not t.is_float:
            return f"{v} {'>' if largest else '<'} {b}"
        bits = "hg_bits32" if REGISTER[t.name] == "float" else "hg_bits64"
        order = ">" if largest else "<"
        sign = f"{bits}({b}) < 0 && {bits}({v}) >= 0" if largest else \
            f"{bits}({v}) < 0 && {bits}({b}) >= 0"
        return (f"({v} != {v} && {b} == {b}) || ({b} == {b} && ({v} {order} {b} || "
                f"({v} == 0 && {b} == 0 && {sign})))")
