"""The renderer's LLVM IR text builder (``backends/cpu/textir.py``) against llvmlite's:
the same calls give the same text, character for character (value numbering, quoting,
constants, metadata, declarations), so the text builder changes no compiled kernel."""

from __future__ import annotations

import math

import pytest
from llvmlite import ir as llvmlite_ir

from hologram.backends.cpu import mathlib, softfloat, textir
from hologram.backends.cpu import target as targets

BOTH = [pytest.param(llvmlite_ir, id="llvmlite"), pytest.param(textir, id="textir")]


def _every_call(ir) -> str:
    """A module that makes every builder call the renderer and its emitters make."""
    i1, i8, i16, i32, i64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
    f32, f64, f16 = ir.FloatType(), ir.DoubleType(), ir.HalfType()
    C = ir.Constant
    module = ir.Module(name="every call")
    module.triple = ""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [i8.as_pointer().as_pointer(),
                                                             i64, i64]), "hg_kernel")
    fn.args[0].add_attribute("noalias")
    entry = fn.append_basic_block("entry")
    b = ir.IRBuilder(entry)
    start = fn.append_basic_block("start")
    b.branch(start)
    b.position_at_end(start)
    raw = b.load(b.gep(fn.args[0], [C(i64, 2)]))
    floats = b.bitcast(raw, f32.as_pointer())
    doubles = b.bitcast(raw, f64.as_pointer())
    ints = b.bitcast(raw, i32.as_pointer())
    x = b.load(b.gep(floats, [fn.args[1]]))
    d = b.load(doubles)
    n = b.load(ints)
    # arithmetic, with and without flags and names
    y = b.fadd(x, C(f32, 1.5))
    y = b.fsub(y, x, name="named")
    y = b.fmul(y, C(f32, -0.0))
    y = b.fdiv(C(f32, 1.0), y, flags=("arcp", "ninf", "contract"))
    y = b.fadd(y, x, flags=("reassoc",))
    y = b.fneg(y)
    k = b.add(n, C(i32, 7))
    k = b.sub(k, n)
    k = b.mul(k, C(i32, -3))
    k = b.sdiv(k, C(i32, 5))
    k = b.udiv(k, C(i32, 5))
    k = b.srem(k, C(i32, 3))
    k = b.urem(k, C(i32, 3))
    k = b.and_(b.or_(b.xor(k, n), C(i32, 0xFFFF0000)), C(i32, 0x7FFF))
    k = b.ashr(b.lshr(b.shl(k, C(i32, 3)), C(i32, 1)), C(i32, 1))
    k = b.not_(b.neg(k))
    # compares, selects, casts
    c1 = b.icmp_signed("<", k, n)
    c2 = b.icmp_unsigned(">=", k, n)
    c3 = b.icmp_signed("==", k, n)
    c4 = b.fcmp_ordered("!=", x, y)
    c5 = b.fcmp_unordered("uno", x, x)
    c6 = b.fcmp_ordered(">", x, C(f32, 0.0))
    c = b.and_(b.or_(c1, c2), b.xor(c3, b.not_(b.and_(c4, b.or_(c5, c6)))))
    y = b.select(c, y, x)
    wide = b.fpext(y, f64)
    wide = b.fadd(wide, d)
    narrow = b.fptrunc(wide, f32)
    half = b.bitcast(b.fptrunc(narrow, f16), i16)
    back = b.fpext(b.bitcast(half, f16), f32)
    same = b.bitcast(back, f32)  # no instruction: the value itself
    as_int = b.fptosi(same, i64)
    as_uint = b.fptoui(same, i32)
    z = b.sitofp(b.trunc(as_int, i16), f64)
    z = b.fadd(z, b.uitofp(b.zext(as_uint, i64), f64))
    z = b.fadd(z, b.sitofp(b.sext(b.trunc(as_uint, i8), i64), f64))
    flag = b.zext(c, i8)
    # calls: an intrinsic declaration, an internal defined function
    fabs = ir.Function(module, ir.FunctionType(f64, [f64]), "llvm.fabs.f64")
    z = b.call(fabs, [z])
    helper = ir.Function(module, ir.FunctionType(f32, [f32, f32]), "hg.helper")
    helper.linkage = "internal"
    helper.attributes.add("alwaysinline")
    helper.attributes.add("nounwind")
    hb = ir.IRBuilder(helper.append_basic_block("entry"))
    hb.ret(hb.fmul(*helper.args))
    y = b.call(helper, [y, narrow])
    # allocas at the entry block's start, aggregates, a loop with a phi and metadata
    with b.goto_block(entry):
        b.position_at_start(entry)
        lanes = b.alloca(ir.ArrayType(f32, 4))
    with b.goto_block(entry):
        b.position_at_start(entry)
        acc = b.alloca(f64)
    b.store(C(ir.ArrayType(f32, 4), [-0.0, 0.0, math.inf, math.nan]), lanes)
    b.store(C(f64, 2.0 ** -1074), acc)
    head = fn.append_basic_block("d-1.head")
    body = fn.append_basic_block("d-1.body")
    done = fn.append_basic_block("d-1.done")
    before = b.block
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(i64, name="i-1")
    i.add_incoming(C(i64, 0), before)
    b.cbranch(b.icmp_signed("<", i, fn.args[2]), body, done)
    b.position_at_end(body)
    slot = b.gep(lanes, [C(i64, 0), b.and_(i, C(i64, 3))])
    stored = b.store(b.fadd(b.load(slot), y), slot)
    group = module.add_metadata([])
    stored.set_metadata("llvm.access.group", group)
    following = b.add(i, C(i64, 1))
    i.add_incoming(following, b.block)
    back_edge = b.branch(head)
    hints = [module.add_metadata([ir.MetaDataString(module, "llvm.loop.interleave.count"),
                                  C(i32, 4)]),
             module.add_metadata([ir.MetaDataString(module, "llvm.loop.vectorize.enable"),
                                  C(i1, 1)]),
             module.add_metadata([ir.MetaDataString(module, "llvm.loop.unroll.disable")])]
    loop = ir.MDValue(module, hints, name=str(len(module.metadata)))
    loop.operands = (loop, *hints)
    back_edge.set_metadata("llvm.loop", loop)
    b.position_at_end(done)
    total = b.load(acc)
    with b.if_then(b.fcmp_ordered("<", total, z)):
        b.store(b.fadd(total, z), acc)
    array = b.load(lanes)
    first = b.extract_value(array, 0)
    last = b.extract_value(array, [3])
    b.store(b.fadd(first, last), floats)
    b.store(flag, b.gep(raw, [C(i64, 1)]))
    b.ret_void()
    return str(module)


