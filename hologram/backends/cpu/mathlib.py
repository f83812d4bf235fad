"""The transcendental functions in LLVM IR, so that loops calling them vectorize.

``llvm.exp.f32`` and friends lower to scalar libm calls, which stop LLVM's loop
vectorizer. :func:`get` instead emits ``hg.<name>.f32`` / ``hg.<name>.f64``: internal,
``alwaysinline`` functions built only from instructions that vectorize (``fma``, ``rint``,
``floor``, ``fabs``, ``copysign``, ``fdiv``, ``ldexp`` on AVX-512, selects, bitcasts and
integer ops), with no branches and no calls to libm.

The algorithms are device-neutral and live in :mod:`hologram.codegen.mathlib`; this module
is its LLVM emitter (:class:`LLVMEmitter`), which implements each primitive with one
instruction or intrinsic (most of them :mod:`.primitives`, shared with :mod:`.softfloat`).
Every ``fma`` is ``llvm.fma`` (exact semantics, so results are the same on every host,
f32 sigmoid's last bit excepted); on targets without FMA or SSE4.1, ``fma``, ``rint`` and
``floor`` are our own exact IR instead (:mod:`.intrinsics`), never library calls. Scaling
by ``2^n`` is ``llvm.ldexp`` (``vscalefps``) on AVX-512 hosts, elsewhere two
multiplications by powers of two.

A rarely taken path (:meth:`~hologram.codegen.mathlib.MathEmitter.rarely`: sin and cos of
large arguments) is a branch to a call of an out-of-line function instead of a select.
That function carries vector variants (LLVM's vector-function ABI, masked): where the loop
vectorizer vectorizes the loop, it calls the variant with the branch's mask, and the
variant computes the path for the whole vector only if some lane of the mask is set. The
variants are inlined after vectorization (:func:`.llvm.optimize_ir`), so a vector with no
such lane costs one test of its mask.
"""

from __future__ import annotations

from collections.abc import Callable

from hologram.backends.cpu import intrinsics
from hologram.backends.cpu import llvm as _llvm
from hologram.backends.cpu import target as _targets
from hologram.backends.cpu import textir as ir
from hologram.backends.cpu.primitives import TYPES, Primitives
from hologram.backends.cpu.target import Target
from hologram.codegen import mathlib as _shared
from hologram.codegen.mathlib import FORMATS, FUNCTIONS, Format, MathEmitter

__all__ = ["FUNCTIONS", "LLVMEmitter", "branches_to_rare_paths", "get"]

#: Format name -> the lane counts of a rarely taken path's vector variants: the widths the
#: loop vectorizer picks (SSE to AVX-512, NEON).
_LANES = {"f32": (4, 8, 16), "f64": (2, 4, 8)}
#: The operations a vector variant uses that may otherwise need our scalar soft IR.
_VECTOR_OPS = ("fma", "rint", "floor")


def _use_scalef(target: Target | None = None) -> bool:
    """Scale by 2^n with ``llvm.ldexp`` where the target has it as an instruction (AVX-512
    ``vscalefps``, SVE ``fscale``; elsewhere it is a libm call)."""
    return _llvm.lowers_natively(target or _targets.current(), "ldexp", "float")


