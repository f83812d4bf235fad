"""The Atlas text form: print → parse is the identity on every verified program."""

from __future__ import annotations

import math
import re
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hologram.errors import IRError
from hologram.isa import dtypes as dt
from hologram.isa.builder import KernelBuilder, ProgramBuilder, Value
from hologram.isa.ir import (
    ALL_OPS,
    BINARY_OPS,
    COMPARE_OPS,
    REDUCE_KINDS,
    UNARY_OPS,
    BufferDecl,
    IndexMap,
    Instr,
    Kernel,
    Opcode,
    Program,
    encode_const,
)
from hologram.isa.text import parse_program, print_instr, print_program
from hologram.isa.verify import infer, verify


def assert_round_trip(program: Program) -> str:
    """print → parse gives back an equal program, and printing is a fixed point."""
    text = print_program(program)
    parsed = parse_program(text)
    assert parsed == program, text
    assert print_program(parsed) == text
    return text


def try_emit(make, *args) -> Value | None:
    """Build one instruction, or None when the typing rules reject these operands."""
    try:
        return make(*args)
    except IRError:
        return None


# --- programs covering the ISA ---------------------------------------------------------
def every_op_for(t: dt.DType) -> Program:
    """One kernel applying every opcode and reduce kind that accepts ``t``, and every cast."""
    b = ProgramBuilder(f"ops_{t.name}")
    xs = b.input("x", t, (3, 4))
    ys = b.buffer("y", t, (1, 4), "inout")
    out = b.output("out", t, (3, 4))
    k = b.kernel((3, 4), grid_rank=1)
    x, y = k.load(xs), k.load(ys)
    cond = k.load(b.input("c", "bool", (3, 1)))
    for op in UNARY_OPS:
        try_emit(k.unary, op, x)
    for op in BINARY_OPS + COMPARE_OPS:
        try_emit(k.binary, op, x, y)
    try_emit(k.fma, x, y, x)
    k.select(cond, x, y)
    for kind in REDUCE_KINDS:
        try_emit(k.reduce, kind, x, 1)
    try_emit(k.contract, x, y, (1,))
    for other in dt.ALL:
        k.cast(x, other)
        k.cast(k.const(1, other), t)
    if t.is_int:
        k.index(0, t)
        k.index(1, t)
        k.gather(xs, x, (3, 4))  # an offset of every integer dtype
    k.gather(xs, k.index(1, "i32"), (3, 4), offset=-1, strides=(4, 0))  # and of every value
    k.store(out, x)
    return b.build()


def reductions() -> Program:
    """Every reduce kind over one axis and over several (grid_rank 1 leaves 1..3)."""
    b = ProgramBuilder("reductions")
    x = b.input("x", "f32", (2, 3, 4, 5))
    k = b.kernel((2, 3, 4, 5), grid_rank=1)
    v = k.load(x)
    for kind in REDUCE_KINDS:
        for axes in ((1,), (3,), (1, 2), (1, 2, 3)):
            k.reduce(kind, v, axes)
    k.contract(v, v, (2, 3))
    return b.build()


def rank0() -> Program:
    """Rank-0 buffers and domain: maps print as ``[+0; ]`` and shapes as ``f32[]``."""
    b = ProgramBuilder("rank0")
    x = b.input("x", "f32", ())
    y = b.output("y", "f32", ())
    k = b.kernel(())
    k.store(y, k.add(k.load(x), 1.5))
    k2 = b.kernel((2, 3), "bcast")
    z = b.output("z", "f32", (2, 3))
    k2.store(z, k2.load(x, shape=(1, 1), strides=(0, 0)))
    return b.build()


def empty() -> Program:
    """Extent-0 domains; a negative offset verifies there because nothing is touched."""
    b = ProgramBuilder("empty")
    x = b.input("x", "f32", (0, 5))
    s = b.output("s", "f32", (5,))
    n = b.output("n", "i32", (0,))
    k = b.kernel((0, 5))
    k.store(s, k.reduce("sum", k.load(x), 0), strides=(0, 1))
    k2 = b.kernel((0,), "neg_offset")
    k2.store(n, k2.index(0, "i32"), offset=-3, strides=(-7,))
    return b.build()


