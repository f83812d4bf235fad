"""Decomposition: the numeric lowering a target's instructions do not give, in Atlas ops.

docs/isa.md defines every operation for every input. Where a target's own instructions
do not compute that definition, this pass rewrites the operation into Atlas operations
that do, chosen by the target's :class:`~hologram.compiler.capabilities.Capabilities`
(never by a backend name), so that every renderer receives operations it can emit
plainly and every backend computes the same bits:

- **f16 / bf16 arithmetic** on a target without it natively (``f16_arithmetic``,
  ``bf16_arithmetic``): ``add sub mul div mod pow`` and the float unary functions become
  ``cast`` to f32, the operation in f32, ``cast`` back: the result rounded to the narrow
  format after every inexact operation. For ``+ - * /``, ``sqrt`` and ``mod`` that is the
  correctly rounded result (float32 has more than twice their precision plus two bits);
  the transcendental functions round twice, within their stated accuracy. ``fma`` is
  computed in f64 operations and rounded once (TwoSum's error decides the ties that the
  f64 sum's own rounding made), where the target has f64 (without f64 it is left to the
  renderer). Operations exact in the format (``neg abs sign min max select``, compares)
  stay as they are.
- **integer ``div`` / ``mod``** on a target without ``total_division`` (every target so
  far, the cpu included: the guards are what its renderer emitted itself): the divisor is
  replaced by 1 where it is 0 (and, signed, where it is -1), and the ISA's results are
  selected there: ``x / 0 = 0``, ``x % 0 = x``, ``x / -1 = -x`` (wrapping, so
  ``INT_MIN / -1 = INT_MIN``), ``x % -1 = 0``. The ``div``/``mod`` left then never sees a
  divisor whose result a target's instruction may leave undefined.
- **float ``min`` / ``max``** on a target without ``ieee_minmax``: compares and selects
  giving IEEE 754-2019 minimum/maximum: NaN if either operand is NaN, ``-0.0 < +0.0``
  (the sign of a zero read as the sign of ``1 / x``).

An operation no rewrite can give (``gather`` or ``scatter`` on a target without the
capability) is refused with a :class:`~hologram.compiler.capabilities.MissingCapabilityError`.
A scatter's combining step (``add``/``mul`` of f16/bf16 elements) is inside the
instruction: renderers compute it in f32 and round once, which gives the ISA's result
(f32 holds the exact sum or product of two f16/bf16 values to within a rounding that
cannot change the second one).

A kernel with nothing to rewrite is returned as it is (a program with nothing to rewrite,
too); a rewritten kernel is verified. Reductions (their accumulators,
argmax's first-occurrence and NaN rules) are not Atlas-level operations and stay with the
loop plan and the renderer.
"""

from __future__ import annotations

from hologram.compiler.capabilities import Capabilities, require
from hologram.isa import dtypes as dt
from hologram.isa.body import Body
from hologram.isa.ir import FLOAT_UNARY_OPS, Instr, Kernel, Program
from hologram.isa.verify import verify_kernel

#: Inexact f16/bf16 operations computed in f32 and rounded back.
WIDENED = frozenset({"add", "sub", "mul", "div", "mod", "pow", *FLOAT_UNARY_OPS})
_NARROW = (dt.float16, dt.bfloat16)
# The largest finite value, and the halfway point above it that rounds to infinity.
_LARGEST = {dt.float16: 65504.0, dt.bfloat16: (2 - 2**-7) * 2.0**127}
_OVERFLOW_TIE = {dt.float16: 65520.0, dt.bfloat16: (2 - 2**-8) * 2.0**127}


def decompose(program: Program, caps: Capabilities) -> Program:
    """``program`` with every operation ``caps`` lacks rewritten (see the module
    docstring). Raises :class:`~hologram.compiler.capabilities.MissingCapabilityError`
    for an operation the target cannot run at all (``gather`` or ``scatter`` without the
    capability)."""
    require(program, caps)
    kernels = tuple(_kernel(k, caps) for k in program.kernels)
    if all(a is b for a, b in zip(kernels, program.kernels)):
        return program
    for old, new in zip(program.kernels, kernels):
        if new is not old:  # what the renderer gets must be valid IR
            verify_kernel(program, new)
    return program.evolve(kernels=kernels)


def native_narrow(t: dt.DType, caps: Capabilities) -> bool:
    """Whether a target with ``caps`` computes in the float format ``t`` itself."""
    return (t is dt.float16 and caps.f16_arithmetic) or \
        (t is dt.bfloat16 and caps.bf16_arithmetic)


def _rewritten(instr: Instr, caps: Capabilities) -> bool:
    t = instr.dtype
    if t in _NARROW and not native_narrow(t, caps) and \
            (instr.op in WIDENED or (instr.op == "fma" and caps.f64)):
        return True
    if instr.op in ("div", "mod") and t.is_int and not caps.total_division:
        return True
    return instr.op in ("min", "max") and t.is_float and not caps.ieee_minmax


