"""The cuda renderer's op table: how each Atlas instruction that is not a memory access,
a constant, an index, a reduction or a math function becomes a Triton expression on
tiles (``op_*``, :meth:`hologram.codegen.gpu_kernel.KernelWriter.apply`), and the steps
of the shared cast rule (:meth:`~hologram.codegen.gpu_kernel.KernelWriter.op_cast`).

Division and square root are the correctly rounded ``tl.div_rn`` / ``tl.sqrt_rn`` (``/``
and ``tl.sqrt`` may be approximate on NVIDIA GPUs; f64 ``/`` is ``div.rn.f64``), float
mod is an exact remainder of the significands (``hg_fmod_*``), min/max order NaN and
signed zeros as the ISA does, and integers wrap in their dtype.
"""

from __future__ import annotations

from hologram.isa import dtypes as dt

from .values import LIMITS, TL


class Ops:
    """The op table of :class:`.render._Kernel` (a mixin): entries build expressions from
    its operand tiles' names, through its ``bind`` and ``extreme``."""

    def op_add(self, args, a, t):
        return f"{args[0]} + {args[1]}" if not a.is_bool else f"{args[0]} | {args[1]}"

    def op_sub(self, args, a, t):
        return f"{args[0]} - {args[1]}"

    def op_mul(self, args, a, t):
        return f"{args[0]} * {args[1]}"

    def op_div(self, args, a, t):
        # Integers: Triton's // truncates toward zero (C); the decompose pass has already
        # made the divisor safe (x / 0, INT_MIN / -1).
        if a is dt.float64:  # correctly rounded on NVIDIA GPUs (div.rn.f64)
            return f"{args[0]} / {args[1]}"
        return f"tl.div_rn({args[0]}, {args[1]})" if a.is_float else f"{args[0]} // {args[1]}"

    def op_mod(self, args, a, t):
        # Floats: C fmod, exact (hg_fmod_*; f16/bf16 arrive as f32, whose remainder is
        # exact in them too). Integers: C's sign of the dividend.
        if a.is_float:
            return f"hg_fmod_{'f64' if a is dt.float64 else 'f32'}({args[0]}, {args[1]})"
        return f"{args[0]} % {args[1]}"

    def op_sqrt(self, args, a, t):
        # tl.sqrt_rn takes f32 only; an f64 sqrt is correctly rounded (sqrt.rn.f64).
        return f"tl.sqrt({args[0]})" if a is dt.float64 else f"tl.sqrt_rn({args[0]})"

    def op_rsqrt(self, args, a, t):
        root = self.bind(self.op_sqrt(args, a, t))
        return self.op_div(["1.0", root], a, t)  # +-0 -> +-inf

    def op_floor(self, args, a, t):
        return self.math(a).floor(args[0])

    def op_ceil(self, args, a, t):
        return self.math(a).ceil(args[0])

    def op_trunc(self, args, a, t):
        e = self.math(a)
        return e.copysign(e.floor(e.fabs(args[0])), args[0])

    def op_round(self, args, a, t):
        return self.math(a).rint(args[0])

    def op_sign(self, args, a, t):
        (x,) = args
        if a.is_float:  # +-0 and NaN pass through
            return f"tl.where({x} > 0, 1.0, tl.where({x} < 0, -1.0, {x}))"
        return f"({x} > 0).to({TL[t.name]}) - ({x} < 0).to({TL[t.name]})"

    def op_fma(self, args, a, t):
        # f16/bf16 fma arrives as f64 steps (the decompose pass).
        return f"tl.fma({args[0]}, {args[1]}, {args[2]})" if a.is_float else \
            f"{args[0]} * {args[1]} + {args[2]}"

    def op_min(self, args, a, t):
        return f"tl.minimum({args[0]}, {args[1]})" if not a.is_bool else \
            f"{args[0]} & {args[1]}"

    def op_max(self, args, a, t):
        return f"tl.maximum({args[0]}, {args[1]})" if not a.is_bool else \
            f"{args[0]} | {args[1]}"

    def op_abs(self, args, a, t):
        if a.is_float:
            return self.math(a).fabs(args[0])
        return args[0] if a.is_bool else f"tl.where({args[0]} < 0, 0 - {args[0]}, {args[0]})"

    def op_neg(self, args, a, t):
        if a.is_float:
            return self.math(a).neg(args[0])
        return f"0 - {args[0]}"

    def op_xor(self, args, a, t):
        return f"{args[0]} ^ {args[1]}"

    def op_not(self, args, a, t):
        return f"{args[0]} == 0" if a.is_bool else f"~{args[0]}"

    def bool_number(self, x: str) -> str:
        return f"{x}.to(tl.int32)"

    def op_select(self, args, a, t):
        return f"tl.where({args[0]}, {args[1]}, {args[2]})"

    # --- casts (the steps of KernelWriter.op_cast) ---------------------------------------
    def cast_to_bool(self, x, a):
        return f"{x} != 0"

    def cast_from_bool(self, x, t):
        return f"{x}.to({TL[t.name]})"

    def cast_to_float(self, x, a, t):
        if t is dt.float64:
            return f"{x}.to(tl.float64)"  # exact from floats; ints round once
        if a is dt.float64:  # then rounded once to f16/bf16
            return f"{x}.to(tl.float32)" if t is dt.float32 else f"hg_f64_to_f32_odd({x})"
        if a.is_float:
            return x  # every other float register holds an exact f32
        if t.name in ("f16", "bf16"):  # one rounding, not two
            wide = f"hg_i64_to_f64_odd({x})" if a is dt.int64 else f"{x}.to(tl.float64)"
            return f"hg_f64_to_f32_odd({wide})"  # (narrower ints: exact in f64)
        return f"{x}.to(tl.float32)"

    def round_narrow(self, value, t):
        if t.name == "f16":
            return f"({value}).to(tl.float16).to(tl.float32)"
        return f"hg_round_bf16({value})"

    def saturate(self, x, t):
        lo, hi = LIMITS[TL[t.name]]
        # in range when truncated: lo - 1 < x < hi + 1
        ok = self.bind(f"({x} > {float(lo - 1)!r}) & ({x} < {float(hi + 1)!r})")
        safe = self.bind(f"tl.where({ok}, {x}, 0.0).to({TL[t.name]})")
        return (f"tl.where({x} != {x}, 0, tl.where({ok}, {safe}, tl.where({x} > 0, "
                f"{hi}, {lo}))).to({TL[t.name]})")

    def int_cast(self, x, a, t):
        return f"{x}.to({TL[t.name]})"  # two's complement