def strided() -> Program:
    """Negative strides (a reversal), stride-0 broadcasts and interior offsets."""
    b = ProgramBuilder("strided")
    x = b.input("x", "i64", (10,))
    y = b.output("y", "i64", (2, 4))
    k = b.kernel((2, 4), grid_rank=2)
    rev = k.load(x, shape=(2, 4), offset=9, strides=(-4, -1))
    row = k.load(x, shape=(2, 1), offset=1, strides=(3, 0))
    k.store(y, k.sub(rev, row), offset=7, strides=(-4, -1))
    return b.build()


def arena() -> Program:
    """Scheduled temporaries with arena offsets, two of them sharing bytes."""
    b = ProgramBuilder("arena")
    x = b.input("x", "f32", (8,))
    t0, t1, t2 = (b.temp(f"t{i}", "f32", (8,)) for i in range(3))
    y = b.output("y", "f32", (8,))
    for src, dst in ((x, t0), (t0, t1), (t1, t2), (t2, y)):
        k = b.kernel((8,), grid_rank=1)
        k.store(dst, k.exp(k.load(src)))
    p = b.build()
    offsets = {"t0": 0, "t1": 32, "t2": 0}  # t0 and t2 are never live together
    buffers = tuple(BufferDecl(bf.name, bf.dtype, bf.shape, bf.kind, offsets.get(bf.name))
                    for bf in p.buffers)
    return verify(Program(p.name, buffers, p.kernels))


def odd_names() -> Program:
    """Names that are not identifiers print quoted; ``.`` is part of an identifier."""
    b = ProgramBuilder('my prog "v2" # not a comment')
    x = b.input("x.1", "u8", (4,))
    y = b.output("out/0 ü\n", "u8", (4,))
    k = b.kernel((4,), name="{kernel}")
    k.store(y, k.xor(k.load(x), 255))
    return b.build()


def scatters() -> Program:
    """``scatter`` in every mode, offsets of every integer dtype, a value of every dtype
    (bool: replace, max and min only)."""
    b = ProgramBuilder("scatters")
    for t in dt.ALL:
        x = b.buffer(f"x_{t.name}", t, (6, 4), "inout")
        modes = ("replace", "max", "min") if t.is_bool else ("replace", "add", "mul", "max",
                                                              "min")
        for mode in modes:
            ints = [o for o in dt.ALL if o.is_int]
            offset = ints[len(b.kernels) % len(ints)]
            ix = b.input(f"ix_{t.name}_{mode}", offset, (3,))
            k = b.kernel((3, 4))
            value = k.const(True if t.is_bool else 1, t)
            k.scatter(x, value, k.load(ix, (3, 1), 0, (1, 0)), mode, (3, 4), 2, (0, 1),
                      (-2, 17))
    return b.build()


ALL_PROGRAMS = {
    **{f"every_op_{t.name}": (lambda t=t: every_op_for(t)) for t in dt.ALL},
    "scatters": scatters,
    "reductions": reductions,
    "rank0": rank0,
    "empty": empty,
    "strided": strided,
    "arena": arena,
    "odd_names": odd_names,
}


@pytest.mark.parametrize("name", ALL_PROGRAMS)
def test_round_trip(name: str) -> None:
    assert_round_trip(ALL_PROGRAMS[name]())