def test_every_call_prints_as_llvmlite_prints_it() -> None:
    assert _every_call(textir) == _every_call(llvmlite_ir)


@pytest.mark.parametrize("target", ["host", "x86-64"])
@pytest.mark.parametrize("name", mathlib.FUNCTIONS)
@pytest.mark.parametrize("bits", [32, 64])
def test_mathlib_functions_print_as_with_llvmlite(target: str, name: str, bits: int) -> None:
    chosen = targets.named(target) if target != "host" else targets.current()
    if name in ("sin", "cos") and mathlib.branches_to_rare_paths(chosen):
        pytest.skip("a textir module calls sin/cos's large-argument path out of line, "
                    "with vector variants (an llvmlite module selects)")
    texts = []
    for ir in (textir, llvmlite_ir):
        module = ir.Module(name="m")
        ty = ir.FloatType() if bits == 32 else ir.DoubleType()
        fn = mathlib.get(module, name, ty, chosen)
        assert isinstance(fn, ir.Function)
        texts.append(str(module))
    assert texts[0] == texts[1]


@pytest.mark.parametrize("name", softfloat.FUNCTIONS)
def test_softfloat_functions_print_as_with_llvmlite(name: str) -> None:
    arg = {"f16_to_f32": "i16", "f16_to_f64": "i16", "f32_to_f16": "f32",
           "f64_to_f16": "f64"}.get(name)
    kinds = [arg] if arg else ["f32", "f64"]
    for kind in kinds:
        texts = []
        for ir in (textir, llvmlite_ir):
            ty = {"i16": ir.IntType(16), "f32": ir.FloatType(), "f64": ir.DoubleType()}[kind]
            module = ir.Module(name="m")
            softfloat.get(module, name, ty)
            texts.append(str(module))
        assert texts[0] == texts[1], (name, kind)


@pytest.mark.parametrize("ir", BOTH)
def test_constants(ir) -> None:
    """Constants print as llvmlite prints them: float bits in hex (space-padded below
    16 digits), integers and booleans, arrays."""
    f32, f64, i1, i64 = ir.FloatType(), ir.DoubleType(), ir.IntType(1), ir.IntType(64)
    for ty, value in [(f32, 0.0), (f32, -0.0), (f32, 0.1), (f32, math.nan), (f32, -math.inf),
                      (f64, 1e-310), (f64, 0.1), (f64, 3), (i1, True), (i1, 0), (i64, -5),
                      (ir.ArrayType(f32, 2), [1.0, -0.0])]:
        assert str(textir.Constant(ty, value)) == str(llvmlite_ir.Constant(ty, value))
    assert textir.Constant(f32, 0.0) == textir.Constant(f32, 0.0)
    assert textir.Constant(f32, 0.0) != textir.Constant(f32, -0.0)