class LLVMEmitter(Primitives, MathEmitter):
    """The primitives of :class:`~hologram.codegen.mathlib.MathEmitter` as LLVM IR, written
    with ``builder`` for ``target``."""

    def __init__(self, builder: ir.IRBuilder, fmt: Format, target: Target):
        super().__init__(builder, fmt)
        self.target = target

    def rarely(self, cond, fast: tuple, slow: Callable[..., tuple], *args) -> tuple:
        """A branch on ``cond`` to calls of ``slow``'s out-of-line functions (one per value,
        with vector variants: :func:`_out_of_line`); the default select where the module is
        llvmlite's or the target lacks vector fma, rint or floor."""
        module = self.b.module
        if not isinstance(module, ir.Module) or not branches_to_rare_paths(self.target):
            return super().rarely(cond, fast, slow, *args)
        fns = [_out_of_line(module, self.fmt, self.target, slow, args, fast, i)
               for i in range(len(fast))]
        b = self.b
        entry = b.block
        taken = b.append_basic_block("rarely")
        join = b.append_basic_block("rarely.join")
        b.cbranch(cond, taken, join)
        b.position_at_end(taken)
        values = [b.call(fn, list(args)) for fn in fns]
        b.branch(join)
        b.position_at_end(join)
        out = []
        for f, v in zip(fast, values, strict=True):
            phi = b.phi(f.type)
            phi.add_incoming(f, entry)
            phi.add_incoming(v, taken)
            out.append(phi)
        return tuple(out)

    def for_format(self, fmt: Format) -> LLVMEmitter:
        return LLVMEmitter(self.b, fmt, self.target)

    def convert(self, a, fmt: Format):
        ty = TYPES[fmt.name][0]
        if fmt.width > self.fmt.width:
            return self.b.fpext(a, ty)
        if fmt.width < self.fmt.width:
            return self.b.fptrunc(a, ty)
        return a

    # intrinsics: fma, rint and floor are our own IR where the target lacks them
    def _call(self, base: str, *args: ir.Value) -> ir.Value:
        return intrinsics.call(self.b, base, list(args), self.target)

    def fma(self, a, b, c):
        return self._call("fma", a, b, c)

    def floor(self, a):
        return self._call("floor", a)

    def rint(self, a):
        return self._call("rint", a)

    # arithmetic
    def div(self, a, b):
        return self.b.fdiv(a, b)

    def fast_recip(self, a):
        """``fdiv 1, a`` with ``arcp ninf contract``: LLVM computes it as a reciprocal
        estimate and a Newton step (x86: ``vrcp14ps`` in a 512-bit loop, the 12-bit
        ``vrcpps`` in a narrower vector epilogue, then two fma), good to ~2^-23; a scalar
        tail gets a true ``divss``. ``ninf`` holds: a is in [1, 2] or NaN."""
        return self.b.fdiv(self.c(1.0), a, flags=("arcp", "ninf", "contract"))

    def neg(self, a):
        return self.b.fneg(a)

    # conversions
    def to_int(self, a):
        return self.b.fptosi(a, self.ity)

    def to_float(self, n):
        return self.b.sitofp(n, self.ty)

    def scale(self, p, n):
        """p * 2^n rounded once. With AVX-512 (or SVE), ``llvm.ldexp``: one
        ``vscalefps``, also right for NaN p; elsewhere the two exact steps of the default,
        because ldexp would become library calls there."""
        if not _use_scalef(self.target):
            return super().scale(p, n)
        i32 = ir.IntType(32)
        name = f"llvm.ldexp.{self.fmt.name}.i32"
        fn = self.b.module.globals.get(name)
        if fn is None:
            fn = ir.namespace(self.b.module).Function(
                self.b.module, ir.FunctionType(self.ty, [self.ty, i32]), name)
        if self.ity.width != 32:
            n = self.b.trunc(n, i32)
        return self.b.call(fn, [p, n])


class _VectorEmitter(LLVMEmitter):
    """:class:`LLVMEmitter` on vectors of ``lanes`` elements (a rarely taken path's vector
    variant; only for targets with vector fma, rint and floor)."""

    def __init__(self, builder: ir.IRBuilder, fmt: Format, target: Target, lanes: int):
        super().__init__(builder, fmt, target)
        self.lanes = lanes
        self.ty, self.ity = (ir.VectorType(t, lanes) for t in TYPES[fmt.name])

    def for_format(self, fmt: Format) -> LLVMEmitter:
        return _VectorEmitter(self.b, fmt, self.target, self.lanes)

    def convert(self, a, fmt: Format):
        raise NotImplementedError("vector variants convert no formats")

    def _call(self, base: str, *args: ir.Value) -> ir.Value:
        name = f"{base}.v{self.lanes}{self.fmt.name}"
        fn = intrinsics.declare(self.b.module, name, self.ty, [a.type for a in args])
        return self.b.call(fn, list(args))

    def scale(self, p, n):
        return MathEmitter.scale(self, p, n)