def test_opcodes_are_one_enum_in_groups() -> None:
    """Every opcode has one group; the group tuples are the enum's members; instructions
    given strings store members, and a program's fingerprint does not depend on which."""
    groups = {op.group for op in Opcode}
    assert groups == {"memory", "const", "index", "unary", "binary", "compare", "fma",
                      "select", "cast", "reduce", "contract"}
    assert tuple(Opcode) == ALL_OPS and len(set(ALL_OPS)) == len(ALL_OPS)
    for group, ops in (("unary", UNARY_OPS), ("binary", BINARY_OPS),
                       ("compare", COMPARE_OPS)):
        assert {op for op in Opcode if op.group == group} == set(ops)
    instr = Instr("add", dt.float32, (4,), (0, 1))
    assert instr.op is Opcode.ADD and instr == Instr(Opcode.ADD, dt.float32, (4,), (0, 1))
    assert repr(Opcode.ADD) == "'add'" and f"{Opcode.ADD}" == "add"
    # on every Python (3.10 has no enum.StrEnum): the string itself, hash included
    assert str(Opcode.ADD) == "add" and Opcode.ADD == "add"
    assert "-".join((Opcode.ADD, Opcode.MUL)) == "add-mul"
    assert hash(Opcode.ADD) == hash("add") and {"add": 1}[Opcode.ADD] == 1
    program = ALL_PROGRAMS[next(iter(ALL_PROGRAMS))]()
    assert parse_program(print_program(program)).fingerprint() == program.fingerprint()


def test_every_opcode_and_dtype_is_covered() -> None:
    """Fails when an opcode or dtype is added to the ISA without a round-trip test."""
    programs = [make() for make in ALL_PROGRAMS.values()]
    instrs = [i for p in programs for k in p.kernels for i in k.body]
    assert {i.op for i in instrs} == set(ALL_OPS)
    assert {i.dtype for i in instrs} == set(dt.ALL)
    assert {i.kind for i in instrs if i.op == "reduce"} == set(REDUCE_KINDS)
    # Each opcode (and reduce kind) appears with every operand dtype its typing rule accepts.
    covered = {
        (i.op, i.kind if i.op == "reduce" else "", k.body[i.args[-1]].dtype if i.args else i.dtype)
        for p in programs for k in p.kernels for i in k.body
    }
    expected = set()
    for t in dt.ALL:
        expected |= {(op, "", t) for op in ("load", "store", "const", "select", "cast")}
        expected |= {("index", "", t), ("gather", "", t), ("scatter", "", t)} if t.is_int \
            else set()
        for op in UNARY_OPS + BINARY_OPS + COMPARE_OPS + ("fma", "contract"):
            arity = 1 if op in UNARY_OPS else 3 if op == "fma" else 2
            if accepts(op, [t] * arity, ((1,),) if op == "contract" else ()):
                expected.add((op, "", t))
        for kind in REDUCE_KINDS:
            if accepts("reduce", [t], (kind, (1,))):
                expected.add(("reduce", kind, t))
    assert expected - covered == set()


def accepts(op: str, operands: list[dt.DType], attrs: tuple) -> bool:
    """Whether the typing rule of ``op`` takes operands of these dtypes."""
    try:
        infer(op, [(t, (2, 3)) for t in operands], attrs, None, (2, 3), 1)
    except IRError:
        return False
    return True


def test_example_text() -> None:
    text = print_program(reductions())
    assert "%0 = load @x[+0; 60, 20, 5, 1] : f32[2, 3, 4, 5]" in text
    assert "reduce argmin %0 axes [1, 2] : i64[2, 1, 1, 5]" in text
    assert "contract %0, %0 axes [2, 3] : f32[2, 3, 1, 1]" in text
    assert "kernel k0 domain [2, 3, 4, 5] grid 1 {" in text
    assert "[+0; ]" in print_program(rank0()) and "f32[]" in print_program(rank0())
    assert "[-3; -7]" in print_program(empty())
    assert "temp @t1: f32[8] @ 32" in print_program(arena())


def test_docs_example_parses() -> None:
    """The example in docs/isa.md is a valid program that prints back as written."""
    doc = Path(__file__).resolve().parent.parent / "docs" / "isa.md"
    if not doc.exists():
        pytest.skip("docs/isa.md is not in this checkout")
    block = re.search(r"```\n(program example .*?)```", doc.read_text(), re.S)
    assert block, "docs/isa.md lost its 'program example' block"
    without_comments = "\n".join(line.split("#")[0].rstrip() for line in block[1].splitlines())
    assert_round_trip(parse_program(block[1]))
    assert print_program(parse_program(block[1])) == without_comments.strip()