def _kernel(kernel: Kernel, caps: Capabilities) -> Kernel:
    if not any(_rewritten(x, caps) for x in kernel.body):
        return kernel
    body = Body(kernel.domain, kernel.grid_rank, canonical=False, name=kernel.name)
    rewriter = _Rewriter(body, caps)
    new: list[int] = []
    for instr in kernel.body:
        args = tuple(new[a] for a in instr.args)
        if _rewritten(instr, caps):
            new.append(rewriter.rewrite(instr, args))
        else:
            new.append(body.push(instr.with_args(args)))
    return kernel.evolve(body=tuple(body.instrs))


class _Rewriter:
    def __init__(self, body: Body, caps: Capabilities):
        self.body, self.caps = body, caps

    def make(self, op: str, *args: int, dtype: dt.DType | None = None) -> int:
        return self.body.make(op, args, dtype=dtype)

    def const(self, value: bool | int | float, t: dt.DType) -> int:
        return self.body.const(value, t)

    def cast(self, x: int, t: dt.DType) -> int:
        return self.make("cast", x, dtype=t)

    def rewrite(self, instr: Instr, args: tuple[int, ...]) -> int:
        t, op = instr.dtype, instr.op
        if op in ("div", "mod") and t.is_int:
            return self.integer_division(op, *args, t)
        if op in ("min", "max"):
            return self.minmax(op, *args, t)
        if op == "fma":
            return self.narrow_fma(*args, t)
        value = self.make(op, *(self.cast(a, dt.float32) for a in args))
        return self.cast(value, t)

    def narrow_fma(self, a: int, b: int, c: int, t: dt.DType) -> int:
        """``a * b + c`` for f16/bf16, rounded once, in f64 operations. The product is
        exact in f64 (at most 22 significant bits); the sum ``s`` rounds, and TwoSum gives
        its error ``e`` exactly (``s + e`` is the exact result). Rounding ``s`` to ``t``
        is then right except where ``s`` is exactly halfway between two ``t`` values and
        ``e`` is not 0: there the exact result lies on ``e``'s side of the midpoint, so it
        rounds to the neighbour on that side (cast's ties-to-even picked one of the two)."""
        w = dt.float64
        x, y, z = (self.cast(v, w) for v in (a, b, c))
        product = self.make("mul", x, y)
        total = self.make("add", product, z)
        back = self.make("sub", total, product)
        error = self.make("add", self.make("sub", product, self.make("sub", total, back)),
                          self.make("sub", z, back))
        rounded = self.cast(total, t)
        near = self.cast(rounded, w)
        # total = near + d; at a midpoint the other neighbour is near + 2d, a t value.
        d = self.make("sub", total, near)
        other = self.make("add", near, self.make("add", d, d))
        zero = self.const(0.0, w)
        midpoint = self.make("and", self.make("ne", d, zero),
                             self.make("eq", self.cast(self.cast(other, t), w), other))
        beyond = self.make("or",
                           self.make("and", self.make("gt", error, zero),
                                     self.make("gt", d, zero)),
                           self.make("and", self.make("lt", error, zero),
                                     self.make("lt", d, zero)))
        value = self.make("select", self.make("and", midpoint, beyond),
                          self.cast(other, t), rounded)
        # Halfway between the largest finite value and the next power of two, ties go to
        # infinity; an error toward zero puts the exact result below: the largest finite.
        largest = _LARGEST[t]
        overflow_tie = self.make("and",
                                 self.make("eq", self.make("abs", total),
                                           self.const(_OVERFLOW_TIE[t], w)),
                                 self.make("lt", self.make("mul", error, total), zero))
        signed = self.make("select", self.make("gt", total, zero),
                           self.const(largest, t), self.const(-largest, t))
        return self.make("select", overflow_tie, signed, value)

    def integer_division(self, op: str, x: int, y: int, t: dt.DType) -> int:
        zero, one = self.const(0, t), self.const(1, t)
        by_zero = self.make("eq", y, zero)
        bad = by_zero
        if t.kind == "i":
            by_minus_one = self.make("eq", y, self.const(-1, t))
            bad = self.make("or", by_zero, by_minus_one)
        safe = self.make("select", bad, one, y)
        if op == "mod":  # x % 1 = 0 is the ISA's x % -1
            return self.make("select", by_zero, x, self.make("mod", x, safe))
        negated = self.make("neg", x) if t.kind == "i" else None
        quotient = self.make("div", x, safe)
        if negated is not None:
            quotient = self.make("select", by_minus_one, negated, quotient)
        return self.make("select", by_zero, zero, quotient)

    def minmax(self, op: str, x: int, y: int, t: dt.DType) -> int:
        largest = op == "max"
        value = self.make("select", self.make("lt", y, x) if largest else
                          self.make("lt", x, y), x, y)
        # Equal operands: only zeros of different signs differ; take x where the zero
        # the compare chose (y for max, x for min) is -0.0.
        signed = y if largest else x
        ct = dt.float32 if t in _NARROW and not native_narrow(t, self.caps) else t
        if ct is not t:
            signed = self.cast(signed, ct)
        negative = self.make("lt", self.make("div", self.const(1.0, ct), signed),
                             self.const(0.0, ct))
        value = self.make("select", self.make("and", self.make("eq", x, y), negative),
                          x, value)
        # A NaN y fails the compares, so y is already chosen; a NaN x must be picked.
        return self.make("select", self.make("ne", x, x), x, value)