def branches_to_rare_paths(target: Target) -> bool:
    """Does :meth:`LLVMEmitter.rarely` branch (into a textir module) for ``target``? Where
    vector fma, rint and floor are instructions (x86-64-v3 and later, aarch64)."""
    return all(_llvm.lowers_natively(target, op, ty)
               for op in _VECTOR_OPS for ty in ("float", "double"))


def _out_of_line(module: ir.Module, fmt: Format, target: Target,
                 slow: Callable[..., tuple], args: tuple, fast: tuple, i: int) -> ir.Function:
    """``hg.<slow>.<fmt>.<i>``: value ``i`` of ``slow(emitter, *args)``, an internal
    ``noinline`` function, with masked vector variants ``...v<lanes>`` for :data:`_LANES`.

    A variant tests its mask first and returns zeros where no lane is set; it is
    ``alwaysinline`` (inlined once the loop vectorizer has called it) and listed in
    ``llvm.compiler.used`` so that it lives until then."""
    fname = f"hg.{slow.__name__.strip('_')}.{fmt.name}.{i}"
    existing = module.globals.get(fname)
    if existing is not None:
        return existing
    arg_types = [a.type for a in args]
    ret = fast[i].type
    fn = ir.Function(module, ir.FunctionType(ret, arg_types), fname)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    b.ret(slow(LLVMEmitter(b, fmt, target), *fn.args)[i])
    params = "v" * len(args)
    variants = []
    for lanes in _LANES[fmt.name]:
        vname = f"{fname}.v{lanes}"
        vty = ir.VectorType(ret, lanes)
        mask_ty = ir.VectorType(ir.IntType(1), lanes)
        vfn = ir.Function(module, ir.FunctionType(
            vty, [ir.VectorType(t, lanes) for t in arg_types] + [mask_ty]), vname)
        vfn.linkage = "internal"
        vfn.attributes.add("alwaysinline")
        vfn.attributes.add("nounwind")
        entry = vfn.append_basic_block("entry")
        work = vfn.append_basic_block("work")
        done = vfn.append_basic_block("done")
        b = ir.IRBuilder(entry)
        lanes_set = b.bitcast(vfn.args[-1], ir.IntType(lanes))
        b.cbranch(b.icmp_unsigned("!=", lanes_set, ir.Constant(ir.IntType(lanes), 0)),
                  work, done)
        b.position_at_end(work)
        value = slow(_VectorEmitter(b, fmt, target, lanes), *vfn.args[:-1])[i]
        work_end = b.block
        b.branch(done)
        b.position_at_end(done)
        phi = b.phi(vty)
        phi.add_incoming(ir.Constant(vty, 0), entry)
        phi.add_incoming(value, work_end)
        b.ret(phi)
        module.compiler_used.append(vfn)
        variants.append(f"_ZGV_LLVM_M{lanes}{params}_{fname}({vname})")
    fn.string_attributes["vector-function-abi-variant"] = ",".join(variants)
    return fn


def get(module: ir.Module, name: str, ty: ir.Type, target: Target | None = None
        ) -> ir.Function:
    """The function ``hg.<name>.f32`` / ``hg.<name>.f64`` in ``module``, emitted on first use
    for ``target`` (default: the current one).

    ``ty`` is ``ir.FloatType()`` or ``ir.DoubleType()``; the function takes one argument of
    that type (two for ``pow``) and returns that type. It is internal and ``alwaysinline``.
    """
    _shared.check(name)
    if isinstance(ty, ir.FloatType):
        fmt = FORMATS["f32"]
    elif isinstance(ty, ir.DoubleType):
        fmt = FORMATS["f64"]
    else:
        raise TypeError(f"mathlib functions take float or double, not {ty}")
    fname = f"hg.{name}.{fmt.name}"
    existing = module.globals.get(fname)
    if existing is not None:
        return existing
    new = ir.namespace(module)  # (tests also emit into llvmlite modules)
    fn = new.Function(module, ir.FunctionType(ty, [ty] * _shared.arity(name)), fname)
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    fn.attributes.add("nounwind")
    builder = new.IRBuilder(fn.append_basic_block("entry"))
    emitter = LLVMEmitter(builder, fmt, target or _targets.current())
    builder.ret(_shared.emit(emitter, name, *fn.args))
    return fn