def test_print_instr_matches_program_lines() -> None:
    p = strided()
    k = p.kernels[0]
    lines = print_program(p).splitlines()
    for pos in range(len(k.body)):
        assert f"    {print_instr(p, k, pos)}" in lines
    assert print_instr(p, k, len(k.body) - 1).startswith("store @y[+7; -4, -1], %")


# --- constants -------------------------------------------------------------------------
def _bits(t: dt.DType, value: float) -> int:
    """The IEEE bit pattern of ``value`` in ``t`` (bf16: the top half of the f32 pattern)."""
    if t is dt.bfloat16:
        return int(dt.to_bf16_bits(np.array([value], np.float32))[0])
    return int(np.array([value], t.storage).view(f"u{t.itemsize}")[0])


SPECIAL_FLOATS = {
    dt.float16: (2.0**-24, 65504.0),
    dt.bfloat16: (2.0**-133, float.fromhex("0x1.fep127")),
    dt.float32: (2.0**-149, float(np.finfo(np.float32).max)),
    dt.float64: (5e-324, sys.float_info.max),
}


@pytest.mark.parametrize("t", dt.FLOATS, ids=lambda t: t.name)
def test_float_constants_bit_exact(t: dt.DType) -> None:
    tiny, huge = SPECIAL_FLOATS[t]
    values = [0.0, -0.0, math.nan, math.inf, -math.inf, tiny, -tiny, huge, -huge,
              1.0, 0.1, 1 / 3, 2.0**-14 * 1.5]
    b = ProgramBuilder("consts")
    k = b.kernel((2,))
    handles = [k.const(v, t) for v in values]
    p = b.build()
    text = assert_round_trip(p)
    parsed = parse_program(text)
    for v, h in zip(values, handles, strict=True):
        got = parsed.kernels[0].body[h.index].value
        if math.isnan(v):
            assert math.isnan(got)
        else:
            assert _bits(t, got) == _bits(t, v)
            original = p.kernels[0].body[h.index].value
            assert struct.pack("<d", got) == struct.pack("<d", original)
    assert re.search(r"const -0\.0 :", text) and re.search(r"const nan :", text)
    assert "const inf :" in text and "const -inf :" in text
    assert f"const {tiny!r} :" in text and f"const {huge!r} :" in text


def test_f16_and_bf16_constants_are_rounded_like_the_builder() -> None:
    for t in (dt.float16, dt.bfloat16):
        text = ("program p {\n  kernel k domain [] grid 0 {\n"
                f"    %a = const 0.1 : {t.name}[]\n    %b = const 1e10 : {t.name}[]\n  }}\n}}")
        body = parse_program(text).kernels[0].body
        assert body[0].attrs == (encode_const(t, 0.1),)
        assert body[1].attrs == (encode_const(t, 1e10),)  # f16: overflows to inf


@pytest.mark.parametrize("t", (*dt.INTS, dt.bool_), ids=lambda t: t.name)
def test_integer_and_bool_constants(t: dt.DType) -> None:
    b = ProgramBuilder("ints")
    k = b.kernel((1,))
    values = (False, True) if t.is_bool else (t.min, t.max, 0, 1)
    for v in values:
        k.const(v, t)
    text = assert_round_trip(b.build())
    for v in values:
        literal = ("true" if v else "false") if t.is_bool else str(v)
        assert f"const {literal} : {t.name}[1]" in text


# --- hypothesis: random well-typed kernels ---------------------------------------------
NAMES = st.one_of(st.from_regex(r"[A-Za-z_][A-Za-z0-9_.]{0,6}", fullmatch=True),
                  st.text(max_size=6))


def _const_value(draw, t: dt.DType) -> bool | int | float:
    if t.is_bool:
        return draw(st.booleans())
    if t.is_int:
        return draw(st.integers(t.min, t.max))
    return draw(st.floats(allow_nan=True, allow_infinity=True))


def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    # IndexMap.contiguous gives stride 0 to every dimension before an extent-0 one, and
    # IndexMap.is_injective then rejects a store that writes nothing; sidestep that here.
    return IndexMap.contiguous(tuple(max(n, 1) for n in shape)).strides


