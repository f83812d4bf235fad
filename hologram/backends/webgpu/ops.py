"""The webgpu renderer's op table: how each Atlas instruction that is not a memory access,
a constant, an index, a reduction or a math function becomes a WGSL expression
(``op_*``, :meth:`hologram.codegen.gpu_kernel.KernelWriter.apply`), the steps of the
shared cast rule (:meth:`~hologram.codegen.gpu_kernel.KernelWriter.op_cast`), and i64
operations on two words (:meth:`Ops.wide`).

Narrow integers live in i32/u32 registers and are wrapped to their width after each
operation that may leave it (:meth:`Ops.wrap`); floats divide, take square roots and fma
through the bit-exact helpers of :mod:`.bitlib` (WGSL's may be inexact); float compares and
min/max handle NaN and signed zeros on the bits, since WGSL lets a driver assume there
are none.
"""

from __future__ import annotations

from hologram.codegen import mathlib as shared_math
from hologram.errors import DTypeError
from hologram.isa.dtypes import DType

from .mathlib import f32_literal, i32_literal
from .values import INT_RANGE, REG


class Ops:
    """The op table of :class:`.render._Kernel` (a mixin): entries build expressions from
    its operands' names, through its ``call`` (a helper of :mod:`.bitlib`) and ``bind``."""

    def wide(self, op: str, args: list[str]) -> str:
        """An operation on i64 values (two words; :data:`.backend._I64_OPS`); division
        and remainder are a call of a long division (:data:`bitlib.LOOPS`)."""
        self.used.add("hg_u64")
        x = args[0]
        y = args[1] if len(args) > 1 else None
        zero = "vec2<u32>(0u, 0u)"
        negative = f"(({x}.y & 0x80000000u) != 0u)"
        table = {
            "add": lambda: f"hg_add64({x}, {y})",
            "sub": lambda: f"hg_sub64({x}, {y})",
            "mul": lambda: f"hg_mul64lo({x}, {y})",
            "and": lambda: f"{x} & {y}", "or": lambda: f"{x} | {y}",
            "xor": lambda: f"{x} ^ {y}", "not": lambda: f"~{x}",
            "neg": lambda: f"hg_sub64({zero}, {x})",
            "abs": lambda: f"select({x}, hg_sub64({zero}, {x}), {negative})",
            "sign": lambda: f"select(select({zero}, vec2<u32>(1u, 0u), any({x} != {zero})), "
                            f"vec2<u32>(0xffffffffu, 0xffffffffu), {negative})",
            "min": lambda: f"select({x}, {y}, hg_slt64({y}, {x}))",
            "max": lambda: f"select({x}, {y}, hg_slt64({x}, {y}))",
            "eq": lambda: f"all({x} == {y})", "ne": lambda: f"any({x} != {y})",
            "lt": lambda: f"hg_slt64({x}, {y})", "gt": lambda: f"hg_slt64({y}, {x})",
            "le": lambda: f"!hg_slt64({y}, {x})", "ge": lambda: f"!hg_slt64({x}, {y})",
            "select": lambda: f"select({args[2]}, {args[1]}, {x})",
            "div": lambda: f"{self.call('hg_divmod64', x, y)}.q",
            "mod": lambda: f"{self.call('hg_divmod64', x, y)}.r",
        }
        if op not in table:
            raise DTypeError(f"kernel {self.kernel.name}: backend 'webgpu' has no {op} on "
                             "i64; cast to i32 first, or run the program on the cpu backend")
        return table[op]()

    def wrap(self, expr: str, t: DType) -> str:
        """An i32/u32 expression wrapped to ``t``'s width."""
        if t.name in ("i8", "i16"):
            bits = 32 - t.bits
            return f"((({expr}) << {bits}u) >> {bits}u)"
        if t.name == "u8":
            return f"(({expr}) & 0xffu)"
        return expr

    # --- the op table (operands' WGSL names, operand dtype, result dtype) -> expression --
    def arith(self, sign: str, args, a: DType) -> str:
        return self.wrap(f"{args[0]} {sign} {args[1]}", a)

    def op_add(self, args, a, t):
        return self.arith("+", args, a)

    def op_sub(self, args, a, t):
        return self.arith("-", args, a)

    def op_mul(self, args, a, t):
        return self.arith("*", args, a)

    def op_div(self, args, a, t):
        if a.is_float:  # WGSL's division may be 2.5 ulp off; the ISA rounds once
            return self.call("hg_div", *args)
        return self.arith("/", args, a)

    def op_mod(self, args, a, t):
        if a.is_float:
            return self.call("hg_fmod", *args)
        if a.name in ("i8", "i16", "i32"):
            return self.wrap(self.call("hg_mod_i32", *args), a)
        return self.arith("%", args, a)

    def minmax(self, args, a, largest: bool) -> str:
        x, y = args
        if a.is_bool:
            return f"{x} {'|' if largest else '&'} {y}"
        if a.is_float:
            kx = self.call("hg_key_f32", x, "true" if largest else "false")
            ky = self.call("hg_key_f32", y, "true" if largest else "false")
            return self.call("hg_unkey_f32", f"{'max' if largest else 'min'}({kx}, {ky})")
        return f"{'max' if largest else 'min'}({x}, {y})"

    def op_min(self, args, a, t):
        return self.minmax(args, a, False)

    def op_max(self, args, a, t):
        return self.minmax(args, a, True)

    def op_xor(self, args, a, t):
        return f"{args[0]} != {args[1]}" if a.is_bool else f"{args[0]} ^ {args[1]}"

    def bool_number(self, x: str) -> str:
        return f"select(0u, 1u, {x})"

    def compare_floats(self, op: str, x: str, y: str) -> str:
        # On the bits: NaN tested (drivers may assume floats are not NaN), the values as
        # ordered integers (-0.0 and +0.0 one key), so that a driver that flushes
        # subnormals to zero still orders them (WGSL allows the flush).
        nan = f"(hg_isnan({x}) || hg_isnan({y}))"
        kx, ky = self.call("hg_ord_f32", x), self.call("hg_ord_f32", y)
        if op == "ne":
            return f"{nan} || ({kx} != {ky})"
        return f"!{nan} && ({kx} {shared_math.COMPARISONS[op]} {ky})"

    def op_abs(self, args, a, t):
        (x,) = args
        if a.is_float:
            return f"bitcast<f32>(bitcast<u32>({x}) & 0x7fffffffu)"
        if a.kind == "u" or a.is_bool:
            return x
        return self.wrap(f"select({x}, 0 - {x}, {x} < 0)", a)

    def op_neg(self, args, a, t):
        (x,) = args
        if a.is_float:
            return f"bitcast<f32>(bitcast<u32>({x}) ^ 0x80000000u)"
        return self.wrap(f"{'0u' if a.kind == 'u' else '0'} - {x}", a)

    def op_not(self, args, a, t):
        return f"!{args[0]}" if a.is_bool else self.wrap(f"~{args[0]}", a)

    def op_sign(self, args, a, t):
        (x,) = args
        if a.is_float:  # on the bits: ±0.0 and NaN are kept, subnormals give ±1
            return (f"select(bitcast<f32>((bitcast<u32>({x}) & 0x80000000u) | 0x3f800000u), "
                    f"{x}, (bitcast<u32>({x}) & 0x7fffffffu) == 0u || hg_isnan({x}))")
        if a.kind == "u":
            return f"select(0u, 1u, {x} > 0u)"
        return f"select(select(0, -1, {x} < 0), 1, {x} > 0)"

    def op_sqrt(self, args, a, t):  # WGSL's sqrt may be inexact; the ISA rounds once
        return self.call("hg_sqrt", args[0])

    def op_rsqrt(self, args, a, t):  # two correctly rounded steps: within 1 ulp
        return self.call("hg_div", f32_literal(1.0), self.call("hg_sqrt", args[0]))

    def op_fma(self, args, a, t):
        if a.is_float:  # WGSL's fma() may round twice
            return self.call("hg_fma", *args)
        return self.wrap(f"{args[0]} * {args[1]} + {args[2]}", a)

    def op_select(self, args, a, t):
        return f"select({args[2]}, {args[1]}, {args[0]})"

    # --- casts (the steps of KernelWriter.op_cast) ---------------------------------------
    def op_cast(self, args, a, t):
        if a is not t and "i64" in (a.name, t.name):
            return self.cast_i64(args[0], a, t)
        return super().op_cast(args, a, t)

    def cast_to_bool(self, x, a):
        if a.is_float:  # on the bits: a subnormal is true (NaN too)
            return f"(bitcast<u32>({x}) & 0x7fffffffu) != 0u"
        return f"{x} != {'0u' if REG[a.name] == 'u32' else '0'}"

    def cast_from_bool(self, x, t):
        return {"f32": f"select(0.0f, 1.0f, {x})", "i32": f"select(0, 1, {x})",
                "u32": f"select(0u, 1u, {x})"}[REG[t.name]]

    def cast_to_float(self, x, a, t):
        if a.is_float:
            return x  # every float register is an exact f32
        if t.name in ("f16", "bf16") and a.name == "i32":
            return self.call("hg_i32_to_f32_odd", x)
        return f"f32({x})"

    def round_narrow(self, value, t):
        return self.call("hg_round_f16" if t.name == "f16" else "hg_round_bf16", value)

    def saturate(self, x, t):
        lo, hi = INT_RANGE[t.name]
        if t.kind == "u":
            return self.call("hg_f32_to_u32", x, f32_literal(float(hi)), f"{hi}u")
        lo_f = f32_literal(float(lo))
        hi_f = "0x1p+31f" if t.name == "i32" else f32_literal(float(hi))
        return self.call("hg_f32_to_i32", x, lo_f, hi_f, i32_literal(lo), i32_literal(hi))

    def cast_i64(self, x: str, a: DType, t: DType) -> str:
        """A cast to or from i64 (two words)."""
        if t.name == "i64":
            if a.is_bool:
                return f"vec2<u32>(select(0u, 1u, {x}), 0u)"
            if a.is_float:  # saturating, NaN -> 0
                return self.call("hg_f32_to_i64", x)
            if REG[a.name] == "u32":
                return f"vec2<u32>({x}, 0u)"
            return f"vec2<u32>(bitcast<u32>({x}), select(0u, 0xffffffffu, {x} < 0))"
        if t.is_bool:
            return f"({x}.x | {x}.y) != 0u"
        if t.is_float:
            if t.name == "f32":
                return self.call("hg_i64_to_f32", x, "false")
            rounding = "hg_round_f16" if t.name == "f16" else "hg_round_bf16"
            return self.call(rounding, self.call("hg_i64_to_f32", x, "true"))
        if REG[t.name] == "u32":
            return self.wrap(f"{x}.x", t)
        return self.wrap(f"bitcast<i32>({x}.x)", t)

    def int_cast(self, x: str, a: DType, t: DType) -> str:
        """An integer register of ``a`` as one of ``t`` (wrapping)."""
        src, dst = REG[a.name], REG[t.name]
        if dst == "bool":
            return f"{x} != {'0u' if src == 'u32' else '0'}"
        if src != dst:
            x = f"bitcast<{dst}>({x})"
        return self.wrap(x, t) if t.bits < a.bits or src != dst else x