@st.composite
def programs(draw) -> Program:
    rank = draw(st.integers(0, 3))
    domain = tuple(draw(st.lists(st.integers(0, 4), min_size=rank, max_size=rank)))
    grid_rank = draw(st.integers(0, rank))
    b = ProgramBuilder(draw(NAMES))
    k: KernelBuilder = b.kernel(domain, name=draw(NAMES), grid_rank=grid_rank)
    values = []
    for i in range(draw(st.integers(1, 3))):
        t = draw(st.sampled_from(dt.ALL))
        shape = tuple(n if draw(st.booleans()) else 1 for n in domain)
        strides = _row_major(shape)
        offset = 0
        if draw(st.booleans()):  # walk the buffer backwards
            offset = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if n)
            strides = tuple(-s for s in strides)
        buf = b.input(f"in{i}", t, shape)
        values.append(k.load(buf, shape, offset, strides))
    loop_axes = list(range(grid_rank, rank))

    def pick(like: Value | None = None) -> Value:
        """Any value, or one of ``like``'s dtype (so that most binary ops type-check)."""
        return draw(st.sampled_from([v for v in values if like is None or v.dtype is like.dtype]))

    for _ in range(draw(st.integers(0, 8))):
        family = draw(st.sampled_from(
            ["unary", "binary", "fma", "select", "cast", "const", "index", "reduce", "contract"]))
        a = pick()
        if family == "unary":
            v = try_emit(k.unary, draw(st.sampled_from(UNARY_OPS)), a)
        elif family == "binary":
            v = try_emit(k.binary, draw(st.sampled_from(BINARY_OPS + COMPARE_OPS)), a, pick(a))
        elif family == "fma":
            v = try_emit(k.fma, a, pick(a), pick(a))
        elif family == "select":
            v = k.select(k.cast(pick(), "bool"), a, pick(a))
        elif family == "cast":
            v = k.cast(a, draw(st.sampled_from(dt.ALL)))
        elif family == "const":
            t = draw(st.sampled_from(dt.ALL))
            v = k.const(_const_value(draw, t), t)
        elif family == "index" and rank:
            v = k.index(draw(st.integers(0, rank - 1)), draw(st.sampled_from(dt.INTS)))
        elif family in ("reduce", "contract") and loop_axes:
            axes = tuple(draw(st.lists(st.sampled_from(loop_axes), min_size=1, unique=True)))
            if family == "reduce":
                v = try_emit(k.reduce, draw(st.sampled_from(REDUCE_KINDS)), a, axes)
            else:
                v = try_emit(k.contract, a, pick(a), axes)
        else:
            v = None
        if v is not None:
            values.append(v)
    result = values[-1]
    out = b.output("out", result.dtype, result.shape)
    k.store(out, result, strides=_row_major(result.shape))
    return b.build()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_round_trip(program: Program) -> None:
    assert_round_trip(program)


# --- parse errors ----------------------------------------------------------------------
GOOD = """\
program p {
  in @a: i32[4]
  in @b: i32[4]
  out @c: i32[4]
  kernel k0 domain [4] grid 1 {
    %0 = load @a[+0; 1] : i32[4]
    %1 = load @b[+0; 1] : i32[4]
    %2 = add %0, %1 : i32[4]
    store @c[+0; 1], %2 : i32[4]
  }
}"""


def test_good_text_parses_and_ignores_comments_and_value_names() -> None:
    p = parse_program(GOOD)
    commented = GOOD.replace("%0", "%x.0").replace("%1", "%y_1")
    commented = "# header\n" + commented.replace("{\n", "{  # open\n") + "\n\n# end\n"
    assert parse_program(commented) == p
    assert parse_program(GOOD.replace(" grid 1", "")).kernels[0].grid_rank == 0


@pytest.mark.parametrize("old, new, line, why", [
    ("add %0", "frob %0", 8, "unknown opcode"),
    ("add %0, %1", "add %0, %7", 8, "use before definition"),
    ("%2 = add %0, %1", "%2 = add %0, %2", 8, "use before definition"),
    ("@b[+0; 1]", "@b[+0, 1]", 7, "expected ';'"),
    ("@b[+0; 1]", "@b[+0; 1 1]", 7, "expected ','"),
    ("@b[+0; 1]", "@b[0.5; 1]", 7, "expected an integer"),
    ("@b[+0; 1]", "@nope[+0; 1]", 7, "unknown buffer"),
    ("in @b: i32[4]", "in @b: int33[4]", 3, "expected a dtype"),
    ("add %0, %1 : i32[4]", "add %0, %1 : f32[4]", 8, "declared result dtype f32"),
    ("add %0, %1 : i32[4]", "add %0, %1 : i32[1]", 8, "declared type"),
    ("  }\n}", "", 5, "kernel k0 is never closed"),
    ("  }\n}", "  }", 1, "program p is never closed"),
    ("  }\n}", "  kernel k1 domain [] {\n  }\n}", 10, "expected an instruction"),
    ("  }\n}", "  }\n} }", 11, "expected end of line"),
    ("program p {", "program p", 1, "expected '{'"),
    ("store @c", "%9 = store @c", 9, "a store has no result"),
    ("%2 = add", "add", 8, "expected an instruction"),
    ("%1 = load", "%0 = load", 7, "defined twice"),
    ("in @a", "inn @a", 2, "expected a buffer"),
    ("store @c", "store @a", 9, "store to input buffer a"),
    ("%1 = load @b[+0; 1]", "%1 = load @b[+1; 1]", 7, "out of bounds"),
    ("  out @c", "  in @a: i32[4]\n  out @c", 4, "buffer name a is declared twice"),
    ("%0 = load", "%0 = load $", 6, "unexpected character '$'"),
])
def test_parse_errors_name_the_line(old: str, new: str, line: int, why: str) -> None:
    assert old in GOOD
    with pytest.raises(IRError) as info:
        parse_program(GOOD.replace(old, new, 1))
    assert f"line {line}:" in str(info.value)
    assert why in str(info.value)


@pytest.mark.parametrize("literal, t, why", [
    ("1.5", "i32", "expected an integer constant"),
    ("128", "i8", "outside the range of i8"),
    ("-1", "u8", "outside the range of u8"),
    ("1", "bool", "expected true or false"),
    ("true", "f32", "expected a floating-point constant"),
])
def test_bad_constants(literal: str, t: str, why: str) -> None:
    text = f"program p {{\n  kernel k domain [] {{\n    %0 = const {literal} : {t}[]\n  }}\n}}"
    with pytest.raises(IRError, match=f"line 3: .*{why}"):
        parse_program(text)


def test_verify_false_keeps_ill_typed_programs() -> None:
    text = GOOD.replace("add %0, %1 : i32[4]", "add %0, %1 : f32[4]")
    p = parse_program(text, verify=False)
    assert p.kernels[0].body[2] == Instr("add", dt.float32, (4,), (0, 1))
    assert print_program(p) == text
    with pytest.raises(IRError):
        verify(p)


def test_empty_text_and_empty_program() -> None:
    with pytest.raises(IRError, match="line 1"):
        parse_program("  # nothing\n")
    empty_program = Program("nothing", ())
    assert print_program(empty_program) == "program nothing {\n}"
    assert_round_trip(empty_program)
    assert_round_trip(Program("k", (), (Kernel("empty", (3,), (), 1),)))


def test_verifier_error_messages_use_the_text_form() -> None:
    b = ProgramBuilder("bad")
    x = b.input("x", "f32", (4,))
    k = b.kernel((4,))
    k.exp(k.load(x))
    p = b.build()
    body = list(p.kernels[0].body)
    body[1] = Instr("exp", dt.float64, (4,), (0,))
    bad = Program(p.name, p.buffers, (Kernel("k0", (4,), tuple(body)),))
    with pytest.raises(IRError, match=r"at: %1 = exp %0 : f64\[4\]"):
        verify(bad)
